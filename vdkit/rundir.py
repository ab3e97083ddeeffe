"""Run directories: created whole or not at all, never overwriting an earlier one.

Layout of a run directory (every engine, every launcher):

    launch.sbatch      the Slurm script (render)            recipe.yaml   the resolved recipe
    plan.json          the plan (layout, memory, feasible)  overrides.txt the overrides, one per line
    nemo.yaml          NeMo's config (engine=nemo)
    logs/              exp_manager explicit_log_dir: TensorBoard events, NeMo log files
    checkpoints/       checkpoints, unless run.results_dir points at shared storage
    slurm-<jobid>.out  job stdout under Slurm; local-<n>.out under `vdkit run`
    run.lock           held (flock) by the one job running in the dir; names it (vdkit.slurm.runlock)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional, Union

import yaml

from vdkit.errors import UserError

RECIPE_FILE = "recipe.yaml"
PLAN_FILE = "plan.json"
OVERRIDES_FILE = "overrides.txt"
SBATCH_FILE = "launch.sbatch"
NEMO_CONFIG_FILE = "nemo.yaml"
LOG_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "run.lock"


def safe_dir_name(name: str) -> str:
    """A directory name from a run name: anything outside [A-Za-z0-9._-] becomes '_'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    return cleaned[:120]


def _base_dir(recipe, out_dir) -> Path:
    base = Path(out_dir if out_dir is not None else recipe.run.out_dir).expanduser().absolute()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {base}: {exc.strerror}",
                        "pass --out DIR (or run.out_dir=DIR) pointing at a writable directory") from None
    return base


def reserve_run_dir(recipe, out_dir: Optional[Union[str, Path]] = None) -> Path:
    """The path the next run directory of ``recipe`` will get (nothing is created).

    Renderers need the final path inside the files they write; pass it back as
    ``create_run_dir(..., run_dir=path)``.
    """
    base = _base_dir(recipe, out_dir)
    stem = safe_dir_name(recipe.run_name)
    n = 1
    while (base / (stem if n == 1 else f"{stem}-{n}")).exists():
        n += 1
    return base / (stem if n == 1 else f"{stem}-{n}")


def create_run_dir(plan, files: Dict[str, Union[str, bytes]], out_dir: Optional[Union[str, Path]] = None,
                   run_dir: Optional[Union[str, Path]] = None) -> Path:
    """Write a new run directory for ``plan`` holding recipe.yaml, plan.json, overrides.txt and ``files``.

    Everything is written into a hidden temporary directory first and renamed into place, so a
    failure leaves nothing half-written. Without ``run_dir`` the name is the run name, with ``-2``,
    ``-3``, ... added when a directory of that name exists (an earlier run is never overwritten).
    With ``run_dir`` (from :func:`reserve_run_dir`) exactly that path is used, and it is an error
    if it has appeared in the meantime.
    """
    recipe = plan.recipe
    if run_dir is not None:
        run_dir = Path(run_dir).absolute()
        out_dir = run_dir.parent
    base = _base_dir(recipe, out_dir)
    stem = safe_dir_name(recipe.run_name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=base))
    try:
        contents = {
            RECIPE_FILE: yaml.safe_dump(recipe.to_dict(), sort_keys=False),
            PLAN_FILE: json.dumps(plan.to_dict(), indent=2) + "\n",
            OVERRIDES_FILE: "".join(f"{o}\n" for o in recipe.overrides),
            **files,
        }
        for name, data in contents.items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, bytes):
                target.write_bytes(data)
            else:
                target.write_text(data)
        from vdkit.files import dir_mode, file_mode

        if SBATCH_FILE in contents:
            os.chmod(tmp / SBATCH_FILE, file_mode(executable=True))
        os.chmod(tmp, dir_mode())  # mkdtemp made it 0700; a run dir follows the umask like any dir
        candidates = [run_dir] if run_dir is not None else (
            base / (stem if n == 1 else f"{stem}-{n}") for n in range(1, 100000))
        for final in candidates:
            if final.exists():
                continue
            try:
                os.rename(tmp, final)  # atomic on one file system
                return final
            except OSError:
                if not final.exists():
                    raise
        raise UserError(f"run directory {run_dir} appeared while rendering",
                        "render again: a new run directory name will be chosen")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
