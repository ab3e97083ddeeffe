"""Composition and rules: Hydra composes conf/ with the overrides into a validated Recipe.

Overrides -> Hydra compose (the schema, :mod:`vdkit.composition.schema`, from the ConfigStore) -> re-merge into
the schema (so that a ``+key=...`` cannot smuggle an unknown key past it) -> field rules -> a frozen
:class:`~vdkit.composition.schema.Recipe`.

Everything downstream takes a ``Recipe``; nothing re-reads overrides.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from functools import lru_cache
from typing import Any, Dict, List, Optional

from vdkit.composition.conftree import conf_dir
from vdkit.errors import UserError
from vdkit.composition.fields import validate_fields
from vdkit.composition.schema import Recipe, VdkitConfig
from vdkit.rules.overrides import refuse_env_interpolation

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
