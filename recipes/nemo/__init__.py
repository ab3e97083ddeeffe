"""engine=nemo: the NeMo 1.x config a plan becomes, and the command the sbatch script runs.

    render_nemo_yaml(plan, run_dir)  -> the text of run_dir/nemo.yaml (built, checked, dumped)
    nemo_command(plan, run_dir)      -> ["python", "-u", <script>, "--config-path=<run_dir>", "--config-name=nemo.yaml"]

The engine interface (:mod:`vdkit.recipes.engines`): ``files`` (nemo.yaml), ``command``,
``container`` (the NeMo image with the data, base-model, results and run directories mounted),
``inputs`` (the base model), ``env`` (CUDA_DEVICE_MAX_CONNECTIONS with TP), NeMo's own log format.

NeMo's scripts are Hydra apps: the rendered YAML replaces NeMo's own config instead of being
nested inside vdkit's Hydra. Building lives in :mod:`.config`, the contract (deliberately added
keys, the traps refused before anything is written) in :mod:`.contract`.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import List, Union

from vdkit.run.jobspec import Container
from vdkit.recipes.nemo.runcheck.venv import NEMO_VERSION
from vdkit.recipes.spec import EngineSpec
from vdkit.run.rundir import NEMO_CONFIG_FILE
from vdkit.recipes.nemo.config import build_config
from vdkit.recipes.nemo.contract import check_nemo_config
from vdkit.recipes.nemo.performance import megatron_amp_o2

# Under engine.nemo_root inside the container (NeMo 1.x layout; also in 24.05+ images).
FINETUNE_SCRIPT = "examples/nlp/language_modeling/tuning/megatron_gpt_finetuning.py"
PRETRAIN_SCRIPT = "examples/nlp/language_modeling/megatron_gpt_pretraining.py"


def nemo_script(recipe) -> str:
    """The NeMo example script the recipe runs, as a path inside the container."""
    rel = PRETRAIN_SCRIPT if recipe.method.name == "pretrain" else FINETUNE_SCRIPT
    return str(PurePosixPath(recipe.engine.nemo_root) / rel)


def nemo_command(plan, config_dir: Union[str, Path], config_name: str = None) -> List[str]:
    """The argv srun runs on every task: NeMo's script reading ``config_dir/config_name``."""
    from vdkit.run.rundir import NEMO_CONFIG_FILE

    config_dir = PurePosixPath(Path(config_dir).absolute())
    return ["python", "-u", nemo_script(plan.recipe),
            f"--config-path={config_dir}", f"--config-name={config_name or NEMO_CONFIG_FILE}"]


def render_nemo_yaml(plan, run_dir: Union[str, Path]) -> str:
    """Build the config, refuse the known traps (UserError), and dump it as YAML text.

    The text is headed by the command that runs it; it is what the Slurm renderer writes as
    ``run_dir/nemo.yaml`` (vdkit.run.rundir.NEMO_CONFIG_FILE).
    """
    import yaml

    cfg = build_config(plan, run_dir)  # Fine-tuning: finetuning_config's shape; pretrain: llama_config's
    check_nemo_config(cfg, plan)
    r = plan.recipe
    header = (f"# NeMo 1.x config rendered by vdkit for {r.run_name}: {r.model.name} {r.method.name}, "
              f"{r.cluster.nodes} x {r.cluster.gpus_per_node} GPUs, TP {plan.tp} PP {plan.pp} DP {plan.dp}.\n"
              f"# Run (in the NeMo container, one task per GPU): {' '.join(nemo_command(plan, run_dir))}\n")
    return header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False, width=4096)


# ----------------------------------------------------------------------------- the engine interface
def finished_line(plan) -> str:
    """What Lightning's fit loop logs on rank 0 when every step is done (lightning/pytorch/loops/fit_loop.py);
    a max_time stop exits 0 without it."""
    return f"`Trainer.fit` stopped: `max_steps={plan.recipe.train.max_steps}` reached."


def _base_model_dir(recipe):
    """The base model's directory when the method starts from one (fine-tuning), else None."""
    if recipe.model.nemo_path and recipe.method.name != "pretrain":
        return str(PurePosixPath(recipe.model.nemo_path).parent)
    return None


