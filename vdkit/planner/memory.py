"""The per-GPU memory model of Megatron / NeMo layouts (TP x PP x CP x VP): bytes per stage and per GPU.

Arithmetic only (no search, no prediction): the planner (:mod:`vdkit.planner.plan`) weighs layouts with
it, and the engines compare what their ranks really hold against it (the megatron engine's memory.json,
:mod:`vdkit.recipes.common.mcore_memory`) and pad the vocabulary as it does.

The memory model (bytes per GPU, worst pipeline stage), Megatron / NeMo mixed precision with
``megatron_amp_O2``:

- weights: 2 bytes per parameter held by the GPU (bf16); 4 where the engine's rendered model keeps fp32 parameters
  (its spec's ``fp32_params``: NeMo 1.23's LoRA / P-tuning in the design guide's recipe, no ``megatron_amp_O2``;
  then fp32 gradients and Adam's m and v with no master copy, ``fp32_params_bytes``, and in bf16 each layer in
  flight holds the bf16 cast of its linear weights that Transformer Engine saves for backward, counted with the
  activations, ``fp32_params_cast_bytes``); with ``train.precision=fp8`` the transformer layers'
  linear weights hold what the engine's stack keeps (``fp8_linear_weight_bytes``, by engine): NeMo 1.23 a bf16
  parameter plus Transformer Engine's cached FP8 copy and its transpose (4), Bridge FP8 parameters with their
  transpose (2); embeddings, output layer and norms stay bf16. Layers the engine keeps in bf16 under FP8 (its spec's
  ``fp8_bf16_layers``: Bridge's preset, the first and the last) save bf16 linear inputs (``fp8_bf16_layers``).
- gradients: 4 bytes per *trainable* parameter (fp32 main gradients).
- optimizer states: 12 bytes per trainable parameter (fp32 master copy + Adam m and v), divided by
  DP when the distributed optimizer shards them; NeMo's distributed Adam (Apex) 10: a 16-bit remainder of the
  master beside the bf16 weight (``fp32_distributed_optimizer_bytes``). ``train.optimizer_dtype=bf16``: (gradient, optimizer state)
  bytes by engine (``bf16_optimizer_bytes``): NeMo's Apex distributed Adam with ``dtype`` and ``grad_sync_dtype``
  bf16 (NVIDIA's SFT settings) 2 and 4, Bridge's precision-aware distributed optimizer 4 and 8.
- per stage (``stage_static_bytes``): stage 0 holds the input embedding (and P-tuning's prompt
  encoder), the last stage the final norm and output layer; the vocabulary is padded to a multiple
  of 128 x TP; norm weights are replicated over TP. The megatron engine measures each rank's
  weights / gradients / optimizer bytes against this (memory.json); in fp32 (CPU) the bytes are
  4 / 4 / 8 per parameter.
- activations, per layer and micro batch, bf16 (fp32 on a CPU cluster, ``run_precision``: every engine trains in
  fp32 there): what the layers the engine builds save for backward, tensor by tensor
  (:mod:`vdkit.planner.activations`, the engine spec's ``layer_kernels``): megatron-core's Transformer Engine layers
  with flash attention (NeMo, Bridge), megatron-core's local spec (the megatron engine, on GPUs too: unfused
  attention keeps its s^2 softmax), or transformers' own layers (the reference engine, sdpa or eager attention, under
  DDP's bf16 autocast over fp32 weights: :mod:`vdkit.planner.hf_activations`), checked against saved-tensor hooks.
  Full recomputation keeps only each layer's input (sbh, / TP with SP) plus one layer's working
  set. Each pipeline stage holds its 1F1B warm-up's micro batches plus one, per model chunk (``layers_in_flight``,
  megatron-core's schedule: the first stage min(PP, micro batches), times (1 + (PP-1)/(PP*VP)) when
  interleaved; the last one, or PP - (PP-1)/VP interleaved). The last stage adds the logits, 6*s*b*V / TP
  (``logit_bytes``; 4 in fp32, one buffer): the bf16 logits (2) live at the loss and the fp32 softmax the loss
  saves for backward (4) - megatron-core
  0.16.1's ``vocab_parallel_cross_entropy`` (tensor_parallel/cross_entropy.py: ``.float()`` copy, in-place
  exp, ``save_for_backward(exp_logits, ...)``), which NeMo 1.23 runs, and its ``native`` fused variant
  (fusions/fused_cross_entropy.py:119, the same fp32 ``exp_logits``), which Bridge runs as the kit renders it
  (``cross_entropy_loss_fusion`` on, ``cross_entropy_fusion_impl`` left at megatron-core's ``native``);
  backward turns the fp32 buffer into the gradient in place and casts it to bf16: 4 + 2 again. Transformer
  Engine's ``parallel_cross_entropy`` (``cross_entropy_fusion_impl="te"``, NVIDIA's Llama 3 recipes) saves
  only its bf16 input and writes the gradient into it (2*s*b*V / TP); no engine here renders it.
- per-layer CUDA graphs (``train.cuda_graphs=layer``): each graphed layer's static input and causal mask per micro
  batch in flight, with the graph pool's fragmentation left out as workload dependent (:mod:`vdkit.planner.cuda_graphs`).
- capacity: the cluster's ``gpu_memory_gb`` in the same GB (1e9 bytes) as these totals - the GPU's reported
  total (hf_step_time.yaml ``memory_total_bytes``; an H100 "80GB" is 81,559 MiB = 85.5 GB).
- overhead: CUDA context, NCCL and cuBLAS workspaces, allocator fragmentation (``overhead_gb`` in
  conf/calibration/memory.yaml, or the cluster's ``memory_overhead_gb``: 0 for CPU processes).

Every byte count here is a number in conf/calibration/memory.yaml; "borderline" (within its
``borderline_fraction`` of the GPU's memory) is one rule, vdkit.planner.calibration.is_borderline, for every plan.

Checkpoint size (checkpoint_bytes): the trainable weights as held plus the optimizer state as the engine's optimizer
exports it - 14 bytes per trainable parameter for a bf16 model with an fp32 master, m and v; NeMo's fp32 PEFT weights
16 with Apex's distributed Adam, 12 with fused Adam; Bridge's bf16 optimizer state 10, NeMo's 8 (a PEFT checkpoint
holds only the adapter's).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Tuple

from vdkit.planner.activations import attention_precision, layer_bytes
from vdkit.planner.arch import lora_params_per_layer, param_counts, ptuning_params
from vdkit.planner.lora_targets import of as lora_of
from vdkit.planner.calibration import overhead_gb
from vdkit.planner.cuda_graphs import graph_bytes
from vdkit.planner.layout import data_parallel
from vdkit.composition.plan_types import Memory
from vdkit.composition.schema import GB, Recipe

# The memory model's numbers (bytes per parameter, the per-GPU overhead, the borderline band) live in
# conf/calibration/memory.yaml, read through vdkit.planner.calibration.


def recompute_share(recipe, recompute: str, layers_per_stage: int, vp: int = 1) -> float:
    """The share of a stage's layers whose forward full recompute repeats (parallelism.recompute_num_layers:
    partial, the first N of each of the stage's ``vp`` model chunks, vdkit.planner.recompute); 0 for none / selective."""
    from types import SimpleNamespace

    from vdkit.planner.recompute import full_share

    p = SimpleNamespace(recompute=recompute, recompute_num_layers=recipe.parallelism.recompute_num_layers)
    return full_share(p, layers_per_stage, vp)


