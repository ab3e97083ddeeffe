"""The kit's types: the recipe schema (what the planner returns: :mod:`vdkit.composition.plan_types`). Dataclasses only.

The bottom layer: it imports nothing from the kit, and every layer above takes these types.

- The recipe: the sections Hydra composes (registered in its ConfigStore by :mod:`vdkit.composition.config`)
  and the frozen :class:`Recipe` built from them.
- The vocabularies a recipe and an engine's spec share, and the planner's gigabyte (:data:`GB`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

GB = 1e9  # the planner's gigabyte (memory and checkpoint figures)
SEEDED_NOTE = "seeded weights: "  # how an engine's plan note that a fine-tune starts from seeded weights begins (render prints it)
RUN_MODES = ("train", "timing")  # run.mode: a real fine-tune | the design guides' timing run
VAL_TIMES_PER_RUN = 5  # run.mode=train without train.val_every_n_steps: validations over the run (a five-point loss curve; with train.val_batches 4, ~0.7 % of the training compute)
# The vocabularies a recipe and an engine's spec (vdkit.recipes.spec) share: here, below both.
METHODS = ("sft", "lora", "ptuning", "pretrain")
# method.lora_targets: megatron-core's / Megatron-Bridge's linear layers LoRA may adapt (vdkit.planner.lora_targets)
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
LORA_DEFAULT_TARGETS = ("linear_qkv",)  # QKV alone, as NeMo 1.23's lora_tuning (every plan before the setting)
PRECISIONS = ("bf16", "fp8")
# The distributed optimizer's state and gradient-buffer dtype (Apex distributed_fused_adam's dtype and grad_sync_dtype)
OPTIMIZER_DTYPES = ("fp32", "bf16")
# The dtype the fused SwiGLU saves its input (fc1's output) in for backward: fp8 is megatron-core's
# activation_func_fp8_input_store (MLPerf's FP8_ACT / FP8_ACTIVATION), an unscaled cast to float8_e4m3fn
SWIGLU_INPUT_DTYPES = ("bf16", "fp8")
# train.cuda_graphs: eager (none) | each decoder layer's forward and backward captured as CUDA graphs and replayed
# (layer: megatron-core's cuda_graph_impl, rendered by an engine whose spec's cuda_graphs holds it)
CUDA_GRAPHS = ("none", "layer")
SHARDINGS = ("none", "fsdp", "zero3")
GPU_VENDORS = ("nvidia", "amd")
CPU_GPU_TYPE = "cpu"  # cluster.gpu_type of a cluster with no GPUs (cluster=local, k8s_cpu): ranks train in fp32
ARCHS = ("llama", "opt")
STEP_TIME_REGIMES = ("unfused", "fused", "hf")  # vdkit.planner.predict: NeMo / Megatron defaults, NVIDIA's fused path, HF
# The decoder layer's kernel set an engine builds on a GPU (vdkit.planner.activations): Transformer Engine's fused layers
# with flash attention | megatron-core's local layer spec (torch norms, unfused attention with its s^2 softmax) |
# transformers' eager PyTorch layers (sdpa or eager attention: vdkit.planner.hf_activations)
LAYER_KERNELS = ("fused", "local", "hf")
ATTENTIONS = ("sdpa", "eager")  # transformers' attn_implementation values the transformers engine passes
ROW_PADDINGS = ("micro_batch", "global_batch")  # an engine's padding of unpacked rows (its spec's pads_rows_to)
# The host read-backs an engine's loop makes (its spec's loop_drains, priced by vdkit.planner.host_time drain_terms
# from step_time.yaml host.drain.<name>): the loss's NaN / Inf checks per micro batch | the DDP's per gradient bucket
LOOP_DRAINS = ("loss", "grad_bucket")


# ----------------------------------------------------------------------------- the recipe
# Plain dataclasses registered in Hydra's ConfigStore. Each field's trailing comment is its documentation,
# the only one: `vdkit plan --explain KEY` and `vdkit plan --cfg` print it (vdkit/commands/keys.py); a test requires one.


@dataclass
class ModelCfg:
    name: str = "llama2_7b"  # the model's name (conf/model/<name>.yaml; `model=NAME` picks one); in run names
    num_layers: int = 32  # transformer layers (blocks)
    hidden_size: int = 4096  # model width (d_model)
    ffn_hidden_size: int = 11008  # MLP inner width
    num_attention_heads: int = 32  # attention heads (hidden_size must divide by it)
    num_query_groups: int = 32  # KV heads (grouped-query attention when < num_attention_heads)
    vocab_size: int = 32000  # tokenizer vocabulary (embedding and output-layer rows)
    max_position_embeddings: int = 4096  # the longest sequence the model was trained for
    pretrain_tp: Optional[int] = None  # the training guide's tensor parallelism for method=pretrain
    pretrain_pp: Optional[int] = None  # the training guide's pipeline stages for method=pretrain
    nemo_path: Optional[str] = None  # base model .nemo file (engine=nemo restore_from_path)
    # Architecture: every engine builds its model from these (defaults are Llama 2's).
    arch: str = "llama"  # model family: llama | opt
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    norm_eps: float = 1e-5  # epsilon of every norm layer
    activation: str = "swiglu"  # MLP: swiglu (gated, 3 matrices) | relu | gelu (2 matrices)
    bias: bool = False  # bias terms in the linear layers (OPT: true)
    qkv_bias: bool = False  # bias terms on the query, key and value projections only (Qwen2: true; implied by bias)
    position_embedding: str = "rope"  # rope | learned (absolute, OPT)
    rope_base: float = 10000.0  # RoPE theta (Llama 3.1: 500000)
    rope_scaling: Any = None  # a mapping or null (typed Any: OmegaConf cannot merge into a None Dict); e.g. Llama 3.1's {rope_type: llama3, factor: 8, ...}
    tied_embeddings: bool = False  # output layer shares the input embedding (Llama 2: untied)
    tokenizer: str = "sentencepiece"  # tokenizer library: sentencepiece | huggingface | byte-level
    embedding_dim: Optional[int] = None  # word-embedding width when it differs from hidden_size (OPT-350m: 512, projected)
    pre_norm: bool = True  # norm before each block (OPT-350m: false, post-norm without a final norm)
    hf_path: Optional[str] = None  # the staged HF weights + tokenizer (hub id or local dir): reference and megatron load a fine-tune's base from it; None: seeded init
    pretrained: bool = True  # published weights exist: a run.mode=train fine-tune must load them (engine=megatron refuses seeded weights); false: a toy with none (tests, the demo)
    megatron_path: Optional[str] = None  # engine=bridge: the base model as a Megatron-Bridge checkpoint (from hf_path, converted once)


@dataclass
class MethodCfg:
    name: str = "lora"  # sft | lora | ptuning | pretrain
    peft_scheme: str = "lora"  # NeMo's model.peft.peft_scheme: none | lora | ptuning
    optimizer: str = "fused_adam"  # NeMo's optimizer name: fused_adam | distributed_fused_adam (with parallelism.distributed_optimizer)
    lr: float = 1e-4  # peak learning rate
    min_lr: float = 0.0  # learning rate at the end of the cosine decay
    warmup_steps: int = 50  # linear learning-rate warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    lora_adapter_dim: int = 32  # LoRA rank (method=lora)
    lora_dropout: float = 0.0  # dropout on the LoRA adapters' input (method=lora)
    lora_targets: List[str] = field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))  # LoRA adapts: LORA_TARGETS
    lora_a2a: bool = False  # row-parallel adapters' output by all-to-all under SP (Bridge LoRA a2a_experimental)
    ptuning_virtual_tokens: int = 10  # virtual prompt tokens the prompt encoder produces (method=ptuning)
    ptuning_bottleneck_dim: int = 1024  # P-tuning prompt encoder's hidden width (method=ptuning)
    ptuning_embedding_dim: int = 1024  # P-tuning prompt encoder's embedding width (method=ptuning)


@dataclass
class ClusterCfg:
    name: str = "xe9680"  # the cluster's name (conf/cluster/<name>.yaml; `cluster=NAME` picks one)
    launcher: str = "slurm"  # a name in vdkit.launch.launchers.REGISTRY: slurm | local | kubernetes (`vdkit list launchers`)
    nodes: int = 1  # nodes in the job (sbatch --nodes); world size = nodes x gpus_per_node
    min_nodes: int = 1  # the fewest nodes this cluster offers (cluster.nodes is checked against it)
    max_nodes: int = 6  # the most nodes this cluster offers (the design guides: 6 XE9680s)
    gpus_per_node: int = 8  # GPUs (ranks) per node (sbatch --gpus-per-node): 8 on an XE9680, or 4 (the job still holds the node)
    node_gpus: Optional[int] = None  # GPUs a node of this cluster has (the most gpus_per_node can ask); None: unchecked (local ranks)
    gpu_memory_gb: float = 80.0  # memory of one GPU the planner fits into: its reported total in GB of 10^9 bytes (conf/cluster: it follows gpu_type unless a number is written; docs/prediction.md "Capacity")
    memory_overhead_gb: Optional[float] = None  # per-device overhead the planner reserves; None: conf/calibration/memory.yaml overhead_gb
    gpu_type: str = "H100-SXM5-80GB"  # GPU model; the step-time model predicts only for the types it is calibrated on
    cpus_per_task: int = 12  # CPU cores per rank (sbatch --cpus-per-task)
    time_limit_min: Optional[int] = None  # sbatch --time; None: from the plan (vdkit.planner.timeplan), capped at max_time_min
    max_time_min: int = 240  # the partition's maximum time limit (`sinfo -o "%P %l"`): a site fact
    storage_write_gbps_per_node: float = 0.67  # checkpoint write bandwidth per node (GB/s); PowerScale F710 (Table 4)
    startup_s: float = 120.0  # seconds each allocation takes before training, besides reading weights and checkpoint (container start, imports, NCCL set-up, model build); assumed: read yours off a job's log
    mtbf_h: float = 24.0  # mean hours between failures that end a job early (node, GPU, fabric; not the time limit): Young's M for the checkpoint interval; assumed, conservative (Llama 3's 419 unexpected interruptions in 54 days on 16,384 H100s scale to ~1,000 h for 48 GPUs): use your incident history
    max_restarts: int = 3  # failed job steps (dead rank or node, hang, failed save) the launcher restarts by itself from the last good checkpoint, per run (NeMo-Run's retries on failure); 0: none
    heartbeat_timeout_s: Optional[float] = None  # a rank whose heartbeat is this many seconds old is dead or stopped: the watchdog kills the step; None: vdkit.run.faults.DEAD_AFTER_S (20)
    kill_grace_s: Optional[float] = None  # seconds the watchdog waits for srun after killing the step, before killing srun itself; None: vdkit.run.faults.KILL_GRACE_S (10)
    restart_delay_s: Optional[float] = None  # seconds before a successor that excludes a failed node may start (sbatch --begin); None: vdkit.run.faults.RESTART_DELAY_S (30)
    max_lost_work_min: float = 60.0  # the most training a failure between checkpoints may lose (minutes): caps the checkpoint interval; a site's choice
    ib_hcas: List[str] = field(default_factory=list)  # exact-match NCCL_IB_HCA list
    socket_ifname: Optional[str] = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    mpi: str = "pmix"  # srun --mpi for an engine whose ranks bootstrap through PMI (its spec's needs_pmi): pmix | pmi2 | none
    partition: Optional[str] = None  # sbatch --partition (site option); None: the site's default
    account: Optional[str] = None  # sbatch --account (site option)
    qos: Optional[str] = None  # sbatch --qos (site option)
    reservation: Optional[str] = None  # sbatch --reservation (site option)
    dependency: Optional[str] = None  # sbatch --dependency, e.g. singleton for chained continuation
    nccl_debug: Optional[str] = None  # e.g. INFO; off by default
    gpu_vendor: str = "nvidia"  # nvidia (CUDA, NCCL) | amd (ROCm, RCCL)
    transport: str = "ib"  # inter-node fabric: ib (InfiniBand verbs) | roce (RDMA over Ethernet) | tcp (sockets)
    inter_node_gb_s: Optional[float] = None  # usable inter-node bandwidth per node and direction (GB/s) as collectives reach it (all_gather_perf); None: adapters x the transport's rate (conf/calibration/hf_step_time.yaml)
    container_image: Optional[str] = None  # the cluster's image for engines without their own (e.g. a ROCm PyTorch image)
    container_writable: bool = False  # srun --container-writable (pyxis): for sites whose enroot root filesystem is read-only (Bridge's launcher adds it)
    env: Dict[str, str] = field(default_factory=dict)  # extra variables exported before srun (site / fabric settings)
    kubernetes: Dict[str, Any] = field(default_factory=dict)  # a Kubernetes site's settings, read by vdkit.k8s.settings
    probed: List[str] = field(default_factory=list)  # the fields `vdkit site probe` read on a node; render lists the other site facts as assumptions


@dataclass
class DataCfg:
    name: str = "dolly"  # the data set's name (conf/data/<name>.yaml; `data=NAME` picks one)
    kind: str = "sft"  # sft (JSONL input/output) | pretrain (Megatron indexed prefixes)
    data_dir: Optional[str] = None  # mounted into the container at the same path
    train_files: List[str] = field(default_factory=list)  # relative to data_dir
    validation_files: List[str] = field(default_factory=list)  # relative to data_dir
    test_files: List[str] = field(default_factory=list)  # relative to data_dir
    packed: bool = False  # packed sequences (NeMo: requires micro_batch_size 1)
    tokenizer_model: Optional[str] = None  # SentencePiece .model or HF tokenizer dir; None: engine default


@dataclass
class EngineCfg:
    name: str = "nemo"  # a name in vdkit.recipes.engines.REGISTRY (nemo, reference, ...)
    container_image: Optional[str] = None  # pyxis --container-image, for engines that run in a container
    rocm_image: Optional[str] = None  # the engine's ROCm image for clusters with cluster.gpu_vendor=amd (engine=megatron / bridge)
    nemo_root: str = "/opt/NeMo"  # where NeMo's scripts are inside the container (engine=nemo)
    log_every_n_steps: int = 1  # log a training step every N steps (validation needs per-step timings: keep 1)
    checkpoint_every_n_steps: Optional[int] = None  # save a checkpoint every N steps; None: the plan's policy (vdkit.planner.checkpoint_policy); 0: none periodic (the end's as run.mode says: a timing run saves only when stopped)
    attention: str = "sdpa"  # engine=reference: sdpa (PyTorch's fused attention, flash kernels on GPU: no score matrix in HBM) | eager (scores materialized: transformers before 4.36, e.g. the white paper's 4.26)
    transformer_engine: Optional[str] = None  # the Transformer Engine version the job's image runs as pip reports it, e.g. 1.10.0, to plan a published run on its stack (the step-time model's attention kernels: conf/calibration/step_time.yaml attention); None: the engine's image's (memory.yaml transformer_engine_major)
    lora_qkv: str = "fused"  # where LoRA sits: fused (one adapter on the fused QKV, NeMo / Megatron) | separate (q, k, v: peft)


@dataclass
class ParallelismCfg:
    sharding: str = "none"  # data-parallel sharding (engine=reference): none (DDP) | fsdp (torch FSDP full-shard) | zero3 (DeepSpeed)
    cpu_offload: bool = False  # fsdp / zero3: keep parameters and optimizer states in host memory
    deepspeed_config: Optional[str] = None  # zero3: a file in conf/deepspeed/ (name) or a JSON/YAML path; None: plain ZeRO-3
    tp: Optional[int] = None  # None: chosen by the planner
    pp: Optional[int] = None  # pipeline-parallel stages; None: chosen by the planner
    vp: Optional[int] = None  # virtual pipeline (interleaved) stages per rank
    sequence_parallel: Optional[bool] = None  # None: on when tp > 1
    cp: int = 1  # context-parallel ranks: each sequence split over CP GPUs (engine=bridge / nemo; seq divisible by 2 x CP)
    recompute: Optional[str] = None  # none | selective | full; None: cheapest that fits
    recompute_num_layers: Optional[int] = None  # full recompute: layers per stage recomputed (the rest keep activations); None: all
    distributed_optimizer: Optional[bool] = None  # None: on for sft / pretrain
    tp_comm_overlap: bool = True  # TP collectives overlapped with GEMMs where the engine does (Bridge: TP >= 2 with SP); false: never (NCCL, unoverlapped)
    tp_comm_overlap_cfg: Optional[str] = None  # TP overlap's userbuffers settings per GEMM (engine=bridge): a file in conf/tp_overlap/ (name); None: Transformer Engine's defaults


@dataclass
class TrainCfg:
    micro_batch_size: int = 1  # samples per rank per forward pass (MBS; the design guide's 1)
    global_batch_size: int = 128  # samples per optimizer step (GBS = MBS x DP x gradient accumulation; the guide's 128)
    max_steps: int = 50  # steps the job runs (the measured run: Table 9 extrapolates 50 -> 1000 steps)
    target_steps: int = 1000  # steps validation extrapolates to
    seq_length: int = 2048  # tokens per sample (padded / packed to it; NeMo's SFT default, pretraining 4096)
    precision: str = "bf16"  # bf16 | fp8 (FP8 parameters and compute, as NVIDIA's 70B SFT)
    # Apex distributed_fused_adam's dtype / grad_sync_dtype; NVIDIA's SFT launcher config runs bf16 (docs/fast-recipe.md)
    optimizer_dtype: str = "fp32"  # fp32 | bf16: the optimizer's master copy, moments and gradient buffer (bf16: an engine that renders it)
    # FP8 dot-product attention (megatron-core's fp8_dot_product_attention; MLPerf's FP8_DPA): with train.precision=fp8
    # only, an engine that renders it; off, Transformer Engine runs attention in BF16 (what the planner prices)
    fp8_attention: bool = False  # true: FP8 dot-product attention (train.precision=fp8, engine=bridge)
    cuda_graphs: str = "none"  # none | layer: per-layer CUDA graphs (megatron-core cuda_graph_impl; engine=bridge)
    swiglu_input_dtype: str = "bf16"  # bf16 | fp8: the dtype SwiGLU keeps its input in for backward (fp8: megatron-core's activation_func_fp8_input_store; an engine that renders it)
    fused_kernels: bool = False  # fine-tuning: NVIDIA's fusions (grad-accumulation, RoPE, ...); pretraining always
    seed: int = 1234  # random seed (data order, initialisation)
    val_every_n_steps: Optional[int] = None  # run.mode=train: validate on the validation split every N steps; None: VAL_TIMES_PER_RUN times per run
    val_batches: int = 4  # run.mode=train: global batches per validation (512 samples at GBS 128; bounds its cost; NeMo limit_val_batches, Bridge eval_iters)


@dataclass
class RunCfg:
    name: Optional[str] = None  # job and run-directory name; default <model>_<method>_<N>n<G>g
    out_dir: str = "runs"  # parent directory of the run directories (--out overrides it)
    results_dir: Optional[str] = None  # shared checkpoint dir every node reaches; default run dir
    secrets_file: Optional[str] = None  # file with HF_TOKEN= / WANDB_API_KEY= lines, read at run time
    mode: str = "train"  # train (a real fine-tune: periodic validation, best + last checkpoints, exported weights) | timing (the guides' method: no validation, no checkpoint but the stop one; the published-table sweeps set it)


@dataclass
class VdkitConfig:
    model: ModelCfg = field(default_factory=ModelCfg)
    method: MethodCfg = field(default_factory=MethodCfg)
    cluster: ClusterCfg = field(default_factory=ClusterCfg)
    data: DataCfg = field(default_factory=DataCfg)
    engine: EngineCfg = field(default_factory=EngineCfg)
    parallelism: ParallelismCfg = field(default_factory=ParallelismCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    run: RunCfg = field(default_factory=RunCfg)


@dataclass(frozen=True)
class Recipe:
    """A composed, validated recipe: the single input of everything downstream.

    The sections are the schema dataclasses; treat them as read-only. ``overrides`` are the
    command-line overrides it was composed from (kept for ``overrides.txt``).
    """

    model: ModelCfg
    method: MethodCfg
    cluster: ClusterCfg
    data: DataCfg
    engine: EngineCfg
    parallelism: ParallelismCfg
    train: TrainCfg
    run: RunCfg
    overrides: tuple = ()

    # Derived values: computed here once, never typed twice.
    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.gpus_per_node

    @property
    def run_name(self) -> str:
        if self.run.name:
            return self.run.name
        return f"{self.model.name}_{self.method.name}_{self.cluster.nodes}n{self.cluster.gpus_per_node}g"

    @property
    def is_peft(self) -> bool:
        return self.method.name in ("lora", "ptuning")

    @property
    def timing(self) -> bool:
        """run.mode=timing: the guides' measured run (no validation, no checkpoint but the stop one)."""
        return self.run.mode == "timing"

    @property
    def val_every(self) -> int:
        """Steps between validations on the validation split; 0: none (run.mode=timing)."""
        if self.timing:
            return 0
        if self.train.val_every_n_steps:
            return self.train.val_every_n_steps
        return max(1, self.train.max_steps // VAL_TIMES_PER_RUN)

    def to_dict(self) -> dict:
        """The resolved config as plain data (what ``recipe.yaml`` holds)."""
        out = {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(VdkitConfig)}
        return out

    def with_parallelism(self, **changes) -> "Recipe":
        """A copy with parallelism fields replaced (the planner fills in what auto left open)."""
        return dataclasses.replace(self, parallelism=dataclasses.replace(self.parallelism, **changes))
