"""The LoRA adapter's own memory traffic per layer and micro batch: what its rank-r GEMMs cost (issue 35).

A LoRA adapter's FLOPs are tiny (rank 16 against a hidden size of thousands), so the compute term gives it nearly
nothing; but each of its ops streams whole activations through HBM: its first linear reads the layer's input, its
second writes a QKV-shaped output that is scaled and added into the frozen projection's, and backward writes an
input gradient that autograd sums into the norm output's. These are memory-bound kernels, priced here as bytes at
the GPU's HBM bandwidth, counted from the adapters both fused engines run (Megatron-Bridge 0.3.1
``peft/lora_layers.py`` ``LoRALinear.forward`` and ``peft/utils.py`` ``ParallelLinearAdapter.forward``; NeMo 1.23's
``ParallelLinearAdapter`` is the same code): per layer and micro batch, ``t`` the tokens the GPU's adapter sees (the
micro batch's over CP, gathered over TP), ``x`` the tokens of its input before the gather (``t / TP`` with sequence
parallelism), ``h`` the hidden size, ``o`` QKV's output columns on this GPU, ``a`` the adapters on QKV (1 fused, 3
separate q / k / v), bf16 (2 bytes):

- forward: ``linear_in`` reads the input, ``2 a t h``; ``linear_out`` writes ``[t, o]`` (``2 t o``), the scale by
  alpha / dim reads and writes it (``4 t o``), the add into the projection's output reads both and writes one
  (``6 t o``): ``2 a t h + 12 t o``;
- backward: the scale's gradient (``4 t o``), ``linear_out``'s input and weight gradients read the output gradient
  (``4 t o``), ``linear_in``'s write the input gradient and read the input (``4 a t h``), and autograd adds each
  adapter's input gradient into the norm output's, one at a time (two read, one written: ``6 a x h``):
  ``8 t o + 4 a t h + 6 a x h``;
- LoRA dropout (``method.lora_dropout`` > 0, Bridge's ``dropout_position: pre``, on the input before the gather):
  ``torch.nn.Dropout`` reads the input and writes it and its one-byte mask forward, reads the gradient and the mask
  and writes the gradient backward: ``10 x h`` per adapter;
- a recomputed layer runs its forward again.

Those are the column-parallel targets (``linear_qkv``, ``linear_fc1``: ``o`` their output columns on this GPU, ``h``
their input). A row-parallel target (``linear_proj``, ``linear_fc2``: Bridge's adapter with ``input_is_parallel``,
peft/utils.py 481-491 and 507-527) reads this GPU's share of the base's input, ``[t, i]`` (``i`` = in / TP), and its
B gathers the whole output, ``[t, out]`` (``gather_output=True``), which SP then splits back to ``y`` tokens
(``t / TP``; ``t`` without SP):

- forward: ``linear_in`` reads the input (``2 t i``), the gathered output is written (``2 t out``), scaled
  (``4 y out``) and added into the projection's (``6 y out``): ``2 t i + 2 t out + 10 y out``;
- backward: the scale's gradient (``4 y out``), SP's gather of that gradient (``2 t out``), ``linear_out``'s input
  and weight gradients read their share (``4 t out / TP``), ``linear_in``'s write the input gradient and read the
  input (``4 t i``), and autograd adds it into the base's input gradient (``6 t i``).

The rank-r tensors (``[t, r]``) and the adapter's weights are left out (under 1 % at rank 16). The gather of a
column target's input and its reduce-scatter, and a row target's reductions, are TP collectives
(vdkit.planner.tp_overlap, :func:`row_collective_bytes`). Nothing is fitted.
"""
from __future__ import annotations

from vdkit.planner import lora_targets
from vdkit.planner.arch import BF16_BYTES as BF16  # the adapter's activations and gradients
from vdkit.planner.layout import effective_sp

MASK = 1  # torch.nn.Dropout's bool mask, one byte per element