def command(plan, run_dir) -> List[str]:
    """The argv srun runs on every task: :func:`nemo_command` with the run dir's heartbeat callback directory put
    first on PYTHONPATH (Lightning finds the callback through its entry points: vdkit.recipes.nemo.heartbeat);
    the image's own PYTHONPATH is kept after it."""
    import shlex

    from vdkit.recipes.nemo.heartbeat import CALLBACK_DIR

    from vdkit.run.rundir import PREFLIGHT_FILE, PREFLIGHT_SCRIPT

    run = PurePosixPath(Path(run_dir).absolute())
    callbacks = shlex.quote(str(run / CALLBACK_DIR))
    nemo = nemo_command(plan, run_dir)
    # Before NeMo's script: the base .nemo is there and a .nemo (the run dir's pre-flight, --base: a few reads), so a
    # rank never starts NeMo on a missing base (its FileNotFoundError is exit 1, which the launchers retry).
    base = shlex.join([nemo[0], str(run / PREFLIGHT_SCRIPT), "--base", str(run / PREFLIGHT_FILE)])
    return ["bash", "-c", f"{base} || exit $?; PYTHONPATH={callbacks}${{PYTHONPATH:+:$PYTHONPATH}} exec "
                          f"{shlex.join(nemo)}"]


def heartbeat_files() -> dict:
    """The run dir's :data:`~vdkit.recipes.nemo.heartbeat.CALLBACK_DIR`: the callback module, the heartbeat as one
    file, and the metadata of a distribution whose entry points name the callback factories (Lightning loads them
    into every Trainer NeMo's script builds)."""
    from vdkit.recipes.nemo import heartbeat as cb
    from vdkit.recipes.common.heartbeat import STANDALONE_NAME, standalone_source

    info = f"{cb.CALLBACK_DIR}/{cb.DIST_NAME}-1.0.dist-info"
    entry_points = "".join(f"[{group}]\nvdkit_heartbeat = {cb.DIST_NAME}:{fn}\n\n" for group, fn in cb.ENTRY_POINTS.items())
    return {f"{cb.CALLBACK_DIR}/{cb.DIST_NAME}.py": Path(cb.__file__).read_text(),
            f"{cb.CALLBACK_DIR}/{STANDALONE_NAME}.py": standalone_source(),
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {cb.DIST_NAME}\nVersion: 1.0\n",
            f"{info}/entry_points.txt": entry_points}


# NeMo 1.23's own HF -> .nemo converter for Llama (in the image; later releases moved it to
# scripts/checkpoint_converters/convert_llama_hf_to_nemo.py): --in-file HF_DIR --out-file X.nemo --precision.
CONVERTER = "scripts/nlp_language_modeling/convert_hf_llama_to_nemo.py"
CONVERT_PRECISION = "bf16"  # bf16 where the job's GPU supports it (the converter falls back to fp16 without one)


def import_sbatch(plan) -> str:
    """The one-time conversion job: the staged HF weights -> ``model.nemo_path`` with NeMo 1.23's converter,
    one task on one whole node in the NeMo image (the converter loads the whole model in host memory)."""
    from vdkit.recipes.common import staging

    r = plan.recipe
    src, out = staging.conversion_source(r), str(r.model.nemo_path)
    script = str(PurePosixPath(r.engine.nemo_root) / CONVERTER)
    comments = [
        f"One-time step before fine-tuning {r.model.name} with engine=nemo: convert the staged HF weights ({src})",
        f"to {out} with NeMo 1.23's own {CONVERTER}, inside the NeMo image.",
        "Run it once per site and model (not per job):   sbatch import_hf.sbatch",
        "The whole node: the converter holds the model in host memory (a 70B: ~140 GB in bf16, more while it copies).",
    ]
    mounts = {staging.parent(out)} | ({src} if staging.is_local(src) else set())
    return staging.one_node_sbatch(plan, f"import-{r.model.name}", comments, r.engine.container_image or "", mounts,
                                   ["python", script, "--in-file", src, "--out-file", out,
                                    "--precision", CONVERT_PRECISION], secrets=not staging.is_local(src))


def _converts(recipe) -> bool:
    """Whether the run dir holds the one-time HF -> .nemo conversion job (fine-tuning from model.hf_path;
    a site's own .nemo with no hf_path has none)."""
    return _base_model_dir(recipe) is not None and bool(recipe.model.hf_path)


def files(plan, run_dir) -> dict:
    """nemo.yaml, built and checked against NeMo's traps; the heartbeat callback (:func:`heartbeat_files`); for
    fine-tuning, the one-time conversion job."""
    from vdkit.run.rundir import IMPORT_FILE, NEMO_CONFIG_FILE

    out = {NEMO_CONFIG_FILE: render_nemo_yaml(plan, Path(run_dir)), **heartbeat_files()}
    if _converts(plan.recipe):
        out[IMPORT_FILE] = import_sbatch(plan)
    return out


