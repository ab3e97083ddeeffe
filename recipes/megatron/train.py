"""The megatron engine's training loop: megatron-core's parallel state, schedules, DDP and optimizer.

One process per rank. ``parallel_state`` lays out TP x PP (x VP) x DP; ``get_forward_backward_func`` picks the
schedule (no pipelining, 1F1B, or interleaved 1F1B with VP); megatron's ``DistributedDataParallel`` keeps fp32
gradients in contiguous buffers and ``finalize_model_grads`` reduces them (and the sequence-parallel norm gradients);
``get_megatron_optimizer`` builds Adam with the method's betas and NeMo's clipping (vdkit.recipes.common.training_constants),
optionally distributed (ZeRO-1). A fine-tune starts from its base (vdkit.recipes.megatron.base). One iteration is one optimizer step over GBS samples in grad_accum micro batches per DP rank, in the reference engine's batch order; the loss
is NeMo's: the mean over the global batch's micro batches of each micro batch's masked token mean.

On a CPU the pinned megatron-core shim (recipes/common/mcore_cpu.py) is applied first, gloo, fp32; on GPUs NCCL, bf16, no shim.
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

from vdkit.errors import UserError
from vdkit.recipes.megatron import base as mbase  # a fine-tune's base (no heavy imports: torch, megatron load lazily)

ADAM_EPS = 1e-8


def check_layout(plan, dist) -> None:
    """The processes started must be the recipe's world, the plan one this engine runs, a fine-tune's base there."""
    r = plan.recipe
    if dist.world_size != r.world_size:
        raise UserError(f"{dist.world_size} processes were started ({dist.source}), the recipe needs "
                        f"{r.world_size} (cluster.nodes x cluster.gpus_per_node)",
                        "start one task per GPU: srun --ntasks-per-node=cluster.gpus_per_node, or use `vdkit run`")
    from vdkit.recipes.megatron import check

    check(plan)
    mbase.check_rank(r)  # before anything is built: a missing, empty or wrong base is one line, exit 2


def _quiet() -> None:
    """Silence megatron-core's known-harmless warnings (each with its reason: vdkit.recipes.common.known_warnings)."""
    from vdkit.recipes.common.known_warnings import silence

    silence("megatron")


def check_megatron_version() -> None:
    """The API this engine is written against (GPU too; the CPU shim pins the exact release)."""
    from importlib.metadata import PackageNotFoundError, version

    from vdkit.recipes.megatron import MCORE_SERIES

    try:
        have = version("megatron-core")
    except PackageNotFoundError:
        raise UserError("megatron-core is not installed", f"pip install 'megatron-core=={MCORE_SERIES}.1'") from None
    if ".".join(have.split(".")[:2]) != MCORE_SERIES:
        raise UserError(f"the megatron engine is written for megatron-core {MCORE_SERIES}.x, found {have}",
                        f"pip install 'megatron-core=={MCORE_SERIES}.1' (in the container, too)")


def _init_distributed(dist, cuda: bool):
    import torch

    from vdkit.run.faults import collective_timeout_s  # the launcher's, from the plan

    if cuda:
        torch.cuda.set_device(dist.local_rank)
    torch.distributed.init_process_group(
        backend="nccl" if cuda else "gloo", init_method=f"tcp://{dist.master_addr}:{dist.master_port}",
        rank=dist.rank, world_size=dist.world_size, timeout=timedelta(seconds=collective_timeout_s()))


