"""The bridge engine: NVIDIA's current stack, Megatron-Bridge 0.3.1 (``nvcr.io/nvidia/nemo:26.02.01``).

From the plan it writes Bridge's own ``ConfigContainer`` as ``bridge.yaml`` into the run directory
(:mod:`.config`), and the job every rank runs, ``bridge_job.py`` (:mod:`.job`: Bridge's
``ConfigContainer.from_yaml`` and its own ``pretrain()`` / ``finetune()`` loop, nothing of vdkit):
on the cluster one srun task per GPU in the NeMo container. SFT, LoRA (Bridge's PEFT) and pretraining;
TP / PP / VP / SP / DP, the distributed optimizer; torch_dist checkpoints; fine-tuning from
``model.megatron_path``, a Bridge checkpoint converted once from the site's HF weights
(``import_hf.sbatch``, :mod:`.convert`). P-tuning does not exist in Bridge.

Here (``vdkit run``) the same YAML trains with Bridge's loop on CPU over gloo
(``python -m vdkit.recipes.bridge.rank RUN_DIR``, :mod:`.rank`, :mod:`.train`) under a pinned run-time shim
(:mod:`.cpu_shim`); logs are Bridge's Megatron ``iteration N/M | ...`` lines and TensorBoard scalars.
This ``__init__`` is the engine interface (:mod:`vdkit.recipes.engines`): standard library only.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path, PurePosixPath
from typing import List

from vdkit.composition.schema import LORA_TARGETS
from vdkit.errors import UserError
from vdkit.run.rundir import BRIDGE_EXPORT_FILE as EXPORT_FILE, BRIDGE_IMPORT_FILE as IMPORT_FILE
from vdkit.run.rundir import BRIDGE_CONFIG_FILE, BRIDGE_JOB_FILE as JOB_FILE, FIRST_FILE
from vdkit.recipes.bridge.versions import BRIDGE_VERSION, IMAGE_TAG, MCORE_VERSION  # noqa: F401  (the image <-> Bridge map)
from vdkit.recipes.spec import EngineSpec
from vdkit.recipes.common.preflight import TRACKERS as BASE_MARKERS  # what Bridge checks for (standard library only)

MODULE = "vdkit.recipes.bridge.rank"  # the rank entry point (python -m)
CONTAINER_PYTHON = "python"


def in_container(plan) -> bool:
    """Ranks run in engine.container_image under Slurm; local processes use this Python."""
    from vdkit.launch import launchers

    from vdkit.recipes.common.rocm import image

    return bool(image(plan)) and not launchers.executes_here(plan.recipe.cluster.launcher)


def overlaps_tp_comm(recipe, tp: int) -> bool:
    """The spec's ``tp_comm_overlap``: whether the rendered bridge.yaml of ``recipe`` at TP ``tp`` turns on
    ``comm_overlap.tp_comm_overlap`` (config.tp_comm_overlap, in the container only: bridge_config)."""
    from types import SimpleNamespace

    from vdkit.recipes.bridge.config import tp_comm_overlap

    # in_container reads nothing of a plan but its recipe (the cluster's launcher and vendor, the engine's image)
    return tp_comm_overlap(recipe, tp) and in_container(SimpleNamespace(recipe=recipe))


def fp8_bf16_layers(recipe) -> tuple:
    """The spec's ``fp8_bf16_layers``: the decoder layers at the start and at the end that Bridge's FP8 preset keeps in
    bf16 (config.FP8_PRESET_FIELDS: ``first_last_layers_bf16``, ``num_layers_at_start/end_in_bf16``). megatron-core
    0.16.1 builds those with no fp8_model_init and, under the preset's tensorwise recipe, runs each layer in its own
    context, none for them (transformer/transformer_block.py:346-351, :717-753; fp8_utils.py:513-530, :612-616)."""
    from vdkit.recipes.bridge.config import FP8_PRESET_FIELDS as preset

    if not preset["first_last_layers_bf16"]:
        return 0, 0
    return preset["num_layers_at_start_in_bf16"], preset["num_layers_at_end_in_bf16"]


def command(plan, run_dir) -> List[str]:
    """In the container: ``python RUN_DIR/bridge_job.py RUN_DIR/bridge.yaml`` (Bridge only, no vdkit);
    on this machine: ``python -m vdkit.recipes.bridge.rank RUN_DIR`` (the CPU shim, memory.json, then the same)."""
    from vdkit.recipes.bridge.config import CONFIG_FILE

    if in_container(plan):
        job = [CONTAINER_PYTHON, str(PurePosixPath(run_dir) / JOB_FILE), str(PurePosixPath(run_dir) / CONFIG_FILE)]
        if plan.recipe.cluster.gpus_per_node != NUMA_GPUS:
            return job
        # NVIDIA's performance executor: each rank on its GPU's socket, CPU and memory (NUMA node = local id / 4)
        import shlex

        node = f"$((SLURM_LOCALID / {NUMA_GPUS // NUMA_NODES}))"
        return ["bash", "-c", f"exec numactl --cpunodebind={node} --membind={node} {shlex.join(job)}"]
    return [sys.executable, "-m", MODULE, str(run_dir)]


# NUMA binding as NVIDIA's performance executor does it, for an 8-GPU node of two sockets (XE9680: GPUs 0-3 on
# socket 0, 4-7 on socket 1); other shapes run unbound (which GPUs a 4-GPU job holds is the scheduler's choice).
NUMA_GPUS, NUMA_NODES = 8, 2


def check(plan) -> None:
    """What Bridge cannot run beyond its spec (P-tuning and non-Llama fields are refused at the door): FP8 without the
    distributed optimizer, interleaving without a multiple of PP micro batches, a missing base checkpoint."""
    from vdkit.recipes.bridge.config import check_model
    from vdkit.recipes.bridge.data import dataset_root

    from vdkit.recipes.common.rocm import check as check_rocm

    r = plan.recipe
    check_rocm(plan)
    check_model(r)
    p = r.parallelism
    if r.train.precision == "fp8" and not p.distributed_optimizer:
        raise UserError("train.precision=fp8 on Bridge gathers FP8 parameters (bf16_with_fp8_current_scaling_mixed: "
                        "fp8_param_gather), which Megatron runs only with the distributed optimizer",
                        "leave parallelism.distributed_optimizer unset or set it true (NVIDIA's H100 FP8 configs do), "
                        "or train.precision=bf16")
    if (p.vp or 1) > 1 and plan.grad_accum % p.pp:
        raise UserError(f"interleaved pipelining (vp={p.vp}) needs the micro batches per step ({plan.grad_accum}) "
                        f"to be a multiple of pp={p.pp} (megatron-core 0.16)",
                        "raise train.global_batch_size or unset parallelism.vp")
    if r.method.name != "pretrain":
        dataset_root(r, "/run")  # refuses data Bridge's fine-tuning dataset cannot read
        _require_chat_rows(r)
        from vdkit.launch import launchers

        from vdkit.recipes.bridge.base import chains_import

        # without model.megatron_path a Slurm render converts model.hf_path first (convert.chains_import)
        if (not r.model.megatron_path and not launchers.executes_here(r.cluster.launcher)
                and not chains_import(r, in_container(plan))):
            how = (f"stage the HF weights ({staging_hint(r)}; on cluster.launcher=slurm the render then converts "
                   "them before training) or " if not r.model.hf_path else
                   f"convert the HF weights once (the run dir's {IMPORT_FILE}) and ")
            raise UserError(f"model.megatron_path is not set: {r.method.name} fine-tunes a base model from a "
                            "Megatron-Bridge checkpoint", f"{how}set model.megatron_path=/path/to/{r.model.name}-bridge")


def _require_chat_rows(recipe) -> None:
    """An Instruct tokenizer's chat template (read at render) needs prepared rows with ``messages`` (.chat)."""
    from vdkit.recipes.bridge.chat import require_messages
    from vdkit.recipes.bridge.tokenizer import chat_template
    from vdkit.recipes.bridge.data import dataset_root

    if recipe.data.name == "synthetic":
        return  # the render writes the synthetic rows, with messages where the template asks for them
    try:
        chat = chat_template(recipe, "/run") is not None
    except UserError:
        return  # no staged tokenizer: the render says so in its own line
    if chat:
        require_messages(recipe, dataset_root(recipe, "/run"))


