"""Benchmark: per-step time of engine=megatron in each parallel layout, and memory vs plan.

Trains the 4-layer tiny Llama (SFT, GBS 8, MBS 2, seq 128) with `vdkit run engine=megatron` in each
layout on this machine, then prints, per layout, the median ``train_step_timing in s`` over the
steps after the first two (warm-up) and the worst measured-vs-planned difference of memory.json.
Figures, no assertions (the equality and memory checks live in tests/test_megatron_engine.py).

    python benchmarks/bench_megatron_layouts.py [--steps 20] [--out DIR] [--only tp2,pp2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = ["engine=megatron", "model.num_layers=4", "train.seq_length=128", "method.warmup_steps=0",
        "train.global_batch_size=8", "train.micro_batch_size=2", "method=sft", "method.lr=1e-3"]
LAYOUTS = {
    "1 rank": ["cluster.gpus_per_node=1"],
    "tp2 (sp)": ["cluster.gpus_per_node=2", "parallelism.tp=2"],
    "pp2 (1F1B)": ["cluster.gpus_per_node=2", "parallelism.pp=2"],
    "dp2 (dist-opt)": ["cluster.gpus_per_node=2", "parallelism.tp=1", "parallelism.pp=1",
                       "parallelism.distributed_optimizer=true"],
    "tp2 pp2 vp2 (sp)": ["cluster.gpus_per_node=4", "parallelism.tp=2", "parallelism.pp=2", "parallelism.vp=2"],
    "pp2 dp2 (dist-opt)": ["cluster.gpus_per_node=4", "parallelism.tp=1", "parallelism.pp=2",
                           "parallelism.distributed_optimizer=true"],
}


def step_times(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vdkit.run.logformat import TIMING_KEY
    from vdkit.run.rundir import LOG_DIR

    acc = EventAccumulator(str(run_dir / LOG_DIR))
    acc.Reload()
    return [e.value for e in acc.Scalars(TIMING_KEY)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None, help="where the run directories go (default: a temp dir)")
    ap.add_argument("--only", default=None, help="comma-separated layout keys (default: all)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_megatron_"))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    chosen = [k for k in LAYOUTS if not args.only or k.split()[0] in args.only.split(",")]
    print(f"{'layout':<20} {'ranks':>5} {'median s/step':>14} {'min':>8} {'max':>8} {'memory vs plan':>16}")
    for name in chosen:
        cmd = [sys.executable, "-m", "vdkit", "run", *BASE, f"train.max_steps={args.steps}", *LAYOUTS[name],
               "--out", str(out / name.split()[0])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            print(f"{name:<20} FAILED: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        run_dir = Path(proc.stdout.strip().splitlines()[-1])
        times = step_times(run_dir)[2:]
        report = json.loads((run_dir / "memory.json").read_text())
        worst = max(abs(r["measured"][k] - r["planned"][k]) / r["planned"][k]
                    for r in report["ranks"] for k in r["planned"] if r["planned"][k])
        print(f"{name:<20} {len(report['ranks']):>5} {statistics.median(times):>14.3f} {min(times):>8.3f} "
              f"{max(times):>8.3f} {100 * worst:>14.2f} %")
    print(f"runs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
