"""The schema of ``conf/calibration/*.yaml``: one dataclass per file, checked by OmegaConf on load.

:func:`vdkit.planner.calibration.load` merges each file into ``OmegaConf.structured(SCHEMAS[name])``: an
unknown key, a value of the wrong type or a missing required key is one line naming the file and the key
(``conf/calibration/hf_step_time.yaml: gpus.H200-SXM5-141GB.hbm_gb_s is missing``), never a ``KeyError``
deep in the step-time model. A field without a default (``MISSING``) is required; ``Optional`` with a
``None`` default may be left out. What each number means and its source is in the YAML beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING


# ----------------------------------------------------------------------------- memory.yaml
@dataclass
class MemoryCalib:
    """memory.yaml: the memory model's bytes per parameter and element, by precision, engine and sharding."""

    overhead_gb: float = MISSING
    borderline_fraction: float = MISSING
    megatron_bytes: Dict[str, List[float]] = MISSING  # precision -> (weights, gradients, optimizer) bytes
    fp8_linear_weight_bytes: Dict[str, float] = MISSING  # engine -> bytes per FP8 linear weight in the layers
    bf16_optimizer_bytes: Dict[str, List[float]] = MISSING  # engine -> train.optimizer_dtype=bf16 (gradients, optimizer)
    fp32_distributed_optimizer_bytes: Dict[str, float] = MISSING  # engine -> its distributed optimizer's fp32 state
    fp32_params_bytes: Dict[str, Dict[str, List[float]]] = MISSING  # engine -> optimizer dtype -> (w, g, o), fp32 params
    fp32_params_cast_bytes: Dict[str, Dict[str, float]] = MISSING  # engine -> precision -> saved cast of a linear weight
    checkpoint_optimizer_bytes: Dict[str, Dict[str, float]] = MISSING  # engine -> optimizer dtype -> exported state
    sharded_bytes: Dict[str, List[float]] = MISSING  # sharding -> (parameter, gradient, optimizer) bytes
    sharded_frozen_bytes: Dict[str, float] = MISSING
    accumulation_grad_bytes: Dict[str, float] = MISSING
    gathered_layers: int = MISSING
    logit_bytes: float = MISSING
    transformer_engine_major: Dict[str, int] = MISSING  # engine -> its image's TE major (PEFT activations)
    swiglu_input_bytes: Dict[str, float] = MISSING  # train.swiglu_input_dtype -> bytes of the saved SwiGLU input


# ----------------------------------------------------------------------------- hf_step_time.yaml
@dataclass
class GpuCalib:
    """One GPU's facts (hf_step_time.yaml ``gpus``, by ``cluster.gpu_type``): the one home of a GPU's
    datasheet and measured figures, read by both step-time regimes."""

    vendor: str = MISSING  # nvidia | amd (composition.schema GPU_VENDORS): the cluster.gpu_vendor it runs under
    peak_tflops_bf16: float = MISSING  # dense BF16 tensor-core peak (datasheet)
    mamf_tflops_bf16: float = MISSING  # measured maximum achievable BF16 matmul TFLOP/s
    hbm_gb_s: float = MISSING  # HBM bandwidth (datasheet)
    intra_node_gb_s: float = MISSING  # in-node collective bus bandwidth per direction
    collective_latency_us: float = MISSING  # per ring step
    compute_units: int = MISSING  # SMs / CUs (wave quantization)
    # the transformers regime's fitted fraction of MAMF its GEMMs reach in a step (benchmarks/hf_efficiency.py)
    hf_gemm_efficiency: float = MISSING
    peak_tflops_fp8: Optional[float] = None  # dense FP8 peak; None: no FP8 tensor cores (FP8 plans get no prediction)
    memory_gb: Optional[float] = None  # the GPU's memory as sold (a cluster's gpu_memory_gb is what the planner fits)
    # what nvidia-smi / rocm-smi report, bytes: the planner's capacity (vdkit.planner.calibration.capacity_gb)
    memory_total_bytes: Optional[int] = None
    # what nvidia-smi / rocm-smi call it (without "NVIDIA "): `vdkit site probe` writes this gpu_type for them
    product_names: List[str] = field(default_factory=list)