def staging_hint(recipe) -> str:
    """How to stage the model's HF weights (:func:`vdkit.recipes.common.staging.stage_hint`)."""
    from vdkit.recipes.common.staging import stage_hint

    return stage_hint(recipe)



def local_check(plan) -> None:
    """Before a local run: packed sequences need TE's attention (GPU); the base checkpoint exists."""
    r = plan.recipe
    if r.data.packed:
        raise UserError("packed sequences cannot train on this CPU: megatron-core's attention without "
                        "Transformer Engine refuses packed (THD) batches",
                        "set data.packed=false here (packing works in the NeMo container on GPUs)")
    if r.method.name != "pretrain":
        if not r.model.megatron_path:
            raise UserError(f"model.megatron_path is not set: {r.method.name} fine-tunes a Megatron-Bridge checkpoint",
                            "make one: `python -m vdkit.recipes.bridge.convert HF_DIR OUT_DIR` (or a pretraining "
                            "run's checkpoints dir), then set model.megatron_path=OUT_DIR")
        if not Path(r.model.megatron_path).is_dir():
            raise UserError(f"model.megatron_path={r.model.megatron_path} is not a directory",
                            "point it at a Megatron-Bridge checkpoint directory (the one holding iter_*/)")
        # Bridge's checkpoint_exists (training/utils/checkpoint_utils.py:138-161) looks for these; without
        # either, its SFT silently starts from fresh random weights instead of the base model
        if not any((Path(r.model.megatron_path) / n).is_file() for n in BASE_MARKERS):
            raise UserError(f"model.megatron_path={r.model.megatron_path} holds no Megatron-Bridge checkpoint "
                            f"(no {' or '.join(BASE_MARKERS)})",
                            "point it at the directory `python -m vdkit.recipes.bridge.convert HF_DIR OUT_DIR` wrote "
                            "(OUT_DIR, the one holding iter_0000000/)")
        from vdkit.recipes.common.preflight import FIXES, problem

        why = problem("model.megatron_path", r.model.megatron_path, "megatron_checkpoint")  # the iteration it names too
        if why:
            raise UserError(why, FIXES["megatron_checkpoint"])
        if r.data.name != "synthetic":
            from vdkit.recipes.bridge.data import TRAIN_FILE, dataset_root

            from vdkit.recipes.bridge.data import VALIDATION_FILE

            for name in (TRAIN_FILE,) + (() if r.timing else (VALIDATION_FILE,)):  # train mode validates
                f = Path(str(dataset_root(r, "/run"))) / name
                if not f.is_file():
                    raise UserError(f"{f} does not exist", "prepare the data: vdkit data prepare NAME SOURCE DATA_DIR"
                                    + ("" if name == TRAIN_FILE else " (or run.mode=timing: no validation)"))


