"""Composition and rules: Hydra composes conf/ with the overrides into a validated Recipe.

Overrides -> Hydra compose (the schema, :mod:`vdkit.composition.schema`, from the ConfigStore) -> re-merge into
the schema (so that a ``+key=...`` cannot smuggle an unknown key past it) -> field rules -> a frozen
:class:`~vdkit.composition.schema.Recipe`.

Everything downstream takes a ``Recipe``; nothing re-reads overrides.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from functools import lru_cache
from typing import Any, Dict, List, Optional

from vdkit.composition.conftree import conf_dir
from vdkit.errors import UserError
from vdkit.launch.fabric import NCCL_DEBUG_LEVELS, check_names
from vdkit.composition.limits import MAX_SEQ_LENGTH, MAX_TRAIN_STEPS, check_node_cpus
from vdkit.composition.schema import ARCHS, ATTENTIONS, METHODS, PRECISIONS, RUN_MODES, SHARDINGS, ModelCfg, Recipe, VdkitConfig
from vdkit.rules.overrides import refuse_env_interpolation

# ----------------------------------------------------------------------------- allowed values
def _engine_names() -> tuple:
    from vdkit.recipes.engines import names
    return names()


PEFT_SCHEMES = {"sft": "none", "lora": "lora", "ptuning": "ptuning", "pretrain": "none"}
RECOMPUTE = ("none", "selective", "full")
MPI_TYPES = ("pmix", "pmi2", "pmi1", "none")
DATA_KINDS = ("sft", "pretrain")
TRANSPORTS = ("ib", "roce", "tcp")
NORMS = ("rmsnorm", "layernorm")
ACTIVATIONS = ("swiglu", "relu", "gelu")
POSITION_EMBEDDINGS = ("rope", "learned")
TOKENIZERS = ("sentencepiece", "huggingface", "byte-level")


# ----------------------------------------------------------------------------- conf/ location
def group_options(group: str) -> List[str]:
    """The options of one config group (file stems under conf/<group>/ and the user's --config-dir)."""
    return sorted({p.stem for p in (conf_dir() / group).glob("*.yaml")} | set(_user_options(group)))


# ----------------------------------------------------------------------------- the user's config dir
_USER_DIRS: List[Path] = []  # --config-dir DIR (Hydra's convention): DIR/<group>/<name>.yaml beside conf/


def use_config_dir(path: str) -> None:
    """Add ``path`` as a user config dir: its ``cluster/NAME.yaml`` (etc.) become ``cluster=NAME`` options."""
    d = Path(path).expanduser().absolute()
    loose = [] if any(d.glob("*/*.yaml")) else sorted(f.name for f in d.glob("*.yaml"))  # cluster=NAME: "not found"
    if not d.is_dir() or loose:
        raise UserError(f"--config-dir {path}: " + (f"{', '.join(loose)} at its top, in no group folder" if loose else
                        "no such directory"), "give the directory that holds cluster/NAME.yaml (`vdkit site probe --out DIR`'s)")
    for f in sorted(d.glob("*/*.yaml")):
        if (conf_dir() / f.parent.name / f.name).is_file():
            raise UserError(f"{f} has the name of the kit's own {f.parent.name}={f.stem}",
                            f"rename it (e.g. {f.parent.name}/{f.stem}_site.yaml) so cluster= says which one you mean")
    if d not in _USER_DIRS:
        _USER_DIRS.append(d)


def _user_options(group: str) -> Dict[str, Path]:
    return {f.stem: f for d in _USER_DIRS for f in sorted((d / group).glob("*.yaml"))}


def _register_user_configs() -> None:
    """The user's group files as ConfigStore entries (a file-system search path would wake every
    installed Hydra search-path plugin, e.g. multistorageclient's, which prints tracebacks)."""
    from hydra.core.config_store import ConfigStore

    from vdkit.composition.files import load_yaml

    for group in sorted({f.parent.name for d in _USER_DIRS for f in d.glob("*/*.yaml")}):
        for name, f in _user_options(group).items():
            try:
                data = load_yaml(f, f"{group}={name}")
            except UserError:
                continue  # a broken file stops only a command that chooses it (vdkit.rules.sitefiles says why)
            if isinstance(data, dict) and data:  # empty or not a mapping: likewise
                ConfigStore.instance().store(group=group, name=name, node=data)


# ----------------------------------------------------------------------------- compose
_STORED = False


def _register_schema() -> None:
    global _STORED
    if _STORED:
        return
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="vdkit_schema", node=VdkitConfig)
    from omegaconf import OmegaConf

    from vdkit.planner.calibration import MEMORY_RESOLVER, gpu_memory_gb

    # ${nvidia_pretrain:MODEL,KEY}: NVIDIA's Llama 2 pretraining value (conf/method/pretrain.yaml uses it);
    # ${gpu_memory_gb:GPU_TYPE}: the GPU's reported total (conf/cluster/*.yaml: the capacity follows cluster.gpu_type).
    OmegaConf.register_new_resolver("nvidia_pretrain", _nvidia_pretrain, replace=True)
    OmegaConf.register_new_resolver(MEMORY_RESOLVER, gpu_memory_gb, replace=True)
    _STORED = True


