"""The plan as Megatron-Bridge's own configuration: a ``ConfigContainer`` in Bridge's YAML form.

``bridge_config(plan, run_dir)`` returns the dict a rank loads with Bridge's own
``ConfigContainer.from_yaml`` (``megatron/bridge/training/utils/config_utils.py``): every section a
``_target_`` (Bridge's dataclass) plus the values the plan sets; every field not written keeps
Bridge's default. It is written into the run dir as ``bridge.yaml`` - a site engineer reads and edits
it, and the job runs what the file says (the rank reads the file, not the plan). Pure Python: render
needs no Bridge install.

What comes from where:

- model: Bridge's Llama 2 / 3.1 providers (``Llama2ModelProvider7B/13B/70B``, ``Llama31ModelProvider8B/70B``),
  its Qwen2.5 one (``Qwen25ModelProvider7B``: Q/K/V biases); other Llama-architecture models:
  ``LlamaModelProvider`` (``Qwen2ModelProvider`` with ``model.qkv_bias``) with their sizes; the planned TP / PP / VP / SP, recompute,
  sequence length; NVIDIA's fusions on (the step time is predicted for this fused stack);
- train / optimizer / scheduler / ddp: GBS, MBS, steps; Adam with the kit's betas and clipping
  (vdkit.recipes.common.training_constants), the method's LR / min LR / warm-up / weight decay, cosine
  decay; distributed optimizer as planned (grad reduce / param gather overlapped on GPUs);
- dataset: the kit's prepared JSONL (``input`` / ``output``; NeMo's prompt template, answer-only
  loss) through Bridge's ``FinetuningDatasetConfig``; with a tokenizer that carries a chat template
  (Instruct models), Bridge's chat dataset on the rows' ``messages`` with that template, the loss on the
  assistant's turn only (:mod:`vdkit.recipes.bridge.chat`); packed sequences (``data.packed``, on with
  ``recipe=fast``) through its ``PackedSequenceSpecs``; pretraining: Megatron indexed prefixes
  (``GPTDatasetConfig``), or Bridge's mock data for ``data=synthetic``;
- peft: Bridge's LoRA on the fused QKV projection, the method's adapter dim (NeMo 1.23's targets,
  what the planner counts); SFT and pretraining: none;
- checkpoint: torch_dist under the run's checkpoint dir (resumes from it), fine-tuning from
  ``model.megatron_path`` (``pretrained_checkpoint``: a Bridge checkpoint, made once from HF
  weights by ``AutoBridge.import_ckpt``; see :mod:`vdkit.recipes.bridge.convert`).
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Dict, Optional

from vdkit.planner import lora_targets, recompute
from vdkit.planner.context import interpolation_factor, llama3_factor
from vdkit.errors import UserError
from vdkit.recipes.bridge.tokenizer import chat_template, tokenizer_model  # bridge.yaml's tokenizer section
from vdkit.recipes.bridge.chat import DATASET_KWARGS as CHAT_DATASET_KWARGS  # Bridge's chat dataset switches
from vdkit.recipes.bridge import cuda_graphs  # train.cuda_graphs: what megatron-core runs per-layer graphs with
from vdkit.recipes.bridge.userbuffers import ub_overlap_cfg  # parallelism.tp_comm_overlap_cfg
from vdkit.run.rundir import BRIDGE_CONFIG_FILE as CONFIG_FILE  # noqa: F401  (what the ranks load)
from vdkit.run.rundir import BRIDGE_RESOLVED_FILE as RESOLVED_FILE  # noqa: F401  (rank 0: Bridge's to_yaml)


_T = "_target_"
_CFG = "megatron.bridge.training.config."
PROVIDERS = {  # model.name -> Bridge's provider class (its dimensions are the model card's)
    "llama2_7b": "megatron.bridge.models.llama.llama_provider.Llama2ModelProvider7B",
    "llama2_13b": "megatron.bridge.models.llama.llama_provider.Llama2ModelProvider13B",
    "llama2_70b": "megatron.bridge.models.llama.llama_provider.Llama2ModelProvider70B",
    # Llama 3.1: Bridge's own (rope_scaling True, rope_scaling_factor 8, rotary_base 500000: llama_provider.py
    # Llama31ModelProvider); a generic LlamaModelProvider without the scaling is another model than the weights
    "llama3_1_8b": "megatron.bridge.models.llama.llama_provider.Llama31ModelProvider8B",
    "llama3_1_70b": "megatron.bridge.models.llama.llama_provider.Llama31ModelProvider70B",
    # Qwen2.5: the Llama block with biases on Q, K and V only (qwen_provider.py Qwen2ModelProvider: add_qkv_bias
    # True, add_bias_linear False, RMSNorm eps 1e-6, rotary_base 1e6; Qwen25ModelProvider7B: the model card's sizes)
    "qwen2_5_7b": "megatron.bridge.models.qwen.qwen_provider.Qwen25ModelProvider7B",
}
GENERIC_PROVIDER = "megatron.bridge.models.llama.llama_provider.LlamaModelProvider"
GENERIC_QKV_BIAS_PROVIDER = "megatron.bridge.models.qwen.qwen_provider.Qwen2ModelProvider"  # model.qkv_bias: true
# Bridge's mixed-precision recipe names (training/mixed_precision.py). FP8: per-tensor current scaling, what
# NVIDIA's H100 performance configs run ("fp8_cs"); the delayed-scaling preset is marked experimental there.
# Both turn on fp8_param_gather, which needs the distributed optimizer (refused at the door otherwise).
PRECISION = {"bf16": "bf16_mixed", "fp8": "bf16_with_fp8_current_scaling_mixed"}
# train.optimizer_dtype=bf16: megatron-core 0.16.1's precision-aware distributed optimizer (optimizer/
# optimizer_config.py:187-206; it needs the distributed optimizer, :378-380, refused at the door without it, and
# Transformer Engine's FusedAdam, :385-402, which the image's TE 2.12 is): Adam's m and v in bf16; the master copy
# stays fp32 (megatron-core's own: Bridge's presets leave the optimizer an fp8_recipe, so no 16-bit remainders).
# main_grads_dtype is not rendered: megatron-core 0.16.1 reads it only in its own assertion (the gradient buffer's
# dtype is ddp.grad_reduce_in_fp32, which the mixed-precision preset sets). The bytes: conf/calibration/memory.yaml
# bf16_optimizer_bytes.bridge.
BF16_OPTIMIZER_STATE = ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype")


def _bf16_optimizer_state() -> dict:
    """The optimizer keys of BF16_OPTIMIZER_STATE, each dtype its own mapping (one YAML node each, no anchors): a
    torch dtype as Bridge's YAML writes one (utils/yaml_utils.py:120)."""
    on, *dtypes = BF16_OPTIMIZER_STATE
    return {on: True, **{k: {_T: "torch.bfloat16", "_call_": False} for k in dtypes}}
