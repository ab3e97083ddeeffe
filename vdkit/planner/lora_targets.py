"""LoRA's target modules (``method.lora_targets``): the one home for their names, shapes and TP splits (issue 35).

The names are megatron-core's / Megatron-Bridge's linear layers (``peft.target_modules`` in Bridge 0.3.1
``peft/lora.py``); each maps to how the base layer is split over tensor-parallel ranks (megatron-core's
``ColumnParallelLinear`` / ``RowParallelLinear``), to the modules transformers' models name for peft's
``LoraConfig.target_modules`` (the reference engine), and to NeMo's PEFT name (NeMo 24.x ``peft_config.py``
``PEFT_MODULE_MAP``; NeMo 1.23's ``LoraPEFTConfig`` has no ``target_modules`` at all: it adapts the fused QKV only,
``peft_config.py`` 62-122, ``LORA_KQV_ADAPTER`` alone).

The default is QKV alone, the kit's plan before this setting; MLPerf's Llama 2 70B LoRA (NeMo 1's
``target_modules: [attention]``, NeMo 2 / Bridge ``[linear_qkv, linear_proj]``) adapts QKV and the attention's
output projection.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from vdkit.composition.schema import LORA_TARGETS
from vdkit.errors import UserError


@dataclass(frozen=True)
class Target:
    """One LoRA target: its base layer's TP split, its transformers modules (llama / qwen2; opt), NeMo's name."""

    split: str  # column: the base's output columns split over TP (A replicated, B split); row: its input rows
    hf: Tuple[str, ...]  # transformers' Llama / Qwen2 modules peft adapts for it
    hf_opt: Tuple[str, ...]  # transformers' OPT modules
    nemo: str  # NeMo 24.x's PEFT_MODULE_MAP name (NeMo 1.23 accepts attention_qkv only, implicitly)


# keyed by the schema's names (its one home, below the planner), in its order: linear_qkv, linear_proj, fc1, fc2
TARGETS: Dict[str, Target] = dict(zip(LORA_TARGETS, (
    Target("column", ("q_proj", "k_proj", "v_proj"), ("q_proj", "k_proj", "v_proj"), "attention_qkv"),
    Target("row", ("o_proj",), ("out_proj",), "attention_dense"),
    Target("column", ("gate_proj", "up_proj"), ("fc1",), "mlp_fc1"),
    Target("row", ("down_proj",), ("fc2",), "mlp_fc2"),
), strict=True))
LORA_QKV = ("fused", "separate")  # engine.lora_qkv: one adapter on each fused linear | peft's per module


def of(recipe) -> Tuple[str, ...]:
    """The recipe's LoRA targets in :data:`TARGETS` order (() unless method=lora)."""
    if recipe.method.name != "lora":
        return ()
    chosen = set(recipe.method.lora_targets)
    return tuple(n for n in TARGETS if n in chosen)


def check(recipe) -> None:
    """The door: ``engine.lora_qkv`` is a placement, ``method.lora_targets`` names known targets, at least one,
    none twice (UserError otherwise)."""
    if recipe.engine.lora_qkv not in LORA_QKV:
        raise UserError(f"engine.lora_qkv={recipe.engine.lora_qkv!r} is not a LoRA placement",
                        "use " + " or ".join(f"engine.lora_qkv={v}" for v in LORA_QKV))
    names = list(recipe.method.lora_targets)
    unknown = [n for n in names if n not in TARGETS]
    fix = "use a list of " + ", ".join(TARGETS) + ", e.g. method.lora_targets=[linear_qkv,linear_proj]"
    if unknown:
        raise UserError(f"method.lora_targets names {', '.join(map(str, unknown))}, not a LoRA target", fix)
    if not names or len(set(names)) != len(names):
        raise UserError(f"method.lora_targets={names} must name at least one target, each once", fix)


def a2a_note(recipe, tp: int, sp: bool) -> List[str]:
    """A plan note when ``method.lora_a2a=true`` changes nothing on the chosen layout: Bridge's all-to-all only
    replaces the scatter after a row-parallel adapter (linear_proj, linear_fc2) under sequence parallelism (Bridge 0.3.1
    peft/utils.py 544-548: without SP ``disable_sequence_parallel_comm``; 633-642: the a2a path is taken for
    ``input_is_parallel`` adapters alone). Noted, not refused: the stack accepts it, and MLPerf's scripts set it on
    every layout (benchmarks/independent_runs.yaml)."""
    m = recipe.method
    if m.name != "lora" or not m.lora_a2a:
        return []
    why = ("TP 1 has no sequence parallelism" if tp == 1 else "sequence parallelism is off" if not sp else
           None if any(TARGETS[n].split == "row" for n in of(recipe)) else
           f"method.lora_targets=[{','.join(of(recipe))}] has no row-parallel adapter (linear_proj, linear_fc2)")
    if why is None:
        return []
    return [f"method.lora_a2a=true changes nothing here: {why}, and Bridge's all-to-all only replaces the scatter "
            "after a row-parallel adapter under sequence parallelism (the step is priced without it); "
            "set method.lora_a2a=false, or add linear_proj / linear_fc2 at TP >= 2 with sequence parallelism"]


