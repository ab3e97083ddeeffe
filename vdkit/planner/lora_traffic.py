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

The rank-r tensors (``[t, r]``) and the adapter's weights are left out (under 1 % at rank 16). The gather of the
input and its reduce-scatter are TP collectives (vdkit.planner.tp_overlap). Nothing is fitted.
"""
from __future__ import annotations

from vdkit.planner.layout import effective_sp

BF16 = 2  # bytes per element of the adapter's activations and gradients
MASK = 1  # torch.nn.Dropout's bool mask, one byte per element


def layer_bytes(recipe, tokens: float, tp: int, recompute_share: float = 0.0) -> float:
    """HBM bytes one layer's LoRA adapters move in one micro batch (the module docstring); 0 unless LoRA.
    ``tokens``: the micro batch's tokens on this GPU's sequence share (over CP); ``recompute_share``: the share of
    the layer's forward run again (vdkit.planner.memory.recompute_share)."""
    if recipe.method.name != "lora":
        return 0.0
    m = recipe.model
    h = m.hidden_size
    o = (h + 2 * m.num_query_groups * (h // m.num_attention_heads)) / tp  # QKV's output columns on this GPU
    a = 3 if recipe.engine.lora_qkv == "separate" else 1
    sp = effective_sp(tp, recipe.parallelism.sequence_parallel)  # unset (auto): on at TP > 1, as the plan resolves it
    t, x = tokens, tokens / tp if sp else tokens
    drop = (BF16 + BF16 + MASK) * a * x * h if float(recipe.method.lora_dropout) > 0 else 0.0  # each way
    forward = BF16 * (a * t * h + 6 * t * o) + drop
    backward = BF16 * (4 * t * o + 2 * a * t * h + 3 * a * x * h) + drop
    return (1.0 + recompute_share) * forward + backward