def layer_bytes(recipe, tokens: float, tp: int, recompute_share: float = 0.0) -> float:
    """HBM bytes one layer's LoRA adapters move in one micro batch (the module docstring); 0 unless LoRA.
    ``tokens``: the micro batch's tokens on this GPU's sequence share (over CP); ``recompute_share``: the share of
    the layer's forward run again (vdkit.planner.memory.recompute_share)."""
    m = recipe.model
    sp = effective_sp(tp, recipe.parallelism.sequence_parallel)  # unset (auto): on at TP > 1, as the plan resolves it
    t, x = tokens, tokens / tp if sp else tokens
    dropout = float(recipe.method.lora_dropout) > 0
    forward = backward = 0.0
    for name in lora_targets.of(recipe):
        i, out = lora_targets.shape(m, name)
        a = len(lora_targets.adapter_shapes(m, name, recipe.engine.lora_qkv))  # adapters reading one input
        if lora_targets.TARGETS[name].split == "column":
            o = out / tp  # the output columns on this GPU
            drop = (BF16 + BF16 + MASK) * a * x * i if dropout else 0.0  # each way
            forward += BF16 * (a * t * i + 6 * t * o) + drop
            backward += BF16 * (4 * t * o + 2 * a * t * i + 3 * a * x * i) + drop
        else:
            i /= tp  # this GPU's share of the input rows
            whole = x * out if sp and recipe.method.lora_a2a else t * out  # the all-to-all's [x, out], else the gather's
            drop = (BF16 + BF16 + MASK) * t * i if dropout else 0.0
            forward += BF16 * (t * i + whole + 5 * x * out) + drop
            backward += BF16 * (2 * x * out + whole + 2 * t * out / tp + 5 * t * i) + drop
    return (1.0 + recompute_share) * forward + backward


def row_collective_s(recipe, tokens: float, tp: int, link_gb_s: float, latency_s: float,
                     recompute_share: float = 0.0) -> float:
    """Seconds one layer's row-parallel adapters spend in TP collectives per micro batch (0 at TP 1), rings over
    ``link_gb_s`` (NVLink) with ``latency_s`` each, not overlapped: A's rank-r output is all-reduced over TP
    (RowParallelLinear) and so is B's input gradient in the backward (its ColumnParallelLinear copies its input to
    the TP region), ``[t, r]`` each; B all-gathers its output (``gather_output=True``) and under SP the backward
    gathers that gradient again (``scatter_to_sequence_parallel_region``'s backward), ``[t, out]`` each (Bridge
    0.3.1 peft/utils.py 481-527 and ``ParallelLinearAdapter.forward``). With ``method.lora_a2a`` under SP
    (``a2a_experimental``, utils.py 508-515 and 636-640) B keeps its output split and an all-to-all turns
    ``[t, out / TP]`` into ``[t / TP, out]`` each way: 1 / TP of the gather's bytes.
    A recomputed forward runs its two again."""
    if tp <= 1:
        return 0.0
    m, r = recipe.model, recipe.method.lora_adapter_dim
    sp = effective_sp(tp, recipe.parallelism.sequence_parallel)
    a2a = sp and recipe.method.lora_a2a
    ring = (tp - 1) / tp / (link_gb_s * 1e9)
    total = 0.0
    for name in lora_targets.of(recipe):
        if lora_targets.TARGETS[name].split == "row":
            reduce = 2 * ring * BF16 * tokens * r + latency_s  # an all-reduce moves twice an all-gather's share
            gather = ring * BF16 * tokens * lora_targets.shape(m, name)[1] / (tp if a2a else 1) + latency_s
            total += (1 + recompute_share) * (reduce + gather) + reduce + (gather if sp else 0.0)
    return total


def layer_s(recipe, tokens: float, tp: int, recompute_share: float, hbm_bytes_s: float, peak_flops_s: float) -> float:
    """Seconds one layer's adapters take per micro batch on one GPU, on the roofline: their HBM bytes
    (:func:`layer_bytes`) at HBM's rate or their GEMM FLOPs (forward, input and weight gradients, a recomputed
    forward again; this GPU's 1 / TP, vdkit.planner.lora_targets.flops_per_token) at the peak, whichever is longer.
    A rank-r GEMM does about r FLOPs per byte it streams, far below an H100's ridge (~300 in BF16), so the bytes
    set the time at the ranks in use; the FLOPs are not model FLOPs (published TFLOP/s leave them out).
    ``peak_flops_s`` is the BF16 peak in an FP8 job too: Bridge's adapters are megatron-core's plain
    Column/RowParallelLinear (peft/utils.py 26, 482-520), torch GEMMs that TE's FP8 autocast leaves in bf16."""
    m = recipe.model
    flops = tokens / tp * lora_targets.flops_per_token(m, recipe.method.lora_adapter_dim, lora_targets.of(recipe),
                                                       recipe.engine.lora_qkv) * (1.0 + recompute_share / 3.0)
    return max(layer_bytes(recipe, tokens, tp, recompute_share) / hbm_bytes_s, flops / peak_flops_s)
