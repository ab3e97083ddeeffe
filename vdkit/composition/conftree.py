"""Where the config tree (conf/) is, and the config files the kit reads from it besides Hydra's.

A low layer (standard library, :mod:`vdkit.errors`, :mod:`vdkit.composition.files`): composition
(:mod:`vdkit.composition.config`), its rules (:mod:`vdkit.rules`), the calibration data (:mod:`vdkit.planner.calibration`)
and the engines all find conf/ here, so none of them imports another to find a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError


def conf_dir() -> Path:
    """The Hydra config tree: $VDKIT_CONF_DIR, a checkout's conf/, or the installed copy."""
    env = os.environ.get("VDKIT_CONF_DIR")
    if env:
        return _checked_env_dir(env)
    here = Path(__file__).resolve().parents[1]  # vdkit/
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    try:  # an installed wheel: conf/ is the package data of vdkit.conf
        import importlib.resources as resources

        installed = Path(str(resources.files("vdkit.conf")))
        if (installed / "config.yaml").is_file():
            return installed
    except (ModuleNotFoundError, TypeError):
        pass
    raise UserError("cannot find the vdkit config tree (conf/config.yaml)",
                    "reinstall vdkit or set VDKIT_CONF_DIR to a conf/ directory")


def _checked_env_dir(env: str) -> Path:
    """$VDKIT_CONF_DIR resolved, or a UserError: missing, a file or a symlink loop would otherwise surface
    as a traceback from deep inside Hydra, for every verb."""
    fix = "point VDKIT_CONF_DIR at a copy of vdkit's conf/ directory (it holds config.yaml), or unset it"
    try:
        path = Path(env).expanduser().resolve(strict=True)
    except FileNotFoundError:
        raise UserError(f"VDKIT_CONF_DIR={env} does not exist", fix) from None
    except (RuntimeError, OSError) as exc:  # RuntimeError: Path.resolve's "Symlink loop" (Python < 3.13)
        why = "is a symlink loop" if "loop" in str(exc).lower() or getattr(exc, "errno", 0) == 40 else \
            f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
        raise UserError(f"VDKIT_CONF_DIR={env} {why}", fix) from None
    if not path.is_dir():
        raise UserError(f"VDKIT_CONF_DIR={env} is not a directory", fix)
    if not (path / "config.yaml").is_file():
        raise UserError(f"VDKIT_CONF_DIR={env} holds no config.yaml: not a vdkit config tree", fix)
    return path


def deepspeed_config_source(name_or_path: Optional[str]) -> dict:
    """The mapping behind ``parallelism.deepspeed_config``: a conf/deepspeed/NAME.yaml, or a JSON / YAML path."""
    if not name_or_path:
        return {"zero_optimization": {"stage": 3}}
    path = Path(name_or_path).expanduser()
    if not path.suffix and "/" not in str(name_or_path):
        path = conf_dir() / "deepspeed" / f"{name_or_path}.yaml"
    if not path.is_file():
        choices = " | ".join(sorted(p.stem for p in (conf_dir() / "deepspeed").glob("*.yaml")))
        raise UserError(f"parallelism.deepspeed_config={name_or_path!r}: no such file ({path})",
                        f"use one of {choices}, or a path to a DeepSpeed JSON / YAML file")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
        else:
            from vdkit.composition.files import load_yaml

            data = load_yaml(path, "DeepSpeed config")
    except (ValueError, RecursionError) as exc:
        raise UserError(f"cannot parse DeepSpeed config {path}: {str(exc).splitlines()[0]}",
                        "fix the file (DeepSpeed's JSON config format)") from None
    if not isinstance(data, dict):
        raise UserError(f"DeepSpeed config {path} is not a mapping", "write DeepSpeed's JSON config format")
    stage = (data.get("zero_optimization") or {}).get("stage")
    if stage != 3:
        raise UserError(f"DeepSpeed config {path} has zero_optimization.stage={stage!r}, not 3",
                        "parallelism.sharding=zero3 needs stage 3")
    return data


