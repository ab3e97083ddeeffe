"""`vdkit runs`, `vdkit logs`, `vdkit cancel`: the run directories under a results root as things to list,
follow and stop, on every launcher (:mod:`vdkit.run.runs`, :mod:`vdkit.run.runctl`)."""
from __future__ import annotations

import sys

from vdkit.commands.args import finite_seconds


def register(sub) -> None:
    """Add the `vdkit runs`, `logs` and `cancel` verbs to ``sub``."""
    r = sub.add_parser("runs", help="every run directory under a results root: engine, launcher, state, steps, last job",
                       description="One line per run directory under DIR (default: runs): the run directory, its "
                                   "engine, its launcher, its state (its own finished / cancelled markers first, "
                                   "else its launcher's answer), steps done / planned, and its last job. A run "
                                   "directory that cannot be read says why on its line; the others are listed.")
    r.add_argument("root", nargs="?", default="runs", metavar="DIR", help="results root (default: runs)")
    r.set_defaults(func=run_runs)
    g = sub.add_parser("logs", help="a run's rank logs, the failing rank first (-f follows until the run ends)",
                       description="Print the run directory's job output (slurm-<job>.out/.err, local-1.out, "
                                   "logs/rank<R>.out; a Kubernetes run's pods through kubectl logs), each under a "
                                   "'==> FILE <==' header, the failing rank's first. -f goes on printing what they "
                                   "gain until the run ends, --timeout seconds pass, or Ctrl-C.")
    g.add_argument("run_dir", metavar="RUN_DIR")
    g.add_argument("-f", "--follow", action="store_true", help="follow the logs until the run ends")
    g.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N lines of each file")
    g.add_argument("--timeout", type=finite_seconds, default=None, metavar="S", help="with -f: stop after S seconds")
    g.set_defaults(func=run_logs)
    c = sub.add_parser("cancel", help="cancel a run: its jobs and any successor it queued, on its launcher",
                       description="Stop the run in RUN_DIR on its launcher: local (TERM to `vdkit run`: the ranks "
                                   "checkpoint and stop), Slurm (scancel of its jobs and of any queued successor "
                                   "running its launch.sbatch), Kubernetes (kubectl delete of its manifest). The run "
                                   "directory's file `cancelled` then records when, which jobs, and the command that "
                                   "continues the run; `vdkit status` reads it.")
    c.add_argument("run_dir", metavar="RUN_DIR")
    c.add_argument("--settle", type=finite_seconds, default=60.0, metavar="S",
                   help="seconds to wait for the jobs to end (default 60)")
    c.set_defaults(func=run_cancel)


def run_runs(args) -> int:
    """Print one tab-separated line per run directory under the root; exit 1 when one could not be read."""
    from vdkit.run.runs import MAX_DEPTH, describe, find_runs

    rc = 0
    found = find_runs(args.root)
    if not found:  # a silent empty list reads as "the results root is right and empty" or as a hang
        print(f"vdkit runs: no run directory (a directory holding recipe.yaml) under {args.root}, "
              f"{MAX_DEPTH} levels deep; `vdkit render` / `submit` / `run` print where they write theirs", file=sys.stderr)
    for path in found:
        info = describe(path)
        rc |= 1 if info.state.startswith("UNREADABLE") else 0
        print("\t".join([str(info.path), info.engine, info.launcher, info.state, info.steps, info.job]), flush=True)
    return rc


def run_logs(args) -> int:
    """`vdkit logs RUN_DIR`: the run's job and rank output, the failing rank first (``-f``: followed); the exit code."""
    from vdkit.errors import UserError
    from vdkit.run.runctl import show_logs

    if args.lines is not None and args.lines < 0:
        raise UserError(f"--lines {args.lines} is negative", "pass a count of lines, e.g. -n 50")
    return show_logs(args.run_dir, follow=args.follow, lines=args.lines, timeout=args.timeout)


def run_cancel(args) -> int:
    """`vdkit cancel RUN_DIR`: the run's jobs and any queued successor stopped on its launcher; the exit code."""
    from vdkit.run.runctl import cancel

    record = cancel(args.run_dir, settle_s=args.settle)
    jobs = ", ".join(record["jobs"]) or "no job was running"
    print(f"{args.run_dir}\tCANCELLED\t{jobs}\tcontinue: {record['continue']}")
    return 0