# train.swiglu_input_dtype=fp8: megatron-core 0.16.1's TransformerConfig field (transformer/transformer_config.py:176)
# that makes the fused SwiGLU (bias_activation_fusion, on below: transformer/mlp.py:204 bias_swiglu_impl) save its
# input for backward as an unscaled float8_e4m3fn copy, cast back in backward (fusions/fused_bias_swiglu.py:163, :166,
# :186). NVIDIA's MLPerf LoRA runs set it (v5.1 FP8_ACT=1 -> activation_func_fp8_input_store, v4.0's H200 config
# FP8_ACTIVATION); Bridge 0.3.1's own recipes do not, so it is the user's choice. TransformerConfig.__post_init__ checks
# it (SwiGLU only, :1526-1528), which `vdkit check` runs through Bridge's runtime_config_update. The bytes:
# conf/calibration/memory.yaml swiglu_input_bytes.
SWIGLU_FP8_INPUT_STORE = "activation_func_fp8_input_store"
# train.fp8_attention: megatron-core 0.16.1's TransformerConfig.fp8_dot_product_attention (transformer/transformer_config.py
# :477), handed to Transformer Engine's recipe as fp8_dpa (fp8_utils.py:563, extensions/transformer_engine.py:2210); MLPerf's
# FP8_DPA. It is a MixedPrecisionConfig field too, and Bridge 0.3.1's runtime_config_update copies every such field onto
# the model config (training/config.py:1864 -> mixed_precision.py:125-143): a model-level true is overwritten by the
# preset's false. So it is set in mixed_precision itself, written out as Bridge's FP8 preset's fields
# (FP8_PRESET_FIELDS: bf16_with_fp8_current_scaling_mixed, mixed_precision.py:272-290 over bf16_mixed :172-184;
# tests/test_fp8_attention.py holds them to Bridge's own) plus this one.
FP8_ATTENTION = "fp8_dot_product_attention"
_BF16 = {_T: "torch.bfloat16", "_call_": False}
FP8_PRESET_FIELDS = {"bf16": True, "params_dtype": _BF16, "pipeline_dtype": _BF16, "autocast_enabled": False,
                     "grad_reduce_in_fp32": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                     "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
                     "fp8_param_gather": True}