@dataclass
class HfStack:
    """hf_step_time.yaml ``stack``: the transformers engine's eager ops, hooks and bytes per parameter."""

    op_overhead_us: float = MISSING
    ops_per_layer_forward: int = MISSING
    backward_ops_factor: float = MISSING
    hook_ops_per_unit: Dict[str, int] = MISSING
    backward_prefetch: Dict[str, bool] = MISSING
    gradient_copy_bytes_per_param: Dict[str, float] = MISSING
    accumulate_gradient_bytes_per_param: Dict[str, float] = MISSING
    optimizer_bytes_per_param: float = MISSING
    elementwise_passes: float = MISSING
    attention_score_passes: float = MISSING
    comm_bytes_per_param: float = MISSING
    ddp_gradient_bytes_per_param: float = MISSING


@dataclass
class RowsFigure:
    """hf_step_time.yaml ``data_defaults.datasets.<name>``: a data set's collated tokens per row, sourced."""

    tokens_per_row: float = MISSING
    source: str = MISSING


@dataclass
class DataDefaults:
    """hf_step_time.yaml ``data_defaults``: row lengths where the run's data was not counted."""

    length_sigma: float = MISSING
    datasets: Dict[str, RowsFigure] = MISSING
    unknown_fraction_of_seq: float = MISSING


@dataclass
class CrossCheck:
    """hf_step_time.yaml ``cross_checks[]``: a published run predicted beside the fitted rows, never fitted."""

    name: str = MISSING
    minutes: float = MISSING
    source: str = MISSING
    overrides: List[str] = MISSING


@dataclass
class Interval:
    """``intervals.<group>``: a prediction range (ratios of the point estimate) and the rows that set it."""

    min: float = MISSING
    max: float = MISSING
    figures: str = MISSING  # what a plan prints: the rows it is derived from, their errors, why this wide
    # step_time.yaml: the published row sets whose leave-one-out errors set it (benchmarks/ranges.py ROW_SETS)
    # and why those (kept by `bench_prediction.py --fit`, which rewrites min, max and figures)
    derived_from: List[str] = field(default_factory=list)
    why: str = ""


@dataclass
class FabricCalib:
    """One inter-node transport (hf_step_time.yaml ``fabric``, by ``cluster.transport``)."""

    latency_us: float = MISSING  # one ring step across nodes
    default_adapters: Optional[int] = None  # RDMA: adapters when cluster.ib_hcas lists none
    adapter: Optional[str] = None  # RDMA: the adapter and its rate's source
    gb_s_per_node: Optional[float] = None  # TCP: the per-node default
    source: Optional[str] = None


@dataclass
class HfStepTimeCalib:
    """hf_step_time.yaml: the transformers regime's GPUs, fabrics, stack costs and ranges."""

    gpus: Dict[str, GpuCalib] = MISSING
    gemm_tile: List[int] = MISSING
    adapter_gb_s: Dict[str, float] = MISSING
    fabric: Dict[str, FabricCalib] = MISSING
    stack: HfStack = MISSING
    data_defaults: DataDefaults = MISSING
    cross_checks: List[CrossCheck] = field(default_factory=list)
    intervals: Dict[str, Interval] = MISSING


# ----------------------------------------------------------------------------- step_time.yaml
@dataclass
class Hardware:
    """step_time.yaml ``hardware``: the reference GPU's peaks and the collectives' latency."""

    reference_gpu: str = MISSING  # the GPU the constants were fitted on (a key of hf_step_time.yaml gpus)
    peak_tflops_bf16: float = MISSING
    peak_tflops_fp8: float = MISSING
    hbm_gb_s: float = MISSING
    collective_latency_us: float = MISSING
    gpu_speed_cv: float = MISSING  # spread of identical GPUs' speed (one standard deviation, relative)


@dataclass
class StackBytes:
    """step_time.yaml ``bytes``: bytes per parameter (or activation element) each term moves."""

    weight_bf16: float = MISSING
    weight_fp8: float = MISSING
    unfused_weights_read: float = MISSING
    unfused_recompute_read: float = MISSING
    unfused_sft_gradient: float = MISSING
    activation: float = MISSING


@dataclass
class SampleFigure:
    """step_time.yaml ``data.<name>``: a data set's tokens per sample, sourced."""

    tokens_per_sample: float = MISSING
    source: str = MISSING


