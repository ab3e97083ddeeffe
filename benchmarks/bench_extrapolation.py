"""Benchmark: how accurate is the 50-step -> N-step extrapolation? Measured, not assumed.

For every long trace available, the estimator sees only the first 50 steps (what a 50-step run of
the design guide measures) and extrapolates to the trace's full length; the result is compared
with the measured total over the whole trace (the sum of its step timings, the same quantity).

Traces:

* the real public logs in tests/fixtures/logs that are long enough (at least twice the measured
  window; sources in tests/fixtures/logs/SOURCES.md);
* the kit's own engine: a 1000-step run of the reference engine on the tiny model (CPU; minutes)

      vdkit run model=tiny_llama engine=reference cluster=local data=synthetic train.global_batch_size=8 \
          train.max_steps=1000

  or finished run directories passed with --run-dir (any engine: reference, megatron, NeMo).

Two totals are compared: the raw sum of every logged step, and the like-for-like total in which
steps the estimator leaves out by design (checkpoint / validation slow-down, timer glitches) count
at the steady mean, because the estimate excludes checkpoint and validation time. Figures, no
assertions.

    python benchmarks/bench_extrapolation.py                       # fixtures + a 1000-step reference run
    python benchmarks/bench_extrapolation.py --no-engine           # fixtures only
    python benchmarks/bench_extrapolation.py --run-dir runs/X ...  # reuse finished runs
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

# GBS 8: ~0.1-0.6 s a step on 2 CPU cores, so 1000 steps take minutes (GBS 128 takes an hour here).
RUN_COMMAND = ["vdkit", "run", "model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic",
               "train.global_batch_size=8"]
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs"


def run_engine(steps: int, extra) -> Path:
    """Run the reference engine and return the run directory it prints (its last output line)."""
    cmd = RUN_COMMAND + [f"train.max_steps={steps}", f"train.target_steps={steps}", *extra]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"`vdkit run` failed with exit code {proc.returncode}")
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    for line in reversed(lines):
        if Path(line).is_dir():
            return Path(line)
    sys.exit("`vdkit run` did not print its run directory")


def compare(name: str, log, measured: int):
    """One row: the estimate from the first ``measured`` samples against the whole trace."""
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.steps import StepLog

    timed = log.timed
    total_its = sum(r.span for r in timed)
    head = StepLog(log.source, log.format, timed[:measured], [], log.files, None,
                   [e for e in log.events if e[0] < timed[measured - 1].step], log.timing_source)
    est = estimate_log(head, total_its)
    full = estimate_log(log, total_its)  # the whole trace, measured: left-out steps at the steady mean
    raw = math.fsum(r.timing_s * r.span for r in timed) / 60
    like = full.extrapolated_minutes
    lo, hi = est.interval_minutes
    return (name, len(timed), total_its, est.extrapolated_minutes, lo, hi, raw, like,
            (est.extrapolated_minutes - raw) / raw, (est.extrapolated_minutes - like) / like, lo <= like <= hi,
            len(full.excluded_steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="steps of the reference engine run (the truth)")
    ap.add_argument("--measured", type=int, default=50, help="steps the extrapolation may see")
    ap.add_argument("--run-dir", action="append", default=[], help="a finished run directory (repeatable)")
    ap.add_argument("--no-engine", action="store_true", help="only the real fixture traces")
    ap.add_argument("overrides", nargs="*", help="extra overrides for `vdkit run`")
    args = ap.parse_args()

    from vdkit.validation.logs import read_source

    rows = []
    for path in sorted(FIXTURES.glob("*.log")):
        log = read_source(path, require_timing=False)
        if len(log.timed) >= 2 * args.measured:
            rows.append(compare(f"real: {path.name}", log, args.measured))
    runs = [Path(p) for p in args.run_dir]
    if not runs and not args.no_engine:
        runs.append(run_engine(args.steps, args.overrides))
    for run in runs:
        log = read_source(run)
        if len(log.timed) < 2 * args.measured:
            print(f"skipped {run}: {len(log.timed)} timed steps, fewer than {2 * args.measured}")
            continue
        rows.append(compare(f"engine: {run.name}", log, args.measured))

    print(f"\nestimate from the first {args.measured} steps vs the measured total of the whole trace (minutes)")
    head = (f"{'trace':58} {'steps':>6} {'estimate':>9} {'95 % interval':>17} {'raw total':>10} {'like-for-like':>13} "
            f"{'err raw':>8} {'err like':>9} {'inside':>6} {'left out':>8}")
    print(head)
    print("-" * len(head))
    for (name, n, its, est, lo, hi, raw, like, err_raw, err_like, inside, left) in rows:
        print(f"{name[:58]:58} {its:6d} {est:9.3f} {lo:8.3f}-{hi:8.3f} {raw:10.3f} {like:13.3f} "
              f"{err_raw:+8.1%} {err_like:+9.1%} {'yes' if inside else 'NO':>6} {left:8d}")
    if rows:
        mean_abs = sum(abs(r[9]) for r in rows) / len(rows)
        print(f"\nmean |error| (like-for-like) over {len(rows)} trace(s): {mean_abs:.1%}")


if __name__ == "__main__":
    main()