# Transformer Engine 2.12 (the image's) has no FP8 attention backend for current scaling below sm100 (attention/
# dot_product_attention/utils.py:491-495 disables FusedAttention, :473-486 FlashAttention and the unfused path): on
# H100 / H200 the run would stop with no backend. TE's documented switch for FP8CS linears keeps attention on delayed
# scaling (dot_product_attention.py:99-111 "FP8CS | FP8DS", :603-614): rendered in the job's environment.
FP8_ATTENTION_ENV = {"NVTE_DPA_FP8_RECIPE": "DelayedScaling"}
FUSIONS = ("bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion", "persist_layer_norm",
           "apply_rope_fusion", "gradient_accumulation_fusion", "cross_entropy_loss_fusion")
# The interleaved (VP) schedule's stage-to-stage sends as NVIDIA runs them: overlapped, not batched -
# Bridge's CommOverlapConfig (training/comm_overlap.py:451-454) and Megatron-LM (Bridge's
# mlm_compat/arguments.py:69: batch_p2p_comm = not overlap_p2p_comm). The model's own default is
# batch_p2p_comm=True (mcore model_parallel_config.py:302), and with PP 2 the batched sends
# (mcore pipeline_parallel/p2p_communication.py:16-48: send_prev, recv_prev, send_next, recv_next on
# one communicator) give the peer its activation and its gradient in the other order from the one
# it receives them in - measured on gloo: from the third micro-batch on, a stage's input was the
# other stage's gradient. The unbatched ops keep the two directions on two communicators (:65-76).
INTERLEAVED_P2P = {"overlap_p2p_comm": True, "batch_p2p_comm": False}
# TP overlap with a frozen base (PEFT: Bridge freezes every base weight): megatron-core's defaults
# (model_parallel_config.py:192-199, both true) make TE's QKV and fc1 LayerNormLinear reduce-scatter their input
# gradient only inside the weight-gradient GEMM's bulk overlap, which a frozen weight never runs - TE 2.12 keeps each
# rank's own partial sum (layernorm_linear.py:727-728, 755-756, 781, 937-941; TE 1.5-1.13 switched the bulk overlaps
# off for a frozen weight, 2.x dropped that). Off, TE reduce-scatters it with NCCL (layernorm_linear.py:757-766) and
# does not gather an input no wgrad GEMM reads. NVIDIA's NeMo LoRA recipe sets bulk dgrad off too
# (scripts/performance/llm/finetune_llama3_70b.py). docs/bridge-h100.md, runcheck_tp_overlap.py checks it.
FROZEN_BASE_TP_OVERLAP = {"tp_comm_bulk_wgrad": False, "tp_comm_bulk_dgrad": False}
# (upstream file under site-packages/megatron, line, text that line holds, what it decides here): the
# lines the configuration above and the rank's CPU changes answer; tests/test_bridge_shim.py fails when
# one moves, as for the shim's patches.
UPSTREAM = (
    ("core/model_parallel_config.py", 302, "batch_p2p_comm: bool = True", "the model's default: batched p2p"),
    ("core/pipeline_parallel/p2p_communication.py", 16, "def _batched_p2p_ops(",
     "one communicator for both directions: with PP 2 the peer's activation and gradient cross"),
    ("core/pipeline_parallel/p2p_communication.py", 66, "if group.size() == 2",
     "unbatched ops: a second communicator for PP 2"),
    ("bridge/training/comm_overlap.py", 453, "comm_overlap_cfg.overlap_p2p_comm = True", "NVIDIA's VP setting"),
    ("bridge/training/comm_overlap.py", 454, "comm_overlap_cfg.batch_p2p_comm = False", "NVIDIA's VP setting"),
    ("bridge/training/mlm_compat/arguments.py", 69, 'kw_args["batch_p2p_comm"] = not args.overlap_p2p_comm',
     "Megatron-LM's rule"),
    ("core/pipeline_parallel/schedules.py", 259, "if not config.calculate_per_token_loss:",
     "the default loss: a mean per micro-batch (per_token_loss)"),
    ("core/distributed/distributed_data_parallel.py", 256, "not self.ddp_config.average_in_collective",
     "per-token loss: DDP sums, no averaging in the collective"),
    ("bridge/data/samplers.py", 289, "self.data_parallel_rank,",
     "the fine-tuning sampler deals samples to DP ranks interleaved"),
    ("core/pipeline_parallel/schedules.py", 165, "out.data = torch.empty((1,), device=out.device, dtype=out.dtype)",
     "a sent output freed at once: the rank keeps it on CPU (train.make_cpu_runnable)"),
)
# NVIDIA's H100 settings the bridge engine renders (docs/bridge-h100.md: each adopted or departed from, why):
# Bridge 0.3.1's Llama recipes (manual GC, workers) and its performance plugin (LayerNorm SM margin).
NVIDIA_H100 = {"manual_gc_interval": 100, "num_workers_pretrain": 8, "num_workers_finetune": 1,
               "layernorm_sm_margin": 16}
