"""Benchmark: parse a 100,000-step log: NeMo 1.x Slurm .out (TQDM updates separated by '\\r'),
and with --format, NeMo 2.x ProgressPrinter lines or Megatron-LM lines under srun labels.

Writes the log into a temporary file (NeMo 1.x: Lightning's two prints per step, the bar moved
with the old metrics, then the new metrics, a [NeMo I ...] record glued on every 100th update;
NeMo 2.x: Ray-prefixed ProgressPrinter lines; Megatron: `srun -l`-labelled, timestamped
training_log lines), then prints the file size, the parse time (best of --repeat runs) and the
peak Python memory of one parse (tracemalloc, a separate run because tracing slows parsing
down). Figures, no assertions.

    python benchmarks/bench_parse.py [--steps 100000] [--repeat 3] [--format nemo1|nemo2|megatron|all]
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import tracemalloc

from vdkit.run.logformat import CONSUMED_SAMPLES_KEY, GLOBAL_STEP_KEY, LOSS_KEY, TIMING_KEY  # the metric names' home
from vdkit.recipes.common.progress import tqdm_num  # the engine's NeMo-format numbers


def write_log(path: str, steps: int) -> None:
    rng = random.Random(0)
    with open(path, "w", newline="") as fh:
        fh.write("[NeMo I 2024-01-01 11:59:00 megatron_init:263] Rank 0 has data parallel group : [0]\n")
        prev = None
        for i in range(steps):
            n = i + 1
            if prev is not None:
                fh.write(prev.replace(f"| {n - 1}/", f"| {n}/", 1) + "\r")
            body = (f"v_num=0, {LOSS_KEY}={tqdm_num(2.0 - i * 1e-5)}, {GLOBAL_STEP_KEY}={tqdm_num(float(i))}, "
                    f"{CONSUMED_SAMPLES_KEY}={tqdm_num(float(n * 128))}, "
                    f"{TIMING_KEY}={tqdm_num(9.0 + rng.gauss(0, 0.1))}")
            upd = f"Epoch 0: : {100 * n // steps:3d}%|███▏      | {n}/{steps} [03:10<04:23, 0.11it/s, {body}]"
            if i % 100 == 0:
                upd += f"[NeMo I 2024-01-01 12:00:00 nemo_logging:349] step {i}\n"
            fh.write(upd + "\r")
            prev = upd.split("[NeMo I")[0]
        fh.write("\n")


def write_nemo2_log(path: str, steps: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as fh:
        for i in range(steps):
            fh.write(f"(pretraining, pid=4112) Training epoch {i // 1000}, iteration {i % 1000}/999 | lr: 1.2e-05 | "
                     f"global_batch_size: 128 | {GLOBAL_STEP_KEY}: {i} | {LOSS_KEY}: {2.0 - i * 1e-5:.4g} | "
                     f"{TIMING_KEY}: {9.0 + rng.gauss(0, 0.1):.4g} | {CONSUMED_SAMPLES_KEY}: {(i + 1) * 128}\n")


def write_megatron_log(path: str, steps: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as fh:
        for i in range(1, steps + 1):
            fh.write(f"1:  [2025-10-06 03:27:07] iteration {i:8d}/{steps:8d} | consumed samples: {i * 128:12d} | "
                     f"elapsed time per iteration (ms): {9000 + rng.gauss(0, 100):.1f} | learning rate: 1.500000E-06 | "
                     f"global batch size:   128 | lm loss: {9.76 - i * 1e-5:.6E} | loss scale: 1.0 | "
                     "grad norm: 33.055 | "
                     "number of skipped iterations:   0 | number of nan iterations:   0 |\n")


WRITERS = {"nemo1": write_log, "nemo2": write_nemo2_log, "megatron": write_megatron_log}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--format", choices=[*WRITERS, "all"], default="nemo1")
    args = ap.parse_args()
    for fmt in (WRITERS if args.format == "all" else [args.format]):
        bench(fmt, args)


def bench(fmt: str, args) -> None:
    """Write one log of ``fmt`` and time its parse."""
    from vdkit.validation.text_log import parse_text_log

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "slurm-1.out")
        t0 = time.perf_counter()
        WRITERS[fmt](path, args.steps)
        size = os.path.getsize(path)
        print(f"{fmt} log: {args.steps:,} steps, {size / 1e6:.1f} MB, written in {time.perf_counter() - t0:.1f} s")
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            log = parse_text_log(path)
            best = min(best, time.perf_counter() - t0)
        assert len(log.timed) == args.steps, f"parsed {len(log.timed)} steps"  # the benchmark must parse it all
        print(f"parse: {best:.2f} s (best of {args.repeat}), {size / 1e6 / best:.0f} MB/s, "
              f"{args.steps / best:,.0f} steps/s, {len(log.timed):,} steps parsed "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: a shared machine runs slower)")
        tracemalloc.start()
        log = parse_text_log(path)
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"memory: peak {peak / 1e6:.1f} MB during one parse, of which {kept / 1e6:.1f} MB is the result "
              f"({kept / args.steps:.0f} B per step); the {size / 1e6:.1f} MB file is streamed in 1 MiB chunks")


if __name__ == "__main__":
    main()
