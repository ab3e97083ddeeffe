"""Step-time prediction: how long a planned run takes, term by term.

The model is physical where the physics is known and calibrated where it is not. Per micro batch
and pipeline stage (one GPU's share of the work):

- **compute**: model FLOPs of the micro batch's tokens divided over TP x PP, at a calibrated fraction
  of the H100 peak (BF16 989 / FP8 1979 TFLOP/s), but never faster than streaming the GPU's weights from
  HBM (3.35 TB/s) once per GEMM pass (the roofline). Model FLOPs per token, per method: forward
  2 x (matmul parameters) + 4 x layers x hidden x attention span + 2 x hidden x vocab; SFT and
  pretraining run forward + activation gradients + weight gradients (3x), LoRA and P-tuning skip the
  frozen weights' gradients (2x); full recomputation adds one forward of the layers. The s^2 attention runs at
  its stack's published kernel rate (vdkit.planner.attention_rate), else at the GEMMs' rule; with FP8 the GEMMs run
  at the FP8 peak x the fitted FP8 efficiency, the attention in FP8 only with ``train.fp8_attention``.
- **per-micro-batch overhead**: the design guide's fine-tuning stack (NeMo's defaults: no fused
  kernels, unpacked samples) pays, every micro batch, for each byte of weights it touches - read
  forward and backward (4 B/param, +2 recomputed), and for SFT the bf16 weight gradient written, read
  back and added into the fp32 main gradient (+12 B/param) - at ``guide_stack_gb_s``, a calibrated rate
  far below HBM's (Table 9 implies ~1 % of the BF16 peak). NVIDIA's fused path (pretraining, and the
  fast recipe: ``train.fused_kernels``) has no such term; its only overhead is the roofline's excess. LoRA's
  adapters and TE 1.x's CP ring stream activations through HBM (vdkit.planner.lora_traffic, cp_overheads: at HBM's rate).
- **communication**: tensor-parallel collectives per layer (4 per micro batch, 6 with full
  recompute) over NVLink at the GPU's measured NCCL bus bandwidth (H100: 370 GB/s per direction); pipeline point-to-point sends (NVLink or
  InfiniBand), once per virtual stage; the data-parallel gradient all-reduce once per step over
  NVLink within a node or, across nodes, the cluster's fabric (vdkit.planner.interconnect: InfiniBand or RoCE
  adapters x their rate, TCP's sockets default, or the site's measured ``cluster.inter_node_gb_s``;
  the node's bandwidth shared by its GPUs); each collective pays ``collective_latency_us`` per ring step
  inside a node, the fabric's latency across nodes. NVIDIA's fused path with the distributed optimizer
  overlaps that reduction with a micro batch's compute: only the excess is exposed.
- **host**: the CPU issues each layer's kernels eagerly (ops x the eager cost of one; vdkit.planner.host_time), ahead
  of the GPU: a stage costs max(its GPU time, its host time) per micro batch (per-layer CUDA graphs: one replay).
- **pipeline bubble**: (PP - 1) / VP micro-batch times of the stage per step (1F1B, interleaved).
- **optimizer**: one memory-bound pass over the optimizer state each step.

Step time = (m + (PP - 1) / VP) x stage time per micro batch + DP all-reduce + optimizer, with m the
micro batches per step and data-parallel rank. Tokens per sample come from the data (unpacked Dolly
averages 114.5), a packed sample or a pretraining sample is ``train.seq_length`` tokens.

Every constant - hardware figures, bytes per parameter, the data's tokens per sample, and the few
calibrated ones - lives in ``conf/calibration/step_time.yaml`` with its source (the memory model's in
``memory.yaml``, the transformers engine's regime's in ``hf_step_time.yaml``, same folder);
``benchmarks/bench_prediction.py`` refits the calibrated ones on the published runs and prints the error
against each.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

from vdkit.planner import attention_rate, cp_overheads, data_parallel, lora_traffic, tp_overlap
from vdkit.planner.attention_rate import FLASH_BACKWARD_PASSES  # this module's API too (its home: attention_rate)
from vdkit.planner.activations import attention_precision
from vdkit.planner.arch import param_counts, trainable_params
from vdkit.planner.collectives import cp_ring_s, straggler  # noqa: F401 (straggler: this module's API too)
from vdkit.planner.host_time import drain_terms, stage_terms
from vdkit.planner.interconnect import interconnect
from vdkit.planner.local_traffic import local_parts, local_step
from vdkit.planner.memory import optimizer_pass_bytes, recompute_share
from vdkit.composition.plan_types import Prediction, StepTime
from vdkit.composition.schema import STEP_TIME_REGIMES

CALIBRATION_FILE = Path("calibration") / "step_time.yaml"  # under the conf/ tree (package data in a wheel)
FITTED_KEYS = ("gemm_efficiency_bf16", "gemm_efficiency_fp8", "guide_stack_gb_s", "per_step_host_s")


# ----------------------------------------------------------------------------- constants
def calibration() -> dict:
    """The step-time constants (conf/calibration/step_time.yaml) as data."""
    from vdkit.planner.calibration import load

    return load("step_time")


def predicts_for(recipe, calib: Optional[dict] = None) -> bool:
    """Whether the model describes the recipe's GPU: the reference GPU (step_time.yaml's ``hardware``) or one
    hf_step_time.yaml's ``gpus`` describes, with an FP8 peak for an FP8 recipe (:func:`why_no_prediction`)."""
    return _gpu_gap(recipe, calib or calibration()) is None