PRETRAIN_SPLIT = "99990,8,2"  # NVIDIA's Llama 2 launcher (NeMo-Framework-Launcher's llama2 configs)
SFT_DATASET_KWARGS = {"prompt_template": "{input} {output}", "label_key": "output", "truncation_field": "input",
                      "answer_only_loss": True}  # NeMo's SFT conventions, as the kit's other engines


def provider_target(model) -> str:
    """Bridge's provider class for ``model`` (a Llama-architecture ModelCfg; with ``qkv_bias``: Qwen2's)."""
    return PROVIDERS.get(model.name, GENERIC_QKV_BIAS_PROVIDER if model.qkv_bias else GENERIC_PROVIDER)


def check_model(recipe) -> None:
    """Refuse models Bridge's Llama and Qwen2 providers cannot express."""
    m = recipe.model
    if m.arch != "llama" or m.position_embedding != "rope" or m.bias or m.activation != "swiglu":
        raise UserError(f"engine=bridge builds Llama-architecture models from Bridge's Llama and Qwen2 providers; "
                        f"model={m.name} is {m.arch}", "use a Llama model (llama2_7b/13b/70b, tiny_llama) "
                        "or engine=reference for other architectures")


def per_token_loss(recipe) -> bool:
    """Fine-tuning averages the loss over the global batch's answer tokens, not per micro-batch.

    Answer-only loss gives each sample its own token count, and Bridge's fine-tuning sampler deals a
    global batch to the data-parallel ranks interleaved (``data/samplers.py:284-291``): with the model's
    default per-micro-batch mean (``calculate_per_token_loss=False``, mcore ``pipeline_parallel/
    schedules.py:259``) the gradient depends on which samples share a micro-batch, so DP2 trained a
    different model from one rank's (grad norm 2.92 vs 3.08 at step 1, measured). Per token, the
    gradient is the global batch's and every layout's is the same. (DDP then must not average in the
    collective: mcore ``distributed/distributed_data_parallel.py:254-257``.) Pretraining counts every
    token of fixed-length sequences, where the two agree: NVIDIA's default stays."""
    return recipe.method.name != "pretrain"


def _model(plan) -> dict:
    r, p = plan.recipe, plan.recipe.parallelism
    m = r.model
    out = {_T: provider_target(m)}
    if m.name not in PROVIDERS:  # the provider carries no sizes of its own: say them
        out.update(num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
                   num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
                   vocab_size=m.vocab_size, layernorm_epsilon=m.norm_eps, rotary_base=m.rope_base,
                   share_embeddings_and_output_weights=bool(m.tied_embeddings), add_qkv_bias=bool(m.qkv_bias))
    vp = p.vp if (p.vp or 1) > 1 else None
    out.update(tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
               virtual_pipeline_model_parallel_size=vp)
    if vp:
        out.update(INTERLEAVED_P2P)
    out.update(sequence_parallel=bool(p.sequence_parallel), context_parallel_size=p.cp, seq_length=r.train.seq_length)
    out.update(_rope(m))
    if per_token_loss(r):
        out.update(calculate_per_token_loss=True)
    out.update(recompute.mcore(p))
    out.update({k: True for k in FUSIONS})  # NVIDIA's fused stack (what the plan predicts: vdkit.planner.predict "fused")
    if r.train.swiglu_input_dtype == "fp8":
        out[SWIGLU_FP8_INPUT_STORE] = True
    out.update(cuda_graphs.model_fields(r))  # train.cuda_graphs=layer (vdkit.recipes.bridge.cuda_graphs)
    return out


