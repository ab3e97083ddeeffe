"""What vdkit promises NeMo 1.x: the keys it adds on purpose, and the traps it refuses.

NeMo's own v1.23.0 YAMLs are the contract (tests/test_nemo_contract.py reads them): every key
the rendered ``nemo.yaml`` sets exists there, or is listed in :data:`DELIBERATE_ADDITIONS` with
the reason. :func:`check_nemo_config` runs on the built config before anything is written, so a
trap NeMo would hit hours into a queue (or silently paper over) is one clear line at render time.
"""
from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Tuple

from vdkit.composition.config import nvidia_pretrain_settings as _settings_for, nvidia_pretrain_tables
from vdkit.errors import UserError


class Addition(NamedTuple):
    """A key vdkit sets that NeMo's YAML does not show: its type and why it is there."""

    types: Tuple[type, ...]
    why: str


# Keys not in megatron_gpt_finetuning_config.yaml / megatron_llama_config.yaml that vdkit sets.
# Each is read by NeMo 1.23 (trainer keys by Lightning's Trainer, exp_manager keys by
# ExpManagerConfig, model keys by the model) — the YAMLs just do not show them.
DELIBERATE_ADDITIONS: Dict[str, Addition] = {
    "trainer.limit_val_batches": Addition(
        (int,), "the finetuning YAML omits it: timing runs validate once, one batch; train runs train.val_batches"),
    "trainer.num_sanity_val_steps": Addition(
        (int,), "0: no sanity validation before step 1, which would land inside the measured time"),
    "exp_manager.create_tensorboard_logger": Addition(
        (bool,), "explicit: validation reads `train_step_timing in s` from the TensorBoard events"),
    "exp_manager.log_step_timing": Addition(
        (bool,), "explicit: NeMo's TimingCallback logs `train_step_timing in s`, the measured figure"),
    "exp_manager.step_timing_kwargs": Addition(
        (dict,), "the timing callback's settings (below)"),
    "exp_manager.step_timing_kwargs.sync_cuda": Addition(
        (bool,), "true: synchronize CUDA at step edges so each step's time is its real time"),
    "exp_manager.step_timing_kwargs.buffer_size": Addition(
        (int,), "1: every logged value is one step's time, not a sliding mean (validation does the stats)"),
    "exp_manager.checkpoint_callback_params.dirpath": Addition(
        (str,), "checkpoints in run.results_dir (shared by all nodes); resume_if_exists looks there too"),
    "exp_manager.checkpoint_callback_params.every_n_train_steps": Addition(
        (int,), "the plan's checkpoint cadence (vdkit.planner.timeplan): periodic checkpoints the next allocation resumes from"),
    "exp_manager.checkpoint_callback_params.save_last": Addition(
        (bool,), "explicit (NeMo's default): the -last checkpoint a max_time stop writes at the end of fit"),
    "exp_manager.max_time_per_run": Addition(
        (str,), "DD:HH:MM:SS: NeMo's StatelessTimer stops fit cleanly before the allocation's limit (the job contract)"),
    "exp_manager.checkpoint_callback_params.every_n_epochs": Addition(
        (int,), "0 next to every_n_train_steps: Lightning refuses both triggers at once"),
    "model.virtual_pipeline_model_parallel_size": Addition(
        (int,), "interleaved pipeline (VP > 1 only); the finetuning YAML omits it, the llama YAML has it"),
    "model.fp8": Addition(
        (bool,), "train.precision=fp8 for fine-tuning (Transformer Engine FP8; in the llama YAML)"),
    "model.rotary_base": Addition(
        (float, int), "model.rope_base when it is not NeMo's 10000 (MegatronGPTModel reads cfg.rotary_base)"),
    "model.fp8_hybrid": Addition(
        (bool,), "FP8 with E4M3 forward / E5M2 backward, as NVIDIA's FP8 recipes"),
    "model.data.train_ds.packed_sequence": Addition(
        (bool,), "data.packed=true: NeMo's packed SFT dataset (needs micro batch size 1)"),
    "model.optim.dtype": Addition(
        (str,), "train.optimizer_dtype=bf16: Apex distributed Adam's state dtype (NVIDIA's SFT launcher config, "
                "conf/peft/llama/sft.yaml)"),
    "model.optim.grad_sync_dtype": Addition(
        (str,), "train.optimizer_dtype=bf16: Apex distributed Adam's gradient-buffer dtype (the same launcher config)"),
    "model.data.data_prefix": Addition(
        (list,), "pretraining shards as [weight, prefix, ...]; the llama YAML only shows it in a comment"),
}

