"""`vdkit check` for engine=bridge: the model bridge.yaml builds has the planned model's function, not only its size.

The provider's parameter count (:func:`vdkit.recipes.bridge.runcheck._model`) catches an edit that changes a weight's
shape. An edit that changes what the same weights compute does not change the count: ``model.rotary_base: 500000``,
``layernorm_epsilon``, ``rotary_percent`` or ``seq_len_interpolation_factor`` on a Llama 2 fine-tune loaded, passed
``validate()``, and the job fine-tuned the base (trained with RoPE base 10,000) under another position encoding. Bridge
passes each field straight to megatron-core's GPTModel (``models/gpt_provider.py:284-290``) and its checkpoint load
compares tensors only (``dist_checkpointing`` by shape), so nothing in the stack notices. Here each such field of the
edited model is compared with the provider the kit renders from the run's own recipe.yaml.
"""
from __future__ import annotations

from pathlib import Path

from vdkit.run.jobcheck import Report, one_line

# TransformerConfig / GPTModelProvider fields that change what a layer computes without changing a weight's shape
# (a shape change is the parameter count's: runcheck._model), read from megatron-core 0.16.1 transformer_config.py
# and Bridge 0.3.1 gpt_provider.py.
FUNCTION_FIELDS = ("rotary_base", "rotary_percent", "rope_scaling", "rope_scaling_factor",
                   "seq_len_interpolation_factor", "position_embedding_type", "layernorm_epsilon", "normalization",
                   "layernorm_zero_centered_gamma", "activation_func", "gated_linear_unit",
                   "apply_residual_connection_post_layernorm")


def _rendered_model(plan, run_dir: Path, render):
    """The provider the kit renders for this run (``render``: the engine's ``render_bridge_yaml``), instantiated."""
    import yaml

    from vdkit.recipes.bridge.edits import _class

    section = dict(yaml.safe_load(render(plan, Path(run_dir).absolute()))["model"])
    cls = _class(section.pop("_target_"))
    return cls(**section)


def check(model, plan, run_dir: Path, render, rep: Report) -> None:
    """Each :data:`FUNCTION_FIELDS` value of ``model`` (bridge.yaml's provider as loaded, before Bridge's setup)
    against the rendered provider's: a difference is a defect (one line per field)."""
    try:
        ref = _rendered_model(plan, run_dir, render)
    except Exception as exc:  # noqa: BLE001 - the comparison cannot run; say so, never pass silently
        rep.not_here(f"the model's RoPE / norm settings against the render: the rendered provider did not build "
                     f"here ({one_line(exc)})")
        return
    m = plan.recipe.model
    base = plan.recipe.method.name != "pretrain"
    differ = [f for f in FUNCTION_FIELDS if getattr(model, f, None) != getattr(ref, f, None)]
    for field in differ:
        got, want = getattr(model, field, None), getattr(ref, field, None)
        rep.defect(f"bridge.yaml model.{field}={_shown(got)} is not the planned model's {_shown(want)} "
                   f"({type(ref).__name__} as rendered for model={m.name}): the parameter count is the same, so "
                   "neither Bridge's validate() nor its checkpoint load notices, and the job would "
                   + (f"fine-tune the base (its weights were trained with {_shown(want)}) under another "
                      "function" if base else "train another model than the plan and its export describe")
                   + " (megatron-core GPTModel, Bridge models/gpt_provider.py:284-290)", f"bridge.yaml model.{field}",
                   "undo the edit; another RoPE base / scaling or norm is the recipe's model (vdkit plan --explain "
                   "model.rope_base), then re-render")
    if not differ:
        rep.checked(f"the model's RoPE, norm and activation settings are the planned model's ({type(ref).__name__}: "
                    f"rotary_base {_shown(ref.rotary_base)}, layernorm_epsilon {_shown(ref.layernorm_epsilon)})")


def _shown(value) -> str:
    return getattr(value, "__name__", None) or repr(value)
