"""The step-time model's second regime: the transformers engine (HF Trainer / Accelerate, eager PyTorch)
with DDP, torch FSDP full-shard or DeepSpeed ZeRO-3, on H100 or MI300X.

vdkit.planner.predict models NeMo's stack (its largest term is the unfused stack's per-micro-batch weight
traffic, calibrated on Table 9); none of that describes an HF model under FSDP. Here every term is
physical and every constant comes from a datasheet or a measurement (conf/calibration/hf_step_time.yaml),
none fitted to the runs it predicts. Per micro batch of ``N`` tokens (the collator's padded rows:
vdkit.planner.tokens) on one GPU:

- **compute**: every GEMM of every decoder layer (QKV, output, MLP), the logits, forward and both
  backward GEMMs (activation and weight gradients; LoRA / P-tuning skip frozen weight gradients), each
  on the roofline ``max(FLOPs / MAMF, bytes / HBM)`` - MAMF the GPU's *measured* maximum achievable matmul
  rate, less what tile and wave quantization of the GEMM's output cost on the GPU's compute units, so a
  small micro batch (few tokens, the weights still streamed whole) reaches the efficiency its size allows;
  attention scores over the padded row length; element-wise work as HBM traffic of the stored activations.
  The one fitted constant, per GPU: ``hf_gemm_efficiency``, the fraction of MAMF eager PyTorch's GEMMs reach
  inside a training step (MAMF is one GEMM in a loop; a step interleaves them with launches, hooks and
  collectives on the same SMs), fitted by benchmarks/hf_efficiency.py on public torch FSDP runs on H100 and
  A100 (full rows), with leave-one-out. Full recomputation repeats the forward of the layers it covers (``recompute_num_layers`` of
  them, else all). The gradient's own HBM traffic: the stack's
  copy of every gradient (FSDP's flat-parameter concatenation, ZeRO-3's contiguous reduce bucket) and the
  in-place accumulation into a resident gradient on a step's later micro batches (FSDP under ``no_sync``, DDP).
- **communication** (sharded): FSDP / ZeRO-3 gather each decoder layer's parameters in bf16 before its
  forward and again before its backward (all-gather, ``(p-1)/p`` of the layer per GPU), and
  reduce-scatter its bf16 gradients - ZeRO-3 on every micro batch, the HF Trainer's FSDP once per step
  (``no_sync`` while accumulating; the memory cost is in vdkit.planner.sharded). DDP all-reduces the gradients
  once per step. Ring bus bandwidth: the node's fabric (NVSwitch / Infinity Fabric), or across nodes the
  slower of that and the node's inter-node bandwidth (vdkit.planner.interconnect: the site's measured
  ``inter_node_gb_s``, adapters x usable rate, or TCP's stated default); ``collective_latency_us`` per
  ring step, the fabric's across nodes.
- **overlap**: the next layer's gather is prefetched while this layer computes, so each layer exposes
  only ``max(0, comm - compute)``, plus the first gather of each pass: overlap is a function of the
  tokens per micro batch, not a fraction. Where a stack does not prefetch in backward
  (``backward_prefetch`` false in the file), the backward gathers are not hidden at all; torch FSDP's
  default (BACKWARD_PRE) and DeepSpeed ZeRO-3 both prefetch.
- **fixed cost**: eager PyTorch is launch-bound when the GPU work is short: the CPU issues every operation
  (``ops_per_layer_forward`` x layers, backward ``backward_ops_factor`` times as many, the sharding
  library's hooks per wrapped unit) at ``op_overhead_us`` each; a micro batch takes at least that long.
- **optimizer**: one memory-bound Adam pass over the rank's shard per step.

Step = grad_accum x micro batch + the once-per-step collectives + optimizer.
"""
from __future__ import annotations

from typing import Optional

from vdkit.composition.plan_types import StepTime


def constants() -> dict:
    """conf/calibration/hf_step_time.yaml as data."""
    from vdkit.planner.calibration import load

    return load("hf_step_time")