def files(plan, run_dir) -> dict:
    """bridge.yaml (Bridge's ConfigContainer), bridge_job.py with its checkpoint check (bridge_trust.py) and heartbeat,
    the one-time import job, data and tokenizer."""
    from vdkit.recipes.bridge import convert
    from vdkit.recipes.bridge.config import CONFIG_FILE
    from vdkit.recipes.bridge.tokenizer import TOKENIZER_DIR
    from vdkit.recipes.bridge.data import synthetic_files
    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files
    from vdkit.run.rundir import checkpoint_dir

    r = plan.recipe
    from vdkit.recipes.common.heartbeat import STANDALONE_NAME, standalone_source

    from vdkit.recipes.bridge.job import TRUST_MODULE

    here = Path(__file__).parent
    out = {CONFIG_FILE: render_bridge_yaml(plan, run_dir), JOB_FILE: (here / "job.py").read_text(),
           f"{TRUST_MODULE}.py": (here / "trust.py").read_text(),  # the checkpoints it resumes from, beside it
           f"{STANDALONE_NAME}.py": standalone_source()}  # bridge_job.py's heartbeat, beside it (no vdkit there)
    if r.data.name == "synthetic" and r.method.name != "pretrain":
        from vdkit.recipes.bridge.tokenizer import chat_template

        out.update(synthetic_files(r, chat=chat_template(r, run_dir) is not None))
    if r.model.tokenizer == "byte-level" and not (r.data.tokenizer_model or r.model.hf_path):
        out.update(byte_tokenizer_files(TOKENIZER_DIR))
    if in_container(plan) and r.method.name != "pretrain" and r.model.hf_path:  # (a site's own checkpoint: none)
        chained = convert.chains_import(r, True)
        out[IMPORT_FILE] = convert.import_sbatch(plan, run_dir, chained)
        if chained:  # no model.megatron_path: the conversion runs first, training after it (vdkit submit)
            from vdkit.run.rundir import FIRST_FILE

            out[FIRST_FILE] = IMPORT_FILE + "\n"
    if in_container(plan) and not r.timing and r.model.hf_path:  # run.mode=train: the final weights as HF
        out[EXPORT_FILE] = convert.export_sbatch(plan, run_dir, checkpoint_dir(r, run_dir))
    return out


