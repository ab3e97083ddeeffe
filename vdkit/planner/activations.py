"""Bytes one decoder layer saves for backward, per micro batch: what megatron-core keeps, tensor by tensor.

Derived from what megatron-core 0.16.1 saves (the tensors autograd holds between a layer's forward and
its backward), not fitted. ``s`` is this GPU's share of the sequence (``seq / CP``), ``b`` the micro batch,
``h`` hidden, ``kv`` the key/value width (query groups x head dim), ``f`` the MLP width, ``a`` heads, ``d``
the head dim, ``t`` TP; ``n`` = 1 / t under sequence parallelism, else 1 (the tensors before the
column-parallel linears are replicated over TP without it). Element bytes ``e``: 2 in bf16, 4 in fp32.

Three kernel sets, as each engine runs them:

``local`` (megatron-core's local layer spec: torch norms, unfused ``DotProductAttention``, unfused RoPE
and GLU; the CPU engines, and the megatron engine on GPUs too: it builds this spec everywhere, its spec's
``layer_kernels``, so its plans count this set). Counted with saved-tensor hooks on a live model
(:mod:`vdkit.recipes.megatron.activations`, tests/test_activation_memory.py):

- each RMSNorm: its input, the normalised input and 1/rms: ``(2sbh + sb) n`` elements (LayerNorm: input,
  mean and 1/std, ``(sbh + 2sb) n``); the QKV and fc1 linears their input, ``sbh n`` each (under
  sequence parallelism the local shard, gathered again in backward);
- RoPE: cos and sin for Q and K, ``4sd`` (no batch dimension);
- attention, no recompute: Q, K and V with K/V repeated to every head (``3sbh / t``), the softmax output
  ``b (a/t) s^2``, and the causal mask ``s^2`` bytes (bool); selective recompute keeps only the
  checkpoint's inputs: Q (``sbh / t``), K after RoPE (``sbkv / t``) and V, a view that keeps the whole
  QKV output alive (``sb(h + 2kv) / t``), plus a 4-byte mask-type tensor;
- in bf16 (the megatron engine on GPUs, measured on the CPU in bf16): torch's RMSNorm upcasts (its composite
  ``rms_norm``, torch 2.6 of the engine's NGC PyTorch 25.01 image as on this CPU) and keeps the fp32 input, the
  fp32 normalised input and fp32 1/rms, 4 bytes each, plus the linear's bf16 input; LayerNorm its bf16 input
  and fp32 mean and 1/std; megatron-core's softmax runs in fp32 (``attention_softmax_in_fp32``, fused_softmax.py
  ``forward_torch_softmax``): the softmax keeps its fp32 output and the second bmm the bf16 cast, 6 bytes an
  element of ``b (a/t) s^2``;
- the output projection's input ``sbh / t``; SwiGLU: fc1's output ``2sbf / t``, the activation's output
  and the linear half plus its offset (``x_linear + glu_linear_offset`` is a new tensor) ``2sbf / t``, fc2's
  input ``sbf / t``; GeLU: fc1's output and fc2's input, ``2sbf / t``; ReLU: fc2's input only (ReLU's
  backward reads its own output), ``sbf / t``.

``hf`` (transformers' own decoder layers: the reference engine, :mod:`vdkit.planner.hf_activations`, measured with
saved-tensor hooks on its model).

``fused`` (Transformer Engine layer spec with flash / cuDNN attention: NeMo and Bridge on GPUs; read from
TE's ``_LayerNormLinear`` and ``FusedAttention`` and megatron-core's fused
SwiGLU, not measured here - the CPU has neither kernel):

- each fused norm + linear: its input and the norm's output, ``2sbh n`` elements, plus 1/rms in fp32
  (``4sb n`` bytes);
- attention: Q and K after RoPE, V and the output, ``(2sbh + 2sbkv) / t``, plus the softmax
  log-sum-exp in fp32 (``4 b (a/t) s`` bytes); no s^2 term, so selective recompute frees only the
  log-sum-exp; fused RoPE keeps only its (shared) frequency table;
- SwiGLU: fc1's output ``2sbf / t`` (the fused kernel recomputes the activation) and fc2's input ``sbf / t``;
  GeLU ``2sbf / t``, ReLU ``sbf / t`` as on the local path. With ``train.swiglu_input_dtype=fp8``
  (megatron-core's ``activation_func_fp8_input_store``) the fused SwiGLU keeps fc1's output as a 1-byte
  float8_e4m3fn copy (conf/calibration/memory.yaml ``swiglu_input_bytes``; measured on the CPU).
- FP8 (``train.precision=fp8``; read from Transformer Engine's source, NVIDIA/TransformerEngine d0067d0,
  not measured - the CPU has no TE): a linear keeps the FP8 copy it quantized its input to, 1 byte an element,
  not the bf16 input (module/linear.py: ``inputmat = input_quantizer(inputmat)`` ... ``saved_inputmat =
  inputmat``, row-wise data dropped for the column-wise copy the weight gradient reads); a norm + linear
  quantizes the norm's output in the norm kernel and keeps that (module/layernorm_linear.py
  ``with_quantized_norm`` ... ``prepare_for_saving(inputmat, ..., ln_out_to_save, mu, rsigma)``: the norm's
  bf16 input stays). So each norm output costs ``sbh n`` bytes instead of 2x that; the output projection
  keeps an FP8 copy of the attention output beside the bf16 one flash attention saves (``+ sbh / t`` bytes);
  fc2 keeps its input in FP8 (``sbf / t`` bytes instead of 2x). Attention itself stays bf16 unless FP8
  dot-product attention is rendered (``train.fp8_attention``, the bridge engine): then Q, K, V and the output are
  saved as FP8 copies, ``(2sbh + 2sbkv) / t`` bytes, and the FP8 kernel's two fp32 softmax statistics replace the
  log-sum-exp (``8 b (a/t) s`` bytes; FP8_ATTENTION_BYTES, with the source lines).

Frozen base weights (LoRA, P-tuning; local kernels, measured): megatron's frozen linears
(``linear_with_frozen_weight``) keep no input and frozen norms no normalised input, so the output
projection, QKV, fc1, fc2 and the two norms keep ``(sbh/t + 2sbh n + sbf/t + 2sbh n)`` less; LoRA's
adapter on QKV (vdkit's NeMo split) gathers QKV's input over the sequence itself and keeps it, ``sbh``,
and its A output (rank r, gathered), ``sbr``.

Frozen base weights on the fused set (derived from Transformer Engine's source, not measured - TE does not
run on the CPU), by the TE each engine's image runs (conf/calibration/memory.yaml
``transformer_engine_major``): NeMo 1.23 (nemo 24.01.01: TE 1.2 / 1.3), Bridge 0.3.1
(nemo 26.02.01: TE 2.12). QKV's adapter is counted here (NeMo 1.23's ``lora_tuning`` is a ``LoraKQVAdapter``
only, nemo/collections/nlp/parts/peft_config.py; Bridge's ``target_modules`` default ``[linear_qkv]``), the
other ``method.lora_targets`` by vdkit.planner.lora_targets ``activation_bytes`` (measured on the local layers,
tests/test_activation_memory.py); ``q`` below is a saved linear input's bytes (``e``, 1 in FP8):

- frozen Linear (the output projection, fc2) keeps no input, bf16 or FP8 (TE 2.12 module/linear.py:144
  ``backward_needs_input = is_grad_enabled and weight.requires_grad``, :402-404 ``saved_inputmat = None;
  if backward_needs_input: saved_inputmat = inputmat``; TE 1.2 / 1.3 linear.py:264-265 ``if
  weight.requires_grad:``): fc2 drops ``sbf/t q`` (ReLU's backward still reads the same bf16 tensor: ReLU
  keeps ``sbf/t e``); the projection's bf16 input is flash attention's saved output and stays, its FP8 copy
  (``sbh/t``) goes;
- frozen norm + linear, TE 2.12 (layernorm_linear.py:375-377 ``if not weight.requires_grad and not
  return_layernorm_output: clear_tensor_data(ln_out, ln_out_total)``): keeps the norm's input and 1/rms but
  not its output, ``sbh n q`` less - fc1's pre-MLP norm always, QKV's unless a LoRA adapter asks for the
  norm output (below); P-tuning (no adapter in the layer) drops both. TE 1.2 / 1.3 (NeMo) save ``ln_out``
  whatever the weight (layernorm_linear.py v1.3:256-265 ``ctx.save_for_backward(inputmat, ..., ln_out,
  ...)``): both norm outputs stay;
- LoRA on QKV: the engine sets ``return_layernorm_output`` (Bridge peft/utils.py:138; NeMo
  adapters/mcore_mixins.py:63), so TE keeps its ``ln_out`` (``sbh n q``) and hands the adapter its bf16 norm
  output, which the adapter's first linear (megatron-core ``ColumnParallelLinear``, not TE: it runs bf16
  under FP8 too) keeps: without SP and in bf16 that is the same tensor (nothing more); in FP8 TE keeps its
  FP8 copy and the adapter the bf16 one (TE 2.12 layernorm_linear.py:237-238 ``ln_out_return = ln_out``
  ... :277 ``ln_out = input_quantizer(ln_out)``; TE 1.3:138-145), ``+ sbh n e``. Under SP Bridge asks
  for the gathered output (peft/utils.py:147 ``return_layernorm_output_gathered``; TE 2.12:247-251 gathers
  it in bf16 and saves only the local ``ln_out``) and the adapter keeps the whole sequence, ``+ sbh e``;
  NeMo's adapter runs with the model's SP config, so its ``ColumnParallelLinear`` gathers inside and saves
  the local shard it was handed (megatron-core tensor_parallel/layers.py ``ctx.save_for_backward(input,
  weight)``): in bf16 TE's own tensor again. A's output (rank ``r``, ``gather_output=True``) is kept by B:
  Bridge's column-parallel B the gathered ``sbr e`` (peft/utils.py:498), NeMo's row-parallel B
  (``input_is_parallel=False``, parallel_adapters.py:159-166) its TP split, ``sbr/t e``. LoRA dropout (0 in
  the kit's method defaults) would add a mask and a dropped copy; it is not counted. Measured on the CPU
(tests/test_peft_activations.py, saved-tensor hooks): Bridge's adapter itself (megatron-core linears) keeps
exactly the tensor it is handed and A's output; TE's terms are derived only.

Full recompute: a layer keeps only its input, ``sbh n`` (megatron's ``CheckpointFunction``); one
layer's full set is live again while it is recomputed (the memory model adds it once).
Bias terms (OPT) are not counted.
"""
from __future__ import annotations

