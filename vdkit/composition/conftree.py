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