def inputs(plan) -> list:
    """The base .nemo file (and its directory) a fine-tuning job restores from; a packed run's .npy files,
    each named with the command that writes it (``vdkit data pack``, on the login node)."""
    from vdkit.recipes.common import staging
    from vdkit.recipes.common.packing import pack_command, packed_files
    from vdkit.run.rundir import IMPORT_FILE

    r = plan.recipe
    out = []
    base = _base_model_dir(r)
    if base is not None:
        out += [("the directory of model.nemo_path", base, True),
                ("model.nemo_path" + (f" (make it: sbatch {IMPORT_FILE})" if _converts(r) else ""), r.model.nemo_path,
                 False)]
    if r.data.packed and r.data.data_dir:
        tok = staging.staged_tokenizer(r) or "<the model's staged tokenizer>"
        out += [(f"packed training file (make it once: {pack_command(r, src, npy, tok)}) data.packed", npy, False)
                for src, npy in packed_files(r)]
    return out


def preflight(plan, run_dir) -> list:
    """The job's pre-flight (vdkit.recipes.common.preflight): a fine-tune's base .nemo (a tar NeMo's restore opens, holding
    model_config.yaml), the packed .npy files (their headers load) or the JSONL files NeMo's datasets read."""
    r = plan.recipe
    out = []
    if r.method.name != "pretrain":
        out.append(("model.nemo_path", r.model.nemo_path or "", "nemo"))
    d = r.data
    if d.kind == "sft" and d.data_dir:
        from pathlib import PurePosixPath as P

        if d.packed:
            from vdkit.recipes.common.packing import packed_files

            out += [("data.packed (vdkit data pack)", npy, "npy") for _src, npy in packed_files(r)]
        else:
            out += [("data.train_files", str(P(d.data_dir) / n), "file") for n in d.train_files]
        out += [("data.validation_files", str(P(d.data_dir) / n), "file") for n in d.validation_files]
        # the render's test_ds: MegatronGPTSFTModel builds it at fit's start-up too (megatron_gpt_sft_model.py:773)
        out += [("data.test_files", str(P(d.data_dir) / n), "file") for n in d.test_files]
    return out