# Transformer Engine 2.12's userbuffers GEMMs (pytorch/module/base.py:267-277) and the methods each may take here:
# the gathers run as a ring (a pipeline gathers nothing: base.py:343-346), the output reduce-scatters as a pipeline or
# a ring, the input-gradient ones in bulk. The keys each method needs are Megatron-Bridge 0.3.1's dataclass fields
# (training/comm_overlap.py BulkOverlapCfg / PipelineOverlapCfg / RingExchangeOverlapCfg), which it renders into.
TP_OVERLAP_METHODS = {"qkv_fprop": ("ring_exchange",), "fc1_fprop": ("ring_exchange",), "proj_dgrad": ("ring_exchange",),
                      "fc2_dgrad": ("ring_exchange",), "proj_fprop": ("pipeline", "ring_exchange"),
                      "fc2_fprop": ("pipeline", "ring_exchange"), "qkv_dgrad": ("bulk",), "qkv_wgrad": ("bulk",),
                      "fc1_dgrad": ("bulk",), "fc1_wgrad": ("bulk",)}
TP_OVERLAP_KEYS = {"bulk": {"required": ("num_sm", "cga_size", "set_sm_margin"), "optional": ()},
                   "pipeline": {"required": ("num_sm", "cga_size", "num_splits", "set_sm_margin"),
                                "optional": ("fp8_buf", "atomic_gemm")},
                   "ring_exchange": {"required": (), "optional": ("aggregate", "num_sm", "cga_size", "set_sm_margin",
                                                                  "fp8_buf", "atomic_gemm")}}


def tp_overlap_source(name: str) -> dict:
    """The per-GEMM userbuffers settings behind ``parallelism.tp_comm_overlap_cfg``: conf/tp_overlap/NAME.yaml, every
    GEMM of :data:`TP_OVERLAP_METHODS` with a method it may take and the keys that method needs (UserError otherwise)."""
    folder = conf_dir() / "tp_overlap"
    path = folder / f"{name}.yaml"
    what = f"parallelism.tp_comm_overlap_cfg={name!r}"
    if "/" in str(name) or not path.is_file():
        choices = " | ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise UserError(f"{what}: no such file in conf/tp_overlap/ ({path})",
                        f"use one of {choices}, or parallelism.tp_comm_overlap_cfg=null (Transformer Engine's defaults)")
    from vdkit.composition.files import load_yaml

    data = load_yaml(path, "userbuffers config")
    fix = f"fix {path} (per GEMM: its method and Transformer Engine's keys for it; the file's comments cite the source)"
    if not isinstance(data, dict) or sorted(data) != sorted(TP_OVERLAP_METHODS):
        raise UserError(f"{what}: {path.name} must set exactly the ten GEMMs {', '.join(TP_OVERLAP_METHODS)}", fix)
    for gemm, s in data.items():
        method = (s or {}).get("method") if isinstance(s, dict) else None
        if method not in TP_OVERLAP_METHODS[gemm]:
            raise UserError(f"{what}: {gemm}.method={method!r}; Transformer Engine runs {gemm} as "
                            + " or ".join(TP_OVERLAP_METHODS[gemm]), fix)
        keys = TP_OVERLAP_KEYS[method]
        missing = [k for k in keys["required"] if k not in s]
        unknown = sorted(set(s) - {"method", *keys["required"], *keys["optional"]})
        if missing or unknown:
            raise UserError(f"{what}: {gemm} ({method}) " + (f"lacks {', '.join(missing)}" if missing else
                                                            f"has unknown keys {', '.join(unknown)}"), fix)
        if int(s.get("num_sm", 1)) < 1:
            raise UserError(f"{what}: {gemm}.num_sm={s['num_sm']} must be at least 1", fix)
    return data
