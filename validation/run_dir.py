"""Run directories as data: validating one run (parse its logs and extrapolate, reading the target from the
rendered recipe) and what each run contributes to a published table (:class:`RunResult`, :func:`collect_runs`).

The domain half of ``vdkit validate`` (the CLI formats what :func:`validate_one` returns) and of
``vdkit report`` (:func:`vdkit.validation.tables.build` takes the collected runs); the demo and the
tests call them directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from vdkit.errors import UserError
from vdkit.run.rundir import find_run_dir
from vdkit.composition.schema import TrainCfg

DEFAULT_TARGET_STEPS = TrainCfg.target_steps  # the schema's default: used only when no recipe.yaml says one

__all__ = ["DEFAULT_TARGET_STEPS", "find_run_dir", "checkpoint_every", "recipe_of", "on_cpu", "validate_one", "RunResult", "collect_run", "collect_runs"]


def checkpoint_every(run_dir: Optional[Path]) -> int:
    """The run's checkpoint cadence in steps: its time plan's (plan.json), else its recipe's (a run directory
    rendered before the time plan was part of the plan); 0 without a run directory (one checkpoint at the end)."""
    if run_dir is None:
        return 0
    from vdkit.planner.timeplan import every_n_steps
    from vdkit.run.rundir import load_recipe, load_schedule

    schedule = load_schedule(run_dir)
    if "every_n_steps" in schedule:
        return int(schedule["every_n_steps"])
    return every_n_steps(load_recipe(run_dir))


def on_cpu(recipe) -> bool:
    """Whether the run's ranks were CPU processes (the step-time flag's CPU threshold applies); False for
    no recipe (a log without its run directory: the accelerator's rule)."""
    return recipe is not None and recipe.cluster.gpu_type == "cpu"


def recipe_of(source):
    """The recipe of the run directory ``source`` is in (or is), else None."""
    run_dir = find_run_dir(Path(source))
    if run_dir is None:
        return None
    from vdkit.run.rundir import load_recipe

    return load_recipe(run_dir)


def validate_one(source, target_steps: Optional[int] = None, overheads=None) -> dict:
    """Parse one source and estimate; the result as the JSON-able dict `vdkit validate --json` prints.

    Keys starting with ``_`` hold the parsed log and the estimate objects (not printed).
    """
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.logs import read_source

    source = Path(source)
    log = read_source(source)
    recipe = recipe_of(source)
    if target_steps is None:
        target_steps = DEFAULT_TARGET_STEPS if recipe is None else recipe.train.target_steps
    est = estimate_log(log, target_steps, overheads, on_cpu=on_cpu(recipe))
    timed = log.timed
    stopped = _cancelled(source, log, recipe)
    warnings = ([f"the run was {stopped}: the estimate extrapolates the steps it ran before the cancel; "
                 "it is no finished run's figure"] if stopped else []) + log.warnings + est.data_warnings
    return {"source": str(source), "format": log.format, "files": log.files,
            "first_step": timed[0].step, "last_step": timed[-1].step, **est.to_dict(),
            "cancelled": stopped or None, "warnings": warnings, "_log": log, "_estimate": est}


def _cancelled(source, log, recipe) -> str:
    """'cancelled by `vdkit cancel` (or `scancel`) at T after N of M steps (continue: CMD)' for a run directory whose cancel
    record holds (vdkit.run.runs.cancelled_note), else ''."""
    from vdkit.run.runs import cancelled_note

    run_dir = find_run_dir(Path(source))
    note = cancelled_note(run_dir) if run_dir is not None else None
    if note is None:
        return ""
    done = log.steps[-1].step + 1 if log is not None and log.steps else "?"
    planned = recipe.train.max_steps if recipe is not None else "?"
    at, _, rest = note.partition("; ")
    return f"{at} after {done} of {planned} steps ({rest})"


@dataclass
class RunResult:
    """What one run directory contributes to a table."""

    path: str
    recipe: object  # vdkit.composition.schema.Recipe
    plan: object = None  # vdkit.composition.plan_types.Plan from its plan.json (None: unreadable)
    log: object = None  # validation.steps.StepLog
    estimate: object = None  # validation.extrapolate.Estimate
    error: str = ""  # why there is no estimate (no timing yet, ...)
    cancelled: str = ""  # `vdkit cancel` stopped it: when, after how many steps, how to continue ('' otherwise)
    warnings: List[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.plan is None or self.plan.feasible


def collect_run(path, target_steps: Optional[int] = None) -> RunResult:
    """Recipe, plan, step log and estimate of one run directory, for ``target_steps`` (None: its recipe's
    ``train.target_steps``)."""
    from vdkit.run.rundir import RECIPE_FILE, load_plan, load_recipe
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.logs import read_source

    path = Path(path)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"{path} is not a run directory (no {RECIPE_FILE})",
                        "pass run directories written by `vdkit render` / `vdkit run`, e.g. runs/*")
    res = RunResult(str(path), load_recipe(path))
    try:
        res.plan = load_plan(path)  # the plan the run was rendered with, never re-planned
    except UserError as exc:
        # An unreadable plan.json says nothing about fitting ("N/A" would claim it does not fit): the
        # run's measured steps still count; only the predicted column stays blank.
        res.warnings.append(f"{exc.what}: its predicted minutes are left blank (the measured steps still count)")
    if not res.feasible:
        return res
    try:
        res.log = read_source(path)
        res.warnings += list(res.log.warnings)
        res.estimate = estimate_log(res.log, target_steps or res.recipe.train.target_steps,
                                    on_cpu=on_cpu(res.recipe))
        res.warnings += res.estimate.data_warnings
    except UserError as exc:
        res.error = str(exc)
        res.warnings.append(f"{path}: no steps to report yet ({exc.what})")
    res.cancelled = _cancelled(path, res.log, res.recipe)
    return res


def collect_runs(paths, target_steps: Optional[int] = None) -> List[RunResult]:
    """:func:`collect_run` for each run directory, each read once (a directory given twice, however spelled,
    would count its steps twice in a cell)."""
    seen: Dict[Path, str] = {}
    results, twice = [], []
    for p in paths:
        real = Path(p).resolve()
        if real in seen:
            twice.append(f"{p} (as {seen[real]})")
            continue
        seen[real] = str(p)
        results.append(collect_run(p, target_steps))
    if twice and results:
        results[0].warnings.insert(0, f"run directories given twice were read once: {', '.join(twice)}")
    return results
