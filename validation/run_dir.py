"""Validating one run: parse its logs and extrapolate, reading the target from the rendered recipe.

The domain half of ``vdkit validate`` (the CLI formats what :func:`validate_one` returns); the
demo and the tests call it directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vdkit.rundir import find_run_dir
from vdkit.schema import TrainCfg

DEFAULT_TARGET_STEPS = TrainCfg.target_steps  # the schema's default: used only when no recipe.yaml says one

__all__ = ["DEFAULT_TARGET_STEPS", "find_run_dir", "checkpoint_every", "target_steps_of", "validate_one"]


def checkpoint_every(run_dir: Optional[Path]) -> int:
    """The run's engine.checkpoint_every_n_steps (0 without a run directory: one checkpoint at the end)."""
    if run_dir is None:
        return 0
    from vdkit.rundir import load_recipe

    from vdkit.planner.timeplan import every_n_steps

    return every_n_steps(load_recipe(run_dir))


def target_steps_of(source) -> int:
    """train.target_steps of the run ``source`` belongs to, else DEFAULT_TARGET_STEPS."""
    run_dir = find_run_dir(Path(source))
    if run_dir is None:
        return DEFAULT_TARGET_STEPS
    from vdkit.rundir import load_recipe

    return load_recipe(run_dir).train.target_steps


def validate_one(source, target_steps: Optional[int] = None, overheads=None) -> dict:
    """Parse one source and estimate; the result as the JSON-able dict `vdkit validate --json` prints.

    Keys starting with ``_`` hold the parsed log and the estimate objects (not printed).
    """
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.logs import read_source

    source = Path(source)
    log = read_source(source)
    if target_steps is None:
        target_steps = target_steps_of(source)
    est = estimate_log(log, target_steps, overheads)
    timed = log.timed
    return {"source": str(source), "format": log.format, "files": log.files,
            "first_step": timed[0].step, "last_step": timed[-1].step, **est.to_dict(),
            "warnings": log.warnings + est.data_warnings, "_log": log, "_estimate": est}