def static_bytes(precision: str) -> Tuple[float, float, float]:
    """Bytes per parameter a GPU holds for (weights, gradients, optimizer states) in ``precision``:
    weights per parameter held, gradients and optimizer states per *trainable* parameter held
    (conf/calibration/memory.yaml ``megatron_bytes``)."""
    from vdkit.planner.calibration import memory

    return tuple(float(x) for x in memory()["megatron_bytes"][precision])


def optimizer_bf16_bytes(engine: str) -> Optional[Tuple[float, float]]:
    """Bytes per trainable parameter for (gradients, optimizer states) with ``train.optimizer_dtype=bf16`` as
    ``engine`` renders it (conf/calibration/memory.yaml ``bf16_optimizer_bytes``); None: it renders none."""
    from vdkit.planner.calibration import memory

    pair = memory()["bf16_optimizer_bytes"].get(engine)
    return None if pair is None else (float(pair[0]), float(pair[1]))


def fp32_distributed_optimizer_bytes(engine: str) -> Optional[float]:
    """Optimizer-state bytes per trainable parameter of ``engine``'s distributed optimizer with fp32 state on a
    bf16 / fp8 model (conf/calibration/memory.yaml ``fp32_distributed_optimizer_bytes``: NeMo's Apex distributed
    Adam keeps a 16-bit remainder of the master, 10); None: ``megatron_bytes``' figure."""
    from vdkit.planner.calibration import memory

    b = memory()["fp32_distributed_optimizer_bytes"].get(engine)
    return None if b is None else float(b)


