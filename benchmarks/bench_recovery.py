"""The fault suite's SIGKILL, repeated: does every run finish by itself, with every step once? (issue 37)

On the local Slurm (`vdkit cluster up`'s, started here in a temporary directory; needs root), each engine that
recovers (reference; megatron where megatron-core is installed) runs its cell of tests/test_faults.py
``--repeat`` times on an idle machine and as many under load (one busy process per CPU), the kill timing
cycling through mid-step, during a save and just after one (tests/fault_kill.py). Every run also has a
process of the failed job hold the run dir's lock after its batch shell exited, the straggler that stranded
runs before the hand-over waited for it. A run counts as finished when it ends by itself with every step
done once (the scenario's own assertions); anything else is printed with its error.

    python benchmarks/bench_recovery.py [--repeat 10] [--engines reference,megatron] [--loads idle,loaded]

Prints one line per run and a summary per engine and load (finished / runs, wall seconds, steps redone);
it asserts nothing. The CI slow tier runs each timing once (tests/test_faults.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def _load(n: int) -> list:
    """``n`` busy processes (the loaded machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="runs per engine and load (default 10)")
    ap.add_argument("--engines", default="reference,megatron")
    ap.add_argument("--loads", default="idle,loaded")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    import test_faults  # the cells and the scenario: one home for both
    from fault_kill import TIMINGS

    from vdkit.slurm.localcluster import up, why_unavailable

    reason = why_unavailable()
    if reason:
        print(f"bench_recovery: {reason}", file=sys.stderr)
        return 2
    engines = [e for e in args.engines.split(",") if e != "megatron" or test_faults.HAVE_MEGATRON]
    root = Path(tempfile.mkdtemp(prefix="bench_recovery-"))
    cluster = up(root / "slurm")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["OMP_NUM_THREADS"] = "1"
    results = {}
    try:
        for load in args.loads.split(","):
            burners = _load(os.cpu_count() or 1) if load == "loaded" else []
            try:
                for engine in engines:
                    cell = test_faults.CELLS[engine]
                    for i in range(args.repeat):
                        timing = TIMINGS[i % len(TIMINGS)]
                        start = time.monotonic()
                        try:
                            row = test_faults._sigkilled_rank(root / f"{load}-{engine}-{i}", cell, timing)
                            ok, note = True, row.split("steps redone: ")[1].split(" |")[0] + " redone"
                        except Exception as exc:  # noqa: BLE001 - a benchmark reports every failure and goes on
                            ok, note = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                        wall = time.monotonic() - start
                        results.setdefault((engine, load), []).append((ok, wall, note))
                        print(f"{engine:9} {load:6} run {i + 1:2} kill {timing:10} "
                              f"{'finished' if ok else 'FAILED  '} {wall:6.1f} s  {note}", flush=True)
            finally:
                for p in burners:
                    p.kill()
                    p.wait()
    finally:
        cluster.down()
    print("\nengine    load   finished  wall s (median, max)")
    for (engine, load), rows in results.items():
        walls = [w for _, w, _ in rows]
        print(f"{engine:9} {load:6} {sum(ok for ok, _, _ in rows):2} / {len(rows):<2}   "
              f"{statistics.median(walls):6.1f} {max(walls):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