NVIDIA_PRETRAIN_FILE = Path("nvidia") / "llama2_pretrain.yaml"  # under conf/: NVIDIA's Llama 2 settings (data)


@lru_cache(maxsize=1)
def nvidia_pretrain_tables() -> dict:
    """conf/nvidia/llama2_pretrain.yaml: NVIDIA's common and per-size settings, NeMo's llama defaults."""
    import yaml

    return yaml.safe_load((conf_dir() / NVIDIA_PRETRAIN_FILE).read_text())


def nvidia_pretrain_settings(model_name: str) -> Dict[str, Any]:
    """NVIDIA's pretraining settings for one Llama 2 size (common + per size); {} for other models."""
    tables = nvidia_pretrain_tables()
    if model_name not in tables["by_size"]:
        return {}
    return {**tables["common"], **tables["by_size"][model_name]}


def _nvidia_pretrain(model: str, key: str):
    """NVIDIA's launcher value of ``model.optim.KEY`` / ``model.optim.sched.KEY`` for a Llama 2 size.

    Sizes NVIDIA publishes no recipe for get NeMo's llama YAML defaults (lr 2e-4, min_lr 2e-5)."""
    settings = {**nvidia_pretrain_tables()["nemo_llama_defaults"], **nvidia_pretrain_settings(model)}
    for dotted in (f"model.optim.{key}", f"model.optim.sched.{key}"):
        if dotted in settings:
            return settings[dotted]
    raise ValueError(f"no NVIDIA pretraining value for {key!r}")