def build(plan, cuda: bool, clock=None):
    """(layout, DDP-wrapped chunks, optimizer) for this rank, parallel state initialised; ``clock`` (a
    ComputeClock) notes when each step's gradient reduction starts."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from vdkit.recipes.megatron.model import Layout, build_chunks
    from vdkit.recipes.common.training_constants import GRAD_CLIP, adam_betas

    recipe = plan.recipe
    layout = Layout.from_plan(plan)
    ps.initialize_model_parallel(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                                 virtual_pipeline_model_parallel_size=layout.vp)
    model_parallel_cuda_manual_seed(recipe.train.seed)
    chunks = build_chunks(recipe, layout, cuda, load_base=mbase.loader(recipe))
    config = chunks[0].config
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=layout.distributed_optimizer)
    wrapped = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0)
               for i, c in enumerate(chunks)]
    config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    config.finalize_model_grads_func = clock.wrap(finalize_model_grads) if clock else finalize_model_grads
    m = recipe.method
    opt_config = OptimizerConfig(optimizer="adam", lr=m.lr, min_lr=m.min_lr, weight_decay=m.weight_decay,
                                 adam_beta1=adam_betas(recipe)[0], adam_beta2=adam_betas(recipe)[1], adam_eps=ADAM_EPS, clip_grad=GRAD_CLIP,
                                 bf16=cuda, params_dtype=torch.bfloat16 if cuda else torch.float32,
                                 use_distributed_optimizer=layout.distributed_optimizer)
    optimizer = get_megatron_optimizer(opt_config, wrapped)
    return layout, wrapped, optimizer


def _loss_func(loss_mask, output_tensor):
    """NeMo's SFT loss for one micro batch: the mean over the tokens that carry a label."""
    import torch

    losses = output_tensor.float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * mask) / mask.sum().clamp(min=1.0)
    return loss, {"lm loss": loss.detach().clone()}  # the schedule divides `loss` in place: log a copy


def _forward_step(data_iterator, model):
    from functools import partial

    batch = next(data_iterator)
    device = next(model.parameters()).device
    t = {k: (v.to(device) if v is not None else None) for k, v in batch.items()}
    out = model(t["tokens"], t["position_ids"], t["attention_mask"], labels=t["labels"])
    return out, partial(_loss_func, t["loss_mask"])


def _state(chunks, optimizer, step: int) -> dict:
    """This rank's checkpoint: trainable parameters, the optimizer's inner state and master copies."""
    model = [{n: p.detach().cpu().clone() for n, p in c.module.named_parameters() if p.requires_grad} for c in chunks]
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    inner = [s.optimizer.state_dict() for s in subs]
    masters = [[[p.detach().cpu().clone() for p in g] for g in _masters(s)] for s in subs]
    return {"model": model, "optimizer": inner, "masters": masters, "step": step}


def _masters(sub):
    """fp32 master copies a mixed-precision megatron optimizer keeps (none in fp32)."""
    for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
        groups = getattr(sub, name, None)
        if groups:
            return groups
    return []


def _restore(chunks, optimizer, state: dict) -> int:
    import torch

    if len(state["model"]) != len(chunks):
        raise UserError("the checkpoint was written by another pipeline layout",
                        "resume with the layout that wrote it, or move the checkpoints away")
    with torch.no_grad():
        for c, saved in zip(chunks, state["model"]):
            params = {n: p for n, p in c.module.named_parameters() if p.requires_grad}
            if set(params) != set(saved) or any(params[n].shape != saved[n].shape for n in saved):
                raise UserError("checkpoint does not match the model (another method or layout wrote it)",
                                "resume with the recipe that wrote the checkpoint, or move the checkpoints away")
            for n, v in saved.items():
                params[n].copy_(v.to(params[n].device))
        subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
        for s, inner, masters in zip(subs, state["optimizer"], state["masters"]):
            for group, saved in zip(_masters(s), masters):
                for p, v in zip(group, saved):
                    p.copy_(v.to(p.device))
            s.optimizer.load_state_dict(inner)
    return int(state["step"])