def grad_optimizer_bytes(r: Recipe, distributed_optimizer: bool,
                         precision: Optional[str] = None) -> Tuple[float, float]:
    """(gradients, optimizer states) bytes per trainable parameter as ``r``'s engine renders them; default
    precision ``train.precision``. The gradient bytes are the buffer's dtype, which the data-parallel reduction
    moves too (vdkit.planner.predict counts them from here: one home): fp32 main gradients (4), NeMo's Apex
    ``grad_sync_dtype`` bf16 with ``train.optimizer_dtype=bf16`` (2)."""
    precision = precision or r.train.precision
    _, g, o = static_bytes(precision)
    if precision == "fp32":
        return g, o
    held = fp32_params_bytes(r)
    if held is not None:  # fp32 parameters (NeMo without megatron_amp_O2): their own gradient and state bytes
        return held[1], held[2]
    if r.train.optimizer_dtype == "bf16":  # the distributed optimizer's bf16 state
        return optimizer_bf16_bytes(r.engine.name) or (g, o)  # (the engine's spec refuses a dtype it cannot render)
    if distributed_optimizer:  # fp32 state: NeMo's Apex keeps 16-bit remainders, not an fp32 master
        o = fp32_distributed_optimizer_bytes(r.engine.name) or o
    return g, o


def optimizer_pass_bytes(r: Recipe, distributed_optimizer: bool, precision: Optional[str] = None) -> float:
    """Bytes the optimizer step moves per trainable parameter it updates, from the bytes this model says ``r``'s
    engine keeps (one home; vdkit.planner.predict times the pass at HBM bandwidth): Adam reads and writes every
    optimizer-state byte (master or remainder, m, v) and the gradient (read, then zeroed), and writes the updated
    weight - read too where the parameter is its own master (fp32 parameters, fp32 training). Megatron's fp32
    master: 2 x (12 + 4) + 2 = 34; NeMo's Apex remainders 30; bf16 state 2 x (4 + 2) + 2 (NeMo) or 2 x (8 + 4) + 2
    (Bridge). (Apex's remainder step also reads the bf16 weight, the master's upper half: 2 more, not counted.)"""
    precision = precision or r.train.precision
    g, o = grad_optimizer_bytes(r, distributed_optimizer, precision)
    held = fp32_params_bytes(r) if precision != "fp32" else None
    if precision == "fp32" or held is not None:  # no separate master: the parameter is read and written
        return 2 * (g + o) + 2 * (held or static_bytes(precision))[0]
    return 2 * (g + o) + static_bytes(precision)[0]