# NVIDIA's fused path (pretraining always; fine-tuning with train.fused_kernels=true, the fast recipe).
for _key, _why in {
    "model.gc_interval": "NVIDIA's launcher: manual host garbage collection every 100 steps (NeMo 1.23's base "
                         "model reads it; the llama YAML omits it)",
    "model.use_flash_attention": "NVIDIA's launcher: flash attention (read by NeMo 1.23's GPT model; only the GPT "
                                 "YAML shows it)",
    "model.optim.bucket_cap_mb": "NVIDIA's launcher: distributed Adam's gradient bucket size (Apex keyword)",
    "model.optim.overlap_grad_sync": "NVIDIA's launcher: overlap the gradient reduce-scatter with the backward",
    "model.optim.overlap_param_sync": "NVIDIA's launcher: overlap the parameter all-gather with the forward",
    "model.optim.contiguous_grad_buffer": "NVIDIA's launcher: one contiguous gradient buffer (needed by the overlaps)",
    "model.gradient_accumulation_fusion": "fast recipe (fine-tuning): fuse the weight-gradient accumulation into "
                                          "the GEMM (in the llama YAML; merged over the base model's config)",
    "model.bias_activation_fusion": "fast recipe (fine-tuning): NVIDIA's fused SwiGLU kernel (in the llama YAML)",
    "model.bias_dropout_add_fusion": "fast recipe (fine-tuning): NVIDIA's fused residual kernel (in the llama YAML)",
    "model.masked_softmax_fusion": "fast recipe (fine-tuning): fused softmax (in the llama YAML)",
}.items():
    DELIBERATE_ADDITIONS[_key] = Addition((bool,) if "cap" not in _key and "gc_" not in _key else (int,), _why)

# Keys whose NeMo YAML value shows one type where NeMo takes several.
WIDENED_TYPES: Dict[str, Tuple[type, ...]] = {
    # NeMo's YAMLs show Lightning's int 16/32; 1.23's trainer builder also takes "bf16" / "bf16-mixed".
    "trainer.precision": (int, str),
}

FUSED_ADAM = "fused_adam"
DISTRIBUTED_ADAM = "distributed_fused_adam"
DISTRIBUTED_OPTIMIZERS = (DISTRIBUTED_ADAM,)  # Apex's: the only distributed optimizer NeMo 1.23 registers
# The names NeMo 1.23's optimizer registry knows (nemo/core/optim/optimizers.py AVAILABLE_OPTIMIZERS, the Apex
# ones with Apex, as in the container); any other name raises "Cannot resolve optimizer" at setup.
NEMO_1_23_OPTIMIZERS = ("sgd", "adam", "adamw", "adadelta", "adamax", "adagrad", "rmsprop", "rprop", "novograd",
                        "adafactor", "adan", "lamb", FUSED_ADAM, DISTRIBUTED_ADAM, "megatron_fused_adam")
PACKED_SUFFIX = ".npy"  # GPTSFTPackedDataset._load_packed_dataset: np.load(file_path, allow_pickle=True)


class Trap(UserError):
    """A trap :func:`check_nemo_config` refuses; ``setting``: the nemo.yaml key it is at (`vdkit check` names it)."""

    def __init__(self, what: str, fix: str, setting: str = ""):
        super().__init__(what, fix)
        self.setting = setting


def _fail(what: str, fix: str, setting: str = "") -> None:
    raise Trap(what, fix, setting)