from vdkit.composition.schema import LAYER_KERNELS as KERNELS  # each engine's spec names its set (``layer_kernels``)
from vdkit.composition.schema import LORA_DEFAULT_TARGETS  # method.lora_targets' default (QKV alone)

# torch's norms and megatron-core's softmax (attention_softmax_in_fp32) compute and keep fp32 on a bf16 input
OPMATH = 4.0
MASK_TYPE_BYTES = 4  # selective recompute's checkpoint saves the attention-mask type as an int32 tensor


# Bytes an element of Q, K, V and the output FP8 attention saves for backward: Transformer Engine 2.12's
# FusedAttnFunc keeps (q_fp8, k_fp8, v_fp8, out_fp8) with FP8 backward on (NVTE_FP8_DPA_BWD, default 1) and delayed
# scaling, which the bridge engine renders for attention (attention/dot_product_attention/backends.py:1313-1318,
# saved :1382-1391); its FP8 kernel's softmax statistics are M and ZInv, fp32 [b, a, s, 1] each
# (common/fused_attn/fused_attn_fp8.cu:2436-2446), where the BF16 kernel keeps one log-sum-exp.
FP8_ATTENTION_BYTES = 1.0


def attention_precision(recipe, precision: str = "") -> str:
    """The precision the dot-product attention runs in (``precision``: the recipe's train.precision unless given):
    "fp8" only with FP8 compute and FP8 attention asked for (``train.fp8_attention``, megatron-core's
    ``fp8_dot_product_attention``: an engine that renders it), else "bf16" - Transformer Engine's FP8 recipes cover
    the linears, its attention stays BF16 unless fp8_dpa is set (megatron-core 0.16.1
    extensions/transformer_engine.py:2210, fp8_utils.py:563). The step time prices it, the memory counts it."""
    t = recipe.train
    return "fp8" if (precision or t.precision) == "fp8" and t.fp8_attention else "bf16"


