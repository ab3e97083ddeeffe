"""Long contexts: sequence length past a model's trained maximum, RoPE scaling and context parallelism,
and what each engine's stack can express of them (the facts, with where they come from).

- Sequence length: rotary positions (RoPE) are computed for any position, so a RoPE model trains past
  ``model.max_position_embeddings`` (its pre-training context); attention has not seen those distances
  (quality) and activations grow with the sequence (memory, step time: the plan counts both). The plan
  says so in a note; it refuses only what a stack cannot build: a learned position table has exactly
  ``max_position_embeddings`` rows (OPT), and RoPE scaling types an engine's model code lacks.
- RoPE scaling (``model.rope_scaling``): Llama 3.1 / 3.3 ship Llama 3's frequency scaling
  (``rope_type: llama3``); position interpolation (``rope_type: linear``, arXiv 2306.15595) is how
  Llama 2 is stretched. megatron-core 0.16 builds llama3 scaling with fixed low / high frequency factors
  1 / 4 and an 8192-token original context (``RotaryEmbedding._apply_scaling``, only ``factor`` is a
  parameter) and linear as ``seq_len_interpolation_factor``; NeMo 1.23 (Feb 2024, before Llama 3) has only
  ``seq_len_interpolation_factor`` (megatron_gpt_config.yaml); transformers has every type.
- Context parallelism (``parallelism.cp``): megatron-core splits each sequence into 2 x CP chunks
  (load-balanced causal attention), so the sequence must divide by 2 x CP; packed rows are padded to a
  multiple of 2 x CP per sample (Bridge's ``PackedSequenceSpecs.pad_seq_to_mult``). Only Transformer
  Engine's attention implements it: megatron-core's local ``DotProductAttention`` asserts
  ``context_parallel_size == 1`` (megatron/core/transformer/dot_product_attention.py:57-59), so the
  megatron engine (local layer spec) and every CPU run cannot; Bridge (TE in NVIDIA's image) and NeMo 1.23
  (``context_parallel_size``, megatron_base_model.py:196) can; the transformers engine has no CP.
"""
from __future__ import annotations

from typing import List, Optional

from vdkit.errors import UserError

#: megatron-core's fixed llama3 scaling constants (RotaryEmbedding._apply_scaling's defaults)
MCORE_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_type(model) -> Optional[str]:
    """The model's RoPE scaling type (``rope_type``, or transformers' older ``type``), or None."""
    rs = model.rope_scaling
    if not rs:
        return None
    return rs.get("rope_type", rs.get("type"))