def env(plan) -> dict:
    """NVIDIA's launcher's environment for this image. CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context
    parallelism: it orders their communication before compute. NVTE_FUSED_ATTN=0: TE 1.2+ would otherwise run
    cuDNN's attention on H100, which NeMo-Framework-Launcher 24.01 - 24.07 switched off ("Disable cudnn FA until we've
    tested it more", config.yaml, commit 562dcb45), so the job runs the flash-attn 2 kernels the plan prices
    (conf/calibration/step_time.yaml attention: TE 1 -> flash2; docs/prediction.md "Table 4's stack")."""
    out = {"NVTE_FUSED_ATTN": "0"}
    if plan.tp > 1 or plan.recipe.parallelism.cp > 1:
        out["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return out


def container(plan, run_dir) -> Container:
    """The NeMo container (engine.container_image) with data, base model, results and run dir mounted."""
    from vdkit.recipes.engines import standard_mounts

    base = _base_model_dir(plan.recipe)
    extra = [("the directory of model.nemo_path", base)] if base else []
    return Container(image=plan.recipe.engine.container_image, mounts=standard_mounts(plan, run_dir, extra),
                     workdir=str(run_dir))


def check_runs(run_dirs) -> list:
    """`vdkit check`: NeMo 1.23's own optimizer registry, restore merge and dataset on each nemo.yaml (:mod:`.runcheck`)."""
    from vdkit.recipes.nemo.runcheck import check_runs as run_checks

    return run_checks(run_dirs, render_nemo_yaml)


SPEC = EngineSpec(
    name="nemo", summary=f"NVIDIA NeMo {NEMO_VERSION} (the design guides' stack), in its container on the cluster",
    command=command, preflight=preflight, files=files, inputs=inputs, env=env, container=container, check_runs=check_runs,
    finished_line=finished_line,
    families=("llama", "opt"),
    maps={"name": "run names", "num_layers": "model.num_layers", "hidden_size": "model.hidden_size",
          "ffn_hidden_size": "model.ffn_hidden_size", "num_attention_heads": "model.num_attention_heads",
          "num_query_groups": "model.num_query_groups", "vocab_size": "the tokenizer's (padded by NeMo)",
          "max_position_embeddings": "model.max_position_embeddings", "pretrain_tp": "the planner's layout",
          "pretrain_pp": "the planner's layout", "nemo_path": "model.restore_from_path",
          "arch": "the fields below", "norm": "model.normalization", "norm_eps": "model.layernorm_epsilon",
          "activation": "model.activation", "bias": "model.bias", "position_embedding": "model.position_embedding_type",
          "rope_base": "model.rotary_base", "rope_scaling": "model.seq_len_interpolation_factor (linear)",
          "tied_embeddings": "model.share_embeddings_and_output_weights", "tokenizer": "model.tokenizer.library",
          "hf_path": "the one-time HF -> .nemo conversion job (NeMo's Llama converter)"},
    ignores={"megatron_path": "engine=bridge's base model", "pretrained": "its fine-tunes restore model.nemo_path"},
    refuses={"qkv_bias": ("NeMo 1.23's GPT model has no Q/K/V-only bias (no qkv_bias key in its code) and its HF "
                          "import is the Llama converter, which would drop the biases"),
             "embedding_dim": "NeMo's GPT model has no projected word embedding",
             "pre_norm": "NeMo's GPT model config here is pre-norm"},
    methods=("sft", "lora", "ptuning", "pretrain"), precisions=("bf16", "fp8"),
    no_lora_targets=("NeMo 1.23's lora_tuning adapts the fused QKV only: its LoraPEFTConfig builds LORA_KQV_ADAPTER "
                     "alone and reads no target_modules (nemo/collections/nlp/parts/peft_config.py 62-122)"),
    optimizer_dtypes=("fp32", "bf16"),  # distributed_fused_adam's dtype / grad_sync_dtype (recipes/nemo/config.py _optim)
    context_parallel=True,  # NeMo 1.23's context_parallel_size (megatron_base_model.py:196), TE attention
    no_fp8_attention=("NeMo 1.23 has no FP8 attention setting: its source never names fp8_dot_product_attention or "
                      "fp8_dpa, its FP8 recipe is DelayedScaling without it (modules/common/megatron/transformer.py:1015)"
                      ", and its image's Transformer Engine 1.2 predates fp8_dpa (TE 1.6)"),
    no_cuda_graphs=("NeMo 1.23's GPT models have no CUDA-graph setting: enable_cuda_graph (NeMo 24.09's per-layer "
                    "graphs, MLPerf's LAYER_CUDA_GRAPH) is not in its source, and its one CUDAGraphCallback "
                    "(utils/callbacks/cuda_graph.py, a whole step under torch DDP) is wired to Stable Diffusion only"),
    rope_scaling=("linear",),  # NeMo 1.23: model.seq_len_interpolation_factor only (no llama3 scaling)
    step_time_regime="unfused",  # the design guide's stack: NeMo 1.x defaults (vdkit.planner.predict)
    # no loop_drains priced: NeMo 1.23's Lightning step reads its loss back once a step (the logged reduced_train_loss),
    # which the unfused regime's constants, fitted on the design guide's runs, absorb
    # without megatron_amp_O2 (PEFT in the design guide's recipe) NeMo 1.23 builds fp32 parameters
    # (megatron_base_model.py:128-132): the memory model counts them (conf/calibration/memory.yaml fp32_params_bytes)
    fp32_params=lambda recipe: not megatron_amp_o2(recipe),
    # no tp_comm_overlap: NVIDIA's pretraining settings ask for model.ub_tp_comm_overlap, but the kit renders it off
    # (contract.PRETRAIN_DEPARTURES: NeMo 1.23's userbuffers need an MPI bootstrap), and the fast recipe does not
    # render it (performance.PERFORMANCE_DEPARTURES): the step-time model counts NeMo's TP collectives whole
    run_dir_files=(NEMO_CONFIG_FILE,),
    gpu_vendors=("nvidia",),  # NVIDIA's NeMo image: CUDA only
    images=("engine.container_image",), stack={"NeMo": NEMO_VERSION},
    runs_locally=False,  # NeMo runs only in its container on the cluster (it needs Apex and GPUs)
    config_files=(NEMO_CONFIG_FILE,),  # held to NeMo's types and the value rules, not bytes
    # NeMo 1.23 nlp_adapter_mixins.py:176 add_adapter: "Virtual pipeline model parallel is not supported when using
    # PEFT"; `vdkit check` runs that precondition (recipes/nemo/runcheck/probe.py check_peft)
    no_peft_interleaving="NeMo 1.23's add_adapter refuses it (nlp_adapter_mixins.py:176)",
    writes_heartbeat=True,  # a Lightning callback from the run dir (vdkit.recipes.nemo.heartbeat): the launcher watches
    # NeMo stops by its own clock (exp_manager.max_time_per_run, rendered from the plan) and exits 0;
    # a USR1 would reach Lightning's SLURM handler, which runs `scontrol requeue` inside the container.
    catches_stop_signals=False,
)
