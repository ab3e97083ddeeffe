"""`vdkit check` for engine=reference: the engine's own model code (transformers + peft) on the rendered recipe.

The job loads ``model.hf_path`` (pretrained weights on shared storage) or builds transformers' own
class from the model's dimensions, then wraps it with peft. Here, per run dir in one process: the
job's :func:`build_model` on the meta device from the recipe's dimensions (peft wrapper included), its
parameter count against the plan's; the staged ``config.json`` compared with those dimensions where
``model.hf_path`` is on this machine, else "not checked here", and there the job's peft wrapper applied to the
staged model's own class on the meta device (a target that names none of its modules is peft's refusal). First the
rank's start-up rules (:func:`vdkit.recipes.reference.rules.check_plan`: batch arithmetic, layout, room per sample) and
its data set-up on sample rows (:mod:`vdkit.recipes.common.probe`: tokenizer, samples, first micro batch).
DeepSpeed / FSDP and the GPU kernels are the cluster's (the same loop trains on CPU in the tests).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from vdkit.run.jobcheck import Report, check_each, one_line


def check_runs(run_dirs) -> list:
    """One Report per run directory."""
    from importlib.metadata import version

    stack = f"transformers {version('transformers')}, peft {version('peft')}"
    return check_each(run_dirs, stack, _check, "transformers / peft", "model / method")


def _check(run_dir: Path, rep: Report) -> None:
    import torch

    from vdkit.planner.arch import param_counts, trainable_params
    from vdkit.recipes.reference.model import build_model
    from vdkit.run.rundir import load_plan

    from vdkit.recipes.common import steps_edit

    plan = load_plan(run_dir)
    r = plan.recipe  # recipe.yaml's train.max_steps is what the job's loop runs
    if not steps_edit.check(plan, run_dir, "recipe.yaml train.max_steps", r.train.max_steps, rep):
        return
    if not _startup(plan, run_dir, rep):
        return
    hf = r.model.hf_path
    if hf and Path(hf, "config.json").is_file():
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(hf, local_files_only=True)
        dims = {"num_layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
                "num_attention_heads": c.num_attention_heads, "vocab_size": c.vocab_size}
        off = [f"{k} {v} (recipe {getattr(r.model, k)})" for k, v in dims.items() if v != getattr(r.model, k)]
        if off:
            rep.defect(f"{hf}/config.json is another model: {', '.join(off)}", "model.hf_path", "point it at the "
                       f"staged {r.model.name}, or pick the model that matches")
        else:
            rep.checked(f"{hf}/config.json matches model={r.model.name} ({', '.join(f'{k} {v}' for k, v in dims.items())})")
            _staged_method(c, r, hf, rep)
            if not rep.defects:  # a model peft cannot wrap is that one line; its weights then do not matter
                _staged_weights(hf, rep)
    elif hf:
        rep.not_here(f"{hf} (model.hf_path): weights and tokenizer on cluster storage")
    bare = dataclasses.replace(r, model=dataclasses.replace(r.model, hf_path=None))
    tok = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2)
    with torch.device("meta"):
        model = build_model(bare, tok)
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    want_trained = plan.trainable_params or trainable_params(r)  # plan.json's (an edited adapter differs)
    want_total = (plan.params or param_counts(r.model).total) + (want_trained if r.is_peft else 0)  # plan.json's
    line = (f"the job's build_model on the meta device ({type(model).__name__}): {total:,} parameters, {trained:,} "
            f"train; plan {want_total:,} / {want_trained:,}")
    if (total, trained) == (want_total, want_trained):
        rep.checked(line)
    else:
        rep.defect(line, "model / method", "re-render the run (the plan counts another model: recipe.yaml edited since, or an engine that builds another)")
    rep.not_here(f"data {r.data.data_dir or '-'}, {r.parallelism.sharding} sharding and GPU kernels: the cluster's")


def _startup(plan, run_dir: Path, rep: Report) -> bool:
    """What a rank runs before its model (``train.check_layout``'s plan rules) and its data set-up on sample rows;
    False after a defect that stops the job there."""
    from vdkit.errors import UserError
    from vdkit.recipes.common import probe
    from vdkit.recipes.common.data import virtual_tokens
    from vdkit.recipes.reference.rules import check_plan

    try:
        check_plan(plan)
    except UserError as exc:
        rep.defect(f"the rank refuses the plan at start-up: {exc.what}", "train / parallelism", exc.fix)
        return False
    t = plan.recipe.train
    rep.checked(f"the rank's start-up rules: DP {plan.dp} x micro batch {t.micro_batch_size} x {plan.grad_accum} "
                f"accumulation = GBS {t.global_batch_size}")
    room = t.seq_length - virtual_tokens(plan.recipe)
    return probe.sample_batch(plan.recipe, run_dir, rep, room) is not None


def _staged_method(config, recipe, hf: str, rep: Report) -> None:
    """The job's peft wrapper (:func:`~vdkit.recipes.reference.model.wrap_method`) on the staged model's own class
    (``AutoModelForCausalLM.from_config`` of its config.json) on the meta device: the class the job's
    ``from_pretrained`` builds, and whether the method's targets name its modules."""
    import torch
    from transformers import AutoModelForCausalLM

    from vdkit.recipes.common.probe import library_site
    from vdkit.planner.lora_targets import hf_modules
    from vdkit.recipes.reference.model import wrap_method

    if not recipe.is_peft:
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    name = type(model).__name__
    try:
        wrapped = wrap_method(model, recipe)
    except ValueError as exc:
        rep.defect(f"peft refuses method={recipe.method.name} on {hf} ({name}; {library_site(exc)}: {one_line(exc)})",
                   "model.hf_path", f"stage a model whose modules include {', '.join(hf_modules(recipe))} "
                   "(transformers' Llama / Qwen2 / OPT), or change method.lora_targets or the method")
        return
    trained = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    rep.checked(f"peft's {recipe.method.name} applied to the staged model's own class ({name}) on the meta device: "
                f"{trained:,} parameters train")


def _staged_weights(hf: str, rep: Report) -> None:
    """transformers' own ``from_pretrained`` on the meta device (no tensor data read): the weights the staged files
    lack, which the job's load would start at random (the job refuses them too: ``model.py`` ``_pretrained``)."""
    if not any(Path(hf).glob("*.safetensors")):
        rep.not_here(f"{hf}: the weights' names (only *.safetensors headers are read here)")
        return
    from transformers import AutoModelForCausalLM

    _model, info = AutoModelForCausalLM.from_pretrained(hf, device_map="meta", output_loading_info=True,
                                                        local_files_only=True)
    missing = sorted(set(info.get("missing_keys") or ()))
    if missing:
        rep.defect(f"{hf} lacks {len(missing)} of the model's weights (e.g. {missing[0]}; its files hold "
                   f"{len(info.get('unexpected_keys') or ())} names the model does not have): transformers' "
                   "from_pretrained would start them from random values", "model.hf_path",
                   "stage a complete Hugging Face checkpoint (save_pretrained's names, no module. / base_model.model. "
                   "prefixes)")
    else:
        rep.checked(f"{hf}: every weight of the model is in its files (transformers' from_pretrained on the meta device)")