def check(recipe) -> None:
    """Refuse in one line what the engine's stack cannot build: a RoPE scaling type, context parallelism,
    a sequence its positions cannot reach or context parallelism cannot split."""
    from vdkit.recipes import engines

    m, p, t, engine = recipe.model, recipe.parallelism, recipe.train, recipe.engine.name
    # the engine's module is looked up only when a RoPE scaling type or CP asks what its stack builds
    eng = engines.get(engine) if (rope_type(m) or p.cp > 1) else None
    if m.position_embedding != "rope" and t.seq_length > m.max_position_embeddings:
        raise UserError(f"train.seq_length={t.seq_length} exceeds {m.name}'s {m.max_position_embeddings} learned "
                        "positions: the table has no row for later positions",
                        f"use train.seq_length<={m.max_position_embeddings}")
    rtype = rope_type(m)
    if rtype and rtype not in eng.rope_scaling:
        have = " or ".join(eng.rope_scaling) or "none"
        raise UserError(f"model {m.name} uses rope_scaling type {rtype}, which engine={engine}'s model code "
                        f"cannot build (it has {have})",
                        "use engine=" + " or engine=".join(n for n in engines.names() if rtype in engines.get(n).rope_scaling))
    if rtype == "llama3" and eng.mcore_rope:
        odd = {k: m.rope_scaling.get(k) for k, v in MCORE_LLAMA3.items() if float(m.rope_scaling.get(k, v)) != v}
        if odd:
            raise UserError(f"model {m.name}'s llama3 rope_scaling {odd} differs from megatron-core's fixed "
                            f"{MCORE_LLAMA3} (only the factor is a parameter there)",
                            "use engine=reference for this model, or megatron-core's values")
    cp = p.cp
    if cp < 1:
        raise UserError(f"parallelism.cp={cp} must be >= 1", "use parallelism.cp=1 (no context parallelism) or 2, 4, ...")
    if cp > 1 and not eng.context_parallel:
        raise UserError(f"parallelism.cp={cp} with engine={engine}: {eng.no_context_parallel}",
                        "use engine=" + " or engine=".join(n for n in engines.names() if engines.get(n).context_parallel)
                        + " for context parallelism, or parallelism.cp=1")
    from vdkit.launch import launchers

    if cp > 1 and launchers.get(recipe.cluster.launcher).executes_here:
        raise UserError(f"parallelism.cp={cp} on cluster {recipe.cluster.name}: context parallelism runs only in "
                        "Transformer Engine's attention (GPU), never in a local CPU run",
                        "render it for a GPU cluster (vdkit render ... cluster=xe9680), or parallelism.cp=1 here")
    if cp > 1 and t.seq_length % (2 * cp):
        raise UserError(f"train.seq_length={t.seq_length} does not divide by 2 x CP = {2 * cp} (parallelism.cp={cp}): "
                        "context parallelism cuts each sequence into 2 x CP chunks",
                        f"use a train.seq_length that is a multiple of {2 * cp}")
    if cp > 1 and recipe.method.name == "ptuning":
        raise UserError("parallelism.cp>1 with method=ptuning: the virtual tokens prefix the first chunk only",
                        "use parallelism.cp=1 for P-tuning")


def seq_notes(recipe) -> List[str]:
    """What changes when a RoPE model trains past its pre-training context (empty when it does not)."""
    m, t = recipe.model, recipe.train
    if m.position_embedding != "rope" or t.seq_length <= m.max_position_embeddings:
        return []
    ratio = t.seq_length / m.max_position_embeddings
    rtype = rope_type(m)
    rope = (f"RoPE positions past {m.max_position_embeddings} were never trained" +
            (f" (rope_scaling {rtype} is set)" if rtype else
             f"; consider position interpolation: model.rope_scaling={{rope_type:linear,factor:{ratio:g}}}"))
    return [f"train.seq_length={t.seq_length} is {ratio:.3g}x {m.name}'s trained {m.max_position_embeddings}: "
            f"{rope}; activations and attention grow with the sequence (the memory and step time above count them)"]


def data_notes(recipe) -> List[str]:
    """Packed fine-tuning: whose samples the step time assumes (attention spans, samples per row)."""
    from vdkit.planner.predict import avg_tokens, calibration, regime
    from vdkit.planner.tokens import counted_mean

    if not recipe.data.packed or regime(recipe) == "hf" or recipe.method.name == "pretrain":
        return []
    avg = avg_tokens(recipe, calibration())
    where = (counted_mean(recipe) or (None, f"the calibration's figure for data={recipe.data.name}"))[1]
    return [f"packed rows of {recipe.data.name} samples: {avg:.0f} tokens each on average ({where}); attention "
            "spans one sample" if avg else f"packed rows: no token counts for data={recipe.data.name}, samples "
            "assumed full-length"]


def interpolation_factor(model) -> Optional[float]:
    """Linear position interpolation's factor (megatron-core / NeMo ``seq_len_interpolation_factor``), or None."""
    return float(model.rope_scaling["factor"]) if rope_type(model) == "linear" else None


def llama3_factor(model) -> Optional[float]:
    """Llama 3's RoPE scaling factor (megatron-core ``rope_scaling_factor``), or None."""
    return float(model.rope_scaling["factor"]) if rope_type(model) == "llama3" else None
