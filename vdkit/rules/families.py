"""Model families at the door: the architecture fields agree with ``model.arch`` (:data:`FAMILIES`),
and RoPE scaling is one transformers can build (:data:`ROPE_TYPES`)."""
from __future__ import annotations

import math

from vdkit.errors import UserError

# What each model family's block is built from: key -> allowed values. ``gqa: False`` means every
# attention head has its own K / V (num_query_groups == num_attention_heads).
FAMILIES = {
    "llama": {"norm": ("rmsnorm",), "activation": ("swiglu",), "position_embedding": ("rope",), "bias": (False,),
              "pre_norm": (True,), "embedding_dim": (None,)},
    "opt": {"norm": ("layernorm",), "activation": ("relu", "gelu"), "position_embedding": ("learned",),
            "rope_scaling": (None,), "gqa": (False,)},
}
# transformers' RoPE types (ROPE_INIT_FUNCTIONS) and the keys each needs besides rope_type / factor.
ROPE_TYPES = {"linear": (), "dynamic": (), "yarn": (), "longrope": ("short_factor", "long_factor"),
              "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def check_architecture(m) -> None:
    """The model's architecture fields agree with its family (``model.arch``) and its RoPE scaling."""
    family = FAMILIES.get(m.arch)
    if family is None:
        return  # an unknown arch is validate_fields' line
    for key, allowed in family.items():
        value = (m.num_query_groups != m.num_attention_heads) if key == "gqa" else getattr(m, key)
        if value not in allowed:
            what = (f"model.num_query_groups={m.num_query_groups} (grouped-query attention with "
                    f"{m.num_attention_heads} heads)" if key == "gqa" else f"model.{key}={value!r}")
            want = (f"model.num_query_groups={m.num_attention_heads}" if key == "gqa" else
                    " or ".join(f"model.{key}={'null' if a is None else str(a).lower()}" for a in allowed))
            raise UserError(f"{what} does not exist in the {m.arch} architecture of model {m.name}",
                            f"use {want}, or another model (model.arch={m.arch})")
    rs = m.rope_scaling
    if isinstance(rs, dict) and rs:  # not a mapping: validate_fields' line
        rtype = rs.get("rope_type", rs.get("type"))
        if not isinstance(rtype, str) or rtype not in ROPE_TYPES:  # a list or mapping is unhashable: not a name
            raise UserError(f"model.rope_scaling.rope_type={rtype!r} is not a RoPE scaling transformers builds",
                            "use one of " + ", ".join(ROPE_TYPES) + ", or model.rope_scaling=null")
        for key in ("factor",) + ROPE_TYPES[rtype]:
            if key not in rs:
                raise UserError(f"model.rope_scaling (rope_type {rtype}) has no {key}",
                                f"add it, e.g. model.rope_scaling.{key}=..., as in conf/model/llama3_1_8b.yaml")
            value = rs[key]
            listed = key in ("short_factor", "long_factor")  # longrope's per-dimension lists
            if listed:
                ok = isinstance(value, (list, tuple))
            else:  # a word or NaN here fails later in float() or in the rotary tables, as a traceback
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
            if not ok:
                raise UserError(f"model.rope_scaling.{key}={value!r} is not a {'list' if listed else 'number'}",
                                "give it as conf/model/llama3_1_8b.yaml does, or set model.rope_scaling=null")
        for key, v in rs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v) or v <= 0 or (key == "factor" and v < 1):
                raise UserError(f"model.rope_scaling.{key}={v} must be a finite number "
                                + (">= 1 (it stretches the context)" if key == "factor" else "> 0"),
                                f"use e.g. model.rope_scaling.{key}=" + ("8.0" if key == "factor" else "1.0"))