@dataclass
class Fitted:
    """step_time.yaml ``fitted``: the constants benchmarks/bench_prediction.py --fit writes."""

    gemm_efficiency_bf16: float = MISSING
    gemm_efficiency_fp8: float = MISSING
    guide_stack_gb_s: float = MISSING
    per_step_host_s: float = MISSING


@dataclass
class LocalLayerOps:
    """Ops megatron-core's local layer launches per micro batch (step_time.yaml ``host.local``; measured live)."""

    forward: int = MISSING
    backward: int = MISSING
    frozen_backward: int = MISSING
    gqa_forward: int = MISSING
    gqa_backward: int = MISSING
    gqa_query_copy: int = MISSING
    selective_backward: int = MISSING
    lora_forward: int = MISSING
    lora_backward: int = MISSING


@dataclass
class DrainOps:
    """step_time.yaml ``host.drain``: ops issued in series with the GPU after a loop's host syncs (keyed by the names
    an engine spec's ``loop_drains`` holds)."""

    loss: int = MISSING  # per micro batch (the loss's NaN / Inf checks)
    grad_bucket: int = MISSING  # per gradient bucket and step (the DDP's NaN / Inf checks)
    bucket_params: int = MISSING  # megatron-core's default bucket size, parameters ...
    bucket_params_per_dp_rank: int = MISSING  # ... or this x DP, the larger


@dataclass
class HostOps:
    """step_time.yaml ``host``: the ops a layer launches per micro batch, by layer kind (vdkit.planner.host_time)."""

    local: LocalLayerOps = MISSING
    te_linear_forward: Dict[str, float] = MISSING  # precision -> op-equivalents of one TE linear's forward
    te_linears: int = MISSING
    te_other_forward: float = MISSING
    te_other_backward: float = MISSING
    cp_step_forward: float = MISSING
    cp_step_backward: float = MISSING
    graphed_forward: float = MISSING
    graphed_backward: float = MISSING
    drain: DrainOps = MISSING


@dataclass
class AnchorRun:
    """step_time.yaml ``anchors.runs[]``: one published run, its overrides and its throughput."""

    name: str = MISSING
    overrides: List[str] = MISSING
    tflops: Optional[float] = None  # model TFLOP/s per GPU (BF16 runs) ...
    tokens_per_s_per_gpu: Optional[float] = None  # ... or tokens/s/GPU (FP8 runs)
    # what the published run set that only engine=bridge renders (the kit's NeMo engine runs no userbuffers overlap, so
    # the fitted plan cannot take it): benchmarks/bench_prediction.py's Bridge table adds these
    bridge_overrides: List[str] = field(default_factory=list)


@dataclass
class Anchors:
    """step_time.yaml ``anchors``: NVIDIA's published throughputs the model is checked against."""

    source_bf16: str = MISSING
    source_fp8: str = MISSING
    runs: List[AnchorRun] = MISSING


@dataclass
class AttentionKernels:
    """One kernel's published TFLOP/s by sequence length (step_time.yaml ``attention.kernels``)."""

    forward: List[float] = MISSING
    backward: List[float] = MISSING


@dataclass
class TeKernels:
    """From which Transformer Engine version on a stack runs which kernels (step_time.yaml ``attention``)."""

    te_from: str = MISSING  # the first Transformer Engine version this entry applies to
    kernels: str = MISSING  # a key of ``kernels``


@dataclass
class AttentionRate:
    """step_time.yaml ``attention``: the fused attention kernels' published rates (vdkit.planner.attention_rate)."""

    source: str = MISSING
    head_dim: int = MISSING
    gpus: List[str] = MISSING
    seq_lengths: List[int] = MISSING
    kernels: Dict[str, AttentionKernels] = MISSING
    transformer_engine: List[TeKernels] = MISSING


@dataclass
class StepTimeCalib:
    """step_time.yaml: the NeMo / Megatron regimes' hardware, bytes, host ops, fitted constants and ranges."""

    hardware: Hardware = MISSING
    bytes: StackBytes = MISSING
    data: Dict[str, SampleFigure] = MISSING
    packing_efficiency: float = MISSING
    attention: AttentionRate = MISSING
    host: HostOps = MISSING
    fitted: Fitted = MISSING
    intervals: Dict[str, Interval] = MISSING
    anchors: Anchors = MISSING


SCHEMAS: Dict[str, Any] = {"memory": MemoryCalib, "hf_step_time": HfStepTimeCalib, "step_time": StepTimeCalib}