def hf_modules(recipe) -> Tuple[str, ...]:
    """transformers' module names peft adapts for the recipe's targets."""
    opt = recipe.model.arch == "opt"
    return tuple(mod for n in of(recipe) for mod in (TARGETS[n].hf_opt if opt else TARGETS[n].hf))


def shape(m, name: str) -> Tuple[int, int]:
    """``(in, out)`` features of the base linear ``name`` in one layer of model ``m``, before any TP split."""
    h = m.hidden_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    f = m.ffn_hidden_size
    gated = getattr(m, "activation", "swiglu") == "swiglu"
    return {"linear_qkv": (h, h + 2 * kv), "linear_proj": (h, h),
            "linear_fc1": (h, 2 * f if gated else f), "linear_fc2": (f, h)}[name]


def adapter_shapes(m, name: str, qkv: str = "fused") -> Tuple[Tuple[int, int], ...]:
    """``(in, out)`` of each adapter LoRA puts on ``name``: one on the fused layer (megatron-core, Bridge, NeMo), or
    one per transformers module (``engine.lora_qkv=separate``, peft: q / k / v, and gate / up for a gated MLP)."""
    i, o = shape(m, name)
    if qkv != "separate" or TARGETS[name].split == "row":  # peft splits only the fused column-parallel ones
        return ((i, o),)
    if name == "linear_qkv":
        kv = (o - i) // 2
        return ((i, i), (i, kv), (i, kv))
    gated = getattr(m, "activation", "swiglu") == "swiglu"
    return ((i, o // 2), (i, o // 2)) if gated else ((i, o),)


def params_per_layer(m, adapter_dim: int, targets: Tuple[str, ...], qkv: str = "fused") -> int:
    """LoRA parameters in one layer: each adapter's A (in x r) and B (r x out)."""
    return sum(adapter_dim * (i + o) for n in targets for i, o in adapter_shapes(m, n, qkv))


def flops_per_token(m, adapter_dim: int, targets: Tuple[str, ...], qkv: str = "fused") -> float:
    """One layer's adapter GEMM FLOPs per token for a training step: forward (2 r (in + out)), the input gradient
    (the same) and the adapters' weight gradients (the same): 3x the forward."""
    return 3.0 * 2 * params_per_layer(m, adapter_dim, targets, qkv)


def activation_bytes(m, s: float, b: int, tp: int, sequence_parallel: bool, e: float, q: float, kernels: str,
                     lora_dim: int, targets: Tuple[str, ...], te1: bool = False, autocast: bool = False) -> float:
    """Bytes one layer's adapters on the targets other than QKV keep for backward, per micro batch (QKV's adapter:
    vdkit.planner.activations). ``q``: a saved linear input's bytes on the fused set (1 in FP8); ``te1``: NeMo's
    Transformer Engine 1.x (which adapts QKV only, so never reached with another target). Each adapter keeps A's
    output (rank r, whole: B reads it) and A's input where no other op keeps that tensor:

    - ``linear_proj`` (row-parallel A, input ``[s, b, h / t]``): the fused set's and transformers' projection input
      is the attention's saved output (nothing more; under autocast peft's A keeps its own bf16 cast, ``+ sbh e``);
      the local layers' frozen projection keeps none (``+ sbh/t e``);
    - ``linear_fc2`` (row-parallel A): its input is the activation's output, which a frozen fc2 keeps nowhere
      (``+ sbf/t e``) - but ReLU's backward keeps it (transformers' OPT in fp32: nothing more);
    - ``linear_fc1`` (column-parallel A, as QKV's): the norm output, gathered over the sequence under SP (the
      local layers' adapter gathers it itself), and on TE 2.x the frozen norm + linear no longer drops its own
      ``ln_out`` (``+ sbh n q``; vdkit.planner.activations ``_frozen_fused_savings``); transformers' gate and up
      adapters read one norm output (under autocast each its own cast) and keep an A output each.

    transformers' terms are measured in fp32 and under autocast (tests/test_hf_activations.py), the local layers'
    in fp32 at TP 1 and 2 (tests/test_activation_memory.py, tests/test_megatron_engine.py); TE's are derived.
    """
    h, f = m.hidden_size, m.ffn_hidden_size
    n = 1.0 / tp if sequence_parallel else 1.0
    gated = getattr(m, "activation", "swiglu") == "swiglu"
    relu = getattr(m, "activation", "swiglu") == "relu"
    hf = kernels == "hf"
    total = 0.0
    for name in targets:
        if name == "linear_qkv":
            continue
        copies = 2 if hf and name == "linear_fc1" and gated else 1  # peft's gate and up adapters
        r = copies * s * b * lora_dim * e
        if name == "linear_proj":
            total += r + (s * b * h / tp * e if kernels == "local" or (hf and autocast) else 0.0)
        elif name == "linear_fc2":
            total += r + (0.0 if hf and relu and not autocast else s * b * f / tp * e)
        elif kernels == "fused":
            total += r + (0.0 if te1 else s * b * h * n * q) + (s * b * h * e if (q < e or n < 1.0) else 0.0)
        else:
            total += r + (copies if hf and autocast else 1) * s * b * h * e
    return total