def _gpu_gap(recipe, calib: dict) -> Optional[str]:
    """Why the model does not describe the recipe's GPU (None: it does)."""
    from vdkit.planner.calibration import load

    gpu, gpus = recipe.cluster.gpu_type, load("hf_step_time")["gpus"]
    if gpu == calib["hardware"]["reference_gpu"]:
        return None
    if gpu not in gpus:
        described = ", ".join(dict.fromkeys([calib["hardware"]["reference_gpu"], *gpus]))
        return f"the step-time model describes {described} (conf/calibration/hf_step_time.yaml gpus), not {gpu}"
    if recipe.train.precision == "fp8" and gpus[gpu].get("peak_tflops_fp8") is None:
        return f"conf/calibration/hf_step_time.yaml states no FP8 peak for {gpu} (peak_tflops_fp8)"
    return None


def gpu_hardware(calib: dict, gpu_type: str) -> dict:
    """step_time.yaml's ``hardware`` for ``gpu_type``: the reference GPU's as written; another GPU's peaks and
    HBM from hf_step_time.yaml's ``gpus`` and ``gemm_scale``, its measured matmul share of peak relative to the
    reference GPU's (1.0 for the reference GPU). Every GPU's in-node ring bandwidth (``nvlink_gb_s``) is its
    ``gpus`` entry's measured ``intra_node_gb_s`` (a GPU nothing describes is ranked at the reference GPU's)."""
    from vdkit.planner.calibration import load

    hw = dict(calib["hardware"])
    ref = hw.get("reference_gpu")
    gpus = load("hf_step_time")["gpus"]
    g, r = gpus.get(gpu_type), gpus.get(ref)
    if r is None:  # the reference GPU's facts (its ring bandwidth, its measured share of peak) live there
        from vdkit.errors import UserError

        raise UserError(f"conf/calibration/step_time.yaml: hardware.reference_gpu={ref} is not in "
                        "conf/calibration/hf_step_time.yaml gpus", f"describe {ref} there, or name a GPU it describes")
    hw["nvlink_gb_s"] = float((g or r)["intra_node_gb_s"])
    if gpu_type == ref or g is None:  # not described: no prediction is shown (predicts_for), ranking only
        return {**hw, "gemm_scale": 1.0}
    # no FP8 peak (e.g. the A100): layouts are ranked at the BF16 peak, and no FP8 prediction is shown (predicts_for)
    hw.update(peak_tflops_bf16=g["peak_tflops_bf16"], peak_tflops_fp8=g["peak_tflops_fp8"] or g["peak_tflops_bf16"],
              hbm_gb_s=g["hbm_gb_s"],
              gemm_scale=(g["mamf_tflops_bf16"] / g["peak_tflops_bf16"]) / (r["mamf_tflops_bf16"] / r["peak_tflops_bf16"]))
    return hw


