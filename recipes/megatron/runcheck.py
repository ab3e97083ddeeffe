"""`vdkit check` for engine=megatron: the engine's own model code under megatron-core, on the rendered plan.

The job (``python -m vdkit.recipes.megatron RUN_DIR``) builds megatron-core's TransformerConfig and
GPTModel from the run dir's recipe and plan. Here, for every run dir in one process: the
TransformerConfig for the planned layout (megatron-core's own ``__post_init__`` validates heads, groups,
TP / PP / VP / SP against the model), then the model chunks the job builds (LoRA / P-tuning included)
on the meta device at TP = PP = 1, their parameter count against the plan's. Before those, the job's start-up
(:func:`_startup`): megatron-core's ``initialize_model_parallel`` at the plan's world size (a fake process group
stands in for the ranks) and its micro-batch calculator, then the job's data set-up on sample rows
(:mod:`vdkit.recipes.common.probe`). The training itself runs on this CPU in the tests (`vdkit run`), so this
check stops before the optimizer.
"""
from __future__ import annotations

from pathlib import Path

from vdkit.run.jobcheck import Report, check_each, one_line


def check_runs(run_dirs) -> list:
    """One Report per run directory."""
    from importlib.metadata import version

    stack = f"megatron-core {version('megatron-core')}"
    return check_each(run_dirs, stack, _check, "megatron-core", "recipe.yaml / plan.json")


def _check(run_dir: Path, rep: Report) -> None:
    import torch

    from vdkit.errors import UserError
    from vdkit.planner.arch import param_counts, trainable_params
    from vdkit.recipes.megatron.model import Layout, build_chunks, transformer_config
    from vdkit.run.rundir import load_plan

    from vdkit.recipes.common.mcore_cpu import single_rank_model_parallel

    from vdkit.recipes.common import steps_edit

    plan = load_plan(run_dir)
    layout = Layout.from_plan(plan)  # recipe.yaml's train.max_steps is what the job's loop runs
    if not steps_edit.check(plan, run_dir, "recipe.yaml train.max_steps", plan.recipe.train.max_steps, rep):
        return
    if not _startup(plan, layout, run_dir, rep):
        return
    single_rank_model_parallel()  # this run dir's own process (jobcheck.isolated): its own gloo group
    try:
        transformer_config(plan.recipe, layout, cuda=False)
    except (UserError, ValueError, AssertionError) as exc:
        rep.defect(f"megatron-core's TransformerConfig refuses the planned layout: {one_line(exc)}",
                   f"TP {layout.tp} PP {layout.pp} VP {layout.vp}", "change the layout (vdkit plan shows the choices)")
        return
    rep.checked(f"TransformerConfig validated for TP {layout.tp} PP {layout.pp} VP {layout.vp or 1} SP "
                f"{layout.sequence_parallel}, recompute {layout.recompute}")
    whole = Layout(tp=1, pp=1, vp=None, sequence_parallel=False, distributed_optimizer=False, recompute=layout.recompute)
    with torch.device("meta"):
        chunks = build_chunks(plan.recipe, whole, cuda=False)
    total = sum(p.numel() for c in chunks for p in c.parameters())
    trained = sum(p.numel() for c in chunks for p in c.parameters() if p.requires_grad)
    base = plan.params or param_counts(plan.recipe.model).total  # plan.json's count: a recipe.yaml edited since differs
    want_trained = plan.trainable_params or trainable_params(plan.recipe)  # plan.json's too (an edited adapter differs)
    want_total = base + (want_trained if plan.recipe.method.name in ("lora", "ptuning") else 0)
    line = (f"the job's model (build_chunks) on the meta device at TP=PP=1: {total:,} parameters of which {trained:,} "
            f"train; plan {want_total:,} / {want_trained:,}")
    if trained == want_trained and total == want_total:
        rep.checked(line)
    else:
        rep.defect(line, "model / method", "re-render the run (the plan counts another model: recipe.yaml edited since, or an engine that builds another)")
    _check_base(plan.recipe, rep)
    _check_resume(plan, run_dir, rep)


def _check_resume(plan, run_dir: Path, rep: Report) -> None:
    """The checkpoint the job resumes from (its latest), when there is one, as `vdkit run --resume` takes it
    (:func:`vdkit.recipes.megatron.checkpoint.check_resume`: its rank count and recorded layout against this run's),
    else every rank stops at resume with 'checkpoint does not match the model' (a recipe.yaml edited since)."""
    from vdkit.errors import UserError
    from vdkit.recipes.megatron.checkpoint import check_resume

    try:
        line = check_resume(plan, run_dir)
    except UserError as exc:
        rep.defect(exc.what, "cluster.nodes / gpus_per_node / parallelism / method", exc.fix)
        return
    if line:
        rep.checked(line)


def _check_base(recipe, rep: Report) -> None:
    """A fine-tune's base as the rank checks it (:func:`vdkit.recipes.megatron.base.check_rank`), when it is here."""
    from vdkit.errors import UserError
    from vdkit.recipes.megatron.base import KEY, check_rank, source

    hf = source(recipe)
    if hf is None:
        return
    if not Path(hf).exists():
        rep.not_here(f"{hf} ({KEY}): the fine-tune's base on cluster storage (the job's pre-flight checks it)")
        return
    try:
        check_rank(recipe, rank=False)
    except UserError as exc:
        rep.defect(exc.what, KEY, exc.fix)
        return
    rep.checked(f"{KEY}={hf}: a Hugging Face model of {recipe.model.name}'s sizes (config.json, weights)")


def _startup(plan, layout, run_dir: Path, rep: Report) -> bool:
    """The job's start-up before its model: parallel state at the plan's world size, the micro-batch calculator,
    the data rules and a micro batch from sample rows. False after a defect that stops the job there."""
    from vdkit.errors import UserError
    from vdkit.recipes.common import probe
    from vdkit.recipes.common.mcore_cpu import parallel_state_at
    from vdkit.recipes.megatron.data import data_room

    world = plan.recipe.world_size
    try:
        dp = parallel_state_at(world, layout.tp, layout.pp, layout.vp)
    except (RuntimeError, AssertionError, ValueError) as exc:
        rep.defect(f"megatron-core's initialize_model_parallel refuses TP {layout.tp} PP {layout.pp} VP {layout.vp} "
                   f"on {world} GPUs ({probe.library_site(exc)}: {one_line(exc)})", "parallelism.tp / pp / vp",
                   "re-render the run (vdkit plan shows the layouts that fit)")
        return False
    line = f"megatron-core's parallel state at {world} GPUs (TP {layout.tp} PP {layout.pp} VP {layout.vp or 1}): DP {dp}"
    if dp != plan.dp:
        rep.defect(f"{line}, the plan's DP is {plan.dp}", "cluster.nodes / parallelism", "re-render the run")
        return False
    rep.checked(line)
    probe.microbatches(plan, rep)
    try:
        room = data_room(plan.recipe)
    except UserError as exc:
        rep.defect(exc.what, "train.seq_length / data.packed", exc.fix)
        return False
    return probe.sample_batch(plan.recipe, run_dir, rep, room) is not None