def _reduced_loss(losses, cuda: bool):
    """Mean of this step's micro-batch losses over the DP ranks, on every rank (0 off the last stage)."""
    import torch
    from megatron.core import parallel_state as ps

    device = torch.device("cuda") if cuda else torch.device("cpu")
    have = ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_tensor_model_parallel_rank() == 0
    value = torch.stack([x["lm loss"] for x in losses]).mean() if (have and losses) else torch.zeros([])
    # One collective over the world: last-stage TP-rank-0 ranks contribute, everyone learns the mean.
    buf = torch.tensor([float(value) if have else 0.0], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(buf)
    return float(buf[0]) / ps.get_data_parallel_world_size()


def _validate(chunks, forward_backward, samples, order, dp_rank, pad_id, virtual, layout, t, cuda) -> float:
    """run.mode=train: the mean loss of ``t.val_batches`` global batches of the validation split, forward
    only (every rank takes part; the same batches at every validation, so the losses compare)."""
    import torch

    from vdkit.recipes.megatron.data import step_micro_batches

    for c in chunks:
        c.eval()
    total = 0.0
    with torch.no_grad():
        for b in range(t.val_batches):
            micro = step_micro_batches(samples, order, b, dp_rank, pad_id, virtual, layout.tp)
            losses = forward_backward(
                forward_step_func=_forward_step, data_iterator=[iter(micro) for _ in chunks], model=chunks,
                num_microbatches=len(micro), seq_length=micro[0]["tokens"].shape[1],
                micro_batch_size=t.micro_batch_size, forward_only=True)
            total += _reduced_loss(losses, cuda)
    for c in chunks:
        c.train()
    return total / t.val_batches


def _flag_sum(flag: int, cuda: bool) -> float:
    """Sum of the preemption flag over the whole world (every TP, PP and DP rank stops together)."""
    import torch

    buf = torch.tensor([float(flag)], dtype=torch.float64, device="cuda" if cuda else "cpu")
    torch.distributed.all_reduce(buf)
    return float(buf[0])


def _stop_for_preemption(preempt, rank: int, progress, step: int, ckpt_dir) -> None:
    """After the checkpoint of ``step``: rank 0 says so; every rank leaves (raises Preempted, exit 75)."""
    import torch

    from vdkit.recipes.common import preemption

    if rank == 0:
        progress.message(preemption.stop_message(preempt, step, ckpt_dir))
        progress.close()
    torch.distributed.barrier()  # the line is written before any rank exits
    raise preemption.Preempted(step)


def train(run_dir, stream=None, preempt=None) -> int:
    """Train the recipe in ``run_dir`` on this rank; returns the final global step count.

    ``preempt`` (a :class:`vdkit.recipes.common.preemption.Preemption`, installed): when a stop signal
    comes (to any rank) or its time budget runs out, every rank finishes the step, the checkpoint of
    that step is written and every rank raises ``Preempted`` (the job contract, vdkit.run.jobspec).
    """
    from vdkit.recipes.common import data as rdata
    from vdkit.recipes.common.checkpoint import read_best, resume_line, write_best
    from vdkit.recipes.common.data import virtual_tokens
    from vdkit.recipes.common.distributed import resolve_dist_env
    from vdkit.recipes.common.schedule import lr_at
    from vdkit.run.rundir import LOG_DIR, checkpoint_dir, load_plan
    from vdkit.planner.timeplan import every_n_steps

    run_dir = Path(run_dir).absolute()
    plan = load_plan(run_dir)  # the plan rendered into the run directory, never re-planned
    recipe, t = plan.recipe, plan.recipe.train
    dist = resolve_dist_env()
    check_layout(plan, dist)
    from vdkit.recipes.common.heartbeat import Heartbeat
    from vdkit.recipes.common.heartbeat import ComputeClock

    beat = Heartbeat.from_env(dist.rank)  # the launcher's watchdog reads it (vdkit.run.faults)
    virtual = virtual_tokens(recipe)
    from vdkit.recipes.megatron.data import data_room

    room = data_room(recipe)

    check_megatron_version()
    _quiet()
    import torch

    from vdkit.recipes.megatron import checkpoint as ckpt
    from vdkit.recipes.common import mcore_cpu as cpu_shim
    from vdkit.recipes.megatron import activations
    from vdkit.recipes.common import mcore_memory as memory
    from vdkit.recipes.megatron.data import step_micro_batches

    cuda = torch.cuda.is_available()
    if not cuda:
        from vdkit.recipes.common.known_warnings import silence

        silence("megatron-cpu")  # CUDA-only advice
        cpu_shim.apply()
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_world_size))
    _init_distributed(dist, cuda)

    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    tok = rdata.load_tokenizer(recipe)
    samples = rdata.load_samples(recipe, run_dir, tok, room)
    order = rdata.BatchOrder(len(samples), t.seed, t.micro_batch_size, plan.dp, plan.grad_accum)
    clock = ComputeClock(cuda)  # the heartbeat's compute time: until finalize_model_grads reduces (see its module)
    layout, chunks, optimizer = build(plan, cuda, clock)
    dp_rank = ps.get_data_parallel_rank()
    forward_backward = get_forward_backward_func()

    ckpt_dir = checkpoint_dir(recipe, run_dir)
    if dist.rank == 0:
        ckpt.remove_partial(ckpt_dir)  # a save killed mid-write in an earlier job
    torch.distributed.barrier()
    step = 0
    found = _trusted_latest(ckpt_dir, dist.rank, cuda)
    if found is not None:
        step = _restore(chunks, optimizer, ckpt.load_rank(found, dist.rank))
    progress = None
    if dist.rank == 0:
        from vdkit.recipes.common.progress import ProgressLogger

        progress = ProgressLogger(run_dir / LOG_DIR, t.max_steps, step, stream=stream)
        n_train = sum(p.numel() for c in chunks for p in c.parameters() if p.requires_grad)
        progress.message(
            f"[vdkit I] megatron engine (megatron-core {version('megatron-core')}): {recipe.model.name} {recipe.method.name}, "
            f"{dist.world_size} rank(s) ({dist.source}, {'cuda' if cuda else 'cpu'}), tp={layout.tp} pp={layout.pp} "
            f"vp={layout.vp or 1} dp={plan.dp} sp={layout.sequence_parallel} "
            f"distributed_optimizer={layout.distributed_optimizer} mbs={t.micro_batch_size} "
            f"gbs={t.global_batch_size} grad_accum={plan.grad_accum}, {len(samples)} samples, tokenizer {tok.name}, "
            f"{n_train} trainable parameters on rank 0, {mbase.describe(recipe)}")
        if found is not None:
            progress.message(resume_line(found, step, t.global_batch_size))

    every = every_n_steps(plan)  # the time plan in plan.json
    val_every = recipe.val_every  # 0: run.mode=timing (no validation)
    if val_every:
        val_samples, val_order = rdata.validation_split(recipe, plan, run_dir, tok, room)
        best = read_best(ckpt_dir)
    for c in chunks:
        c.train()
    n_chunks = len(chunks)
    while step < t.max_steps:
        start = time.perf_counter()
        clock.start()
        lr = lr_at(step, recipe.method, t.max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro = step_micro_batches(samples, order, step, dp_rank, tok.pad_id, virtual, layout.tp)
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=_forward_step, data_iterator=[iter(micro) for _ in range(n_chunks)], model=chunks,
            num_microbatches=len(micro), seq_length=micro[0]["tokens"].shape[1],
            micro_batch_size=t.micro_batch_size, forward_only=False)
        ok, _grad_norm, _ = optimizer.step()
        reduced = _reduced_loss(losses, cuda)
        if cuda:
            torch.cuda.synchronize()
        timing = time.perf_counter() - start
        epoch = order.epoch(step)
        step += 1
        if not ok or not math.isfinite(reduced):
            raise RuntimeError(f"loss is {reduced} at step {step} (optimizer step {'ok' if ok else 'skipped'})")
        if progress is not None:
            progress.update(epoch, step, reduced, lr, step * t.global_batch_size, timing)
        if beat is not None:
            beat.progress(step, timing, clock.seconds())
        # Every rank asks after every step (a collective): all stop at the same step or none does.
        stopping = step < t.max_steps and preempt is not None and preempt.stop_now(lambda f: _flag_sum(f, cuda))
        improved = False
        if val_every and (step % val_every == 0 or step == t.max_steps):
            val_loss = _validate(chunks, forward_backward, val_samples, val_order, dp_rank, tok.pad_id, virtual,
                                 layout, t, cuda)
            improved = best is None or val_loss < best["validation_loss"]  # the same on every rank (all-reduced)
            if improved:
                best = {"step": step, "validation_loss": val_loss}
            if progress is not None:
                progress.message(f"[vdkit I] validation_loss {val_loss:.4f} at global_step {step} "
                                 f"({t.val_batches} batches of the validation split)" + (" - best" if improved else ""))
        if (every > 0 and step % every == 0) or step == t.max_steps or stopping or improved:
            if dist.rank == 0:
                ckpt.remove_partial(ckpt_dir)  # a stale hidden directory must not be published with this one
            _room_for_a_save(plan, dist.rank, ckpt_dir, cuda)
            if beat is not None:
                beat.saving(True)
            ckpt.write_rank(ckpt_dir, step, dist.rank, _state(chunks, optimizer, step))
            torch.distributed.barrier()
            if dist.rank == 0:
                ckpt.publish(ckpt_dir, step, dist.world_size, ckpt.layout_of(plan))
                if improved:  # the best validation loss so far: its checkpoint is kept as best (best.json)
                    write_best(ckpt_dir, step, val_loss)
                progress.flush()
            torch.distributed.barrier()  # nobody runs ahead of a checkpoint that may be needed to resume
            if beat is not None:
                beat.saving(False)
        if stopping:
            _stop_for_preemption(preempt, dist.rank, progress, step, ckpt_dir)

    # memory.json: every rank's live bytes next to the plan for its stage
    mine = {"rank": dist.rank, "stage": ps.get_pipeline_model_parallel_rank(),
            "tp_rank": ps.get_tensor_model_parallel_rank(), "dp_rank": dp_rank,
            "measured": memory.measure(chunks, optimizer),
            "planned": memory.planned(plan, ps.get_pipeline_model_parallel_rank(),
                                      "bf16" if cuda else "fp32"),  # fp8 recipes train in bf16 here
            # bytes each layer saves for backward (one micro batch), beside the plan's figure
            "activations_per_layer": activations.chunk_report(chunks, plan, cuda)}
    gathered = [None] * dist.world_size
    torch.distributed.all_gather_object(gathered, mine)
    if progress is not None:
        progress.close()
        path = memory.write(run_dir, gathered)
        off = memory.disagreements({"ranks": gathered})
        progress.message(f"[vdkit I] memory per rank (weights/gradients/optimizer bytes, measured vs plan) in {path}"
                         + (": " + "; ".join(off) if off else ": all within 2 %"))
        progress.message(f"[vdkit I] done: global_step {step}, checkpoints in {ckpt_dir}")
    torch.distributed.barrier()  # every rank has finished before any leaves (see __main__)
    return step