def _rope(m) -> dict:
    """RoPE scaling as megatron-core's GPTModel takes it (vdkit.planner.context: llama3 or linear)."""
    if llama3_factor(m):
        return {"rope_scaling": True, "rope_scaling_factor": llama3_factor(m)}
    if interpolation_factor(m):
        return {"seq_len_interpolation_factor": interpolation_factor(m)}
    return {}


def _optimizer_scheduler(plan):
    from vdkit.recipes.common.training_constants import GRAD_CLIP, adam_betas

    r = plan.recipe
    m, p = r.method, r.parallelism
    beta1, beta2 = adam_betas(r)  # pretraining: NVIDIA's 0.95 (Bridge's recipes/utils/optimizer_utils.py too)
    opt = {_T: _CFG + "OptimizerConfig", "optimizer": "adam", "lr": m.lr, "min_lr": m.min_lr,
           "weight_decay": m.weight_decay, "adam_beta1": beta1, "adam_beta2": beta2,
           "adam_eps": 1e-8, "clip_grad": GRAD_CLIP, "use_distributed_optimizer": bool(p.distributed_optimizer),
           "bf16": True}
    if r.train.optimizer_dtype == "bf16":
        opt.update(_bf16_optimizer_state())
    steps = r.train.max_steps
    sched = {_T: _CFG + "SchedulerConfig", "lr_decay_style": "cosine",
             "lr_warmup_iters": min(m.warmup_steps, max(steps - 1, 0)), "lr_warmup_init": 0.0,
             "lr_decay_iters": steps, "start_weight_decay": m.weight_decay, "end_weight_decay": m.weight_decay,
             "weight_decay_incr_style": "constant"}
    return opt, sched


def _workers(recipe, in_container: bool, here: int) -> int:
    """Data-loader workers: NVIDIA's in the container (Bridge's Llama pretraining recipes 8, fine-tuning 1);
    ``here`` on this machine's CPU runs."""
    if not in_container:
        return here
    return NVIDIA_H100["num_workers_pretrain"] if recipe.method.name == "pretrain" else NVIDIA_H100["num_workers_finetune"]


def _dataset(plan, run_dir, in_container: bool = False, chat: bool = False) -> dict:
    r = plan.recipe
    d, t = r.data, r.train
    if r.method.name == "pretrain" and d.kind == "pretrain":
        base = PurePosixPath(d.data_dir)
        return {_T: _CFG + "GPTDatasetConfig", "random_seed": t.seed, "seq_length": t.seq_length,
                "blend": [[str(base / f) for f in d.train_files], None], "split": PRETRAIN_SPLIT,
                "reset_attention_mask": False, "reset_position_ids": False, "eod_mask_loss": False,
                "num_dataset_builder_threads": 1, "dataloader_type": "single",
                "num_workers": _workers(r, in_container, 2), "data_sharding": True}
    if r.method.name == "pretrain":  # data=synthetic: Bridge's own mock data (learnable sequences)
        return {_T: _CFG + "MockGPTDatasetConfig", "random_seed": t.seed, "seq_length": t.seq_length,
                "reset_attention_mask": False, "reset_position_ids": False, "eod_mask_loss": False,
                "num_dataset_builder_threads": 1, "dataloader_type": "single",
                "num_workers": _workers(r, in_container, 0), "data_sharding": True}
    from vdkit.recipes.bridge.data import dataset_root

    out = {_T: _CFG + "FinetuningDatasetConfig", "dataset_root": str(dataset_root(r, run_dir)),
           "seq_length": t.seq_length, "seed": t.seed, "dataloader_type": "batch",
           "num_workers": _workers(r, in_container, 0),
           # run.mode=train: Bridge's validation on <dataset_root>/validation.jsonl; timing: none
           "do_validation": not r.timing, "do_test": False,
           # an Instruct tokenizer's chat template: Bridge's chat dataset on `messages` rows (.chat)
           "dataset_kwargs": dict(CHAT_DATASET_KWARGS if chat else SFT_DATASET_KWARGS)}
    if d.packed:
        out["packed_sequence_specs"] = {
            _T: "megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs",
            "packed_sequence_size": t.seq_length, "pad_cu_seqlens": False}
        if r.parallelism.cp > 1:  # each sample padded to a multiple of 2 x CP (THD context parallelism)
            out["packed_sequence_specs"]["pad_seq_to_mult"] = 2 * r.parallelism.cp
        out["dataset_kwargs"]["pad_to_max_length"] = True
    elif t.cuda_graphs == "layer":  # a graph replays fixed shapes: every row padded to seq_length (.cuda_graphs)
        out["dataset_kwargs"]["pad_to_max_length"] = True
    return out