def render_bridge_yaml(plan, run_dir) -> str:
    """bridge.yaml's text for ``plan`` in ``run_dir`` (what render writes; `vdkit check` and the resume door compare
    a hand-edited file with it: :mod:`.edits`)."""
    from vdkit.recipes.bridge.config import bridge_config, to_yaml
    from vdkit.recipes.bridge.tokenizer import data_format
    from vdkit.run.rundir import checkpoint_dir

    r = plan.recipe
    cfg = bridge_config(plan, run_dir, checkpoint_dir(r, run_dir), in_container(plan))
    header = (f"# Megatron-Bridge {BRIDGE_VERSION} ConfigContainer rendered by vdkit for {r.run_name}: {r.model.name} "
              f"{r.method.name}, {r.cluster.nodes} x {r.cluster.gpus_per_node} GPUs, TP {plan.tp} PP {plan.pp} "
              f"VP {r.parallelism.vp or 1} DP {plan.dp}.\n"
              f"# Loaded by Bridge's ConfigContainer.from_yaml; every field not here keeps Bridge's default. Edit and "
              f"rerun; each rank runs:\n#   {shlex.join(command(plan, run_dir))}\n")
    if r.method.name != "pretrain":
        header += f"# Fine-tuning rows: {data_format(r, run_dir)}.\n"
    return to_yaml(cfg, header)


def inputs(plan) -> list:
    """The base model's Bridge checkpoint a fine-tuning job starts from; the staged tokenizer directory."""
    r = plan.recipe
    out = []
    if r.method.name != "pretrain" and r.model.megatron_path:  # (a chained import's output does not exist yet)
        out.append(("model.megatron_path", r.model.megatron_path, True))
    if not r.data.tokenizer_model and r.model.hf_path and r.model.hf_path.startswith("/"):
        out.append(("model.hf_path (the staged tokenizer)", r.model.hf_path, True))
    return out


def preflight(plan, run_dir) -> list:
    """The job's pre-flight (vdkit.recipes.common.preflight): a fine-tune's base as Bridge loads it (its tracker, the
    iteration it names, that iteration's distributed checkpoint: without the tracker Bridge's SFT silently starts
    from random weights, training/setup.py), the staged tokenizer, the JSONL files Bridge reads."""
    r = plan.recipe
    out = []
    if r.method.name != "pretrain":
        out.append(("model.megatron_path", r.model.megatron_path or "", "megatron_checkpoint"))
    if not r.data.tokenizer_model and r.model.hf_path and r.model.hf_path.startswith("/"):
        out.append(("model.hf_path (the staged tokenizer)", r.model.hf_path, "tokenizer"))
    if r.method.name != "pretrain" and r.data.name != "synthetic" and r.data.kind == "sft" and r.data.data_dir:
        from vdkit.recipes.bridge.data import TRAIN_FILE, VALIDATION_FILE

        for name in (TRAIN_FILE,) + (() if r.timing else (VALIDATION_FILE,)):  # train mode validates
            out.append((f"data.data_dir's {name}", str(PurePosixPath(r.data.data_dir) / name), "file"))
    return out


