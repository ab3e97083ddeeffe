"""The reference (transformers) engine: Lightning Fabric + transformers + peft (+ DeepSpeed), trains for real.

Llama- and OPT-architecture models through transformers' own classes, data parallel with
``parallelism.sharding=none|fsdp|zero3`` (DDP, torch FSDP full-shard, DeepSpeed ZeRO-3).
Run inside each rank as ``python -m vdkit.recipes.reference RUN_DIR``. This ``__init__`` is the
engine interface (:mod:`vdkit.recipes.engines`) and stays free of heavy imports: the host's Python,
or a container when ``engine.container_image`` / ``cluster.container_image`` is set (the MI300X
clusters' ROCm image); no extra run-dir files, data parallel only, NeMo 1.x logs; runs locally too.

Modules: ``distributed`` (ranks from Slurm or local env), ``data`` (tokenizer, samples, the
deterministic batch order), ``model`` (Llama / OPT from ModelCfg or ``model.hf_path``, + peft),
``sharding`` (the strategies and their checkpoints), ``checkpoint`` (atomic save, resume), ``train``
(the loop); NeMo-style progress lines come from ``vdkit.recipes.common.progress``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Union

from vdkit.composition.schema import LORA_TARGETS
from vdkit.errors import UserError
from vdkit.recipes.spec import EngineSpec

def require_runtime() -> None:
    """Raise one line naming the extra to install when the engine's libraries are missing here."""
    from vdkit.recipes.engines import require_modules

    require_modules(SPEC.runtime_modules, SPEC.extra, SPEC.name)


def reference_command(run_dir: Union[str, Path], python: str = sys.executable) -> List[str]:
    """The command one rank runs: ``[python, -m, vdkit.recipes.reference, RUN_DIR]``."""
    return [python, "-m", "vdkit.recipes.reference", str(run_dir)]


CONTAINER_PYTHON = "python3"  # the interpreter inside an image (vdkit installed there)


def _image(plan):
    """(image, recipe key) when ranks run in a container: engine.container_image, else the cluster's
    (e.g. xe9680_mi300x's ROCm image); (None, None) runs the host's Python."""
    r = plan.recipe
    if r.engine.container_image:
        return r.engine.container_image, "engine.container_image"
    if getattr(r.cluster, "container_image", None):
        return r.cluster.container_image, "cluster.container_image"
    return None, None


def command(plan, run_dir) -> List[str]:
    """The engine interface's rank command: this Python, or the image's ``python3`` in a container."""
    image, _ = _image(plan)
    return reference_command(run_dir, python=CONTAINER_PYTHON if image else sys.executable)


def container(plan, run_dir):
    """The image and mounts when one is configured (data, a local model.hf_path, results, run dir); else None."""
    from vdkit.run.jobspec import Container
    from vdkit.recipes.engines import standard_mounts

    image, key = _image(plan)
    if not image:
        return None
    hf = plan.recipe.model.hf_path
    extra = [("model.hf_path", hf)] if hf and hf.startswith("/") else []
    return Container(image=image, mounts=standard_mounts(plan, run_dir, extra), workdir=str(run_dir), image_key=key)


def inputs(plan):
    """A local model.hf_path directory (a hub id is fetched by the job itself)."""
    hf = plan.recipe.model.hf_path
    return [("model.hf_path", hf, True)] if hf and hf.startswith("/") else []  # relative: absolute at the door


def preflight(plan, run_dir):
    """The job's pre-flight (vdkit.recipes.common.preflight): a local model.hf_path as transformers loads it (config.json and
    weights: a missing one would be tried as a hub id offline), the training JSONL files."""
    r = plan.recipe
    out = [("model.hf_path", r.model.hf_path, "hf")] if r.model.hf_path and r.model.hf_path.startswith("/") else []
    from vdkit.recipes.common.data import preflight_needs

    return out + preflight_needs(r)


def check(plan) -> None:
    """What the ranks would refuse, decided from the plan alone (pure): data parallel only (no tensor or
    pipeline parallelism), GBS a multiple of MBS x DP, room for a sample in train.seq_length; on a
    cluster, weights from shared storage, never a hub download per rank.

    The one home of these rules: render, submit, run and the training loop ask it, so a plan the
    ranks cannot train fails before a run directory exists.
    """
    from vdkit.recipes.reference.rules import check_plan

    check_plan(plan)  # the layout rule first: it needs nothing but the layout
    check_hf_path(plan.recipe)


def check_hf_path(recipe) -> None:
    """A run.mode=train fine-tune of a model with published weights (``model.pretrained``) names them in
    ``model.hf_path`` (without it, transformers' seeded init would be fine-tuned); on a cluster it must be a directory
    on shared storage, staged once (not a hub id): every rank would download the weights into its container, and
    compute nodes often have no internet."""
    hf = recipe.model.hf_path
    if not hf and recipe.method.name != "pretrain" and recipe.model.pretrained and not recipe.timing:
        raise UserError(f"engine=reference {recipe.method.name} fine-tunes a base, and model.hf_path is not set: it "
                        "would train random weights", f"set model.hf_path to {recipe.model.name}'s Hugging Face "
                        "weights (a staged directory or a hub id), or run.mode=timing for a timing run")
    from vdkit.launch import launchers

    if not hf or launchers.executes_here(recipe.cluster.launcher) or str(hf).startswith("/"):
        return
    name = str(hf).rstrip("/").split("/")[-1]
    raise UserError(f"model.hf_path={hf} is a Hugging Face hub id: on cluster {recipe.cluster.name} every rank "
                    "would download the weights at job start (compute nodes often have no internet)",
                    f"stage them once on a login node: huggingface-cli download {hf} --local-dir /shared/models/{name} "
                    f"(gated models: HF_TOKEN), then model.hf_path=/shared/models/{name} (docs/cluster-guide.md)")