def gpu_profile(recipe, calib: Optional[dict] = None) -> Optional[dict]:
    """The GPU's figures (None when the file does not describe cluster.gpu_type)."""
    calib = calib or constants()
    return (calib.get("gpus") or {}).get(recipe.cluster.gpu_type)


def predicts_hf(recipe) -> bool:
    """Whether this regime can predict the recipe: the transformers engine on a GPU the file describes."""
    return gpu_profile(recipe) is not None


def why_not_hf(recipe, tp: int = 1, pp: int = 1, calib: Optional[dict] = None) -> Optional[str]:
    """Why this regime predicts no step time for ``recipe`` laid out TP x PP; None when it predicts one.

    The layout first (the regime models data-parallel layouts only, whatever the GPU), then the GPU
    (hf_step_time.yaml's ``gpus``): the one home of these reasons, which the plan's note and the time plan's
    note both quote. (Every cluster has a fabric: a TCP one without a measured figure takes the file's
    stated default, vdkit.planner.interconnect, and the plan says so.)"""
    if (tp, pp) != (1, 1):
        return (f"the transformers-engine regime (vdkit.planner.predict_hf) models data-parallel layouts only, "
                f"not TP {tp} x PP {pp}")
    calib = calib or constants()
    if gpu_profile(recipe, calib) is None:
        return (f"conf/calibration/hf_step_time.yaml describes {', '.join(calib['gpus'])}, "
                f"not {recipe.cluster.gpu_type}")
    return None


def inter_node_gb_s(cluster, calib: Optional[dict] = None) -> float:
    """Usable inter-node bandwidth per node and direction (GB/s): the cluster's fabric
    (:func:`vdkit.planner.interconnect.interconnect`: the site's figure, else adapters x the transport's rate, else
    the transport's stated default)."""
    from vdkit.planner.interconnect import interconnect

    return interconnect(cluster, calib).node_gb_s


def bus_gb_s(recipe, calib: Optional[dict] = None) -> float:
    """The ring bus bandwidth a data-parallel collective over the whole job reaches (GB/s per GPU)."""
    prof = gpu_profile(recipe, calib)
    intra = float(prof["intra_node_gb_s"])
    if recipe.cluster.nodes <= 1:
        return intra
    return min(intra, inter_node_gb_s(recipe.cluster, calib))


def _quantization(n: float, m: float, tile, units: int) -> float:
    """Fraction of a GEMM's compute-unit time doing useful work for an n x m output: tile quantization
    (the edge tiles' padding) times wave quantization (the last wave's idle units)."""
    import math

    tm, tn = (tile[0], tile[1]) if n <= m else (tile[1], tile[0])  # the long tile side along the long side
    tiles_n, tiles_m = math.ceil(n / tm), math.ceil(m / tn)
    tiles = tiles_n * tiles_m
    waves = math.ceil(tiles / units)
    return (n * m) / (tiles_n * tm * tiles_m * tn) * tiles / (waves * units)


def _gemm_s(n: float, k: float, m: float, mamf: float, hbm: float, tile=None, units: int = 0) -> float:
    """One GEMM (n x k) @ (k x m) in bf16 on the roofline: compute at MAMF (less what tile and wave
    quantization of its n x m output cost) or traffic at HBM's rate."""
    eff = _quantization(n, m, tile, units) if tile and units else 1.0
    return max(2.0 * n * k * m / (mamf * eff), 2.0 * (n * k + k * m + n * m) / hbm)


def _layer_gemms(m):
    """(k, m) of a decoder layer's GEMMs: QKV, output projection, the MLP's matrices."""
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    mlp = [(h, 2 * f), (f, h)] if m.activation == "swiglu" else [(h, f), (f, h)]
    return [(h, h + 2 * kv), (h, h)] + mlp


def _stored_activation_bytes(m, tokens: float) -> float:
    """Activations one decoder layer stores for ``tokens`` tokens (vdkit.planner.sharded's per-layer formula)."""
    h, f = m.hidden_size, m.ffn_hidden_size
    mlp = 2 * h + (8 if m.activation == "swiglu" else 4) * f + h
    return tokens * (11 * h + mlp + 4 * h)