def env(plan) -> dict:
    """NVIDIA's environment for this stack (Bridge's NeMo-Run executors and PerfEnvPlugin).

    CUDA_DEVICE_MAX_CONNECTIONS: 1 on Hopper when TP or CP > 1 (without all-to-all overlap), else 8
    (megatron/bridge/recipes/run_plugins.py:573-594)."""
    from vdkit.recipes.bridge import cuda_graphs
    from vdkit.recipes.bridge.config import FP8_ATTENTION_ENV, NVIDIA_H100
    from vdkit.recipes.common.rocm import vendor_env

    margin = str(NVIDIA_H100["layernorm_sm_margin"])
    return vendor_env(plan, {"CUDA_DEVICE_MAX_CONNECTIONS": "1" if plan.tp > 1 or plan.recipe.parallelism.cp > 1 else "8",
            "TORCH_NCCL_HIGH_PRIORITY": "1", "NVTE_NORM_FWD_USE_CUDNN": "1", "NVTE_NORM_BWD_USE_CUDNN": "1",
            # the performance plugin: SMs kept free of the LayerNorm kernels for the overlapped DP communication
            "NVTE_FWD_LAYERNORM_SM_MARGIN": margin, "NVTE_BWD_LAYERNORM_SM_MARGIN": margin,
            # Bridge's later recipes (recipes/utils/environment_utils.py): less fragmentation at 88-90 % of HBM
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "False",
            "PYTHONUNBUFFERED": "1", **(FP8_ATTENTION_ENV if plan.recipe.train.fp8_attention else {}),
            **cuda_graphs.env(plan.recipe)})  # NCCL_GRAPH_REGISTER=0 beside expandable segments (cuda_graphs.py)


def container(plan, run_dir):
    """The NeMo container (engine.container_image) with data, base checkpoint, results and run dir mounted."""
    if not in_container(plan):
        return None
    from vdkit.run.jobspec import Container
    from vdkit.recipes.engines import standard_mounts

    r = plan.recipe
    from vdkit.recipes.bridge.base import base_checkpoint

    base = base_checkpoint(r, True)
    extra = [("model.megatron_path", base)] if base else []
    for what, path in (("data.tokenizer_model", r.data.tokenizer_model), ("model.hf_path", r.model.hf_path)):
        if path and path.startswith("/"):  # a local tokenizer the ranks read (a hub id needs no mount)
            extra.append((what, path))
    from vdkit.recipes.common.rocm import image

    return Container(image=image(plan), mounts=standard_mounts(plan, run_dir, extra), workdir=str(run_dir))


def resume_check(plan, run_dir) -> None:
    """`vdkit run --resume`: the run dir's bridge.yaml (a person may have edited it) as `vdkit check` takes it -
    the job's own loader, the types and counts its dataclasses declare (:mod:`.edits`), then Bridge's
    runtime_config_update - refused in one line before any rank starts."""
    from vdkit.recipes.bridge.runcheck import Refused, check_resume
    from vdkit.recipes.bridge.config import CONFIG_FILE

    try:
        check_resume(Path(run_dir), plan, render_bridge_yaml)
    except Refused as no:
        raise UserError(f"{no.step} refuses {Path(run_dir) / CONFIG_FILE}: {no.error}",
                        f"{no.fix}; the ranks would each stop on it") from None


def check_runs(run_dirs) -> list:
    """`vdkit check`: each run dir's bridge_job.py on its bridge.yaml under Bridge, as far as a CPU goes (:mod:`.runcheck`)."""
    from vdkit.recipes.bridge.runcheck import check_runs as run_checks

    return run_checks(run_dirs, render_bridge_yaml)


def make_base(recipe, directory) -> str:
    """A seeded toy HF model of ``recipe``'s size converted into a Bridge checkpoint at ``directory`` (the demo's
    base model: what a site does once with its own weights); its path."""
    from vdkit.recipes.bridge.convert import make_base as make

    return make(recipe, directory)


