"""The megatron engine: megatron-core's GPTModel, parallel state, schedules and optimizer, for real.

Run inside each rank as ``python -m vdkit.recipes.megatron RUN_DIR``. This ``__init__`` is the
engine interface (:mod:`vdkit.recipes.engines`) and stays free of heavy imports (torch, megatron):
runs locally (CPU over gloo, or GPUs), or on a cluster on the host's Python or in a container
(``engine.container_image``: an NGC PyTorch image with megatron-core 0.16 and vdkit installed),
NCCL on GPUs; NeMo 1.x logs.

Modules (plus the shared megatron-core CPU shim ``vdkit.recipes.common.mcore_cpu``): ``model`` (Llama as
GPTModel chunks, LoRA, P-tuning, layout-independent initial weights), ``data`` (micro batches from
the kit's samples), ``train`` (the loop), ``checkpoint`` (per-rank, atomic, resume); the shared ``vdkit.recipes.common.mcore_memory``
(measured vs planned bytes per rank: memory.json). Logs are the reference engine's NeMo-style
progress lines and TensorBoard scalars (vdkit.recipes.common.progress).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Union

from vdkit.composition.schema import LORA_TARGETS
from vdkit.recipes.common.mcore_cpu import TESTED_VERSION
from vdkit.recipes.spec import EngineSpec


MODULE = "vdkit.recipes.megatron"


def megatron_command(run_dir: Union[str, Path], python: str = sys.executable) -> List[str]:
    """The command one rank runs: ``[python, -m, vdkit.recipes.megatron, RUN_DIR]``."""
    return [python, "-m", MODULE, str(run_dir)]


MCORE_SERIES = "0.16"  # the megatron-core API this engine is written against (CPU shim: 0.16.1 exactly)


CONTAINER_PYTHON = "python"  # the image's interpreter (NGC PyTorch / NeMo images put it on PATH)


def in_container(plan) -> bool:
    """Ranks run in engine.container_image on a cluster; a launcher that starts them on this machine
    (local processes) uses this Python."""
    from vdkit.launch import launchers

    from vdkit.recipes.common.rocm import image

    return bool(image(plan)) and not launchers.executes_here(plan.recipe.cluster.launcher)


def command(plan, run_dir) -> List[str]:
    """The engine interface's rank command (see :func:`megatron_command`): this interpreter on the
    host, the image's ``python`` in a container."""
    return megatron_command(run_dir, CONTAINER_PYTHON if in_container(plan) else sys.executable)


def check(plan) -> None:
    """Refuse what this engine cannot run: interleaving needs micro batches in multiples of PP."""
    from vdkit.errors import UserError

    from vdkit.recipes.common.rocm import check as check_rocm

    check_rocm(plan)
    p = plan.recipe.parallelism
    if plan.recipe.train.precision == "fp8":
        raise UserError("train.precision=fp8 with engine=megatron: its local layer spec has no FP8 GEMMs (FP8 runs "
                        "in Transformer Engine's layers)", "use engine=bridge for FP8, or train.precision=bf16")
    if plan.recipe.method.name == "lora" and plan.recipe.engine.lora_qkv != "fused":
        raise UserError("the megatron engine puts LoRA on the fused QKV projection (NeMo's split); "
                        f"engine.lora_qkv={plan.recipe.engine.lora_qkv} would plan another parameter count",
                        "set engine.lora_qkv=fused")
    if (p.vp or 1) > 1 and plan.grad_accum % p.pp:
        raise UserError(f"interleaved pipelining (vp={p.vp}) needs the micro batches per step ({plan.grad_accum}) "
                        f"to be a multiple of pp={p.pp} (megatron-core {MCORE_SERIES})",
                        "raise train.global_batch_size or unset parallelism.vp")
    from vdkit.recipes.megatron.base import refusal

    no_base = refusal(plan.recipe)  # a run.mode=train fine-tune loads its base (never random weights)
    if no_base is not None:
        raise no_base
    if plan.recipe.data.kind != "sft" and plan.recipe.data.name != "synthetic":
        raise UserError(f"the megatron engine reads NeMo SFT JSONL; data={plan.recipe.data.name} is "
                        f"{plan.recipe.data.kind} data (Megatron indexed files)",
                        "use data=synthetic or a prepared JSONL dataset (or engine=nemo on the cluster)")


def local_check(plan) -> None:
    """Before a local run: a fine-tune's base is a Hugging Face model of the recipe's sizes (what the rank checks
    again, :func:`.base.check_rank`); data files and tokenizer exist and fit (the reference engine's data rules)."""
    from vdkit.recipes.common.data import check_inputs
    from vdkit.recipes.megatron.base import check_rank

    check_rank(plan.recipe, rank=False)
    check_inputs(plan.recipe)


def inputs(plan):
    """A fine-tune's base, the local model.hf_path directory (:mod:`.base`)."""
    from vdkit.recipes.megatron.base import KEY, source

    hf = source(plan.recipe)
    return [(KEY, hf, True)] if hf else []


def preflight(plan, run_dir) -> list:
    """The job's pre-flight (vdkit.recipes.common.preflight): a fine-tune's base as :mod:`.base` reads it (a Hugging Face
    directory: config.json and weights), the training JSONL files."""
    from vdkit.recipes.common.data import preflight_needs

    return [(w, p, "hf") for w, p, _ in inputs(plan)] + preflight_needs(plan.recipe)


def notes(recipe) -> list:
    """What the plan and render say about this run: a fine-tune on seeded weights (:func:`.base.seeded_note`)."""
    from vdkit.recipes.megatron.base import seeded_note

    note = seeded_note(recipe)
    return [note] if note else []


