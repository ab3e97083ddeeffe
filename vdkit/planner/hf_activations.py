"""Bytes one Hugging Face decoder layer saves for backward, per micro batch: the reference engine's ``hf`` set.

What transformers' eager PyTorch layers (``LlamaDecoderLayer`` / ``Qwen2DecoderLayer`` / ``OPTDecoderLayer``,
transformers 5) keep between a layer's forward and its backward, tensor by tensor, as the reference engine
(recipes/reference) runs them: ``engine.attention`` sdpa or eager, ``parallelism.recompute`` none or full
(transformers' gradient checkpointing). Measured with torch's saved-tensor hooks on the engine's own model
(recipes/reference/model.py ``build_model``) on the CPU, deduplicated by storage (tests/test_hf_activations.py):
equal to the byte for every case below but the LayerNorm statistics (see there).

``s`` sequence, ``b`` micro batch, ``h`` hidden, ``kv`` key/value width (KV heads x head dim), ``f`` MLP width,
``a`` heads; ``e`` the compute dtype's bytes (2 in bf16, 4 in fp32), ``r`` the residual stream's. Three ways the
engine computes (``autocast`` and ``e`` say which):

- fp32 (every strategy on a CPU: recipes/common/training_constants.py ``CPU_PRECISION``): ``e = r = 4``;
- bf16 weights (FSDP's ``MixedPrecisionPolicy(param_dtype=bf16)``, DeepSpeed ZeRO-3's bf16 model): ``e = r = 2``;
- autocast over fp32 weights (DDP under Lightning's ``bf16-mixed``): ``e = 2``, but the residual stream stays fp32
  (``r = 4``: the embedding's output is fp32 and fp32 + bf16 is fp32), and autocast casts a linear's input anew for
  every linear that reads it - q, k and v each keep their own bf16 copy of the norm's output, and so do gate and up
  (one copy when the input is already bf16). The bf16 casts of the fp32 weights each linear saves are counted by
  the memory model with the weights' numbers (vdkit.planner.memory ``saved_cast_bytes``), not here.

Per layer:

- RMSNorm (Llama; upcasts to fp32): its fp32 input ``4sbh`` (a copy in bf16, the input itself otherwise), 1/rms
  ``4sb`` and, when its weight trains, the normalised input the weight multiplies, ``r sbh``. LayerNorm (OPT): its
  input ``r sbh``, mean and 1/std ``2 x 4sb`` (fp32 on a GPU; the CPU keeps them in bf16 under bf16 weights, 0.3 %
  of a layer);
- the linears' inputs (trainable weights): the norm's output for q/k/v and for gate/up (or fc1), ``2 e sbh``, or
  under autocast one cast per linear, ``(3 + 2) e sbh`` (``3 + 1`` for a plain MLP); LoRA on q/k/v (peft, the base
  frozen): each adapter's A keeps the norm's output the same way (``e sbh``, or 3 casts under autocast) and B keeps
  A's output, ``3 e sbr``; frozen linears keep no input;
- sdpa attention (PyTorch's flash / memory-efficient kernels: no score matrix): Q and K after RoPE, V and the
  output, ``e (2sbh + 2sbkv)`` (transformers runs grouped-query attention inside sdpa when there is no padding
  mask - the full rows the plan counts), and the log-sum-exp, ``4bas``; the output is the output projection's
  input (the same storage). RoPE keeps only the model's shared cos / sin table (no per-layer bytes);
- eager attention: Q and K repeated to every head (``2 e sbh``), the softmax's fp32 output ``4bas^2`` and, below
  fp32, its cast back ``e bas^2`` that the second matmul keeps, V repeated ``e sbh``, and, when the output projection
  trains, its input (a contiguous copy) ``e sbh``; dropout at p = 0 keeps nothing;
- SwiGLU: gate's output, the SiLU's output and up's output ``3 e sbf``, and down's input (trainable) ``e sbf``;
  ReLU its output (fc2's input) ``e sbf``; GeLU its input ``e sbf`` and, trainable, fc2's input ``e sbf``.

Gradient checkpointing (``recompute=full``, non-reentrant): a layer keeps only its input, ``r sbh``. The first layer
of a PEFT model keeps a little less (its input needs no gradient); the plan counts every layer alike.
"""
from __future__ import annotations

from vdkit.composition.schema import ATTENTIONS  # what composition lets engine.attention be

OPMATH = 4.0  # fp32: RMSNorm's upcast, the softmax's dtype, the statistics and the log-sum-exp


def hf_layer_bytes(m, s: float, b: int, recompute: str, element: float, attention: str = "sdpa",
                   autocast: bool = False, peft: str = "", lora_dim: int = 0) -> float:
    """Bytes one transformers decoder layer keeps for backward for one micro batch (see the module docstring).

    ``element``: the compute dtype's bytes (2 bf16, 4 fp32); ``autocast``: bf16 autocast over fp32 weights (the
    stream stays fp32, every linear casts its own input); ``attention``: sdpa | eager; ``recompute``: none | full;
    ``peft``: lora | ptuning (frozen base weights), ``lora_dim`` LoRA's rank."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, not {attention!r}")
    h, f, a = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads
    kv = m.num_query_groups * (h // a)
    e = element
    stream = OPMATH if autocast else e
    sbh, sbf = s * b * h, s * b * f
    if recompute == "full":
        return sbh * stream
    trains = not peft
    activation = getattr(m, "activation", "swiglu")
    if getattr(m, "norm", "rmsnorm") == "rmsnorm":
        norm = OPMATH * sbh + OPMATH * s * b + (stream * sbh if trains else 0.0)
    else:
        norm = stream * sbh + 2 * OPMATH * s * b
    mlp_inputs = 2 if activation == "swiglu" else 1  # linears reading the second norm's output
    if trains:
        inputs = ((3 + mlp_inputs) if autocast else 2) * sbh * e
    elif peft == "lora":  # the adapters' A on q, k, v read the first norm's output; B keeps A's output
        inputs = (3 if autocast else 1) * sbh * e + 3 * s * b * lora_dim * e
    else:
        inputs = 0.0
    if attention == "sdpa":
        attn = (2 * sbh + 2 * s * b * kv) * e + OPMATH * b * a * s
    else:
        scores = b * a * s * s * (OPMATH + (e if e < OPMATH else 0.0))
        attn = 3 * sbh * e + scores + (sbh * e if trains else 0.0)
    if activation == "swiglu":
        mlp = (3 + (1 if trains else 0)) * sbf * e
    elif activation == "gelu":
        mlp = (1 + (1 if trains else 0)) * sbf * e
    else:  # ReLU's backward reads its output, which is fc2's input
        mlp = sbf * e
    return 2 * norm + inputs + attn + mlp
