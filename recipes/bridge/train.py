"""``python -m vdkit.recipes.bridge.rank RUN_DIR``: one rank of a bridge-engine run on this machine.

It runs the run dir's ``bridge.yaml`` with Megatron-Bridge's own loop (:mod:`.job`) - not the kit's
loop. Without CUDA it first applies the pinned CPU shim (:mod:`.cpu_shim`) and makes the
ConfigContainer CPU-runnable, saying each change in the log: gloo instead of NCCL, fp32 instead
of bf16 mixed precision, Bridge's local (non-TE) layer spec, fusions off, CPU initialisation. Layout,
batch sizes, optimizer, data, checkpoints and PEFT stay as written. After training every rank's live
weight / gradient / optimizer bytes go to ``memory.json`` next to the plan's (Bridge's ``on_train_end``
callback; :mod:`vdkit.recipes.common.mcore_memory`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from vdkit.errors import UserError

CPU_CHANGES = ("distributed backend gloo", "fp32 (no bf16 mixed precision)", "local layer spec (no Transformer Engine; torch norms)",
               "fusions off", "CPU initialisation", "pipeline outputs kept until their backward")


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def make_cpu_runnable(cfg) -> None:
    """The CPU changes (see :data:`CPU_CHANGES`), in place on Bridge's ConfigContainer."""
    import torch
    from vdkit.recipes.bridge.config import FUSIONS
    from vdkit.recipes.common.mcore_cpu import local_block_spec

    if cfg.dataset is not None and getattr(cfg.dataset, "packed_sequence_specs", None) is not None \
            and cfg.dataset.packed_sequence_specs.packed_sequence_size > 0:
        raise UserError("packed sequences cannot train on this CPU: megatron-core's attention without Transformer "
                        "Engine refuses packed (THD) batches (mcore transformer/dot_product_attention.py)",
                        "set data.packed=false here (packing works in the NeMo container on GPUs)")
    cfg.dist.distributed_backend = "gloo"
    cfg.mixed_precision = None
    m = cfg.model
    m.bf16, m.fp16, m.params_dtype, m.pipeline_dtype = False, False, torch.float32, torch.float32
    m.transformer_layer_spec = local_block_spec  # megatron-core's local spec, norms that allow SP
    for k in FUSIONS:
        setattr(m, k, False)
    m.use_cpu_initialization = True
    # A stage frees each output it sends once the send is posted (mcore pipeline_parallel/schedules.py:165,
    # deallocate_output_tensor): on a GPU the stream orders the send before the memory's reuse; gloo sends
    # from a background thread, so the interleaved schedule's overlapped sends (config.INTERLEAVED_P2P) read
    # freed memory - measured: garbage activations from the third micro-batch on. Memory only, not the maths.
    m.deallocate_pipeline_outputs = False
    cfg.optimizer.bf16, cfg.optimizer.fp16 = False, False
    cfg.optimizer.params_dtype = torch.float32


class MemoryReport:
    """Bridge callback: at the end of training every rank's bytes, gathered into memory.json by rank 0."""

    def __init__(self, run_dir: Path, plan):
        self.run_dir, self.plan = run_dir, plan

    def on_train_end(self, context) -> None:
        import torch
        from megatron.core import parallel_state as ps

        from vdkit.recipes.common import mcore_memory as memory

        stage = ps.get_pipeline_model_parallel_rank()
        mine = {"rank": torch.distributed.get_rank(), "stage": stage, "tp_rank": ps.get_tensor_model_parallel_rank(),
                "dp_rank": ps.get_data_parallel_rank(), "measured": memory.measure(context.model, context.optimizer),
                "planned": memory.planned(self.plan, stage, "fp32")}
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, mine)
        if mine["rank"] == 0:
            path = memory.write(self.run_dir, gathered)
            off = memory.disagreements({"ranks": gathered})
            print(f"[vdkit I] memory per rank (weights/gradients/optimizer bytes, measured vs plan) in {path}"
                  + (": " + "; ".join(off) if off else ": all within 2 %"), flush=True)


def train(run_dir, beat=None) -> int:
    """Train the run dir's bridge.yaml on this rank; 0 when every step is done, 75 after a clean stop.
    ``beat``: this rank's heartbeat (vdkit.recipes.common.heartbeat), told of every step by Bridge's callbacks."""
    from vdkit.recipes.bridge.config import CONFIG_FILE, RESOLVED_FILE
    from vdkit.run.rundir import load_plan

    run_dir = Path(run_dir).absolute()
    plan = load_plan(run_dir)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        from vdkit.recipes.bridge import cpu_shim

        cpu_shim.apply()
    from megatron.bridge.training.callbacks import Callback, CallbackManager

    from vdkit.recipes.bridge import job

    cfg = job.load(run_dir / CONFIG_FILE)
    rank = _rank()
    if not cuda:
        make_cpu_runnable(cfg)
        if rank == 0:
            print(f"[vdkit I] bridge engine on CPU (Megatron-Bridge {_version('megatron-bridge')}, megatron-core "
                  f"{_version('megatron-core')}, pinned shim): {', '.join(CPU_CHANGES)}", flush=True)
    if rank == 0:
        _write_resolved(cfg, run_dir / RESOLVED_FILE)
    manager = CallbackManager()
    report = MemoryReport(run_dir, plan)
    manager.add(type("VdkitMemory", (Callback,), {"on_train_end": lambda self, ctx: report.on_train_end(ctx)})())
    return job.run(cfg, callbacks=manager, beat=beat)  # 0: finished; job.EXIT_STOPPED: stopped cleanly (the job contract)


def _write_resolved(cfg, path: Path) -> None:
    """Bridge's own dump of the full ConfigContainer this run uses (every default spelled out)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        cfg.to_yaml(str(tmp))
        os.replace(tmp, path)
    except Exception as exc:  # a field Bridge cannot serialise must not stop training
        print(f"[vdkit W] could not write {path.name}: {exc}", flush=True)
        tmp.unlink(missing_ok=True)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv=None, beat=None) -> int:
    """Entry point: a UserError is one line and exit 2 (no traceback)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m vdkit.recipes.bridge.rank RUN_DIR", file=sys.stderr)
        return 2
    try:
        return train(args[0], beat)
    except UserError as exc:
        print(f"vdkit: error: {exc}", file=sys.stderr)
        return 2