def container(plan, run_dir):
    """The image every rank runs in (engine.container_image), or None: the host's Python."""
    if not in_container(plan):
        return None
    from vdkit.run.jobspec import Container
    from vdkit.recipes.common.rocm import image as rocm_or_cuda_image
    from vdkit.recipes.engines import standard_mounts

    return Container(image=rocm_or_cuda_image(plan), mounts=standard_mounts(plan, run_dir, [(w, p) for w, p, _ in inputs(plan)]),
                     workdir=str(run_dir))


def env(plan) -> dict:
    """Megatron orders tensor-parallel communication before compute with one CUDA connection; on AMD the
    ROCm settings instead (vdkit.recipes.common.rocm)."""
    from vdkit.recipes.common.rocm import vendor_env

    return vendor_env(plan, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if plan.tp > 1 else {})


def check_runs(run_dirs) -> list:
    """`vdkit check`: the job's TransformerConfig and model on the meta device (:mod:`.runcheck`)."""
    from vdkit.recipes.megatron.runcheck import check_runs as run_checks

    return run_checks(run_dirs)


def resume_check(plan, run_dir) -> None:
    """`vdkit run --resume`: the latest checkpoint's rank files and recorded layout against the run's (one line)."""
    from vdkit.recipes.megatron.checkpoint import check_resume

    check_resume(plan, Path(run_dir))


SPEC = EngineSpec(
    name="megatron", summary="megatron-core's GPTModel, schedules and optimizer, for real (CPU over gloo here, GPUs on a cluster)",
    command=command, inputs=inputs, preflight=preflight, notes=notes, check=check, local_check=local_check, container=container, env=env, check_runs=check_runs,
    resume_check=resume_check,
    families=("llama", "opt"),
    maps={"name": "run names", "num_layers": "TransformerConfig.num_layers", "hidden_size": "TransformerConfig.hidden_size",
          "ffn_hidden_size": "TransformerConfig.ffn_hidden_size",
          "num_attention_heads": "TransformerConfig.num_attention_heads",
          "num_query_groups": "TransformerConfig.num_query_groups", "vocab_size": "GPTModel.vocab_size",
          "max_position_embeddings": "GPTModel.max_sequence_length", "pretrain_tp": "the planner's layout",
          "pretrain_pp": "the planner's layout", "arch": "the fields below", "norm": "TransformerConfig.normalization",
          "norm_eps": "TransformerConfig.layernorm_epsilon", "activation": "gated_linear_unit / activation_func",
          "bias": "TransformerConfig.add_bias_linear (and add_qkv_bias)", "qkv_bias": "TransformerConfig.add_qkv_bias",
          "position_embedding": "GPTModel.position_embedding_type", "rope_base": "GPTModel.rotary_base",
          "rope_scaling": "GPTModel rope_scaling / seq_len_interpolation_factor",
          "tied_embeddings": "GPTModel.share_embeddings_and_output_weights",
          "tokenizer": "the kit's data path (vdkit.recipes.common.data)",
          "hf_path": "a fine-tune's base weights (vdkit.recipes.megatron.base: HF Llama / Qwen2 -> GPTModel)",
          "pretrained": "run.mode=train fine-tunes need model.hf_path (vdkit.recipes.megatron.base.refusal)"},
    ignores={"nemo_path": "engine=nemo's base model", "megatron_path": "engine=bridge's base model"},
    refuses={"embedding_dim": "GPTModel has no projected word embedding",
             "pre_norm": "megatron-core's layer spec is pre-norm only"},
    methods=("sft", "lora", "ptuning", "pretrain"), precisions=("bf16",),
    lora_targets=LORA_TARGETS,  # model.py LoraLinear: column- and row-parallel bases (BASE_SPLIT)
    context_parallel=False,
    no_context_parallel=("it builds megatron-core's local layer spec, whose DotProductAttention asserts "
                         "context_parallel_size == 1 (only Transformer Engine's attention splits a sequence)"),
    no_cuda_graphs=("its loop (vdkit.recipes.megatron.train) never captures or replays CUDA graphs, and its local "
                    "layer spec has no Transformer Engine layers for megatron-core's transformer_engine capture"),
    rope_scaling=("llama3", "linear"), mcore_rope=True,  # GPTModel(rope_scaling, rope_scaling_factor): fixed factors
    step_time_regime="unfused",  # megatron-core with NeMo's settings (vdkit.planner.predict)
    # no loop_drains: its loss function (train.py _loss_func) checks nothing and its DDP keeps megatron-core's
    # check_for_nan_in_grad=False; the loop reads the loss back once a step, after the schedule (train.py _reduced_loss)
    # local spec on GPUs too (model.py layer_specs: no Transformer Engine, unfused attention): the plan counts its bytes
    layer_kernels="local",
    pads_rows_to="global_batch",  # data.py step_length: every micro batch of a step padded to its longest row
    gpu_vendors=("nvidia", "amd"),  # NGC PyTorch (CUDA) or, on AMD clusters, engine.rocm_image (vdkit.recipes.common.rocm)
    images=("engine.container_image", "engine.rocm_image"),
    stack={"megatron-core": TESTED_VERSION},
    runtime_modules=("torch", "megatron.core"), extra="megatron",
    runs_locally=True,  # CPU over gloo works here; `vdkit run engine=megatron`
    writes_heartbeat=True,  # every rank beats (vdkit.recipes.common.heartbeat): the launcher watches for hangs
    base_model_key="hf_path",  # a fine-tune's base (vdkit.recipes.megatron.base)
)
