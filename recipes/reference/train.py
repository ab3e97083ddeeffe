"""The training loop of the reference engine (one process per rank).

Fabric (DDP, FSDP2) or DeepSpeed's engine behind the same calls (ZeRO-3; see ``sharding``) gives the
process group (gloo on CPU, NCCL / RCCL on GPU), gradient sync, mixed precision and collective ops; the loop is ours so that step accounting is exact: one iteration is one optimizer
step over GBS samples (grad_accum micro batches of MBS on each of DP ranks), the batch order is a
function of the step, and a restart resumes from the latest checkpoint at the step it holds.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

from vdkit.errors import UserError

from vdkit.recipes.common.training_constants import GRAD_CLIP, adam_betas


def check_layout(plan, dist) -> None:
    """The plan's checks (the engine interface's check), and the ranks this process was started with."""
    from vdkit.recipes.reference.rules import check_plan

    r = plan.recipe
    check_plan(plan)
    if dist.world_size != r.world_size:
        raise UserError(f"{dist.world_size} processes were started ({dist.source}), the recipe needs "
                        f"{r.world_size} (cluster.nodes x cluster.gpus_per_node)",
                        "start one task per GPU: srun --ntasks-per-node=cluster.gpus_per_node, or use `vdkit run`")


def make_fabric(plan, dist):
    """The rank's runtime for ``parallelism.sharding``: Fabric DDP / FSDP2, or DeepSpeed ZeRO-3 (see sharding)."""
    from vdkit.recipes.reference.sharding import make_fabric as make

    return make(plan, dist, GRAD_CLIP, adam_betas(plan.recipe))


def _stop_for_preemption(preempt, fabric, progress, step: int, ckpt_dir) -> None:
    """After the checkpoint of ``step``: rank 0 says so; every rank leaves (raises Preempted, exit 75)."""
    from vdkit.recipes.common import preemption

    if fabric.global_rank == 0:
        progress.message(preemption.stop_message(preempt, step, ckpt_dir))
        progress.close()
    fabric.barrier()  # the line is written before any rank exits
    raise preemption.Preempted(step)


def _room_for_a_save(plan, fabric, ckpt_dir) -> None:
    """Every rank refuses the save together (exit 74, the path named) when rank 0 finds no room for it."""
    import torch

    from vdkit.recipes.common import trust
    from vdkit.recipes.common.checkpoint import latest

    why = None
    if fabric.global_rank == 0:
        last = latest(ckpt_dir)
        try:
            trust.check_room(ckpt_dir, max(trust.size_of(last) if last else 0, int(plan.checkpoint_gb * 1e9)))
        except trust.SaveRefused as exc:
            why = exc
    if float(fabric.all_reduce(torch.tensor(float(why is not None)), reduce_op="sum")) > 0:
        raise why or trust.SaveRefused(f"rank 0 found no room for the next checkpoint in {ckpt_dir}")


def _validate(wrapped, fabric, samples, order, rank: int, pad_id: int, batches: int) -> float:
    """run.mode=train: the mean loss of ``batches`` global batches of the validation split (no gradients;
    the same batches each time, so validations compare), averaged over the data-parallel ranks."""
    import torch

    from vdkit.recipes.common import data as rdata

    wrapped.eval()
    total = 0.0
    with torch.no_grad():
        for b in range(batches):
            losses = [wrapped(**{k: v.to(fabric.device) for k, v in rdata.collate(
                [samples[j] for j in idx], pad_id).items()}).loss.detach().float()
                for idx in order.micro_batches(b, rank)]
            total += float(fabric.all_reduce(torch.stack(losses).mean(), reduce_op="mean"))
    wrapped.train()
    return total / batches


def _export(recipe, model, sharding_kind: str, fabric, run_dir, progress) -> None:
    """run.mode=train: the final weights as Hugging Face's save_pretrained writes them (LoRA / P-tuning:
    peft's adapter directory, served beside the base model) in the run dir's export/; sharded runs
    (fsdp, zero3) keep their checkpoint, which this engine does not gather into one file."""
    from vdkit.run.rundir import EXPORT_DIR

    out = Path(run_dir) / EXPORT_DIR
    if sharding_kind != "none":
        if progress is not None:
            progress.message(f"[vdkit I] export: not written for parallelism.sharding={sharding_kind} (the sharded "
                             "checkpoint is the result)")
        return
    if fabric.global_rank == 0:
        import torch

        if not torch.cuda.is_available():  # save_pretrained's unwrap (accelerate) imports DeepSpeed where it is
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # installed: named, it logs no failed GPU detection
        model.save_pretrained(str(out))
        progress.message(f"[vdkit I] exported the final weights (save_pretrained) to {out}")
    fabric.barrier()