SPEC = EngineSpec(
    name="bridge", summary=f"NVIDIA's Megatron-Bridge {BRIDGE_VERSION} (its Llama and Qwen2 providers, NVIDIA's performance settings)",
    command=command, preflight=preflight, check=check, local_check=local_check, files=files, inputs=inputs, env=env, container=container,
    resume_check=resume_check, check_runs=check_runs, make_base=make_base, tp_comm_overlap=overlaps_tp_comm,
    fp8_bf16_layers=fp8_bf16_layers,
    families=("llama",),  # and Qwen2 (the Llama block with model.qkv_bias): Bridge's Qwen2 providers
    maps={"name": "the provider (conf names Bridge has a provider for) and run names",
          "num_layers": "provider.num_layers", "hidden_size": "provider.hidden_size",
          "ffn_hidden_size": "provider.ffn_hidden_size", "num_attention_heads": "provider.num_attention_heads",
          "num_query_groups": "provider.num_query_groups", "vocab_size": "provider.vocab_size",
          "max_position_embeddings": "provider.seq_length", "pretrain_tp": "the planner's layout",
          "pretrain_pp": "the planner's layout", "arch": "Bridge's Llama / Qwen2 providers", "norm": "RMSNorm (Llama)",
          "norm_eps": "provider.layernorm_epsilon", "activation": "SwiGLU (Llama)", "position_embedding": "RoPE (Llama)",
          "rope_base": "provider.rotary_base", "rope_scaling": "provider rope_scaling / seq_len_interpolation_factor",
          "tied_embeddings": "provider.share_embeddings_and_output_weights",
          "tokenizer": "Bridge's TokenizerConfig", "hf_path": "AutoBridge.import_ckpt (the one-time import job)",
          "megatron_path": "checkpoint.pretrained_checkpoint",
          "qkv_bias": "Bridge's Qwen2 providers (add_qkv_bias; Qwen25ModelProvider7B for qwen2_5_7b)"},
    ignores={"nemo_path": "engine=nemo's base model", "pretrained": "its fine-tunes load model.megatron_path"},
    refuses={"bias": "the kit renders Bridge's Llama and Qwen2 providers, which have no biases beyond Q/K/V",
             "embedding_dim": "Llama providers have no projected word embedding",
             "pre_norm": "Llama providers are pre-norm only"},
    methods=("sft", "lora", "pretrain"),  # Bridge's PEFT: LoRA, DoRA, canonical LoRA (no P-tuning)
    lora_targets=LORA_TARGETS,  # peft.target_modules (Bridge 0.3.1 peft/lora.py: any TE linear of the layer)
    lora_a2a=True,  # peft.a2a_experimental (peft/lora.py:91)
    precisions=("bf16", "fp8"),
    fp8_needs_distributed_optimizer=True,  # its FP8 preset's fp8_param_gather (config.PRECISION; check refuses it off)
    # bf16: megatron-core's precision-aware distributed optimizer (config.py BF16_OPTIMIZER_STATE)
    optimizer_dtypes=("fp32", "bf16"),
    # fp8: megatron-core's activation_func_fp8_input_store (config.py SWIGLU_FP8_INPUT_STORE)
    swiglu_input_dtypes=("bf16", "fp8"),
    context_parallel=True,  # Transformer Engine's attention in NVIDIA's image (context_parallel_size)
    fp8_attention=True,  # megatron-core's fp8_dot_product_attention through Bridge's mixed precision (config.py FP8_ATTENTION)
    # layer: megatron-core's cuda_graph_impl=transformer_engine, MLPerf's per-layer graphs (cuda_graphs.py)
    cuda_graphs=("none", "layer"),
    rope_scaling=("llama3", "linear"), mcore_rope=True,  # the provider's (megatron-core's, fixed llama3 factors)
    step_time_regime="fused",  # Bridge renders NVIDIA's performance settings: the fused path (vdkit.planner.predict)
    # its loop's read-backs: the loss's NaN / Inf checks every micro batch (training/losses.py:72-85,
    # check_for_nan_in_loss's default) and the DDP's of each gradient bucket (config.py renders check_for_nan_in_grad)
    loop_drains=("loss", "grad_bucket"),
    run_dir_files=(BRIDGE_CONFIG_FILE, JOB_FILE, IMPORT_FILE, FIRST_FILE, EXPORT_FILE),
    gpu_vendors=("nvidia", "amd"),  # NVIDIA's NeMo image, or on AMD clusters engine.rocm_image (vdkit.recipes.common.rocm)
    images=("engine.container_image", "engine.rocm_image"),
    stack={"Megatron-Bridge": BRIDGE_VERSION, "megatron-core": MCORE_VERSION, "image": IMAGE_TAG},
    runtime_modules=("torch", "megatron.core", "megatron.bridge"), extra="bridge",
    runs_locally=True,  # CPU over gloo with the shim: `vdkit run engine=bridge`
    config_files=(BRIDGE_CONFIG_FILE,),  # held to Bridge's types and the value rules, not bytes
    writes_heartbeat=True,  # every rank beats through Bridge's callbacks (job.heartbeat_callback): the launcher watches
    base_model_key="megatron_path",
)
