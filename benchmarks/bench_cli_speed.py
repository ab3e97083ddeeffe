"""How fast the planner answers: CPU seconds of `vdkit plan`, `vdkit plan --sweep table9` and `vdkit --help`.

Each command runs as a fresh process (start-up and imports included, as a user meets it) ``--runs`` times
after one warm-up; the figure is the child's user + system CPU time from the operating system's own
accounting (``resource.getrusage(RUSAGE_CHILDREN)`` before and after), median and spread, with the wall
time beside it. The goals (issue 25): one plan under 0.4 s of CPU, the Table 9 sweep under 1 s; `--help`
is the floor (Python, argparse and the CLI's own imports).

    python benchmarks/bench_cli_speed.py [--runs 5]

Prints figures only; it asserts nothing (a timing depends on the machine).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "vdkit --help": ["--help"],
    "vdkit plan model=llama2_70b method=sft cluster.nodes=2": ["plan", "model=llama2_70b", "method=sft",
                                                               "cluster.nodes=2"],
    "vdkit plan --sweep table9": ["plan", "--sweep", "table9"],
}
GOALS_S = {"vdkit plan model=llama2_70b method=sft cluster.nodes=2": 0.4, "vdkit plan --sweep table9": 1.0}


def cpu_and_wall(argv) -> tuple:
    """(CPU seconds, wall seconds) of one run of ``python -m vdkit ARGV`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vdkit", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per command (after one warm-up)")
    args = ap.parse_args(argv)
    print(f"{'command':58s} {'cpu s (median)':>15s} {'min':>6s} {'max':>6s} {'wall s':>7s}  goal")
    for label, cmd in COMMANDS.items():
        cpu_and_wall(cmd)  # warm-up: the file cache, .pyc files
        runs = [cpu_and_wall(cmd) for _ in range(args.runs)]
        cpu = [c for c, _ in runs]
        wall = statistics.median(w for _, w in runs)
        goal = GOALS_S.get(label)
        verdict = "" if goal is None else f"< {goal:g} s: {'met' if statistics.median(cpu) < goal else 'not met'}"
        print(f"{label:58s} {statistics.median(cpu):15.3f} {min(cpu):6.3f} {max(cpu):6.3f} {wall:7.2f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