def _trusted_latest(ckpt_dir, rank: int, cuda: bool):
    """The newest checkpoint every rank verified (each rank its own file); damaged ones set aside by rank 0,
    whose line names the rank that found its file damaged and why."""
    import torch

    from vdkit.recipes.common import trust
    from vdkit.recipes.common.checkpoint import checkpoints
    from vdkit.recipes.megatron import checkpoint as ckpt

    return trust.trusted_latest(
        ckpt_dir, lambda: checkpoints(ckpt_dir), lambda p: trust.check(p, [ckpt.rank_file(p, rank)]),
        lambda flag: _flag_sum(int(flag), cuda) > 0, rank == 0, torch.distributed.barrier,
        lambda line: print(line, flush=True) if rank == 0 else None, lambda why: _first_damage(why, rank))


def _first_damage(why, rank: int):
    """Every rank's verdict on its own file of one checkpoint, gathered (a collective): the first damaged one
    as 'rank R: why', or None when every rank's file is good."""
    import torch

    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, why)
    return next((f"rank {r}: {w}" for r, w in enumerate(gathered) if w), None)


def _room_for_a_save(plan, rank: int, ckpt_dir, cuda: bool) -> None:
    """Every rank refuses the save together (exit 74, the path named) when rank 0 finds no room for it
    (every rank writes to the same file system; the need is the last checkpoint's size, else the plan's)."""
    from vdkit.recipes.common import trust
    from vdkit.recipes.common.checkpoint import latest

    why = None
    if rank == 0:
        last = latest(ckpt_dir)
        try:
            trust.check_room(ckpt_dir, max(trust.size_of(last) if last else 0, int(plan.checkpoint_gb * 1e9)))
        except trust.SaveRefused as exc:
            why = exc
    if _flag_sum(int(why is not None), cuda) > 0:
        raise why or trust.SaveRefused(f"rank 0 found no room for the next checkpoint in {ckpt_dir}")


def main(argv=None) -> int:
    """``python -m vdkit.recipes.megatron RUN_DIR``: train; a UserError is one line and exit 2."""
    from vdkit.recipes.common import preemption

    return preemption.rank_main("megatron", train, argv)
