"""Benchmark: how accurate is the 50-step -> 1000-step extrapolation? Measured, not assumed.

Runs the reference engine for 1000 steps on the tiny model (CPU is enough; minutes):

    vdkit run model=tiny_llama engine=reference cluster=local data=synthetic train.max_steps=1000

then extrapolates from the first 50 steps (what a 50-step run of the design guide measures) to
1000 with `vdkit.validation.extrapolate.estimate`, and prints the estimate, its 95 % interval,
the measured total (the sum of all 1000 `train_step_timing` values, the same quantity) and the
error. Figures, no assertions.

    python benchmarks/bench_extrapolation.py                    # run the engine, then compare
    python benchmarks/bench_extrapolation.py --run-dir runs/X   # reuse a finished 1000-step run
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

RUN_COMMAND = ["vdkit", "run", "model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic"]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="steps the reference run measures (the truth)")
    ap.add_argument("--measured", type=int, default=50, help="steps the extrapolation may see")
    ap.add_argument("--run-dir", help="a finished run directory to reuse instead of running the engine")
    ap.add_argument("overrides", nargs="*", help="extra overrides for `vdkit run`")
    args = ap.parse_args()

    from vdkit.validation.extrapolate import estimate
    from vdkit.validation.logs import read_source

    run_dir = Path(args.run_dir) if args.run_dir else run_engine(args.steps, args.overrides)
    log = read_source(run_dir)
    timings = log.timings
    if len(timings) < args.steps:
        sys.exit(f"{run_dir} holds {len(timings)} timed steps, fewer than {args.steps}")
    truth_min = math.fsum(timings[:args.steps]) / 60
    est = estimate(timings[:args.measured], args.steps)
    lo, hi = est.interval_minutes
    err = (est.extrapolated_minutes - truth_min) / truth_min
    print(f"run: {run_dir} ({log.format}, {len(timings)} timed steps)")
    print(f"first {args.measured} steps: warm-up {est.warmup_steps} ({est.warmup_seconds:.2f} s), steady mean "
          f"{est.step_time_mean_s:.4f} s, CV {est.step_time_cv:.1%}, fluctuating {est.fluctuating}")
    print(f"extrapolated {args.steps} steps: {est.extrapolated_minutes:.3f} min (95 % interval {lo:.3f}-{hi:.3f})")
    print(f"measured {args.steps} steps:     {truth_min:.3f} min (sum of train_step_timing)")
    print(f"error: {err:+.1%}; measured total {'inside' if lo <= truth_min <= hi else 'OUTSIDE'} the interval")
    late = estimate(timings[:args.steps], args.steps)
    print(f"steady mean over all {args.steps} steps: {late.step_time_mean_s:.4f} s "
          f"(first-{args.measured} mean was {est.step_time_mean_s:.4f} s, "
          f"{(est.step_time_mean_s - late.step_time_mean_s) / late.step_time_mean_s:+.1%})")


if __name__ == "__main__":
    main()