def recompute_fraction(recipe, recompute: str) -> float:
    """Share of the decoder layers whose forward full recomputation repeats: ``recompute_num_layers`` of them
    when set (the rest keep their activations), else all; 0 without full recomputation."""
    if recompute != "full":
        return 0.0
    n = recipe.parallelism.recompute_num_layers
    return min(1.0, n / recipe.model.num_layers) if n else 1.0


def predict_hf_step(recipe, recompute: str = "none", calib: Optional[dict] = None) -> Optional[StepTime]:
    """Predicted seconds per step of a transformers-engine recipe (DDP / FSDP / ZeRO-3), by term.

    None when the GPU is not described."""
    from vdkit.planner.arch import param_counts, trainable_params
    from vdkit.planner.calibration import memory
    from vdkit.planner.tokens import micro_batch_tokens

    calib = calib or constants()
    prof = gpu_profile(recipe, calib)
    if prof is None:
        return None
    bus = bus_gb_s(recipe, calib)
    stack = calib["stack"]
    r, m, t = recipe, recipe.model, recipe.train
    kind = r.parallelism.sharding
    p = r.world_size
    grad_accum = max(1, t.global_batch_size // (t.micro_batch_size * p))
    mb = micro_batch_tokens(r, calib["data_defaults"])
    n, row = mb.tokens, mb.padded_row
    if r.method.name == "ptuning":
        n += t.micro_batch_size * r.method.ptuning_virtual_tokens
    mamf = float(prof["mamf_tflops_bf16"]) * 1e12 * float(prof["hf_gemm_efficiency"])
    hbm = float(prof["hbm_gb_s"]) * 1e9
    counts = param_counts(m)
    full = r.method.name in ("sft", "pretrain")
    L = m.num_layers

    # Compute, per layer: forward GEMMs, activation-gradient GEMMs, weight-gradient GEMMs (full methods).
    gemms = _layer_gemms(m)
    q = dict(tile=calib.get("gemm_tile"), units=int(prof.get("compute_units") or 0))
    fwd = sum(_gemm_s(n, k, mm, mamf, hbm, **q) for k, mm in gemms)
    dgrad = sum(_gemm_s(n, mm, k, mamf, hbm, **q) for k, mm in gemms)
    wgrad = sum(_gemm_s(k, n, mm, mamf, hbm, **q) for k, mm in gemms) if full else 0.0
    heads = m.num_attention_heads
    attn_flops = 4.0 * n * row * m.hidden_size  # scores and weighted values over the padded row
    # eager attention writes and reads its bf16 score matrix; sdpa's fused kernels keep it on chip
    eager = r.engine.attention == "eager"
    attn_bytes = float(stack["attention_score_passes"]) * 2.0 * t.micro_batch_size * heads * row * row * eager
    attn_fwd = max(attn_flops / mamf, attn_bytes / hbm)
    elementwise = float(stack["elementwise_passes"]) * _stored_activation_bytes(m, n) / hbm
    recomputed = recompute_fraction(recipe, recompute)
    # The gradient's own HBM traffic outside the GEMMs: the stack's copy of each gradient (FSDP's flat-parameter
    # concatenation, ZeRO-3's contiguous bucket) and the in-place accumulation into a resident gradient on
    # every micro batch of a step but its first; averaged over the step's micro batches.
    grad_bytes = float(stack["gradient_copy_bytes_per_param"][kind]) + \
        float(stack["accumulate_gradient_bytes_per_param"][kind]) * (grad_accum - 1) / grad_accum
    train_frac = min(trainable_params(r), counts.total) / counts.total
    layer_grad = grad_bytes * counts.per_layer * train_frac / hbm
    layer_fwd = fwd + attn_fwd + elementwise / 3.0
    layer_bwd = dgrad + wgrad + 2.0 * attn_fwd + 2.0 * elementwise / 3.0 + recomputed * layer_fwd + layer_grad
    V, h = m.vocab_size, m.hidden_size
    # the output layer's GEMMs, and the loss: the logits' bf16 + fp32 upcast + fp32 gradient, written and read
    logits = (_gemm_s(n, h, V, mamf, hbm, **q) * (3.0 if full else 2.0)
              + float(memory()["logit_bytes"]) * n * V * 2 / hbm)
    compute = L * (layer_fwd + layer_bwd) + logits + grad_bytes * counts.outside_layers * train_frac / hbm

    # Communication: bf16 gathers of every layer forward and backward, gradient reduce-scatters.
    latency = float(prof["collective_latency_us"]) * 1e-6
    if r.cluster.nodes > 1:  # a ring across nodes steps at the slower of the GPU link's and the fabric's latency
        from vdkit.planner.interconnect import interconnect

        latency = max(latency, interconnect(r.cluster, calib).latency_us * 1e-6)
    cb = float(stack["comm_bytes_per_param"])
    trainable = min(trainable_params(r), counts.total)
    frac = (p - 1) / p if p > 1 else 0.0

    def coll(params: float) -> float:
        return (cb * params * frac / (bus * 1e9) + (p - 1) * latency) if p > 1 else 0.0

    layer_gather = coll(counts.per_layer)
    layer_rs = coll(counts.per_layer * trainable / counts.total)
    root_gather = coll(counts.outside_layers)
    per_step_comm = 0.0
    if kind in ("fsdp", "zero3"):
        rs_every = kind == "zero3"  # the HF Trainer's FSDP reduces once per step (no_sync while accumulating)
        exposed_fwd = L * max(0.0, layer_gather - layer_fwd) + layer_gather + root_gather
        bwd_comm = layer_gather + (layer_rs if rs_every else 0.0)
        hidden_bwd = layer_bwd if stack["backward_prefetch"][kind] else 0.0  # no prefetch: no overlap
        exposed_bwd = L * max(0.0, bwd_comm - hidden_bwd) + bwd_comm
        comm_mb = exposed_fwd + exposed_bwd
        if not rs_every:  # the step's last micro batch reduce-scatters, behind its backward
            last = L * max(0.0, layer_gather + layer_rs - hidden_bwd) - L * max(0.0, layer_gather - hidden_bwd)
            per_step_comm = last + layer_rs
    else:  # DDP: the gradient all-reduce once per step, bucketed behind the last backward
        comm_mb = 0.0
        ddp = float(stack["ddp_gradient_bytes_per_param"]) / cb  # coll() counts comm_bytes_per_param
        per_step_comm = 2.0 * coll(trainable * ddp) if p > 1 else 0.0  # ring all-reduce: 2 x (p-1)/p

    # Fixed cost: the CPU issues every op (and the sharding library's hooks); the GPU cannot go faster.
    ops = L * float(stack["ops_per_layer_forward"]) * (1.0 + recomputed + float(stack["backward_ops_factor"]))
    units = L + 1
    ops += units * float(stack["hook_ops_per_unit"][kind])
    cpu_mb = ops * float(stack["op_overhead_us"]) * 1e-6
    gpu_mb = compute + comm_mb
    overhead_mb = max(0.0, cpu_mb - gpu_mb)

    shard = trainable / (p if kind in ("fsdp", "zero3") else 1)
    optimizer = shard * float(stack["optimizer_bytes_per_param"]) / hbm
    return StepTime(
        compute_s=grad_accum * compute, overhead_s=grad_accum * overhead_mb,
        communication_s=grad_accum * comm_mb + per_step_comm, bubble_s=0.0, optimizer_s=optimizer,
        tokens_per_step=t.global_batch_size * mb.mean_row, samples_per_step=float(t.global_batch_size),
        parts={"regime": "hf", "tokens_per_micro_batch": n, "padded_row": row, "mean_row": mb.mean_row,
               "tokens_source": mb.source, "bus_gb_s": bus, "cpu_micro_batch_s": cpu_mb,
               "gpu_micro_batch_s": gpu_mb, "exposed_comm_micro_batch_s": comm_mb,
               "gather_per_layer_s": layer_gather, "layer_compute_s": layer_fwd + layer_bwd,
               "gradient_traffic_micro_batch_s": grad_bytes * counts.total * train_frac / hbm})