def _checkpoint(plan, ckpt_dir, in_container: bool) -> dict:
    """The plan's checkpoint policy (vdkit.planner.checkpoint_policy) in Bridge 0.3.1's CheckpointConfig words.

    ``save_interval``: the policy's cadence; 0 for a timing run - Bridge then saves neither periodically
    (``train.py`` checkpoint_and_decide_exit: ``save_interval and ...``) nor after the last step
    (``pretrain.py:158``: ``save_interval != 0``), while a stop still saves (its signal and duration exits
    test ``checkpoint.save`` only); null for a train run without periodic saves (the end's only).
    ``most_recent_k``: the policy's retention (Bridge's default -1 keeps every checkpoint).
    ``async_save``: the periodic saves in the background (torch_dist only, persistent worker: Bridge's
    ``CheckpointConfig.finalize`` and ``ConfigContainer.validate``), in the container on GPUs; local CPU
    runs save synchronously. An end's weights-only save (nothing resumes from it): ``save_optim`` and the other
    state flags false - Bridge's flags for every save, so ``job.py`` (:func:`weights_only_at_the_end`) keeps
    the full state for a stop's save and its resume and applies these flags only as training ends."""
    from vdkit.recipes.bridge.base import base_checkpoint

    r = plan.recipe
    pol = plan.time.policy
    every = r.engine.checkpoint_every_n_steps if r.engine.checkpoint_every_n_steps is not None else pol.every_n_steps
    if pol.final == "none" and not every:
        interval = 0
    else:
        interval = every or None
    out = {_T: _CFG + "CheckpointConfig", "save": str(ckpt_dir), "load": str(ckpt_dir),
           "save_interval": interval, "most_recent_k": pol.keep, "ckpt_format": "torch_dist",
           "fully_parallel_save": True,
           "pretrained_checkpoint": base_checkpoint(r, in_container)}  # a chained import's output by default
    if pol.async_save and in_container:
        out["async_save"] = True
    if not pol.saves_optimizer:
        out.update(save_optim=False, save_rng=False, load_optim=False, load_rng=False)
    return out


def _peft(plan) -> Optional[dict]:
    m = plan.recipe.method  # method.lora_a2a: a2a_experimental, rendered only when set (the defaults' file unchanged)
    return None if m.peft_scheme != "lora" else {
        _T: "megatron.bridge.peft.lora.LoRA", "target_modules": list(lora_targets.of(plan.recipe)), "dim": m.lora_adapter_dim,
        "alpha": m.lora_adapter_dim, "dropout": m.lora_dropout, **({"a2a_experimental": True} if m.lora_a2a else {})}