def why_no_prediction(recipe, tp: int = 1, pp: int = 1) -> Optional[str]:
    """Why the step-time model predicts nothing for ``recipe`` laid out TP x PP (None: it predicts).

    By the engine's regime: the transformers regime's own reasons (layout, GPU, inter-node bandwidth:
    :func:`vdkit.planner.predict_hf.why_not_hf`); NeMo's and the fused regime's only gap is a GPU that
    step_time.yaml does not describe."""
    if regime(recipe) == "hf":
        from vdkit.planner.predict_hf import why_not_hf

        return why_not_hf(recipe, tp, pp)
    return _gpu_gap(recipe, calibration())


def fitted(calib: Optional[dict] = None) -> Dict[str, float]:
    """The calibrated constants (a dict of FITTED_KEYS)."""
    calib = calib or calibration()
    return {k: float(calib["fitted"][k]) for k in FITTED_KEYS}


# ----------------------------------------------------------------------------- the work
def avg_tokens(recipe, calib: dict) -> Optional[float]:
    """Average tokens per fine-tuning sample of the data actually configured: its `vdkit data stats --plan`
    histogram when the file is beside data.train_files, else the calibration's figure for data.name
    (Dolly's, Alpaca's), else None (unknown: callers assume full-length samples)."""
    from vdkit.planner.tokens import counted_mean

    counted = counted_mean(recipe)
    if counted:
        return counted[0]
    return (calib.get("data") or {}).get(recipe.data.name, {}).get("tokens_per_sample")


def tokens_per_sample(recipe, calib: Optional[dict] = None) -> float:
    """Tokens one sample puts through the model (P-tuning adds its virtual tokens).

    Pretraining and packed samples fill ``train.seq_length``; an unpacked fine-tuning sample has the
    data's average length (from the calibration file), capped at the sequence length; a data set the
    file does not know is assumed full-length (the conservative choice).
    """
    calib = calib or calibration()
    t = recipe.train
    if recipe.method.name == "pretrain" or recipe.data.packed:
        n = float(t.seq_length)
    else:
        avg = avg_tokens(recipe, calib)
        n = min(float(avg), float(t.seq_length)) if avg else float(t.seq_length)
    if recipe.method.name == "ptuning":
        n += recipe.method.ptuning_virtual_tokens
    return n


def samples_per_sequence(recipe, calib: Optional[dict] = None) -> float:
    """Training samples one sequence (one row of a micro batch) carries: > 1 only when packed."""
    calib = calib or calibration()
    if not recipe.data.packed or recipe.method.name == "pretrain":
        return 1.0
    avg = avg_tokens(recipe, calib)
    if not avg:
        return 1.0
    # with context parallelism each packed sample is padded to a multiple of 2 x CP (on average half of it)
    pad = (2 * recipe.parallelism.cp - 1) / 2 if recipe.parallelism.cp > 1 else 0.0
    return recipe.train.seq_length * float(calib["packing_efficiency"]) / (float(avg) + pad)


def attention_span(recipe, calib: Optional[dict] = None) -> float:
    """Tokens each token attends over: a sample's length (packed samples keep their own boundaries)."""
    calib = calib or calibration()
    if recipe.method.name == "pretrain":
        return float(recipe.train.seq_length)
    avg = avg_tokens(recipe, calib)
    return min(float(avg), float(recipe.train.seq_length)) if avg else float(recipe.train.seq_length)


def _matmul_per_layer(m, counts) -> int:
    """A layer's GEMM weights: its parameters less the two norms' (which do no GEMM)."""
    return counts.per_layer - 2 * (2 if getattr(m, "norm", "rmsnorm") == "layernorm" else 1) * m.hidden_size


def _passes(recipe) -> float:
    """Forward-pass equivalents a step runs: forward + activation gradients (+ weight gradients unless PEFT)."""
    return 3.0 if recipe.method.name in ("sft", "pretrain") else 2.0  # PEFT: no frozen weight gradients