def _say(stream, line: str) -> None:
    import sys

    print(line, file=stream or sys.stdout, flush=True)


def _say_ds_start(sharding_kind: str, rank: int, stream):
    """ZeRO-3 on rank 0: one line before DeepSpeed starts (its first start on a machine builds its ops, minutes
    of silence otherwise); the start time, for the 'ready' line. None for other shardings and ranks."""
    if sharding_kind != "zero3" or rank != 0:
        return None
    _say(stream, "[vdkit I] ZeRO-3: building DeepSpeed ops and starting its engine (the first start on a machine "
                 "compiles its ops: minutes) ...")
    return time.monotonic()


def check_base(recipe) -> None:
    """A fine-tune from a local ``model.hf_path`` starts only from a Hugging Face model there (config.json and
    weights): a missing one would reach transformers as a hub id (offline: a traceback, retried by the launcher).
    UserError: one line, exit 2, the recipe's fault; no step trained. (No ``hf_path`` at all: seeded random weights,
    which the door allows only for a model without published ones or a timing run: ``check_hf_path``.)"""
    from vdkit.recipes.common import preflight

    hf = recipe.model.hf_path
    why = preflight.base_problem("model.hf_path", hf, "hf") if hf and hf.startswith("/") else None
    if why:
        what, fix = why.rsplit(" (fix: ", 1)
        raise UserError(what, fix[:-1])


