"""The NeMo 1.x config a plan becomes: one full, self-contained YAML per run.

Two shapes, as NeMo 1.23 ships them (the container nvcr.io/nvidia/nemo:24.01.01 carries 1.23):

- fine-tuning (SFT = ``peft_scheme: none``, LoRA, P-tuning) in the shape of
  ``megatron_gpt_finetuning_config.yaml``, for ``tuning/megatron_gpt_finetuning.py``;
- pretraining in the shape of ``megatron_llama_config.yaml``, for ``megatron_gpt_pretraining.py``.

The rendered file replaces NeMo's YAML (``--config-name``), so it carries every key NeMo's holds:
NeMo's defaults where vdkit has no opinion, with its ``${...}`` interpolations resolved, and
everything the recipe and the plan decide. Numbers come from the plan's recipe, never re-typed.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional

from vdkit.run import rundir
from vdkit.planner.context import interpolation_factor
from vdkit.errors import UserError
from vdkit.recipes.nemo.contract import NEMO_LLAMA_DEFAULTS
from vdkit.recipes.nemo.performance import (PERFORMANCE_SETTINGS, fast_kernels, megatron_amp_o2, optimizer_name,
                                            renders_performance_settings)
from vdkit.recipes.common.training_constants import ADAM_BETAS, GPU_PRECISION, GRAD_CLIP
from vdkit.run.rundir import INDEX_MAPPING_DIR

# vdkit's own choices (each used once; the why is next to it).
VALIDATION_BATCHES = 1  # the single validation at the end of a timing run (run.mode=timing): one global batch
STEP_TIMING = {"sync_cuda": True, "buffer_size": 1}  # exact per-step times; validation does the stats
# ModelCfg's architecture words -> NeMo 1.x model config values.
# NeMo 1.23 has no plain ReLU MLP (activation_to_func lists gelu, *glu, squared-relu).
NEMO_ACTIVATIONS = {"swiglu": "fast-swiglu", "gelu": "gelu"}
NEMO_POSITION_EMBEDDINGS = {"rope": "rope", "learned": "learned_absolute"}
NEMO_ROTARY_BASE = 10000.0  # NeMo 1.23's default for model.rotary_base


# ----------------------------------------------------------------------------- paths

def _absolute(what: str, value: Optional[str], fix: str) -> PurePosixPath:
    """A path the job reads inside the container: it must be absolute (mounted at the same path)."""
    if not value:
        raise UserError(f"{what} is not set", fix)
    if not str(value).startswith("/"):
        raise UserError(f"{what}={value} is not an absolute path (the container sees host paths only "
                        "where they are mounted at the same place)", fix)
    return PurePosixPath(value)


def results_root(plan, run_dir) -> PurePosixPath:
    """:func:`vdkit.run.rundir.results_root`, which the container sees only when run.results_dir is absolute."""
    shared = plan.recipe.run.results_dir
    if shared:
        _absolute("run.results_dir", shared, "set run.results_dir to a directory every node mounts")
    return PurePosixPath(rundir.results_root(plan.recipe, run_dir))


def _data_files(data, names: List[str], key: str) -> List[str]:
    root = _absolute("data.data_dir", data.data_dir,
                     f"set data.data_dir to the prepared {data.name} directory (data={data.name} has none for engine=nemo)")
    if not names:
        raise UserError(f"data.{key} is empty for data={data.name}", f"set data.{key}=[<file>] (relative to data.data_dir)")
    return [str(root / n) for n in names]


def _probabilities(n: int) -> List[float]:
    """Equal sampling over n files, summing to exactly 1.0 (NeMo checks the sum)."""
    probs = [round(1.0 / n, 12)] * n
    probs[-1] = 1.0 - sum(probs[:-1])
    return probs


# ----------------------------------------------------------------------------- shared sections
def _trainer(plan, max_epochs: int) -> dict:
    r = plan.recipe
    t = r.train
    return {
        "devices": r.cluster.gpus_per_node,  # == srun --ntasks-per-node (Lightning insists)
        "accelerator": "gpu",
        "num_nodes": r.cluster.nodes,
        # fp8 too: Transformer Engine FP8 runs inside bf16 mixed precision. NVIDIA's performance settings
        # (recipe=fast) write "bf16": with megatron_amp_O2 NeMo 1.23's trainer builder picks the same
        # half-precision plugin for either spelling.
        "precision": PERFORMANCE_SETTINGS["trainer.precision"] if renders_performance_settings(r) else GPU_PRECISION,
        "logger": False,  # exp_manager provides the loggers
        "enable_checkpointing": False,  # exp_manager provides the checkpoint callback
        "use_distributed_sampler": False,
        "max_epochs": max_epochs,
        "max_steps": t.max_steps,
        "log_every_n_steps": r.engine.log_every_n_steps,
        # run.mode=timing: validation only after the last measured step, never inside the timed steps;
        # run.mode=train: every r.val_every steps on the validation split, train.val_batches batches.
        "val_check_interval": t.max_steps if r.timing else r.val_every,
        "limit_val_batches": VALIDATION_BATCHES if r.timing else t.val_batches,
        "num_sanity_val_steps": 0,
        "gradient_clip_val": GRAD_CLIP,
    }


def _exp_manager(plan, run_dir, name: str, checkpoint: dict) -> dict:

    from vdkit.planner.timeplan import hms

    root = results_root(plan, run_dir)
    times = plan.time  # the cadence and the allocation's budget (pinned values win)
    every = times.every_n_steps
    params = {
        **checkpoint,
        "dirpath": str(root / rundir.CHECKPOINT_DIR),
        "model_parallel_size": plan.tp * plan.pp,  # NeMo's CallbackParams: TP x PP
        # the checkpoint a max_time stop writes (exp_manager.py StatelessTimer calls _save_last_checkpoint)
        "save_last": True,
        **_retention(times.policy),
    }
    if every > 0:
        params["every_n_train_steps"] = every
        params["every_n_epochs"] = 0
    return {
        "explicit_log_dir": str(PurePosixPath(Path(run_dir).absolute()) / rundir.LOG_DIR),
        "exp_dir": str(root),
        "name": name,
        "create_wandb_logger": False,
        "wandb_logger_kwargs": {"project": None, "name": None},
        "create_tensorboard_logger": True,
        "log_step_timing": True,
        "step_timing_kwargs": dict(STEP_TIMING),
        # The next allocation (or a job requeued after a node failure) picks up the last checkpoint.
        "resume_if_exists": True,
        "resume_ignore_no_checkpoint": True,
        "create_checkpoint_callback": True,
        "checkpoint_callback_params": params,
        # Stop cleanly before the allocation ends (the job contract): NeMo's StatelessTimer counts from
        # the start of fit in every allocation (Lightning's trainer.max_time would carry the elapsed time
        # over in the checkpoint). The allocation less the stop's lead and the predicted start-up.
        "max_time_per_run": hms(max(60, times.stop_after_s - times.startup_s)),
    }


def _retention(policy) -> dict:
    """The plan's checkpoint policy (vdkit.planner.checkpoint_policy) in NeMo 1.23's CallbackParams words.

    Kept: the best ``save_top_k`` plus the ``-last`` one (``policy.keep`` in all). A timing run saves only
    when stopped: no top-k saves (``every_n_epochs`` 0: Lightning 2.0.7's ModelCheckpoint saves top-k at a
    validation's end only with every_n_epochs >= 1), no ``.nemo`` at the end; its ``-last`` is the stop's
    (NeMo 1.23 has no asynchronous checkpoint writer: ``policy.async_save`` does not apply)."""
    if policy.final == "none":
        return {"save_top_k": 1, "every_n_epochs": 0, "save_nemo_on_train_end": False, "always_save_nemo": False}
    return {"save_top_k": max(policy.keep - 1, 1)}


def _recompute(plan) -> dict:
    """Activation checkpointing from the plan: none, selective (attention core), full (uniform, every
    layer) or partial (block: the first parallelism.recompute_num_layers of each stage): vdkit.planner.recompute."""
    from vdkit.planner import recompute

    return recompute.nemo(plan.recipe.parallelism)


def _parallel(plan) -> dict:
    p = plan.recipe.parallelism
    out = {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp}
    if p.cp > 1:  # NeMo 1.23 reads model.context_parallel_size (megatron_base_model.py: initialize_model_parallel)
        out["context_parallel_size"] = p.cp
    if p.vp and p.vp > 1:
        out["virtual_pipeline_model_parallel_size"] = p.vp
    return out


def _optim(plan, constant_steps: int, extra_sched: dict, nvidia: Optional[dict] = None) -> dict:
    """The optimizer section; ``nvidia`` (pretraining) supplies NVIDIA's betas and distributed-Adam overlaps.

    Learning rates are the method's (pretraining's default to NVIDIA's per size: conf/method/pretrain.yaml)."""
    m = plan.recipe.method
    nvidia = nvidia or {}
    name = optimizer_name(plan)
    optim = {
        "name": name,
        "lr": float(m.lr),
        "weight_decay": float(m.weight_decay),
        "betas": list(nvidia.get("model.optim.betas", ADAM_BETAS)),
        "sched": {
            "name": "CosineAnnealing",
            "warmup_steps": m.warmup_steps,
            "constant_steps": constant_steps,
            "min_lr": float(m.min_lr),
            **extra_sched,
        },
    }
    if plan.recipe.train.optimizer_dtype != "fp32" and name == "distributed_fused_adam":
        # Apex's state and gradient-buffer dtype, as NVIDIA's SFT launcher config sets them (the memory model counts
        # them: conf/calibration/memory.yaml bf16_optimizer_bytes); composition refuses it without this optimizer
        optim["dtype"] = optim["grad_sync_dtype"] = plan.recipe.train.optimizer_dtype
    if m.optimizer == "distributed_fused_adam" and "model.optim.bucket_cap_mb" in nvidia:
        for key in ("bucket_cap_mb", "overlap_grad_sync", "overlap_param_sync", "contiguous_grad_buffer"):
            optim[key] = nvidia[f"model.optim.{key}"]
    return optim


def _fp8(plan) -> dict:
    return {"fp8": True, "fp8_hybrid": True} if plan.recipe.train.precision == "fp8" else {}


# ----------------------------------------------------------------------------- fine-tuning
def _sft_dataset(plan, files, max_seq: int, train: bool, index_dir: str) -> dict:
    """One of train_ds / validation_ds / test_ds, NeMo's defaults with interpolations resolved."""
    t = plan.recipe.train
    ds = {
        "file_names": files,
        "global_batch_size": t.global_batch_size,
        "micro_batch_size": t.micro_batch_size,
        "shuffle": train,
        "num_workers": 0,
        "memmap_workers": 2,
        "pin_memory": True,
        "max_seq_length": max_seq,
        "min_seq_length": 1,
        "drop_last": train,
    }
    if train:
        ds["concat_sampling_probabilities"] = _probabilities(len(files))
    else:
        ds["names"] = None
    ds.update({"label_key": "output", "add_eos": True, "add_sep": False, "add_bos": False})
    if not train:
        ds.update({"write_predictions_to_file": False, "output_file_path_prefix": None})
    ds.update({"truncation_field": "input", "index_mapping_dir": index_dir, "prompt_template": "{input} {output}"})
    if not train:
        ds["tokens_to_generate"] = 32
    ds["truncation_method"] = "right"
    if not train:
        ds["metric"] = {"name": "loss", "average": None, "num_classes": None}
    return ds


def _peft(plan) -> dict:
    m = plan.recipe.method
    return {
        "peft_scheme": m.peft_scheme,
        "restore_from_path": None,
        "adapter_tuning": {
            "type": "parallel_adapter", "adapter_dim": 32, "adapter_dropout": 0.0, "norm_position": "pre",
            "column_init_method": "xavier", "row_init_method": "zero", "norm_type": "mixedfusedlayernorm",
            "layer_selection": None, "weight_tying": False, "position_embedding_strategy": None,
        },
        "lora_tuning": {
            "adapter_dim": m.lora_adapter_dim,
            "adapter_dropout": float(m.lora_dropout),
            "column_init_method": "xavier",
            "row_init_method": "zero",
            "layer_selection": None,
            "weight_tying": False,
            "position_embedding_strategy": None,
        },
        "p_tuning": {
            "virtual_tokens": m.ptuning_virtual_tokens,
            "bottleneck_dim": m.ptuning_bottleneck_dim,
            "embedding_dim": m.ptuning_embedding_dim,
            "init_std": 0.023,
        },
        "ia3_tuning": {"layer_selection": None},
        "selective_tuning": {"tunable_base_param_names": ["self_attention", "word_embeddings"]},
    }


def finetune_config(plan, run_dir) -> dict:
    """megatron_gpt_finetuning.py's config (SFT, LoRA, P-tuning) for ``plan``, rendered for ``run_dir``."""
    r = plan.recipe
    t, m, d = r.train, r.method, r.data
    name = f"megatron_gpt_peft_{m.peft_scheme}_tuning"  # NeMo's own formula
    nemo_path = r.model.nemo_path
    if nemo_path:
        nemo_path = str(_absolute("model.nemo_path", nemo_path, "give the .nemo file's absolute path"))
    index_dir = str(results_root(plan, run_dir) / INDEX_MAPPING_DIR)
    train_files = _data_files(d, d.train_files, "train_files")
    if d.packed:  # NeMo 1.23's GPTSFTPackedDataset np.loads each file: the packed .npy, never the JSONL
        from vdkit.recipes.common.packing import packed_files

        train_files = [npy for _jsonl, npy in packed_files(r)]
    train_ds = _sft_dataset(plan, train_files, t.seq_length, True, index_dir)
    if d.packed:
        train_ds["packed_sequence"] = True
    validation_ds = _sft_dataset(plan, _data_files(d, d.validation_files, "validation_files"), t.seq_length,
                                 False, index_dir)
    test_ds = _sft_dataset(plan, _data_files(d, d.test_files, "test_files") if d.test_files else None,
                           t.seq_length, False, index_dir)
    model = {
        "seed": t.seed,
        **_parallel(plan),
        # merge_cfg_with lays cfg.model over the restored .nemo config: the interpolation reaches the model
        **({"seq_len_interpolation_factor": interpolation_factor(r.model)} if interpolation_factor(r.model) else {}),
        "global_batch_size": t.global_batch_size,
        "micro_batch_size": t.micro_batch_size,
        "restore_from_path": nemo_path,
        "resume_from_checkpoint": None,
        "save_nemo_on_validation_end": False,
        "sync_batch_comm": False,
        # O2 (bf16 weights with fp32 main params) for full-parameter training, as Dell's SFT runs; for every
        # method in the fast recipe, as NVIDIA's performance settings; PEFT otherwise keeps fp32 weights.
        "megatron_amp_O2": megatron_amp_o2(r),
        "sequence_parallel": bool(r.parallelism.sequence_parallel),
        **_recompute(plan),
        "activations_checkpoint_layers_per_pipeline": None,
        "answer_only_loss": True,
        "gradient_as_bucket_view": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "ffn_dropout": 0.0,
        **_fp8(plan),
        **fast_kernels(plan),
        "peft": _peft(plan),
        "data": {"train_ds": train_ds, "validation_ds": validation_ds, "test_ds": test_ds},
        "optim": _optim(plan, 0, {"monitor": "val_loss", "reduce_on_plateau": False}),
    }
    checkpoint = {
        "monitor": "validation_loss",
        "mode": "min",
        # run.mode=train: the best checkpoint (lowest validation loss) restored and exported as a .nemo
        # at the end (LoRA / P-tuning: the adapter .nemo, served with the base); a timing run exports none.
        "save_nemo_on_train_end": not r.timing,
        "filename": f"{name}--{{validation_loss:.3f}}-{{step}}-{{consumed_samples}}",
        "always_save_nemo": False,
        "save_best_model": not r.timing,
    }
    exp = _exp_manager(plan, run_dir, name, checkpoint)
    # A timing run must run exactly max_steps: no early stop on a validation that has not happened.
    exp["create_early_stopping_callback"] = False
    exp["early_stopping_callback_params"] = {"monitor": "val_loss", "mode": "min", "min_delta": 0.001,
                                             "patience": 10, "verbose": True, "strict": False}
    return {"name": name, "trainer": _trainer(plan, max_epochs=9999), "exp_manager": exp, "model": model}


# ----------------------------------------------------------------------------- pretraining
def _llama_architecture(plan, nvidia: dict) -> dict:
    """The Llama 2 architecture: sizes from ModelCfg, NVIDIA's init std, the rest NeMo's llama defaults."""
    mc, t = plan.recipe.model, plan.recipe.train
    interleaved = (plan.recipe.parallelism.vp or 1) > 1
    if mc.activation not in NEMO_ACTIVATIONS:
        raise UserError(f"model {mc.name} uses activation={mc.activation}, which NeMo 1.x's GPT model has not",
                        "use engine=reference or engine=megatron for this model")
    arch = {
        "encoder_seq_length": t.seq_length,
        "max_position_embeddings": mc.max_position_embeddings,
        "num_layers": mc.num_layers,
        "hidden_size": mc.hidden_size,
        "ffn_hidden_size": mc.ffn_hidden_size,
        "num_attention_heads": mc.num_attention_heads,
        "init_method_std": float(nvidia.get("model.init_method_std", NEMO_LLAMA_DEFAULTS["model.init_method_std"])),
        "use_scaled_init_method": True,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "ffn_dropout": 0.0,
        "kv_channels": None, "apply_query_key_layer_scaling": True,
        "normalization": mc.norm, "layernorm_epsilon": mc.norm_eps, "do_layer_norm_weight_decay": False,
        "make_vocab_size_divisible_by": 128, "pre_process": True, "post_process": True,
        "persist_layer_norm": True, "bias": mc.bias, "activation": NEMO_ACTIVATIONS[mc.activation],
        "headscale": False,
        "transformer_block_type": "pre_ln", "openai_gelu": False, "normalize_attention_scores": True,
        "position_embedding_type": NEMO_POSITION_EMBEDDINGS[mc.position_embedding], "rotary_percentage": 1.0,
        "attention_type": "multihead",
        "share_embeddings_and_output_weights": mc.tied_embeddings,
        # NVIDIA overlaps pipeline sends with compute; NeMo allows it only with an interleaved pipeline.
        "overlap_p2p_comm": interleaved, "batch_p2p_comm": not interleaved,
        "num_query_groups": mc.num_query_groups,
    }
    if mc.rope_base != NEMO_ROTARY_BASE:  # NeMo's model reads cfg.rotary_base (default 10000)
        arch["rotary_base"] = mc.rope_base
    factor = interpolation_factor(mc)  # the only RoPE scaling NeMo 1.23 has (vdkit.planner.context.check refuses others)
    if factor:
        arch["seq_len_interpolation_factor"] = factor
    return arch


def pretrain_config(plan, run_dir) -> dict:
    """megatron_gpt_pretraining.py's config (megatron_llama_config.yaml's shape) for ``plan``."""
    r = plan.recipe
    t, d = r.train, r.data
    name = "megatron_llama"
    prefixes = _data_files(d, d.train_files, "train_files")
    weights = _probabilities(len(prefixes))
    data_root = PurePosixPath(d.data_dir)
    # The SentencePiece model the shards were tokenized with: data.tokenizer_model, else beside them.
    tokenizer = d.tokenizer_model or str(data_root / "tokenizer.model")
    p = r.parallelism
    from vdkit.recipes.nemo.contract import NVIDIA_PRETRAIN, nvidia_pretrain_settings

    nvidia = nvidia_pretrain_settings(r.model.name)  # NVIDIA's launcher settings; departures in nemo_contract
    nvidia_common = nvidia or NVIDIA_PRETRAIN  # kernels, betas, overlaps: NVIDIA's for any model
    parallel = _parallel(plan)
    parallel.setdefault("virtual_pipeline_model_parallel_size", None)
    model = {
        "mcore_gpt": True,
        "micro_batch_size": t.micro_batch_size,
        "global_batch_size": t.global_batch_size,
        **parallel,
        **_llama_architecture(plan, nvidia),
        "tokenizer": {"library": r.model.tokenizer, "type": None, "model": tokenizer, "vocab_file": None,
                      "merge_file": None, "delimiter": None, "sentencepiece_legacy": False},
        "native_amp_init_scale": 4294967296, "native_amp_growth_interval": 1000, "hysteresis": 2,
        "fp32_residual_connection": False, "fp16_lm_cross_entropy": False,
        "megatron_amp_O2": True,
        "grad_allreduce_chunk_size_mb": 125,
        # NVIDIA's fusions (also for models without a published recipe: they are pure kernel choices).
        "grad_div_ar_fusion": True, "gradient_accumulation_fusion": True, "bias_activation_fusion": True,
        "bias_dropout_add_fusion": True, "masked_softmax_fusion": True, "get_attention_mask_from_fusion": True,
        "seed": t.seed,
        "resume_from_checkpoint": None, "use_cpu_initialization": False, "onnx_safe": False,
        "apex_transformer_log_level": 30, "gradient_as_bucket_view": True, "sync_batch_comm": False,
        **_recompute(plan),
        "num_micro_batches_with_partial_activation_checkpoints": None,
        "activations_checkpoint_layers_per_pipeline": None,
        "sequence_parallel": bool(p.sequence_parallel),
        "transformer_engine": True,
        "fp8": t.precision == "fp8", "fp8_e4m3": False, "fp8_hybrid": True, "fp8_margin": 0, "fp8_interval": 1,
        "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max", "reduce_amax": True, "use_emha": False,
        "use_flash_attention": True, "gc_interval": 100,
        "data": {
            "data_prefix": [x for w, pfx in zip(weights, prefixes) for x in (w, pfx)],
            "index_mapping_dir": str(results_root(plan, run_dir) / INDEX_MAPPING_DIR),
            "data_impl": "mmap", "splits_string": "99990,8,2", "seq_length": t.seq_length, "skip_warmup": True,
            "num_workers": 2, "dataloader_type": "single", "reset_position_ids": False,
            "reset_attention_mask": False, "eod_mask_loss": False, "validation_drop_last": True,
            "no_seqlen_plus_one_input_tokens": False, "pad_samples_to_global_batch_size": False,
            "shuffle_documents": True,
        },
        "nsys_profile": {"enabled": False, "start_step": 10, "end_step": 10, "ranks": [0], "gen_shape": False},
        "optim": _optim(plan, 0, {}, nvidia_common),
    }
    trainer = _trainer(plan, max_epochs=-1)
    trainer.update({"limit_test_batches": 500, "accumulate_grad_batches": 1, "benchmark": False,
                    "enable_model_summary": False})
    checkpoint = {
        "monitor": "val_loss", "mode": "min", "always_save_nemo": False,
        "save_nemo_on_train_end": not plan.recipe.timing,  # run.mode=train: the final weights as a .nemo
        "filename": "megatron_gpt--{val_loss:.2f}-{step}-{consumed_samples}",
    }
    return {"name": name, "restore_from_path": None, "trainer": trainer,
            "exp_manager": _exp_manager(plan, run_dir, name, checkpoint), "model": model}


def build_config(plan, run_dir) -> Dict:
    """The config for the plan's method (pretrain or a fine-tuning method)."""
    if plan.recipe.method.name == "pretrain":
        return pretrain_config(plan, run_dir)
    return finetune_config(plan, run_dir)