def checkpoint_bytes(r: Recipe, distributed_optimizer: bool, precision: Optional[str] = None) -> float:
    """Bytes per trainable parameter a checkpoint of ``r``'s engine writes: the trainable weights as the engine holds
    them and the optimizer state as its optimizer exports it - what it holds (megatron-core's and Bridge's
    distributed optimizer: fp32 master + m + v, 14 with the bf16 weight; the megatron engine's own files: the same),
    except where the export differs (conf/calibration/memory.yaml ``checkpoint_optimizer_bytes``: NeMo's Apex
    distributed Adam writes param, m and v in its dtype, its 16-bit remainders rebuilt into the fp32 master).
    PEFT checkpoints hold only the adapter (NeMo 1.23 ``NLPAdapterModelMixin.state_dict``, Bridge
    ``apply_peft_adapter_filter_to_state_dict``): the caller multiplies by the trainable parameters."""
    from vdkit.planner.calibration import memory

    precision = precision or r.train.precision
    held = fp32_params_bytes(r) if precision != "fp32" else None
    weight = (held or static_bytes(precision))[0]
    _, o = grad_optimizer_bytes(r, distributed_optimizer, precision)
    exported = memory()["checkpoint_optimizer_bytes"].get(r.engine.name, {}) if distributed_optimizer else {}
    if precision != "fp32" and r.train.optimizer_dtype in exported:
        o = float(exported[r.train.optimizer_dtype])
    return weight + o


def checkpoint_gb(r: Recipe, distributed_optimizer: bool) -> float:
    """The checkpoint's size (GB) as ``r``'s engine writes it (checkpoint_bytes x the trainable parameters)."""
    from vdkit.planner.arch import trainable_params

    return trainable_params(r) * checkpoint_bytes(r, distributed_optimizer) / GB


_FACTS: "OrderedDict[int, tuple]" = OrderedDict()


def _engine_facts(r: Recipe) -> tuple:
    """(fp32_params, layer_kernels, fp8_bf16_layers) of ``r``'s engine spec, asked once per recipe: a layout search
    asks the memory model thousands of times, and the registry builds its Engine on every lookup. Keyed by the
    recipe's identity (a frozen dataclass; the entry holds it, so the id is not reused)."""
    from vdkit.recipes import engines

    hit = _FACTS.get(id(r))
    if hit is not None and hit[0] is r:
        return hit[1]
    engine = engines.get(r.engine.name)
    bf16_layers = tuple(engine.spec.fp8_bf16_layers(r)) if engine.spec.fp8_bf16_layers else (0, 0)
    facts = (bool(engine.fp32_params(r)), engine.spec.layer_kernels, bf16_layers)
    _FACTS[id(r)] = (r, facts)
    while len(_FACTS) > 64:
        _FACTS.popitem(last=False)
    return facts


def fp32_params_bytes(r: Recipe) -> Optional[Tuple[float, float, float]]:
    """(weights, gradients, optimizer states) bytes per parameter when ``r``'s engine renders a model that keeps
    fp32 parameters under bf16 / fp8 mixed precision (its spec's ``fp32_params``: NeMo 1.23 without
    ``megatron_amp_O2``, i.e. LoRA / P-tuning in the design guide's recipe), by ``train.optimizer_dtype``
    (conf/calibration/memory.yaml ``fp32_params_bytes``); None: the engine holds ``megatron_bytes``' weights."""
    from vdkit.planner.calibration import memory

    if not _engine_facts(r)[0]:
        return None
    return tuple(float(x) for x in memory()["fp32_params_bytes"][r.engine.name][r.train.optimizer_dtype])


def saved_cast_bytes(r: Recipe, precision: str) -> float:
    """Bytes per transformer-layer linear weight that each layer in flight saves for backward as a cast copy of an fp32
    parameter (Transformer Engine's native-AMP cast, conf/calibration/memory.yaml ``fp32_params_cast_bytes``); 0 when
    the engine holds no fp32 parameters (``fp32_params_bytes``) or in fp32."""
    from vdkit.planner.calibration import memory

    if precision == "fp32" or fp32_params_bytes(r) is None:
        return 0.0
    return float(memory()["fp32_params_cast_bytes"][r.engine.name][precision])


def layer_kernels(r: Recipe) -> str:
    """The decoder layers ``r``'s engine builds on a GPU, as vdkit.planner.activations counts them (its spec's
    ``layer_kernels``): fused (Transformer Engine) or local (the megatron engine's megatron-core local spec)."""
    return _engine_facts(r)[1]