def bridge_config(plan, run_dir, ckpt_dir, in_container: bool = False) -> Dict:
    """Megatron-Bridge's ConfigContainer for ``plan`` as a ``_target_`` dict (see the module docstring).

    ``run_dir`` is the run directory's final path, ``ckpt_dir`` the run's checkpoint directory;
    ``in_container``: the ranks run in the NeMo image on GPUs (asynchronous checkpoint writes)."""
    r = plan.recipe
    check_model(r)
    opt, sched = _optimizer_scheduler(plan)
    t, e = r.train, r.engine
    template = chat_template(r, run_dir)
    tokenizer = {_T: "megatron.bridge.training.tokenizers.config.TokenizerConfig",
                 "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": tokenizer_model(r, run_dir)}
    if template is not None:
        tokenizer["chat_template"] = template
    from vdkit.run.rundir import LOG_DIR

    logs = str(PurePosixPath(run_dir) / LOG_DIR)
    cfg = {
        _T: _CFG + "ConfigContainer",
        "model": _model(plan),
        "train": {_T: _CFG + "TrainingConfig", "global_batch_size": t.global_batch_size,
                  "micro_batch_size": t.micro_batch_size, "train_iters": t.max_steps,
                  # run.mode=timing: no validation (measured training steps only); train: train.val_batches
                  # batches of the validation split every r.val_every steps
                  "eval_iters": 0 if r.timing else t.val_batches, "eval_interval": r.val_every or t.max_steps,
                  "exit_signal_handler": True,  # SIGTERM: finish the step, checkpoint, leave
                  # NVIDIA's Llama recipes: Python's GC by hand every 100 steps, never mid-step on one rank
                  "manual_gc": True, "manual_gc_interval": NVIDIA_H100["manual_gc_interval"]},
        "optimizer": opt,
        "scheduler": sched,
        "ddp": {_T: _CFG + "DistributedDataParallelConfig", "check_for_nan_in_grad": True,
                # fp32 for every method: NVIDIA's fine-tuning recipes ask for bf16 here, but Bridge 0.3.1's
                # mixed-precision preset overwrites this field (mixed_precision.py:135-143, its grad_reduce_in_fp32=True
                # :183), so rendering false would state a reduction the run does not do. The memory / DP bytes count 4
                # (memory.grad_optimizer_bytes); docs/bridge-h100.md lists it as a departure
                "grad_reduce_in_fp32": True,
                "use_distributed_optimizer": bool(r.parallelism.distributed_optimizer),
                "overlap_grad_reduce": bool(r.parallelism.distributed_optimizer),
                "overlap_param_gather": bool(r.parallelism.distributed_optimizer),
                "average_in_collective": not per_token_loss(r)},
        "dataset": _dataset(plan, run_dir, in_container, chat=template is not None),
        "logger": {_T: _CFG + "LoggerConfig", "log_interval": e.log_every_n_steps, "tensorboard_dir": logs,
                   "log_timers_to_tensorboard": True, "log_throughput": True},
        "tokenizer": tokenizer,
        "checkpoint": _checkpoint(plan, ckpt_dir, in_container),
        "dist": {_T: _CFG + "DistributedInitConfig", "distributed_backend": "nccl"},
        "rng": {_T: _CFG + "RNGConfig", "seed": t.seed},
        "mixed_precision": _mixed_precision(t),
    }
    if in_container and tp_comm_overlap(plan.recipe, plan.tp):
        cfg["comm_overlap"] = {_T: "megatron.bridge.training.comm_overlap.CommOverlapConfig", "tp_comm_overlap": True,
                               "tp_comm_bootstrap_backend": "nccl"}
        if r.parallelism.tp_comm_overlap_cfg:  # the run's own userbuffers settings per GEMM (conf/tp_overlap/)
            cfg["comm_overlap"]["tp_comm_overlap_cfg"] = ub_overlap_cfg(r.parallelism.tp_comm_overlap_cfg)
        if r.is_peft:
            cfg["model"].update(FROZEN_BASE_TP_OVERLAP)
    peft = _peft(plan)
    if peft is not None:
        cfg["peft"] = peft
    return cfg


def _mixed_precision(t):
    """Bridge's mixed-precision preset by name; with FP8 attention, the FP8 preset's fields and fp8_dot_product_attention
    as a MixedPrecisionConfig (see FP8_ATTENTION: the preset by name would switch it off again)."""
    if t.fp8_attention:
        fields = {k: dict(v) if isinstance(v, dict) else v for k, v in FP8_PRESET_FIELDS.items()}  # (a shared
        # mapping would be written as a YAML anchor)
        return {_T: "megatron.bridge.training.mixed_precision.MixedPrecisionConfig", **fields, FP8_ATTENTION: True}
    return PRECISION.get(t.precision, "bf16_mixed")


def tp_comm_overlap(recipe, tp: int) -> bool:
    """NVIDIA's TP communication overlap (TE userbuffers over NCCL) for ``recipe`` at TP ``tp``: where Bridge keeps it
    (training/comm_overlap.py: TP >= 2 with SP) unless ``parallelism.tp_comm_overlap=false`` (megatron-core's default)."""
    sp = recipe.parallelism.sequence_parallel  # None (the planner's default, before it resolves): on when TP > 1
    return tp > 1 and (sp is None or bool(sp)) and bool(recipe.parallelism.tp_comm_overlap)


def to_yaml(cfg: Dict, header: str = "") -> str:
    """The config as YAML text (keys in the order built), with a comment header."""
    import yaml

    return header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