def train(run_dir, stream=None, preempt=None) -> int:
    """Train the recipe in ``run_dir`` (recipe.yaml) on this rank; returns the final global step count.

    ``preempt`` (a :class:`vdkit.recipes.common.preemption.Preemption`, installed): when a stop signal comes
    or its time budget runs out, the loop finishes the step, checkpoints and raises ``Preempted``.
    """
    from vdkit.recipes.reference import checkpoint as ckpt
    from vdkit.recipes.common import data as rdata
    from vdkit.recipes.common.distributed import resolve_dist_env
    from vdkit.run.rundir import checkpoint_dir
    from vdkit.recipes.reference import sharding
    from vdkit.recipes.common.data import virtual_tokens
    from vdkit.recipes.common.checkpoint import read_best, resume_line, write_best
    from vdkit.recipes.common.schedule import lr_at
    from vdkit.planner.timeplan import every_n_steps
    from vdkit.recipes.reference.model import build_model
    from vdkit.recipes.common.progress import ProgressLogger
    from vdkit.run.rundir import LOG_DIR, load_plan

    from vdkit.recipes.common.heartbeat import Heartbeat
    from vdkit.recipes.common.heartbeat import ComputeClock

    run_dir = Path(run_dir).absolute()
    plan = load_plan(run_dir)  # the plan rendered into the run directory, never re-planned
    recipe, t = plan.recipe, plan.recipe.train
    dist = resolve_dist_env()
    check_layout(plan, dist)
    check_base(recipe)
    beat = Heartbeat.from_env(dist.rank)  # the launcher's watchdog reads it (vdkit.run.faults)
    room = t.seq_length - virtual_tokens(recipe)  # >= MIN_ROOM (vdkit.recipes.reference): check_layout said so

    import torch  # after the checks above: a misconfigured rank fails in a second, not after torch loads

    tok = rdata.load_tokenizer(recipe)
    samples = rdata.load_samples(recipe, run_dir, tok, room)
    order = rdata.BatchOrder(len(samples), t.seed, t.micro_batch_size, plan.dp, plan.grad_accum)

    sharding_kind = recipe.parallelism.sharding
    ds_started = _say_ds_start(sharding_kind, dist.rank, stream)
    fabric = make_fabric(plan, dist)
    model = build_model(recipe, tok, fabric)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # Module first, then the optimizer over its (possibly sharded) parameters: FSDP replaces them.
    wrapped = fabric.setup_module(model)
    optimizer = None
    if sharding_kind != "zero3":  # ZeRO-3: DeepSpeed builds its optimizer from its config
        optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=recipe.method.lr,
                                      betas=adam_betas(recipe), weight_decay=recipe.method.weight_decay)
    optimizer = fabric.setup_optimizers(optimizer)
    wrapped = getattr(fabric, "module", None) or wrapped  # the DeepSpeed engine is the callable model
    clock = ComputeClock(fabric.device.type == "cuda")  # the heartbeat's compute time (DDP only: see the module)
    timed = dist.world_size > 1 and sharding_kind not in ("fsdp", "zero3") and clock.ddp_hook(wrapped)
    if ds_started is not None:
        _say(stream, f"[vdkit I] ZeRO-3: DeepSpeed ready in {time.monotonic() - ds_started:.0f} s")

    ckpt_dir = checkpoint_dir(recipe, run_dir)
    if fabric.global_rank == 0:
        ckpt.remove_partial(ckpt_dir)  # a save killed mid-write in an earlier job
    fabric.barrier()
    found, step = sharding.load_state(sharding_kind, fabric, model, optimizer, ckpt_dir)
    progress = None
    if fabric.global_rank == 0:
        progress = ProgressLogger(run_dir / LOG_DIR, t.max_steps, step, stream=stream)
        progress.message(f"[vdkit I] reference engine: {recipe.model.name} {recipe.method.name}, "
                         f"{dist.world_size} rank(s) ({dist.source}, {fabric.device.type}), dp={plan.dp} "
                         f"mbs={t.micro_batch_size} gbs={t.global_batch_size} grad_accum={plan.grad_accum}, "
                         f"{len(samples)} samples, tokenizer {tok.name}, {n_train} trainable parameters, "
                         f"sharding {sharding_kind}")
        if found is not None:
            progress.message(resume_line(found, step, t.global_batch_size))

    every = every_n_steps(plan)  # the time plan in plan.json
    val_every, best = recipe.val_every, None  # 0: run.mode=timing (no validation)
    if val_every:
        val_samples, val_order = rdata.validation_split(recipe, plan, run_dir, tok, room)
        best = read_best(ckpt_dir)
    wrapped.train()
    while step < t.max_steps:
        start = time.perf_counter()
        clock.start()
        lr = lr_at(step, recipe.method, t.max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro = order.micro_batches(step, dist.rank)
        losses = []
        for i, idx in enumerate(micro):
            batch = {k: v.to(fabric.device) for k, v in rdata.collate([samples[j] for j in idx], tok.pad_id).items()}
            with fabric.no_backward_sync(wrapped, enabled=i < len(micro) - 1):
                loss = wrapped(**batch).loss
                fabric.backward(loss / len(micro))  # mean over the global batch's micro batches
            losses.append(loss.detach().float())
        fabric.clip_gradients(wrapped, optimizer, max_norm=GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reduced = fabric.all_reduce(torch.stack(losses).mean(), reduce_op="mean")
        if fabric.device.type == "cuda":
            torch.cuda.synchronize()
        timing = time.perf_counter() - start
        epoch = order.epoch(step)
        step += 1
        if not math.isfinite(float(reduced)):
            raise RuntimeError(f"loss is {float(reduced)} at step {step}")
        if progress is not None:
            progress.update(epoch, step, float(reduced), lr, step * t.global_batch_size, timing)
        if beat is not None:
            beat.progress(step, timing, clock.seconds() if timed else None)
        # Every rank asks after every step (a collective): all stop at the same step or none does.
        stopping = step < t.max_steps and preempt is not None and preempt.stop_now(
            lambda flag: float(fabric.all_reduce(torch.tensor(float(flag)), reduce_op="sum")))
        improved = False
        if val_every and (step % val_every == 0 or step == t.max_steps):
            val_loss = _validate(wrapped, fabric, val_samples, val_order, dist.rank, tok.pad_id, t.val_batches)
            improved = best is None or val_loss < best["validation_loss"]  # the same on every rank
            if improved:
                best = {"step": step, "validation_loss": val_loss}
            if progress is not None:
                progress.message(f"[vdkit I] validation_loss {val_loss:.4f} at global_step {step} "
                                 f"({t.val_batches} batches of the validation split)" + (" - best" if improved else ""))
        if (every > 0 and step % every == 0) or step == t.max_steps or stopping or improved:
            if improved and fabric.global_rank == 0:  # before the save prunes: the best is kept (best.json)
                write_best(ckpt_dir, step, val_loss)
            _room_for_a_save(plan, fabric, ckpt_dir)
            if beat is not None:
                beat.saving(True)
            sharding.save_state(sharding_kind, fabric, model, optimizer, ckpt_dir, step,
                                {"consumed_samples": step * t.global_batch_size, "run_name": recipe.run_name})
            if beat is not None:
                beat.saving(False)
            if progress is not None:
                progress.flush()
            fabric.barrier()  # nobody runs ahead of a checkpoint that may be needed to resume
        if stopping:
            _stop_for_preemption(preempt, fabric, progress, step, ckpt_dir)
    if val_every and step >= t.max_steps:
        _export(recipe, model, sharding_kind, fabric, run_dir, progress)
    if progress is not None:
        progress.close()
        progress.message(f"[vdkit I] done: global_step {step}, checkpoints in {ckpt_dir}")
    fabric.barrier()  # every rank has finished the last step before any leaves (see __main__)
    return step


def main(argv=None) -> int:
    """``python -m vdkit.recipes.reference RUN_DIR``: train; a UserError is one line and exit 2."""
    from vdkit.recipes.common import preemption
    from vdkit.recipes.reference import require_runtime

    return preemption.rank_main("reference", train, argv, require=require_runtime)