def fp8_bf16_layers(r: Recipe, pp: int, vp: int, recompute: str) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """With ``train.precision=fp8``: (kept, recomputed) counts of the decoder layers that the first and the last
    pipeline stage of ``r`` compute in bf16 (its engine spec's ``fp8_bf16_layers``: Bridge's preset keeps the model's
    first and last layer so; with PP 1 the one stage holds both). Recomputed: under full recompute with
    ``recompute_num_layers`` N, the first N layers of each model chunk (vdkit.planner.recompute), so the model's
    first layer with any N and its last layer only when N covers the whole chunk."""
    start, end = _engine_facts(r)[2]
    chunk = r.model.num_layers // (pp * max(vp, 1))
    n = (r.parallelism.recompute_num_layers or chunk) if recompute == "full" else 0
    start, end = min(start, chunk), min(end, chunk)
    rec_start, rec_end = min(start, n), min(end, max(0, n - (chunk - end)))
    first, last = (start - rec_start, rec_start), (end - rec_end, rec_end)
    if pp == 1:
        first = last = (first[0] + last[0], first[1] + last[1])
    return first, last


def fp8_weight_bytes(engine: str) -> Optional[float]:
    """Bytes per transformer-layer linear weight with ``train.precision=fp8`` as ``engine``'s stack holds it
    (conf/calibration/memory.yaml ``fp8_linear_weight_bytes``); None: the engine renders no FP8."""
    from vdkit.planner.calibration import memory

    b = memory()["fp8_linear_weight_bytes"].get(engine)
    return None if b is None else float(b)


VOCAB_DIVISOR = 128  # NeMo / Megatron pad the vocabulary to a multiple of 128 x TP


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary as NeMo and Megatron allocate it: up to a multiple of 128 x TP."""
    multiple = VOCAB_DIVISOR * tp
    return -(-vocab // multiple) * multiple


def stage_params(r: Recipe, tp: int, pp: int, stage: int) -> Tuple[float, float, float]:
    """(held, held in the transformer layers' linear layers, trainable) parameters of one GPU of pipeline stage
    ``stage`` (the linear layers: what FP8 GEMMs read; the replicated norms and row-parallel biases excluded).

    Stage 0 holds the input embedding (and learned positions), the last stage the final norm and the
    output layer (with PP > 1 a tied output layer is a copy there, as Megatron keeps it); TP shards
    the linear layers and the embeddings, norms and the row-parallel layers' biases are replicated.
    LoRA adapters sit on each layer's fused QKV (A and B both sharded over TP, NeMo's split);
    P-tuning's prompt encoder sits on stage 0 (its linear layers sharded over TP, the virtual-token
    embedding and the second layer's bias replicated)."""
    m, meth = r.model, r.method
    counts = param_counts(m)
    replicated = 2 * counts.final_norm + (2 * m.hidden_size if m.bias else 0)  # norms; o and fc2 biases
    layers = m.num_layers // pp
    linear_params = layers * (counts.per_layer - replicated) / tp
    layer_params = linear_params + layers * replicated
    vocab = padded_vocab(m.vocab_size, tp) * m.hidden_size / tp
    output = vocab if (not counts.tied or pp > 1) else 0.0
    held = (layer_params + ((vocab + counts.positions) if stage == 0 else 0)
            + ((output + counts.final_norm) if stage == pp - 1 else 0))
    if meth.name == "lora":
        trainable = layers * lora_params_per_layer(m, meth.lora_adapter_dim, r.engine.lora_qkv, lora_of(r)) / tp
        held += trainable
    elif meth.name == "ptuning":
        trainable = ptuning_params(meth, m, tp) if stage == 0 else 0.0
        held += trainable
    else:
        trainable = held
    return held, linear_params, trainable