def env(plan, run_dir=None) -> dict:
    """On a cluster the job runs offline (weights and tokenizer are local paths); Hugging Face's cache
    (HF_HOME) on the shared results storage, never in the container's temporary space."""
    from vdkit.launch import launchers

    r = plan.recipe
    if launchers.executes_here(r.cluster.launcher):
        return {}
    out = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if run_dir is not None:
        from vdkit.run.rundir import results_root

        out["HF_HOME"] = str(results_root(r, run_dir) / HF_HOME_DIR)
    return out


HF_HOME_DIR = "hf_home"  # under the run's results root (shared storage every node mounts)


def local_check(plan) -> None:
    """Before training here: the engine's libraries (torch & co., one line naming the extra when
    missing), then a local ``model.hf_path`` as the job's pre-flight reads it (config.json and whole weights: what
    the megatron engine's door asks too), data files and tokenizer exist and fit, before a local run directory is
    written."""
    from vdkit.recipes.common import preflight as pf
    from vdkit.recipes.common.data import check_inputs

    hf = plan.recipe.model.hf_path
    why = pf.problem("model.hf_path", hf, "hf") if hf and str(hf).startswith("/") else None  # a hub id: the job's
    if why:
        raise UserError(why, pf.FIXES["hf"])
    check_inputs(plan.recipe)  # the libraries (the spec's runtime_modules) were checked by the engine registry


def check_runs(run_dirs) -> list:
    """`vdkit check`: the job's build_model on the meta device, the staged config (:mod:`.runcheck`)."""
    from vdkit.recipes.reference.runcheck import check_runs as run_checks

    return run_checks(run_dirs)


SPEC = EngineSpec(
    name="reference", summary="Lightning Fabric + transformers + peft (+ DeepSpeed): data parallel, DDP / FSDP / ZeRO-3",
    command=command, preflight=preflight, check=check, inputs=inputs, env=env, container=container, local_check=local_check,
    check_runs=check_runs,
    families=("llama", "opt"),
    maps={"name": "run names", "num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
          "ffn_hidden_size": "intermediate_size / ffn_dim", "num_attention_heads": "num_attention_heads",
          "num_query_groups": "num_key_value_heads", "vocab_size": "vocab_size",
          "max_position_embeddings": "max_position_embeddings", "arch": "LlamaConfig / Qwen2Config / OPTConfig",
          "norm": "RMSNorm (Llama) / LayerNorm (OPT)", "norm_eps": "rms_norm_eps", "activation": "hidden_act / activation_function",
          "bias": "OPTConfig.enable_bias", "qkv_bias": "Qwen2Config (q/k/v biases, o without)",
          "position_embedding": "rotary (Llama) / learned (OPT)", "rope_base": "rope_theta", "rope_scaling": "rope_scaling",
          "tied_embeddings": "tie_word_embeddings", "tokenizer": "the kit's data path (vdkit.recipes.common.data)",
          "embedding_dim": "OPTConfig.word_embed_proj_dim", "pre_norm": "OPTConfig.do_layer_norm_before",
          "hf_path": "from_pretrained (weights and tokenizer)"},
    ignores={"pretrain_tp": "data parallel only", "pretrain_pp": "data parallel only",
             "nemo_path": "engine=nemo's base model", "megatron_path": "engine=bridge's base model",
             "pretrained": "from_pretrained when model.hf_path is set, else seeded weights"},
    methods=("sft", "lora", "ptuning", "pretrain"), shardings=("none", "fsdp", "zero3"),
    lora_targets=LORA_TARGETS,  # peft's LoraConfig.target_modules, transformers' names (vdkit.planner.lora_targets)
    data_parallel_only=True,  # sharding none: torch DDP and a plain torch.optim.AdamW on every rank (train.py)
    # sharding none: Fabric's bf16-mixed over the fp32 model transformers loads (model.py) - fp32 parameters, gradients
    # and Adam state (conf/calibration/memory.yaml fp32_params_bytes); FSDP / ZeRO-3 have their own memory model
    fp32_params=lambda recipe: recipe.parallelism.sharding == "none",
    precisions=("bf16",),  # no FP8 GEMMs: a plan at fp8 would predict a precision the run does not use
    context_parallel=False,
    no_context_parallel=("the transformers engine has no context parallelism (DDP / FSDP / ZeRO-3 split the batch, "
                         "not the sequence)"),
    no_cuda_graphs=("transformers' eager layers under Fabric (DDP / FSDP / ZeRO-3) are never captured: the loop "
                    "(vdkit.recipes.reference.train) runs eager and renders no torch.compile / CUDA-graph mode"),
    rope_scaling=("linear", "dynamic", "yarn", "longrope", "llama3"),  # transformers' ROPE_INIT_FUNCTIONS
    layer_kernels="hf",  # transformers' own decoder layers, sdpa or eager attention (vdkit.planner.hf_activations)
    step_time_regime="hf",  # eager Hugging Face + DDP / FSDP / ZeRO-3 (vdkit.planner.predict_hf)
    gpu_vendors=("nvidia", "amd"), images=("engine.container_image", "cluster.container_image"),
    stack={},  # unpinned: the reference extra's lower bounds (pyproject.toml)
    # what a rank imports, and the pyproject extra that installs it (torch-less login-node installs plan, render
    # and submit; training here needs these)
    runtime_modules=("torch", "lightning", "transformers", "peft"), extra="reference", runs_locally=True,
    writes_heartbeat=True,  # every rank beats (vdkit.recipes.common.heartbeat): the launcher watches for hangs
)