def flops_per_token(recipe, recompute: str = "none", calib: Optional[dict] = None, pp: int = 1, vp: int = 1) -> float:
    """Model FLOPs per token for one training step (forward, backward and recomputation): the GEMMs' plus
    the s^2 attention's (:func:`attention_flops_per_token`)."""
    m = recipe.model
    counts = param_counts(m)
    layers_fwd = 2 * m.num_layers * _matmul_per_layer(m, counts)
    logits_fwd = 2 * m.hidden_size * m.vocab_size
    passes = _passes(recipe)
    recompute_fwd = recompute_share(recipe, recompute, m.num_layers // pp, vp)
    return ((passes + recompute_fwd) * layers_fwd + passes * logits_fwd
            + attention_flops_per_token(recipe, recompute, calib, pp, vp))


def attention_flops_per_token(recipe, recompute: str = "none", calib: Optional[dict] = None, pp: int = 1,
                              vp: int = 1) -> float:
    """The dot-product attention's share of :func:`flops_per_token`, as published model FLOPs count it (NVIDIA's
    TFLOP/s figures): Q K^T and the weighted sum of V over the whole s x s square, 2 x 2 x hidden x attention span per
    layer forward, with the same passes and recomputation as the layers' GEMMs. Converting a published TFLOP/s
    figure to time uses it; the step time uses :func:`attention_kernel_flops_per_token`, what the kernels run."""
    m = recipe.model
    fwd = 4 * m.num_layers * m.hidden_size * attention_span(recipe, calib)
    return (_passes(recipe) + recompute_share(recipe, recompute, m.num_layers // pp, vp)) * fwd


# Flash attention's tile edge along the sequence (FlashAttention-2 and cuDNN's fused attention on Hopper: 128-row
# blocks): a causal kernel skips the tiles above the diagonal and computes the diagonal ones whole.
ATTENTION_TILE = 128


def attention_kernel_flops_per_token(recipe, recompute: str = "none", calib: Optional[dict] = None, pp: int = 1,
                                     vp: int = 1) -> float:
    """FLOPs per token the attention kernels of a step run (Transformer Engine's flash / cuDNN attention, causal):
    the share of the s x s square a causal kernel computes, ``(1 + tile / span) / 2``, a forward, the backward's
    :data:`FLASH_BACKWARD_PASSES` for every method, and the forward again on recomputed layers. Context parallelism
    keeps the same share: Transformer Engine's load-balanced p2p ring computes half of each causal chunk pair."""
    m = recipe.model
    span = attention_span(recipe, calib)
    causal = min(1.0, (1.0 + ATTENTION_TILE / span) / 2.0)
    fwd = 4 * m.num_layers * m.hidden_size * span * causal
    return (1.0 + FLASH_BACKWARD_PASSES + recompute_share(recipe, recompute, m.num_layers // pp, vp)) * fwd


def efficiency_key(precision: str) -> str:
    """The fitted constant (FITTED_KEYS) that scales ``precision``'s peak: the GEMM efficiency in bf16 or fp8."""
    return "gemm_efficiency_fp8" if precision == "fp8" else "gemm_efficiency_bf16"


# ----------------------------------------------------------------------------- the prediction
def predict_step(recipe, tp: int, pp: int, vp: int = 1, recompute: str = "none",
                 distributed_optimizer: bool = False, constants: Optional[Dict[str, float]] = None,
                 calib: Optional[dict] = None) -> StepTime:
    """Predicted seconds per step of ``recipe`` on layout TP x PP (x VP) with DP = the rest.

    ``constants`` overrides the calibrated ones (the benchmark refits them); the layout must be
    valid (see vdkit.planner.layout.layout_violations).
    """
    calib = calib or calibration()
    k = constants or fitted(calib)
    hw = gpu_hardware(calib, recipe.cluster.gpu_type)
    nb = {key: float(v) for key, v in calib["bytes"].items()}
    r, m, t, c = recipe, recipe.model, recipe.train, recipe.cluster
    vp = vp or 1
    cp = r.parallelism.cp
    dp = r.world_size // (tp * pp * cp)
    micro = t.global_batch_size // (t.micro_batch_size * dp)  # micro batches per step per DP rank
    latency = float(hw["collective_latency_us"]) * 1e-6

    n = t.micro_batch_size * tokens_per_sample(r, calib)  # tokens per micro batch
    fp8 = t.precision == "fp8"
    # The GEMMs run at the recipe's precision, the s^2 attention at its own (attention_precision: BF16 unless FP8
    # attention is rendered), each at its peak x the fitted efficiency of that precision.
    attn = attention_precision(r)
    gemm = "fp8" if fp8 else "bf16"
    peak, attn_peak = (float(hw[f"peak_tflops_{p}"]) * 1e12 for p in (gemm, attn))
    eff, attn_eff = (k[efficiency_key(p)] * float(hw["gemm_scale"]) for p in (gemm, attn))
    stack_attn = attention_rate.rate(r, calib, float(hw["peak_tflops_bf16"]), attention_span(r, calib) / cp)
    attn_eff = stack_attn.efficiency if stack_attn else attn_eff  # its stack's published kernel rate, not fitted
    hbm = float(hw["hbm_gb_s"]) * 1e9
    full = r.method.name in ("sft", "pretrain")
    fused = _fused_path(r)

    counts = param_counts(m)
    layers = m.num_layers // pp
    # One GPU holds the input embedding and, with PP 1, the output layer too (0 extra when tied).
    embed = counts.embedding + counts.output if pp == 1 else max(counts.embedding, counts.output)
    held = (layers * counts.per_layer + embed) / tp
    # GEMM weights a micro batch streams on this GPU: its layers, plus the output layer on the last stage.
    gemm_params = (layers * _matmul_per_layer(m, counts) + counts.embedding) / tp
    trainable_held = held * min(1.0, trainable_params(r) / counts.total)

    # Compute, on the roofline: FLOPs at the achieved GEMM rate, but never faster than streaming the
    # weights from HBM once per GEMM pass (forward, activation gradient, weight gradient).
    share = recompute_share(r, recompute, layers, vp)  # full recompute: the share of layers rerun forward
    passes = (3 if full else 2) + share
    weight_bytes = (nb["weight_fp8"] if fp8 else nb["weight_bf16"]) * gemm_params
    # CP splits every sequence (load-balanced causal chunks): 1 / CP of the micro batch's FLOPs per GPU;
    # every GPU waits for the job's slowest one at each step (straggler), so the compute is the slowest GPU's.
    slow = straggler(r.world_size, hw)
    per_gpu = slow * n / (tp * pp * cp)  # this GPU's tokens of the micro batch (the slowest GPU's)
    # GEMMs: the model FLOPs less their attention share; the attention: what its kernels run (causal, flash backward)
    gemm_fpt = flops_per_token(r, recompute, calib, pp, vp) - attention_flops_per_token(r, recompute, calib, pp, vp)
    flops_mb = per_gpu * gemm_fpt / peak  # GEMMs: s at 100 % of peak
    attn_mb = per_gpu * attention_kernel_flops_per_token(r, recompute, calib, pp, vp) / attn_peak  # at its precision's peak
    # An engine that builds megatron-core's local layers (its spec's layer_kernels) runs its norms, RoPE, SwiGLU and
    # the s x s attention unfused: their HBM traffic, and the bmm FLOPs of the whole score square beyond what the
    # attention term above counts (vdkit.planner.local_traffic; such engines run bf16 only, so peak is the BF16 one).
    local = local_step(r, tp, layers, recompute, share,
                       n * attention_kernel_flops_per_token(r, recompute, calib, pp, vp) / (tp * pp * cp))
    local_flops_mb = slow * local.extra_flops / peak if local else 0.0
    flops_mb += local_flops_mb
    lora_mb = slow * layers * lora_traffic.layer_s(r, n / cp, tp, share, hbm, float(hw["peak_tflops_bf16"]) * 1e12)
    cp_copies_mb = slow * cp_overheads.micro_s(r, n, tp, cp, layers, share, hbm)  # TE 1.x CP ring's copies and merges
    local_mb = (slow * local.hbm_bytes / hbm if local else 0.0) + lora_mb + cp_copies_mb
    floor_mb = slow * passes * weight_bytes / hbm
    compute_mb = max(flops_mb / eff + attn_mb / attn_eff, floor_mb)
    # The design guide's fine-tuning stack (NeMo defaults: no fused kernels, no packing) pays per micro batch for every
    # byte of weights it touches: read forward and backward (4 B/param; a recomputed forward reads them once more), and
    # for a full-parameter method the bf16 weight gradient written, read back and added into the fp32 main gradient
    # (+12 B/param) - at the calibrated rate of that stack, far below HBM's.
    touched = 0.0
    if not fused:
        touched = ((nb["unfused_weights_read"] + nb["unfused_recompute_read"] * share)
                   * gemm_params + (nb["unfused_sft_gradient"] * trainable_held if full else 0.0))
    overhead_mb = touched / (k["guide_stack_gb_s"] * 1e9)

    # Tensor parallel: 2 collectives forward + 2 backward per layer (+2 recomputed), activations in bf16.
    nvlink = float(hw["nvlink_gb_s"])
    act_bytes = n * m.hidden_size * nb["activation"] / cp  # this GPU's share of the sequence
    per_collective = (2.0 * (tp - 1) / tp * act_bytes / (nvlink * 1e9) + latency) if tp > 1 else 0.0
    # counted whole, or as the engine's rendered job overlaps them with GEMMs (TE userbuffers: vdkit.planner.tp_overlap)
    tpo = tp_overlap.stage(r, n / cp, tp, per_collective, slow / peak, share, layers, eff)
    tp_mb = tpo.exposed_s() + slow * layers * lora_traffic.row_collective_s(r, n / cp, tp, nvlink, latency, share)
    # Pipeline: send forward + backward at each virtual stage boundary; hidden when NVIDIA's
    # overlap_p2p_comm is on (interleaved schedule on the fused path).
    # Across nodes: the cluster's fabric (transport, adapters or the site's measured figure; vdkit.planner.interconnect),
    # the node's bandwidth shared by its GPUs, and the fabric's own latency per ring step (TCP's is 4x RDMA's).
    fab = interconnect(c)
    ib_per_gpu = fab.per_gpu_gb_s(c.gpus_per_node)
    fab_latency = fab.latency_us * 1e-6
    inter_pp = tp * pp > c.gpus_per_node
    pp_link, pp_lat = (ib_per_gpu, fab_latency) if inter_pp else (nvlink, latency)
    pp_mb = (2.0 * vp * (act_bytes / tp / (pp_link * 1e9) + pp_lat)) if pp > 1 and not (fused and vp > 1) else 0.0
    # each ring hop hides under one step's attention kernel (forward; the backward's FLASH_BACKWARD_PASSES x it)
    step_fwd = attn_mb / attn_eff / (layers * cp * (1.0 + FLASH_BACKWARD_PASSES + share))
    cp_mb = cp_ring_s(r, n, tp, cp, layers, share, nvlink, ib_per_gpu, fab_latency if tp * cp > c.gpus_per_node
                      else latency, nb["activation"], step_fwd, FLASH_BACKWARD_PASSES * step_fwd)
    stage_mb = compute_mb + overhead_mb + local_mb + tp_mb + pp_mb + cp_mb
    # The host issues the layers' kernels asynchronously: a stage costs max(GPU, host) per micro batch
    # (vdkit.planner.host_time: ops per layer x the eager cost of one; per-layer CUDA graphs issue a replay instead).
    host_mb, host_parts = stage_terms(r, tp, cp, layers, recompute, share, calib, stage_mb, micro)
    stage_mb += host_mb

    # Data parallel: the gradients' ring over DP x CP, hidden behind the last micro batch's compute on the fused path
    # with the distributed optimizer but for the last bucket's tail (vdkit.planner.data_parallel)
    red = data_parallel.reduction(r, dp, cp, trainable_held, counts.embedding / tp * full, distributed_optimizer,
                                  fused and distributed_optimizer, nvlink, latency, fab,
                                  (flops_mb, attn_mb, eff, attn_eff), calib)
    # Optimizer: read + write the state and the gradient, write the weights (memory-bound): the memory model's bytes.
    shard = trainable_held / (dp * cp if distributed_optimizer else 1)
    opt_s = shard * optimizer_pass_bytes(r, distributed_optimizer) / hbm
    # the loop's host syncs (the loss and gradient checks) put the ops issued after them in series with the GPU
    drain_s, drain_parts = drain_terms(r, micro, trainable_held, dp, distributed_optimizer, calib)
    # ... and after the step's own syncs (the gradient norm's read-back, the loss scale's .item()) the host issues the
    # optimizer step and the loop's per-step Python before the GPU has work again: a fitted time, once per step, on
    # the fused path it was fitted for (step_time.yaml fitted.per_step_host_s)
    tail_n = 1.0 if fused else 0.0
    tail_s = tail_n * k["per_step_host_s"]
    overhead_mb += compute_mb - (flops_mb / eff + attn_mb / attn_eff)  # the roofline's excess counts as overhead
    compute_mb = flops_mb / eff + attn_mb / attn_eff

    bubble = (pp - 1) / vp * stage_mb if pp > 1 else 0.0
    spp = samples_per_sequence(r, calib)
    return StepTime(
        compute_s=micro * compute_mb, overhead_s=micro * (overhead_mb + local_mb + host_mb) + drain_s + tail_s,
        communication_s=micro * (tp_mb + pp_mb + cp_mb) + red.exposed_s + red.tail_s, bubble_s=bubble, optimizer_s=opt_s,
        tokens_per_step=t.global_batch_size * n / t.micro_batch_size,
        samples_per_step=t.global_batch_size * spp,
        parts={"tensor_parallel_s": micro * tp_mb, "pipeline_p2p_s": micro * pp_mb, "data_parallel_s": red.exposed_s,
               "data_parallel_tail_s": red.tail_s, "context_parallel_s": micro * cp_mb, "cp_copies_s": micro * cp_copies_mb,
               "straggler": slow, "lora_traffic_s": micro * lora_mb,
               **local_parts(local, micro, local_mb, local_flops_mb / eff, hbm), **host_parts,
               **tpo.parts(micro), **drain_parts, "per_step_host_s": tail_s,
               # the step as a function of the calibrated constants (benchmarks/bench_prediction.py refits them):
               # step = multiplier * max(max(flops / eff + attn_flops / attn_eff, floor) + touched_gb / guide_stack_gb_s
               #        + local_s + comm, host_s) + max(0, dp_s - dp_window_flops_s / eff - dp_window_attn_s / attn_eff)
               #        + per_step + per_step_host_n * per_step_host_s
               # (eff: efficiency_key of the recipe's precision; attn_eff: the part below, or 0: efficiency_key of
               # attention_precision); comm = comm_s + the overlapped TP collectives' exposed seconds at eff (tp_overlap)
               "multiplier": micro + ((pp - 1) / vp if pp > 1 else 0.0), "flops_s": flops_mb, "attn_flops_s": attn_mb,
               "floor_s": floor_mb, "touched_gb": touched / 1e9, "local_s": local_mb, "comm_s": tpo.basis_s() + pp_mb + cp_mb,
               "dp_s": red.ring_s, "dp_window_flops_s": red.window_flops_s, "dp_window_attn_s": red.window_attn_s,
               "per_step_s": opt_s + drain_s + red.tail_s,
               "per_step_host_n": tail_n, "attn_eff": stack_attn.efficiency if stack_attn else 0.0},  # 0: the GEMM rule
    )


REGIMES = STEP_TIME_REGIMES  # the step-time regimes an engine may name (its spec's step_time_regime)


def regime(recipe) -> str:
    """The step-time regime of ``recipe``'s engine: its spec's ``step_time_regime`` (read through the
    registry, vdkit.recipes.engines): "unfused" (this module: NeMo / Megatron's defaults; NVIDIA's fused path
    when the rendered config is NVIDIA's), "fused" (this module, always on NVIDIA's fused path), "hf"
    (vdkit.planner.predict_hf: eager Hugging Face + DDP / FSDP / ZeRO-3)."""
    from vdkit.recipes import engines

    return engines.get(recipe.engine.name).step_time_regime  # one of REGIMES: checked when its spec is built


def _fused_path(recipe) -> bool:
    """Whether the rendered config runs NVIDIA's fused path (fusions incl. gradient-accumulation fusion).

    NVIDIA's pretraining settings do (vdkit renders them), and so does an engine whose regime is "fused";
    the design guide's fine-tuning configs (NeMo's defaults) do not, unless the fast recipe's fused kernels
    are on (then vdkit renders NVIDIA's performance settings: recipes/nemo/performance.PERFORMANCE_SETTINGS).
    """
    return recipe.method.name == "pretrain" or bool(recipe.train.fused_kernels) or regime(recipe) == "fused"


def predict(recipe, tp: int, pp: int, vp: int = 1, recompute: str = "none", distributed_optimizer: bool = False,
            constants: Optional[Dict[str, float]] = None) -> Prediction:
    """The prediction for ``recipe.train.target_steps`` steps on the given layout."""
    step = predict_step(recipe, tp, pp, vp, recompute, distributed_optimizer, constants)
    return Prediction(step, recipe.train.target_steps, recipe.world_size)