def stage_static_bytes(r: Recipe, tp: int, pp: int, stage: int, distributed_optimizer: bool,
                       precision: Optional[str] = None) -> dict:
    """Bytes one GPU of pipeline stage ``stage`` holds for weights, gradients and optimizer states.

    ``precision``: bf16 / fp8 (mixed precision, see static_bytes; fp8: the layers' linear weights at the
    engine's ``fp8_weight_bytes``, bf16 where the engine renders no FP8) or fp32; default ``train.precision``.
    The distributed optimizer shards the optimizer states over DP."""
    precision = precision or r.train.precision
    w = mixed_w = static_bytes(precision)[0]
    if precision != "fp32" and fp32_params_bytes(r) is not None:
        w = fp32_params_bytes(r)[0]  # fp32 parameters: the engine renders no megatron_amp_O2
    g, o = grad_optimizer_bytes(r, distributed_optimizer, precision)
    held, linear_params, trainable = stage_params(r, tp, pp, stage)
    fp8 = fp8_weight_bytes(r.engine.name) if precision == "fp8" else None
    # fp8: the linear weights' bytes beyond a mixed-precision weight (NeMo: Transformer Engine's cached FP8 copy and
    # transpose) come on top of the parameter the engine holds
    weights = w * held + (0.0 if fp8 is None else (fp8 - mixed_w) * linear_params)
    shards = data_parallel(r, tp, pp) * r.parallelism.cp  # megatron-core's distributed optimizer: the DP x CP group
    return {"weights": weights, "gradients": g * trainable,
            "optimizer": o * trainable / (shards if distributed_optimizer else 1)}


def run_precision(r: Recipe) -> str:
    """The precision ``r``'s ranks compute in: fp32 on a CPU cluster (``cluster.gpu_type=cpu``: every engine trains
    in fp32 there - the reference engine's ``CPU_PRECISION``, the megatron-core engines' fp32 parameters), else
    ``train.precision``. The plan counts what the run holds."""
    from vdkit.composition.schema import CPU_GPU_TYPE

    return "fp32" if r.cluster.gpu_type == CPU_GPU_TYPE else r.train.precision


def activation_bytes(precision: str) -> float:
    """Bytes of an activation element the layers keep in ``precision``: 4 in fp32, 2 in bf16 (and fp8: the layers
    compute in bf16; Transformer Engine's FP8 copies are vdkit.planner.activations' own terms)."""
    return 4.0 if precision == "fp32" else 2.0


def logit_bytes(element: float) -> float:
    """Bytes per logit the loss keeps for backward (module docstring): below fp32 the logits (``element``) plus the
    fp32 copy megatron-core's cross entropy exponentiates in place; in fp32 the ``.float()`` is the logits
    themselves, one buffer."""
    from vdkit.planner.activations import OPMATH

    return element + (OPMATH if element < OPMATH else 0.0)


def layers_in_flight(layers: int, pp: int, vp: int, microbatches: int, rank: int) -> float:
    """Layers' activations pipeline rank ``rank`` holds at its peak (1F1B): its warm-up forwards plus the one
    before the first backward, each of a model chunk (``layers / vp`` layers), at most every chunk of every
    micro batch - megatron-core 0.16.1's ``get_pp_rank_microbatches`` (pipeline_parallel/schedules.py):
    ``pp - rank - 1`` warm-up micro batches, interleaved ``(pp - rank - 1) * 2 + (vp - 1) * pp`` (its
    ``microbatch_group_size_per_vp_stage`` left at PP). The first stage holds L/PP x min(PP, micro batches)
    without interleaving, L/PP x (PP + (PP-1)/VP) with it; the last L/PP x (PP - (PP-1)/VP)."""
    vp = max(vp, 1)
    warmup = (pp - rank - 1) * 2 + (vp - 1) * pp if vp > 1 else pp - rank - 1
    return layers / vp * min(warmup + 1, microbatches * vp)