def _te_major(engine: str) -> int:
    """The Transformer Engine major version ``engine``'s image runs (conf/calibration/memory.yaml
    ``transformer_engine_major``; 2 where the engine is not named)."""
    from vdkit.planner.calibration import memory

    return int(memory()["transformer_engine_major"].get(engine, 2))


def _swiglu_input_bytes(dtype: str, element: float) -> float:
    """Bytes per element of the SwiGLU input the fused kernel saves: ``element`` as it is, or the 1-byte copy of
    megatron-core's FP8 store (conf/calibration/memory.yaml ``swiglu_input_bytes``)."""
    from vdkit.planner.calibration import memory

    return element if dtype == "bf16" else float(memory()["swiglu_input_bytes"][dtype])


def layer_bytes(m, s: float, b: int, tp: int, sequence_parallel: bool, recompute: str,
                kernels: str = "fused", element: float = 2.0, peft: str = "", lora_dim: int = 0,
                fp8: bool = False, engine: str = "", swiglu_input: str = "bf16", attention: str = "sdpa",
                autocast: bool = False, fp8_attention: bool = False, lora_targets: tuple = LORA_DEFAULT_TARGETS) -> float:
    """Bytes one layer keeps for backward for one micro batch (see the module docstring).

    ``recompute``: none / selective / full (full: a recomputed layer; partial recompute mixes the two,
    vdkit.planner.memory.estimate_memory). ``kernels``: fused, local or hf (module docstring). ``element``: bytes
    of an activation element (vdkit.planner.memory.activation_bytes: 2 bf16, 4 fp32). ``peft``: lora / ptuning
    (frozen base weights), ``lora_dim`` LoRA's rank. ``fp8``: Transformer Engine's FP8 linears (fused kernels
    only) keep FP8 copies of their inputs. ``engine``: whose Transformer Engine and LoRA wrapping the fused
    set's frozen weights follow (its Transformer Engine, ``_te_major``; see the module docstring).
    ``swiglu_input``: the dtype the fused SwiGLU saves fc1's output in (``train.swiglu_input_dtype``).
    ``kernels="hf"``: transformers' layers (vdkit.planner.hf_activations; data parallel only, so ``tp`` is 1), with
    ``attention`` (``engine.attention``: sdpa / eager) and ``autocast`` (bf16 autocast over fp32 weights).
    ``fp8_attention``: Transformer Engine's FP8 dot-product attention (:func:`attention_precision`; fused set).
    ``lora_targets``: ``method.lora_targets``: QKV's adapter is counted here, the others by
    vdkit.planner.lora_targets' ``activation_bytes``."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, not {kernels!r}")
    extra = 0.0
    if peft == "lora" and "linear_qkv" not in lora_targets:
        peft = "frozen"  # the base frozen, no adapter on QKV: what P-tuning's layers keep, plus the others' adapters
    if peft in ("lora", "frozen") and recompute != "full":
        from vdkit.planner import lora_targets as targets

        extra = targets.activation_bytes(m, s, b, tp, sequence_parallel, element, 1.0 if fp8 else element, kernels,
                                         lora_dim, tuple(lora_targets), _te_major(engine) == 1, autocast)
    if kernels == "hf":
        from vdkit.planner.hf_activations import hf_layer_bytes

        return hf_layer_bytes(m, s, b, recompute, element, attention, autocast, peft, lora_dim) + extra
    h, f, a = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads
    d = h // a
    kv = m.num_query_groups * d
    n = 1.0 / tp if sequence_parallel else 1.0
    e = element
    if recompute == "full":
        return s * b * h * n * e
    gated = getattr(m, "activation", "swiglu") == "swiglu"
    # ReLU's backward reads its output (fc2's input, one tensor); GeLU's its input (fc1's output) too
    mlp_plain = 1 if getattr(m, "activation", "swiglu") == "relu" else 2
    if kernels == "local":
        rms = m.norm == "rmsnorm"
        # torch's norms work in fp32 on a bf16 input (module docstring): RMSNorm keeps fp32 tensors, LayerNorm
        # fp32 statistics
        norm = (2 * s * b * h + s * b) * OPMATH if rms else (s * b * h * e + 2 * s * b * OPMATH)
        replicated = (2 * norm + 2 * s * b * h * e) * n  # two norms and the QKV / fc1 inputs
        rope = 4 * s * d * e if getattr(m, "position_embedding", "rope") == "rope" else 0.0  # learned: none
        if recompute == "selective":
            attention = (s * b * (2 * h + 3 * kv) / tp) * e + MASK_TYPE_BYTES
        else:  # softmax in fp32, and in mixed precision its cast back, which the second bmm keeps; the mask 1 byte
            softmax = b * (a / tp) * s * s * (OPMATH + (e if e < OPMATH else 0.0))
            attention = 3 * s * b * h / tp * e + softmax + s * s
        mlp = (5 if gated else mlp_plain) * s * b * f / tp * e
        total = replicated + rope + attention + s * b * h / tp * e + mlp
        if peft:  # frozen linears keep no input, frozen norms no normalised input (module docstring)
            total -= (s * b * h / tp + s * b * h * n + s * b * f / tp + s * b * h * n) * e
            total -= 2 * s * b * h * n * (OPMATH if rms else e)
            if peft == "lora":  # the adapter gathers QKV's input itself (whole sequence) and keeps A's output
                total += (s * b * h + s * b * lora_dim) * e
        return total + extra
    q = 1.0 if fp8 else e  # bytes of a saved linear input: TE keeps its FP8 copy (module docstring)
    replicated = 2 * (s * b * h * (e + q) + 4 * s * b) * n  # two fused norm + linear pairs: input, norm output, 1/rms
    # FP8 attention (no recompute: selective recompute keeps the checkpoint's bf16 inputs instead) saves Q, K, V and
    # the output as its FP8 copies, and two fp32 softmax statistics for the log-sum-exp (module docstring)
    fp8_saved = fp8_attention and recompute != "selective"
    attention = ((2 * s * b * h + 2 * s * b * kv) / tp * (FP8_ATTENTION_BYTES if fp8_saved else e)
                 + (s * b * h / tp * q if fp8 else 0.0))  # + proj's FP8 copy
    lse = 0.0 if recompute == "selective" else (2 if fp8_saved else 1) * 4 * b * (a / tp) * s
    # what the activation's backward reads; the fused SwiGLU may keep it as an FP8 copy (swiglu_input_bytes)
    fc1_out = 2 * s * b * f / tp * _swiglu_input_bytes(swiglu_input, e) if gated else (mlp_plain - 1) * s * b * f / tp * e
    mlp = fc1_out + s * b * f / tp * q  # + fc2's input
    total = replicated + attention + lse + mlp
    if peft:
        total -= _frozen_fused_savings(m, s, b, tp, sequence_parallel, e, q, fp8, peft, lora_dim, engine)
    return total + extra


def _frozen_fused_savings(m, s, b, tp, sequence_parallel, e, q, fp8, peft, lora_dim, engine) -> float:
    """What frozen base weights save on the fused set, less what a LoRA adapter on QKV adds (module docstring)."""
    h, f = m.hidden_size, m.ffn_hidden_size
    n = 1.0 / tp if sequence_parallel else 1.0
    te1 = _te_major(engine) == 1  # NeMo's TE 1.x: frozen norm outputs stay, B is row-parallel
    relu = getattr(m, "activation", "swiglu") == "relu"
    saved = s * b * f / tp * q - (s * b * f / tp * e if relu else 0.0)  # fc2's input (ReLU keeps its bf16 output)
    saved += s * b * h / tp if fp8 else 0.0  # the projection's FP8 copy (its bf16 input is flash attention's)
    norm_out = s * b * h * n * q
    if not te1:  # TE 2.x drops a frozen norm + linear's norm output: fc1's always, QKV's unless LoRA returns it
        saved += norm_out if peft == "lora" else 2 * norm_out
    if peft == "lora":  # the adapter keeps a bf16 norm output of its own where TE's saved one is not it
        if te1:
            saved -= s * b * h * n * e if fp8 else 0.0
            saved -= s * b * lora_dim / tp * e  # B is row-parallel: A's output split over TP
        else:
            saved -= s * b * h * e if (fp8 or (sequence_parallel and tp > 1)) else 0.0  # gathered under SP
            saved -= s * b * lora_dim * e  # B is column-parallel: A's output gathered
    return saved