@lru_cache(maxsize=1)
def schema_node():
    """``OmegaConf.structured(VdkitConfig)``, built once: OmegaConf.merge deep-copies its first argument,
    so every merge into it starts from the same untouched schema (a sweep merges one per cell)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(VdkitConfig)


def hydra_message(exc: BaseException) -> str:
    """Hydra's message and its cause's first lines (one ending in ':' with the next), and OmegaConf's full_key."""
    parts, key = [], None
    while exc is not None and len(parts) < 2:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        key = key or next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), None)
        first = (" ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines or [""])[0]).rstrip(".")
        parts, exc = parts + ([first] if first and first not in parts else []), exc.__cause__
    return (": ".join(parts) or "composition failed") + (f" (key {key})" if key and key not in str(parts) else "")


def compose(overrides: List[str] | tuple = ()) -> Recipe:
    """Compose conf/ with Hydra-syntax overrides and validate the result into a Recipe.

    Raises UserError (one line) for an unknown key, a wrong type, a bad group option,
    a ``+key=`` outside the schema, or a recipe that breaks a rule.
    """
    from hydra import compose as hydra_compose
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vdkit import rules
    from vdkit.composition.confsource import compose_by_groups, search_path, split_overrides
    from vdkit.rules.overrides import check_overrides
    from vdkit.rules.sitefiles import check_chosen_user_files

    _register_schema()
    _register_user_configs()
    overrides = list(overrides)
    refuse_env_interpolation(overrides)
    check_chosen_user_files(overrides, _user_options)  # a site file held to the command line's rules
    check_overrides(overrides, duplicates=False)  # ~key, hydra.*, sweep syntax in a single recipe
    GlobalHydra.instance().clear()
    try:
        # initialize_config_dir's steps, on the kit's search path (no plugin scan, YAML parsed once)
        version.setbase("1.3")
        Hydra.create_main_hydra2(task_name="vdkit", config_search_path=search_path(str(conf_dir())))
        cfg = None
        picked = split_overrides(overrides, {p.name for p in conf_dir().iterdir() if p.is_dir()}
                                 | {p.name for d in _USER_DIRS for p in d.iterdir() if p.is_dir()})
        if picked is not None:
            try:  # a sweep composes once per group selection; any doubt (an error) composes in full below
                cfg = compose_by_groups(*picked, dirs=[conf_dir(), *_USER_DIRS])
            except Exception:  # noqa: BLE001 - the full compose below gives Hydra's own message
                cfg = None
        if cfg is None:
            cfg = hydra_compose(config_name="config", overrides=overrides)
            # Re-merge into a fresh schema: Hydra force-adds "+key=value"; a closed schema refuses it.
            # (Merging Hydra's own node keeps its forced keys, so merge plain data instead.) A per-selection
            # compose (no "+key": split_overrides) is Hydra's schema-typed node already: no second check.
            cfg = OmegaConf.merge(schema_node(), OmegaConf.to_container(cfg, resolve=True))
        obj: VdkitConfig = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        own = _resolver_error(exc)
        raise own or UserError(f"invalid configuration: {hydra_message(exc)}", _fix_hint(hydra_message(exc))) from None
    finally:
        GlobalHydra.instance().clear()
    absolute_paths(obj)
    recipe = Recipe(overrides=tuple(overrides),
                    **{f.name: getattr(obj, f.name) for f in dataclasses.fields(VdkitConfig)})
    rules.check_recipe(recipe)  # numbers, architecture, cluster.env, files the kit reads (vdkit/rules/)
    validate_fields(recipe)
    return recipe


# Every path a recipe holds, made absolute against the directory vdkit runs in, once, here: the job
# runs elsewhere (a rank's cwd is the run dir, srun's a compute node's), and a relative path would
# be read against a different directory at run time than at render time.
PATH_FIELDS = (("run", "out_dir"), ("run", "results_dir"), ("run", "secrets_file"), ("data", "data_dir"),
               ("data", "tokenizer_model"), ("model", "nemo_path"),
               ("model", "megatron_path"))


def absolute_paths(cfg, cwd: Optional[str] = None) -> None:
    """Make the PATH_FIELDS of ``cfg`` (and a ``./`` container image) absolute, ``~`` expanded; in place."""
    base = cwd or os.getcwd()
    for section, key in PATH_FIELDS:
        sec = getattr(cfg, section)
        value = getattr(sec, key)
        if value:
            setattr(sec, key, os.path.normpath(os.path.join(base, os.path.expanduser(str(value)))))
    hf = cfg.model.hf_path  # a hub id (org/name) stays; a local path is read by ranks elsewhere
    if hf and str(hf).startswith(("./", "../", "~")):
        cfg.model.hf_path = os.path.normpath(os.path.join(base, os.path.expanduser(str(hf))))
    image = cfg.engine.container_image
    if image and str(image).startswith("./"):  # pyxis reads "./x.sqsh" as a file relative to srun's cwd
        cfg.engine.container_image = os.path.normpath(os.path.join(base, str(image)))


def _resolver_error(exc: BaseException) -> Optional[UserError]:
    """The UserError a resolver raised (``${gpu_memory_gb:...}``), which OmegaConf and Hydra wrap: its own line."""
    while exc is not None and not isinstance(exc, UserError):
        exc = exc.__cause__ or exc.__context__
    return exc


def _fix_hint(msg: str) -> str:
    if "Could not find '" in msg:
        group = msg.split("Could not find '", 1)[1].split("/", 1)[0]
        if (conf_dir() / group).is_dir():
            return f"choose one of {group}=" + "|".join(group_options(group))
    if "not in '" in msg:
        return "check the key's spelling; `vdkit plan --cfg` prints every key and its default"
    if "Could not override 'cluster.env'" in msg:
        return "add one variable at a time: +cluster.env.NAME=VALUE (secrets: run.secrets_file=PATH)"
    if "is not in struct" in msg and "Could not override '" in msg:  # a new entry of a mapping, given without '+'
        key = msg.split("Could not override '", 1)[1].split("'", 1)[0]
        return (f"add a variable with a leading '+': +{key}=VALUE (secrets: run.secrets_file=PATH)" if
                key.startswith("cluster.env.") else f"{key} is not set in this config: add it with a leading '+' "
                f"(+{key}=VALUE) or check the spelling; `vdkit plan --cfg` prints every key and its default")
    if "converted to" in msg:
        return "give a value of the key's type; `vdkit plan --cfg` prints every key and its default"
    return "write overrides as key=value (group=option for model, method, cluster, data, engine)"


# ----------------------------------------------------------------------------- field rules
def _check(ok: bool, what: str, fix: str) -> None:
    if not ok:
        raise UserError(what, fix)


def validate_fields(r: Recipe, host: bool = True) -> None:
    """Rules on single fields and their obvious pairs, after :func:`vdkit.rules.check_recipe` (so every
    field of :data:`vdkit.rules.numbers.DOMAINS` is already in its range: its rule lives there, not here).
    Layout rules live in vdkit.planner.layout. ``host=False`` leaves out the rules that read this machine
    (its CPU count): a run directory read back elsewhere (vdkit.run.rundir.load_recipe) is not refused for it."""
    c, t, m = r.cluster, r.train, r.method
    _check(m.name in METHODS, f"method.name={m.name!r} is not a method", "use one of " + ", ".join(METHODS))
    _check(m.peft_scheme == PEFT_SCHEMES[m.name],
           f"method.peft_scheme={m.peft_scheme!r} does not match method {m.name}",
           f"set method.peft_scheme={PEFT_SCHEMES[m.name]}")
    engines = _engine_names()  # the registry now (a test or plugin may have added a line)
    _check(r.engine.name in engines, f"engine.name={r.engine.name!r} is not an engine",
           "use " + " or ".join(f"engine={e}" for e in engines))
    from vdkit.launch import launchers

    _check(c.launcher in launchers.names(), f"cluster.launcher={c.launcher!r} is not a launcher",
           "use " + " or ".join(f"cluster.launcher={n}" for n in launchers.names()))
    # Fabric rules (RDMA adapters, NCCL_IB_DISABLE) apply where ranks span nodes, not on this machine's launcher.
    spans_nodes = not launchers.get(c.launcher).executes_here
    _check(c.mpi in MPI_TYPES, f"cluster.mpi={c.mpi!r} is not an srun --mpi type", "use " + ", ".join(MPI_TYPES))
    _check(c.min_nodes <= c.nodes <= c.max_nodes,
           f"cluster.nodes={c.nodes} is outside {c.min_nodes}-{c.max_nodes} for cluster {c.name}",
           f"use cluster.nodes between {c.min_nodes} and {c.max_nodes}")
    _check(c.gpus_per_node >= 1, f"cluster.gpus_per_node={c.gpus_per_node} must be at least 1",
           "use cluster.gpus_per_node=8 (or 4 for half a node)")
    _check(c.node_gpus is None or c.gpus_per_node <= c.node_gpus,
           f"cluster.gpus_per_node={c.gpus_per_node} is more than a node of cluster {c.name} has ({c.node_gpus} GPUs): "
           "the scheduler would refuse the job", f"use cluster.gpus_per_node={c.node_gpus} (or fewer), and more cluster.nodes")
    _check(c.max_time_min > 0, "cluster.max_time_min must be positive",
           "set it to your partition's maximum time in minutes (`sinfo -o \"%P %l\"`)")
    _check(c.time_limit_min is None or c.time_limit_min <= c.max_time_min,
           f"cluster.time_limit_min={c.time_limit_min} exceeds the partition's maximum cluster.max_time_min="
           f"{c.max_time_min}", "lower cluster.time_limit_min (the run continues over several allocations), or "
           "set cluster.max_time_min to your partition's real limit")
    _check(c.storage_write_gbps_per_node > 0, "cluster.storage_write_gbps_per_node must be positive",
           "measure the checkpoint storage's write rate per node (GB/s), e.g. 0.67 for PowerScale F710")
    _check(c.startup_s >= 0, f"cluster.startup_s={c.startup_s} must be >= 0",
           "set the seconds an allocation takes before its first step (read a job's log), e.g. cluster.startup_s=120")
    _check(c.mtbf_h > 0, f"cluster.mtbf_h={c.mtbf_h} must be positive",
           "set the mean hours between job failures on your cluster, e.g. cluster.mtbf_h=24")
    _check(c.max_lost_work_min > 0, f"cluster.max_lost_work_min={c.max_lost_work_min} must be positive",
           "set the most minutes of training a failure may lose, e.g. cluster.max_lost_work_min=60")
    for key in ("heartbeat_timeout_s", "kill_grace_s", "restart_delay_s"):
        value = getattr(c, key)
        _check(value is None or (math.isfinite(value) and 1 <= value <= 86400),
               f"cluster.{key}={value} must be between 1 and 86400 seconds",
               f"leave it out (the default in vdkit.run.faults) or give e.g. cluster.{key}=20")
    _check(c.cpus_per_task >= 1, f"cluster.cpus_per_task={c.cpus_per_task} must be at least 1 (sbatch rejects it)",
           "use e.g. cluster.cpus_per_task=12 (the CPU cores per GPU rank)")
    check_node_cpus(c.cpus_per_task, c.gpus_per_node, launchers.get(c.launcher).executes_here and host)
    _check(t.micro_batch_size >= 1, f"train.micro_batch_size={t.micro_batch_size} must be >= 1",
           "use train.micro_batch_size=1")
    _check(t.global_batch_size >= t.micro_batch_size,
           f"train.global_batch_size={t.global_batch_size} is smaller than the micro batch",
           "use a multiple of train.micro_batch_size x DP")
    _check(r.run.mode in RUN_MODES, f"run.mode={r.run.mode!r} is not a run mode",
           "use run.mode=train (validation, checkpoints, exported weights) or run.mode=timing (the guides' timing run)")
    _check(t.val_every_n_steps is None or t.val_every_n_steps >= 1,
           f"train.val_every_n_steps={t.val_every_n_steps} must be >= 1", "use e.g. train.val_every_n_steps=100, or leave it unset")
    _check(t.val_batches >= 1, f"train.val_batches={t.val_batches} must be >= 1", "use e.g. train.val_batches=10")
    _check(t.max_steps > 0, f"train.max_steps={t.max_steps} must be > 0 (NeMo needs a positive max_steps)",
           "use e.g. train.max_steps=50")
    _check(t.target_steps > 0, f"train.target_steps={t.target_steps} must be > 0", "use train.target_steps=1000")
    for key, steps in (("train.max_steps", t.max_steps), ("train.target_steps", t.target_steps)):
        _check(steps <= MAX_TRAIN_STEPS, f"{key}={steps} is more than {MAX_TRAIN_STEPS:,} optimizer steps: no "
               "training run takes that many (Llama 2's pretraining took 500,000)",
               f"use the steps you mean to train, e.g. {key}=1000")
    _check(t.seq_length >= 1, f"train.seq_length={t.seq_length} must be >= 1", "use e.g. train.seq_length=2048")
    _check(t.seq_length <= MAX_SEQ_LENGTH, f"train.seq_length={t.seq_length:,} is more than the {MAX_SEQ_LENGTH:,} "
           "tokens any model's context holds", "use the sequence length you mean, e.g. train.seq_length=4096")
    _check(t.precision in PRECISIONS, f"train.precision={t.precision!r} is not supported",
           "use " + " or ".join(PRECISIONS))
    _check(not t.fp8_attention or t.precision == "fp8", f"train.fp8_attention=true with train.precision={t.precision}: "
           "FP8 attention runs inside Transformer Engine's FP8 autocast, which only FP8 precision turns on",
           "set train.precision=fp8, or train.fp8_attention=false")
    _validate_model(r.model)
    from vdkit.planner.calibration import check_gpu_memory, check_gpu_vendor

    check_gpu_vendor(c)  # a vendor the kit runs, and the gpu_type's (hf_step_time.yaml): the images and collectives
    check_gpu_memory(c)  # no more memory than the gpu_type has: the plan's "fits" is the job's
    _check(c.nccl_debug is None or str(c.nccl_debug).upper() in NCCL_DEBUG_LEVELS,
           f"cluster.nccl_debug={c.nccl_debug!r} is not an NCCL_DEBUG level (NCCL would ignore it)",
           "use one of " + ", ".join(NCCL_DEBUG_LEVELS) + ", or null")
    check_names(c)  # interface and adapter names: shell words at render, so refused here (the door) already
    _check(c.transport in TRANSPORTS, f"cluster.transport={c.transport!r} is not a transport",
           "use " + ", ".join(TRANSPORTS))
    _check(not (c.transport == "tcp" and c.ib_hcas),
           f"cluster {c.name}: transport=tcp but cluster.ib_hcas lists RDMA adapters {list(c.ib_hcas)}",
           "set cluster.ib_hcas=[] for TCP sockets, or cluster.transport=ib / roce")
    _check(not (c.transport in ("ib", "roce") and spans_nodes and not c.ib_hcas),
           f"cluster {c.name}: transport={c.transport} needs the RDMA adapters in cluster.ib_hcas",
           "list them as `ibv_devinfo -l` prints them (mlx5_*, bnxt_re*), or use cluster.transport=tcp")
    _check(not (c.transport == "tcp" and spans_nodes and str((c.env or {}).get("NCCL_IB_DISABLE")) != "1"),
           f"cluster {c.name}: transport=tcp but cluster.env does not set NCCL_IB_DISABLE=1, so NCCL / RCCL "
           "would still use any RDMA adapter it finds", "add NCCL_IB_DISABLE: \"1\" to the cluster's env")
    from vdkit.planner import lora_targets

    lora_targets.check(r)  # engine.lora_qkv and method.lora_targets (the engine's spec says which layers it adapts)
    _check(r.parallelism.sharding in SHARDINGS, f"parallelism.sharding={r.parallelism.sharding!r} is not a sharding",
           "use " + ", ".join(SHARDINGS))
    from vdkit.recipes.engines import check_recipe

    check_recipe(r)  # what the engine's spec holds: model family and fields, method, sharding, precision
    _check(not r.parallelism.cpu_offload or r.parallelism.sharding != "none",
           "parallelism.cpu_offload=true needs a sharded strategy", "set parallelism.sharding=fsdp or zero3")
    _check(r.parallelism.deepspeed_config is None or r.parallelism.sharding == "zero3",
           "parallelism.deepspeed_config is set but parallelism.sharding is not zero3",
           "set parallelism.sharding=zero3 or parallelism.deepspeed_config=null")
    p = r.parallelism
    _check(p.recompute is None or p.recompute in RECOMPUTE,
           f"parallelism.recompute={p.recompute!r} is not a recompute mode", "use none, selective or full")
    for key in ("tp", "pp", "vp"):
        v = getattr(p, key)
        _check(v is None or v >= 1, f"parallelism.{key}={v} must be >= 1", f"use parallelism.{key}=1 or leave it unset")
    _check(p.recompute_num_layers is None or p.recompute_num_layers >= 1,
           f"parallelism.recompute_num_layers={p.recompute_num_layers} must be >= 1",
           "use e.g. parallelism.recompute_num_layers=4, or leave it unset (every layer)")
    _check(p.recompute_num_layers is None or p.recompute == "full",
           "parallelism.recompute_num_layers is set but parallelism.recompute is not full",
           "set parallelism.recompute=full (the first N layers of each stage recompute), or drop recompute_num_layers")
    _check(r.engine.attention in ATTENTIONS, f"engine.attention={r.engine.attention!r} is not an attention implementation",
           "use " + " or ".join(f"engine.attention={a}" for a in ATTENTIONS))
    from vdkit.planner import context

    context.check(r)
    _check(r.data.kind in DATA_KINDS, f"data.kind={r.data.kind!r} is not a data kind", "use sft or pretrain")
    _check(not (r.data.packed and m.name == "pretrain"),
           "data.packed=true is for fine-tuning data (pretraining samples already fill train.seq_length)",
           "drop data.packed (and recipe=fast) for method=pretrain")
    # NeMo 1.23 swaps the first virtual_tokens embeddings of a sequence for the prompt encoder's: in a
    # packed row they overwrite the first sample's first tokens and the other samples get no prompt (later
    # NeMo asserts "P-Tuning with packed sequence is not supported"); the kit's engines cannot either.
    _check(not (r.data.packed and m.name == "ptuning"),
           "data.packed=true with method=ptuning: P-tuning's virtual tokens prefix one sequence, and a packed "
           "row holds many samples (NeMo would overwrite the row's first tokens and prompt no other sample)",
           "set data.packed=false for method=ptuning (recipe=fast already leaves P-tuning unpacked)")
    _check(not (r.data.packed and t.micro_batch_size != 1),
           "data.packed=true needs train.micro_batch_size=1 (NeMo's packed sequences)",
           "set train.micro_batch_size=1 or data.packed=false")
    _check((r.data.kind == "pretrain") == (m.name == "pretrain") or r.data.name == "synthetic",
           f"data={r.data.name} ({r.data.kind} data) does not suit method={m.name}",
           "use data=pile for pretrain, and dolly / alpaca / pubmedqa / synthetic for fine-tuning")


def _validate_model(mc: ModelCfg) -> None:
    """The architecture fields: known values, and sizes that divide."""
    for key, allowed in (("arch", ARCHS), ("norm", NORMS), ("activation", ACTIVATIONS),
                         ("position_embedding", POSITION_EMBEDDINGS), ("tokenizer", TOKENIZERS)):
        value = getattr(mc, key)
        _check(value in allowed, f"model.{key}={value!r} is not supported", "use one of " + ", ".join(allowed))
    _check(mc.rope_scaling is None or isinstance(mc.rope_scaling, dict),
           f"model.rope_scaling={mc.rope_scaling!r} is not a mapping",
           "use e.g. model.rope_scaling={rope_type:llama3,factor:8.0} or null")
    _check(mc.rope_scaling is None or mc.position_embedding == "rope",
           "model.rope_scaling is set but model.position_embedding is not rope", "set model.rope_scaling=null")
    # heads and query groups are >= 1 here (vdkit.rules.numbers.DOMAINS): the remainders are defined
    _check(mc.hidden_size % mc.num_attention_heads == 0 and mc.num_attention_heads % mc.num_query_groups == 0,
           f"model {mc.name}: hidden_size {mc.hidden_size}, {mc.num_attention_heads} heads and "
           f"{mc.num_query_groups} query groups do not divide evenly",
           "make hidden_size a multiple of num_attention_heads, and heads a multiple of num_query_groups")


def recipe_from_dict(data: dict, overrides=(), source: str = "the recipe") -> Recipe:
    """Rebuild a Recipe from its ``to_dict()`` form (e.g. a run directory's recipe.yaml, named ``source`` in the
    one-line UserError for an unknown key or a wrong type)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(schema_node(), data)
        obj: VdkitConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)  # the edited key, which Hydra's first line does not name
        raise UserError(f"invalid {source}: {f'{key}: ' if key else ''}{hydra_message(exc)}",
                        "correct that key, or re-render the run with `vdkit render`") from None
    return Recipe(overrides=tuple(overrides), **{f.name: getattr(obj, f.name) for f in dataclasses.fields(VdkitConfig)})