def estimate_memory(r: Recipe, tp: int, pp: int, vp: int, sequence_parallel: bool, recompute: str,
                    distributed_optimizer: bool, precision: Optional[str] = None) -> Memory:
    """Per-GPU memory (GB) of the worst pipeline stage for one layout (see the module docstring); ``precision``
    defaults to the one the run computes in (``run_precision``: fp32 on a CPU cluster)."""
    m, t = r.model, r.train
    precision = precision or run_precision(r)
    dp = data_parallel(r, tp, pp)
    layers = m.num_layers // pp
    static = max((stage_static_bytes(r, tp, pp, st, distributed_optimizer, precision) for st in {0, pp - 1}),
                 key=lambda d: sum(d.values()))
    weight_bytes, grads, optim = static["weights"], static["gradients"], static["optimizer"]

    # context parallelism: each GPU holds 1 / CP of every sequence's activations (and logits)
    s = (t.seq_length + (r.method.ptuning_virtual_tokens if r.method.name == "ptuning" else 0)) / r.parallelism.cp
    b = t.micro_batch_size
    fp8 = precision == "fp8"  # Transformer Engine keeps FP8 copies of the linears' inputs (vdkit.planner.activations)
    peft = r.method.name if r.is_peft else ""  # frozen base weights keep less (vdkit.planner.activations)
    e, kernels = activation_bytes(precision), layer_kernels(r)
    # fp32 parameters under bf16 autocast: the stream stays fp32, each linear casts its input (hf_activations)
    autocast = precision != "fp32" and fp32_params_bytes(r) is not None
    per_layer = layer_bytes(m, s, b, tp, sequence_parallel, "none" if recompute == "full" else recompute,
                            kernels, e, fp8=fp8, peft=peft, lora_dim=r.method.lora_adapter_dim,
                            engine=r.engine.name, swiglu_input=r.train.swiglu_input_dtype,
                            attention=r.engine.attention, autocast=autocast,
                            fp8_attention=attention_precision(r, precision) == "fp8", lora_targets=lora_of(r))
    # fp32 parameters under autocast: each layer's forward saves a cast copy of its linear weights (one layer's here);
    # transformers' (hf) LoRA adapters are torch Linears too and save theirs (megatron-core's adapter linears save the
    # fp32 weight itself)
    _, linear_params, trainable = stage_params(r, tp, pp, 0)
    cast_params = linear_params + (trainable if r.method.name == "lora" and kernels == "hf" else 0.0)
    per_layer += saved_cast_bytes(r, precision) * cast_params / layers
    if recompute == "full":  # partial (recompute_num_layers): those layers keep only their input
        share = recompute_share(r, recompute, layers, vp)
        kept = layer_bytes(m, s, b, tp, sequence_parallel, "full", kernels, e, autocast=autocast)
        stored_per_layer = share * kept + (1 - share) * per_layer
        working = per_layer  # one layer recomputed at a time
    else:
        stored_per_layer, working = per_layer, 0.0
    # the layers the engine keeps in bf16 under FP8 (fp8_bf16_layers) save bf16 linear inputs: each one kept holds a
    # bf16 layer's bytes where the others hold an FP8 one's, per micro batch in flight (the stage's average share)
    bf16 = fp8_bf16_layers(r, pp, vp, recompute) if fp8 else ((0, 0), (0, 0))
    bf16_layer = per_layer
    if any(map(any, bf16)):
        bf16_layer = layer_bytes(m, s, b, tp, sequence_parallel, "none" if recompute == "full" else recompute,
                                 kernels, e, peft=peft, lora_dim=r.method.lora_adapter_dim, engine=r.engine.name,
                                 swiglu_input=r.train.swiglu_input_dtype, attention=r.engine.attention,
                                 lora_targets=lora_of(r))
        bf16_layer += saved_cast_bytes(r, precision) * cast_params / layers
    microbatches = t.global_batch_size // (t.micro_batch_size * dp)
    # train.cuda_graphs=layer: each graphed layer's static input and mask per micro batch in flight (vdkit.planner.cuda_graphs)
    first, last = (layers_in_flight(layers, pp, vp, microbatches, rank) for rank in (0, pp - 1))
    acts_first, acts_last = (n * stored_per_layer + bf16[i][0] * (bf16_layer - per_layer) * n / layers
                             + (max(working, bf16_layer) if bf16[i][1] else working)
                             + graph_bytes(r, s, tp, sequence_parallel, n) for i, n in enumerate((first, last)))
    # one micro batch's logits: the last chunk's backward follows its forward
    logits = logit_bytes(e) * s * b * m.vocab_size / tp
    acts = acts_first + logits if pp == 1 else max(acts_first, acts_last + logits)
    return Memory(weights_gb=weight_bytes / GB, gradients_gb=grads / GB, optimizer_gb=optim / GB,
                  activations_gb=acts / GB,
                  overhead_gb=overhead_gb(r.cluster))
