"""Benchmark: engine=bridge (Megatron-Bridge 0.3.1's own loop, CPU over gloo) in each parallel layout.

Converts a seeded toy HF Llama (tiny_llama's sizes, 4 layers) once with the bridge engine's HF import,
fine-tunes it (SFT, GBS 8, MBS 2, seq 64) with `vdkit run engine=bridge` in each layout from that
one checkpoint, and prints per layout: the losses, their largest relative difference to one rank's,
the median seconds per step after the first two (Bridge's `elapsed time per iteration`), and the
worst measured-vs-planned difference in memory.json (weights / gradients / optimizer bytes, every
rank). Figures, no assertions (the checks live in tests/test_bridge_run.py).

    python benchmarks/bench_bridge_layouts.py [--steps 10] [--out DIR] [--only tp2sp,pp2]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_bridge_run import LAYOUTS  # noqa: E402  (the tests' layouts)

BASE = ["engine=bridge", "model=tiny_llama", "model.num_layers=4", "data=synthetic", "train.seq_length=64",
        "method.warmup_steps=0", "train.global_batch_size=8", "train.micro_batch_size=2", "method=sft",
        "method.lr=1e-3", "engine.checkpoint_every_n_steps=0"]
NAMES = {"one": "1 rank", "tp2sp": "TP2 + SP", "pp2": "PP2 (1F1B)", "pp2vp2": "PP2 x VP2 (interleaved)",
         "dp2": "DP2 + distributed optimizer"}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _steps(run_dir: Path):
    from vdkit.validation.logs import read_source

    return [(r.timing_s, r.loss) for r in read_source(run_dir).steps]


def _memory_worst(run_dir: Path) -> float:
    report = json.loads((run_dir / "memory.json").read_text())
    return max(abs(r["measured"][k] - v) / max(v, 1) for r in report["ranks"] for k, v in r["planned"].items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    ap.add_argument("--only", default=None, help="comma-separated layouts (" + ",".join(LAYOUTS) + ")")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_bridge_"))
    from vdkit.composition.config import compose
    from vdkit.recipes.bridge.convert import make_base

    base = make_base(compose(BASE), out)  # a seeded toy HF tiny_llama converted with Bridge's HF import
    layouts = ["one"] + [n for n in (args.only.split(",") if args.only else LAYOUTS) if n != "one"]
    rows, ref = [], None
    for name in layouts:
        cmd = [sys.executable, "-m", "vdkit", "run", *BASE, f"train.max_steps={args.steps}",
               f"model.megatron_path={base}", *LAYOUTS[name], "--out", str(out / name)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=_env())
        if done.returncode != 0:
            print(f"{NAMES[name]:<30} failed (rc {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        run_dir = Path(done.stdout.strip().splitlines()[-1])
        steps = _steps(run_dir)
        losses = [l for _, l in steps]
        ref = losses if name == "one" else ref
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref)) if ref else float("nan")
        secs = [t for t, _ in steps[2:]] or [t for t, _ in steps]
        rows.append((NAMES[name], losses, diff, statistics.median(secs), _memory_worst(run_dir)))
    print(f"engine=bridge, Megatron-Bridge 0.3.1 on CPU over gloo: tiny_llama (4 layers) SFT, GBS 8, MBS 2, seq 64, "
          f"{args.steps} steps from one converted checkpoint; runs in {out}")
    print(f"{'layout':<30} {'first loss':>10} {'last loss':>10} {'max rel diff vs 1 rank':>23} {'s/step':>8} "
          f"{'memory vs plan (worst)':>23}")
    for label, losses, diff, sec, mem in rows:
        print(f"{label:<30} {losses[0]:>10.5f} {losses[-1]:>10.5f} {diff:>23.2e} {sec:>8.3f} {mem:>22.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