def _get(cfg: dict, dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _check_file_list(cfg: dict, section: str, needs_probabilities: bool) -> None:
    """NeMo's SFT datasets take a LIST of files; the train list needs a matching probabilities list."""
    key = f"model.data.{section}.file_names"
    names = _get(cfg, key)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        _fail(f"{key} must be a non-empty list of JSONL paths (NeMo refuses a bare string), got {names!r}",
              f"set data.{'train' if section == 'train_ds' else 'validation'}_files to a list, e.g. [training.jsonl]")
    if not needs_probabilities:
        return
    probs = _get(cfg, f"model.data.{section}.concat_sampling_probabilities")
    fix = "one probability per file of file_names, summing to 1 (the kit renders them from data.train_files)"
    if not isinstance(probs, list) or len(probs) != len(names):
        _fail(f"model.data.{section}.concat_sampling_probabilities must be a list with one entry per file "
              f"({len(names)}), got {probs!r}: NeMo 1.23's _build_dataset raises at start-up "
              "(megatron_gpt_sft_model.py:215-224)", fix, f"model.data.{section}.concat_sampling_probabilities")
    if any(not isinstance(p, float) or p <= 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-9):
        _fail(f"model.data.{section}.concat_sampling_probabilities {probs} must be positive floats summing to 1",
              fix, f"model.data.{section}.concat_sampling_probabilities")


def _same_seq(cfg: dict, planned: int, key: str) -> None:
    """NeMo trains at the sequence length ``key`` says; the plan's memory and step time are for ``planned``."""
    from vdkit.recipes.common.edits import other_seq_length

    other = other_seq_length(key, _get(cfg, key), planned)
    if other:
        _fail(*other, key)


def check_nemo_config(cfg: dict, plan, registry_probe: bool = False) -> None:
    """Refuse a NeMo config that would fail (or silently misbehave) on the cluster.

    Checks the built config against the plan it came from; raises UserError (one line) for the
    first trap found. Fine-tuning configs are those with ``model.peft``; the rest are pretraining.
    ``registry_probe``: an optimizer name this list does not hold, and the PEFT scheme, are left to NeMo's own
    registries (`vdkit check` runs them in NeMo's venv next: its optimizer registry, ``PEFT_CONFIG_MAP`` and the
    adapters' trainable count against the plan's).
    """
    r = plan.recipe
    c, m = r.cluster, r.method
    trainer, model = cfg.get("trainer", {}), cfg.get("model", {})
    finetune = "peft" in model

    # Lightning wants trainer.devices == srun's tasks per node (vdkit: one task per GPU).
    if trainer.get("devices") != c.gpus_per_node:
        _fail(f"trainer.devices={trainer.get('devices')} differs from the {c.gpus_per_node} tasks per node srun starts",
              f"set cluster.gpus_per_node={trainer.get('devices')} or leave trainer.devices to vdkit", "trainer.devices")
    if trainer.get("num_nodes") != c.nodes:
        _fail(f"trainer.num_nodes={trainer.get('num_nodes')} differs from cluster.nodes={c.nodes}",
              "leave trainer.num_nodes to vdkit", "trainer.num_nodes")
    steps = trainer.get("max_steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        _fail(f"trainer.max_steps={steps!r} must be a positive int (NeMo sizes its datasets from it; -1 hangs the ETA)",
              "use e.g. train.max_steps=50")
    interval = trainer.get("val_check_interval")
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < (steps if plan.recipe.timing else 1):
        _fail(f"trainer.val_check_interval={interval!r} would validate inside the measured steps (max_steps={steps})",
              "leave trainer.val_check_interval to vdkit (run.mode=timing: train.max_steps; train: train.val_every_n_steps)",
              "trainer.val_check_interval")
    if interval > steps:  # NeMo's train loader holds max_steps batches (MegatronPretrainingBatchSampler.__len__)
        _fail(f"trainer.val_check_interval={interval} is above trainer.max_steps={steps}: Lightning's fit loop refuses "
              "an interval above the training batches at start-up ('`val_check_interval` must be less than or equal "
              "to the number of the training batches', lightning/pytorch/loops/fit_loop.py)",
              f"use trainer.val_check_interval <= {steps}", "trainer.val_check_interval")

    lora = _get(model, "peft.lora_tuning") if _get(model, "peft.peft_scheme") == "lora" else None
    if isinstance(lora, dict):  # NeMo 1.23 parallel_adapters.py:157/165: column = A (in), row = B (out)
        from vdkit.recipes.common.lora_init import both_zero

        zero = both_zero(lora.get("column_init_method", "normal"), lora.get("row_init_method", "zero"),
                         "model.peft.lora_tuning.column_init_method", "model.peft.lora_tuning.row_init_method",
                         "the NeMo config")
        if zero:
            _fail(zero[0], zero[2], zero[1])
    em = cfg.get("exp_manager") or {}
    if not em.get("resume_if_exists"):  # every restart after a time limit or a fault would train from step 0
        _fail("exp_manager.resume_if_exists is off: each allocation after the first (the plan's continuation) and "
              "each restart after a fault would start over from step 0", "leave it true", "exp_manager.resume_if_exists")
    if not em.get("resume_ignore_no_checkpoint"):  # exp_manager.py:618
        _fail("exp_manager.resume_ignore_no_checkpoint is off: NeMo's exp_manager raises NotFoundError ('no "
              "checkpoints found ... Cannot resume') at the first start, before any checkpoint exists",
              "leave it true", "exp_manager.resume_ignore_no_checkpoint")
    tp, pp = model.get("tensor_model_parallel_size"), model.get("pipeline_model_parallel_size")
    cp = model.get("context_parallel_size", 1)
    if (tp, pp, cp) != (plan.tp, plan.pp, plan.recipe.parallelism.cp) or tp * pp * cp * plan.dp != c.nodes * c.gpus_per_node:
        _fail(f"model parallelism tp={tp} pp={pp} cp={cp} dp={plan.dp} does not cover {c.nodes} x {c.gpus_per_node} GPUs",
              "re-plan with `vdkit plan` and render again")
    mbs, gbs = model.get("micro_batch_size"), model.get("global_batch_size")
    if gbs % (mbs * plan.dp):
        _fail(f"model.global_batch_size={gbs} is not a multiple of micro_batch_size x DP = {mbs} x {plan.dp}",
              f"use train.global_batch_size={mbs * plan.dp * max(1, round(gbs / (mbs * plan.dp)))}")
    for section in ("validation_ds", "test_ds"):  # each eval loader's MegatronPretrainingBatchSampler, at setup
        ds = _get(cfg, f"model.data.{section}") or {}
        e_gbs, e_mbs = ds.get("global_batch_size"), ds.get("micro_batch_size")
        if ds.get("file_names") and isinstance(e_gbs, int) and isinstance(e_mbs, int) and e_gbs % (e_mbs * plan.dp):
            _fail(f"model.data.{section}.global_batch_size={e_gbs} is not a multiple of its micro_batch_size x DP = "
                  f"{e_mbs} x {plan.dp}: NeMo 1.23's MegatronPretrainingBatchSampler raises at start-up when it builds "
                  "the loader (megatron_batch_samplers.py:104)",
                  f"use a multiple of {e_mbs * plan.dp} (the kit renders train.global_batch_size)",
                  f"model.data.{section}.global_batch_size")
    lr, min_lr = _get(cfg, "model.optim.lr"), _get(cfg, "model.optim.sched.min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and min_lr > lr:
        _fail(f"model.optim.sched.min_lr={min_lr} is above model.optim.lr={lr}: NeMo's CosineAnnealing raises 'received "
              "an initial learning rate that was lower than the minimum' at the first step after warm-up "
              "(nemo/core/optim/lr_scheduler.py:409)", "use min_lr <= lr (method.min_lr, method.lr)",
              "model.optim.sched.min_lr")
    if model.get("sequence_parallel") and tp == 1:
        _fail("model.sequence_parallel=true with TP 1: NeMo would silently turn it off and the plan's memory "
              "figures would be wrong", "set parallelism.sequence_parallel=false or parallelism.tp>1",
              "model.sequence_parallel")
    vp = model.get("virtual_pipeline_model_parallel_size")
    if vp is not None:
        layers = r.model.num_layers
        if pp < 2 or vp < 2 or layers % (pp * vp):
            _fail(f"virtual_pipeline_model_parallel_size={vp} needs PP > 1 and PP x VP dividing {layers} layers (pp={pp})",
                  "set parallelism.vp to a divisor of layers / pp, or leave it unset")
        if (gbs // (mbs * plan.dp)) % pp:
            _fail(f"the interleaved pipeline needs the micro batches per step ({gbs // (mbs * plan.dp)}) to be a "
                  f"multiple of PP={pp}", "change train.global_batch_size, or leave parallelism.vp unset")

    optim = _get(cfg, "model.optim.name")
    if optim not in NEMO_1_23_OPTIMIZERS:
        if not registry_probe:
            _fail(f"model.optim.name={optim}: NeMo 1.23 has no such optimizer (its registry raises 'Cannot resolve "
                  "optimizer' at setup)", f"use {DISTRIBUTED_ADAM} (with the distributed optimizer) or {FUSED_ADAM}")
    elif _get(cfg, "model.gradient_accumulation_fusion") and plan.dp > 1 and pp == 1 and optim != DISTRIBUTED_ADAM:
        _fail(f"model.gradient_accumulation_fusion with DP {plan.dp}, PP 1 and {optim}: NeMo 1.23 turns it off in "
              "silence (megatron_base_model.py), so the job would not run what the plan predicts",
              "set parallelism.distributed_optimizer=true (distributed_fused_adam) or train.fused_kernels=false")
    wants_dist = bool(r.parallelism.distributed_optimizer)
    if optim in NEMO_1_23_OPTIMIZERS and wants_dist != (optim in DISTRIBUTED_OPTIMIZERS):
        _fail(f"method.optimizer={optim} disagrees with parallelism.distributed_optimizer={wants_dist} "
              "(the plan's memory figures assume the latter)",
              f"set method.optimizer={DISTRIBUTED_ADAM if wants_dist else FUSED_ADAM} or "
              f"parallelism.distributed_optimizer={str(not wants_dist).lower()}")
    if m.name == "ptuning" and pp > 1 and _get(cfg, "model.optim.sched.min_lr") != 0.0:
        _fail(f"method.min_lr={_get(cfg, 'model.optim.sched.min_lr')} with P-tuning and PP={pp}: NeMo needs "
              "min_lr 0.0 for prompt learning with pipeline parallelism", "set method.min_lr=0.0")

    if finetune:
        restore = model.get("restore_from_path")
        if not isinstance(restore, str) or not restore:
            _fail(f"model.nemo_path is not set: {m.name} fine-tunes a base model restored from a .nemo file",
                  f"set model.nemo_path=/path/to/{r.model.name}.nemo (on storage every node mounts)")
        _same_seq(cfg, r.train.seq_length, "model.data.train_ds.max_seq_length")
        _check_file_list(cfg, "train_ds", needs_probabilities=True)
        _check_file_list(cfg, "validation_ds", needs_probabilities=False)
        if _get(cfg, "model.data.train_ds.packed_sequence"):
            if mbs != 1:
                _fail(f"packed sequences need micro batch size 1, got {mbs}",
                      "set train.micro_batch_size=1 or data.packed=false")
            bad = [f for f in _get(cfg, "model.data.train_ds.file_names") if not f.endswith(PACKED_SUFFIX)]
            if bad:
                _fail(f"model.data.train_ds.file_names {bad[0]} with packed_sequence: NeMo 1.23 np.loads each file "
                      "(GPTSFTPackedDataset), so it must be the packed .npy", "pack it once: vdkit data pack "
                      f"{bad[0]} <its .npy> --tokenizer <the model's tokenizer> --max-len {r.train.seq_length}")
        if not registry_probe and _get(cfg, "model.peft.peft_scheme") != m.peft_scheme:  # else the probe: NeMo's own map
            _fail(f"model.peft.peft_scheme={_get(cfg, 'model.peft.peft_scheme')!r} does not match method={m.name}",
                  f"set method.peft_scheme={m.peft_scheme}")
    else:
        for key in ("model.data.seq_length", "model.encoder_seq_length"):
            _same_seq(cfg, r.train.seq_length, key)
        prefix = _get(cfg, "model.data.data_prefix")
        ok = isinstance(prefix, list) and prefix and len(prefix) % 2 == 0 and all(
            isinstance(w, float) and isinstance(p, str) for w, p in zip(prefix[::2], prefix[1::2]))
        if not ok:
            _fail(f"model.data.data_prefix must be [weight, path, weight, path, ...], got {prefix!r}",
                  "set data.train_files to the Megatron-indexed shard prefixes (without .bin/.idx)")
        if not _get(cfg, "model.tokenizer.model"):
            _fail("model.tokenizer.model is not set: pretraining needs the SentencePiece model the shards were made with",
                  "put tokenizer.model in data.data_dir")


# ----------------------------------------------------------------------------- NVIDIA's Llama 2 recipes
# NVIDIA's settings are data (conf/nvidia/llama2_pretrain.yaml, read by vdkit.composition.config): the common
# ones, the per-size ones, and NeMo's llama defaults for models without an NVIDIA recipe.
_NVIDIA = nvidia_pretrain_tables()
NVIDIA_SOURCE: str = _NVIDIA["source"]
NVIDIA_PRETRAIN: Dict[str, Any] = dict(_NVIDIA["common"])
NVIDIA_PRETRAIN_BY_SIZE: Dict[str, Dict[str, Any]] = {k: dict(v) for k, v in _NVIDIA["by_size"].items()}


def nvidia_pretrain_at(model: str, key: str, launcher: str):
    """NVIDIA's value of ``key`` for ``model`` as launcher release ``launcher`` (a tag, e.g. "24.01") shipped it:
    the table's ``by_launcher`` where the value changed between releases, else ``by_size``.
    A published run is pinned at its launcher's value (its VP: 20 through 24.07, 5 from 24.09 for 70B)."""
    def tag(text: str) -> tuple:
        return tuple(int(x) for x in str(text).split("."))

    changes = _NVIDIA.get("by_launcher", {}).get(model, {}).get(key)
    if not changes:
        return NVIDIA_PRETRAIN_BY_SIZE[model][key]
    since = [t for t in changes if tag(t) <= tag(launcher)]
    if not since:
        raise ValueError(f"NVIDIA's launcher {launcher} predates the table's {key} for {model} ({sorted(changes)})")
    return changes[max(since, key=tag)]

# Where vdkit's pretraining config departs from NVIDIA's, and why. Everything else is NVIDIA's.
PRETRAIN_DEPARTURES: Dict[str, str] = {
    "model.global_batch_size": "the training design guide's GBS 144 (Table 4 is measured at it)",
    "model.tensor_model_parallel_size": "the training design guide's layout (7B TP 2, 70B TP 4)",
    "model.pipeline_model_parallel_size": "the training design guide's layout (7B PP 1, 70B PP 4)",
    "model.virtual_pipeline_model_parallel_size": "the planner's choice: the interleaving depth with the lowest "
                                                  "predicted step time (ties to the smaller), > 1 wherever PP > 1",
    "model.overlap_p2p_comm": "on exactly when the pipeline is interleaved (NeMo refuses it without VP > 1)",
    "model.batch_p2p_comm": "off exactly when overlap_p2p_comm is on (NeMo's rule)",
    "model.activations_checkpoint_granularity": "the plan's recompute mode (none unless memory needs it)",
    "model.ub_tp_comm_overlap": "off: userbuffers need an MPI bootstrap (srun --mpi=pmix) and a per-shape "
                                "ub_cfg file NeMo 1.23's YAML does not carry; the design guide ran without it",
    "exp_manager.step_timing_kwargs.buffer_size": "1: validation needs every step's own time, not a 5-step mean",
    "exp_manager.resume_if_exists": "true: the next allocation of a run longer than one (vdkit.planner.timeplan) resumes",
    "model.optim.name": "follows parallelism.distributed_optimizer (on by default, as NVIDIA's)",
    "model.optim.bucket_cap_mb": "distributed Adam only",
    "model.optim.overlap_grad_sync": "distributed Adam only",
    "model.optim.overlap_param_sync": "distributed Adam only",
    "model.optim.contiguous_grad_buffer": "distributed Adam only",
}
# NVIDIA's newer settings that NeMo 1.23 (container 24.01) cannot take: not rendered.
NOT_IN_NEMO_1_23: Dict[str, str] = {
    "model.apply_rope_fusion": "added to NeMo after 1.23",
    "model.cross_entropy_loss_fusion": "added to NeMo after 1.23",
}


NEMO_LLAMA_DEFAULTS: Dict[str, Any] = dict(_NVIDIA["nemo_llama_defaults"])


def nvidia_pretrain_settings(model_name: str) -> Dict[str, Any]:
    """NVIDIA's pretraining settings for one Llama 2 size (common + per size); {} for other models."""
    return _settings_for(model_name)
