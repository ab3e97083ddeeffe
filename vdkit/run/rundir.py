"""Run directories: created whole or not at all, never overwriting an earlier one.

The one home of every run-directory file name and of the results-root rule. Layout of a run
directory (every engine, every launcher):

    launch.sbatch      the Slurm launcher's script (render)  recipe.yaml   the resolved recipe
    plan.json          the plan (layout, memory, feasible)  overrides.txt the overrides, one per line
    nemo.yaml          NeMo's config (engine=nemo)
    bridge.yaml        Megatron-Bridge's ConfigContainer, bridge_job.py (+ bridge_trust.py), import_hf.sbatch (engine=bridge)
    logs/              exp_manager explicit_log_dir: TensorBoard events, NeMo log files
    checkpoints/       checkpoints, unless run.results_dir points at shared storage
    slurm-<jobid>.out  job stdout under Slurm; local-<n>.out under `vdkit run`
    job_id.txt         every job id submitted from it (vdkit submit)
    run.lock           held (flock) by the one job running in the dir; names it (vdkit.run.runlock)
    finished           the run's last step is done (the launcher writes it; no job starts again)
    cancelled          `vdkit cancel` stopped it: when, which jobs, how to continue (vdkit.run.runs)
    heartbeat/         rank<R>: each rank's liveness and progress, read by the launcher's watchdog (vdkit.run.faults)
    faults.jsonl       one line per failed job step: cause, rank, node, last checkpoint, restart (vdkit.run.faults)
    excluded_nodes     nodes a failure was blamed on; later allocations run without them

Making one (its name, the whole-or-nothing write): :mod:`vdkit.run.create`. Downstream code (engines, validate, report) reads ``recipe.yaml`` and ``plan.json`` back with
:func:`load_plan` (the prediction included); nothing re-plans from overrides after render. This
module depends on the types (:mod:`vdkit.composition.schema`) and the recipe reader (:mod:`vdkit.composition.config`), never
on the planner.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError
from vdkit.composition.plan_types import Memory, Plan, Prediction, StepTime
from vdkit.composition.schema import Recipe

RECIPE_FILE = "recipe.yaml"
PLAN_FILE = "plan.json"
OVERRIDES_FILE = "overrides.txt"
SBATCH_FILE = "launch.sbatch"
NEMO_CONFIG_FILE = "nemo.yaml"
BRIDGE_CONFIG_FILE = "bridge.yaml"  # engine=bridge: Megatron-Bridge's ConfigContainer (what the ranks load)
BRIDGE_RESOLVED_FILE = "bridge_resolved.yaml"  # engine=bridge: the full ConfigContainer a local run used
BRIDGE_JOB_FILE = "bridge_job.py"  # engine=bridge: what every rank runs in the NeMo container
PREFLIGHT_FILE = "preflight.json"  # what the job's pre-flight checks (vdkit.recipes.common.preflight; vdkit.render.prepare writes it)
PREFLIGHT_SCRIPT = "vdkit_preflight.py"  # the pre-flight itself, a copy of vdkit/recipes/common/preflight.py (no vdkit import)
IMPORT_FILE = "import_hf.sbatch"  # the one-time HF -> engine checkpoint conversion (bridge: Bridge checkpoint; nemo: .nemo)
BRIDGE_IMPORT_FILE = IMPORT_FILE
# Job scripts of the run dir, one a line, that `vdkit submit` submits before launch.sbatch; launch.sbatch then
# waits on them all (--dependency=afterok): bridge's import_hf.sbatch when the render converts the base model
FIRST_FILE = "submit_first.txt"
BRIDGE_EXPORT_FILE = "export_hf.sbatch"  # engine=bridge, run.mode=train: the trained checkpoint -> HF weights
# The files each engine adds to a run directory: its spec's run_dir_files (vdkit.recipes.spec).
EXPORT_DIR = "export"  # run.mode=train, engine=reference: the final model as Hugging Face save_pretrained writes it
LOG_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "run.lock"
JOB_ID_FILE = "job_id.txt"
JOB_STATE_FILE = "job_state.json"
FINISHED_FILE = "finished"  # written by the launcher when the run's last step is done: it never starts again
CANCELLED_FILE = "cancelled"  # written by `vdkit cancel`: when, which jobs, and the command that continues the run
LOCAL_OUT_FILE = "local-1.out"  # rank 0's output under `vdkit run` (a Slurm job's is slurm-<jobid>.out)
HEARTBEAT_DIR = "heartbeat"  # each rank's rank<R> file: liveness and progress (vdkit.run.faults)
FAULTS_FILE = "faults.jsonl"  # the launcher's record of every failed job step (vdkit.run.faults)
EXCLUDED_NODES_FILE = "excluded_nodes"  # nodes a failure was blamed on, one a line (vdkit.run.faults)
# The run's state files: what the launchers read and append in a run dir besides their own output. Each must be a
# regular file or missing: a FIFO blocks its reader (grep, cat, echo >>, Python's read) for ever, a directory
# fails obscurely or reads as empty (a restart count reset to 0). Checked by type before anything opens them:
# the Slurm batch shell's at its start (vdkit.run.runlock.lock_lines), all at the door (vdkit.run.runlock.check_state_files).
SHELL_STATE_FILES = (LOCK_FILE, JOB_ID_FILE, FINISHED_FILE, FAULTS_FILE, EXCLUDED_NODES_FILE)  # the batch shell's
STATE_FILES = SHELL_STATE_FILES + (JOB_STATE_FILE, CANCELLED_FILE)  # and the local launcher's record, vdkit cancel's
MEMORY_FILE = "memory.json"  # engine=megatron: measured vs planned bytes per rank
INDEX_MAPPING_DIR = "index_mapping"  # NeMo's dataset index files, under the results root


def results_root(recipe, run_dir) -> Path:
    """Where a run's checkpoints (and index files) go: ``run.results_dir/<run dir name>``, else the run dir.

    run.results_dir is shared storage every node reaches; the run directory's name keeps runs apart.
    """
    run_dir = Path(run_dir).absolute()
    shared = recipe.run.results_dir
    if not shared:
        return run_dir
    return Path(shared).expanduser() / run_dir.name


def check_results_room(plan, run_dir, check_mounts: Optional[bool] = None) -> None:
    """Refuse, before a run dir exists or a step is computed, a results directory the run could not checkpoint
    into: its nearest existing parent not a directory, not writable, or its file system without room for
    ``copies`` checkpoints of the plan's size. One-line UserError naming the path and the real cause.

    ``check_mounts``: True checks always, False never, None only where the directory's top level exists on
    this machine (else it is the cluster's storage, absent here)."""
    import errno

    from vdkit.composition.files import on_this_machine

    root = results_root(plan.recipe, run_dir)
    if check_mounts is False or (check_mounts is None and not on_this_machine(root)):
        return
    probe = root.expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    key = "run.results_dir" if plan.recipe.run.results_dir else "--out"
    fix = f"point {key} at a writable directory with room for the checkpoints"
    if not probe.is_dir():
        raise UserError(f"checkpoints would go to {root}, but {probe} is not a directory", fix)
    try:  # as root, os.access says yes to /sys and /proc: only a file made and removed tells
        fd, tmp = tempfile.mkstemp(prefix=".vdkit-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        why = "read-only" if exc.errno == errno.EROFS else f"not writable ({exc.strerror})"
        raise UserError(f"checkpoints would go to {root}, but {probe} is {why}", fix) from None
    st = os.statvfs(probe)
    free, need = st.f_bavail * st.f_frsize, room_gb(plan) * 1e9
    if free < need:
        raise UserError(f"checkpoints would go to {root}: {free / 1e9:,.2f} GB free there, the run needs "
                        f"{need / 1e9:,.2f} GB (the plan's storage: the checkpoints kept plus the one being "
                        f"written, at {plan.checkpoint_gb:,.3g} GB each)", fix + " (or free some space)")


def room_gb(plan) -> float:
    """The room the plan's checkpoints need (GB): its time plan's figure (vdkit.planner.checkpoint_policy.room_gb),
    else retention's bound for a plan without one."""
    if plan.time is not None:
        return plan.time.room_gb
    from vdkit.planner.checkpoint_policy import KEEP

    return (KEEP + 1) * plan.checkpoint_gb


def checkpoint_dir(recipe, run_dir) -> Path:
    """The run's checkpoint directory: ``results_root / checkpoints``."""
    return results_root(recipe, run_dir) / CHECKPOINT_DIR


def find_run_dir(source) -> Optional[Path]:
    """The run directory a file or directory belongs to (itself, or up to two parents holding recipe.yaml)."""
    source = Path(source)
    for d in [source if source.is_dir() else source.parent, *list(source.parents)[:2]]:
        if (d / RECIPE_FILE).is_file():
            return d
    return None


def plan_record(plan) -> dict:
    """What plan.json holds: ``plan.to_dict()`` with the figures :func:`load_plan` reads back unrounded.

    ``prediction`` (the step time by term, the target steps and GPUs) lets validation and reports
    show the predicted step seconds, minutes, tokens/s/GPU and GPU-hours without re-planning;
    ``schedule`` is the time plan (``Plan.time``: --time, allocations, checkpoint cadence).
    """
    import dataclasses

    pred = plan.prediction
    return {**plan.to_dict(), "memory": dataclasses.asdict(plan.memory), "checkpoint_gb": plan.checkpoint_gb,
            "params": plan.params,
            "prediction": None if pred is None else {"step": dataclasses.asdict(pred.step),
                                                     "target_steps": pred.target_steps, "gpus": pred.gpus,
                                                     "interval_s": pred.interval_s, "interval_source": pred.interval_source,
                                                     "basis": [list(b) for b in pred.basis]},
            **({} if plan.time is None else {"schedule": plan.time.to_dict(rounded=False)})}


def load_recipe(path) -> Recipe:
    """Read a recipe.yaml (or the run directory holding one) back into a Recipe."""
    from vdkit.composition.config import recipe_from_dict
    from vdkit.composition.files import load_yaml

    path = Path(path)
    if path.is_dir():
        path = path / RECIPE_FILE
    if not path.is_file():
        raise UserError(f"no recipe at {path}", "pass a run directory written by `vdkit render`")
    data = load_yaml(path, "recipe")  # a UserError for a bad file, never a hang on an alias bomb
    if not isinstance(data, dict):
        raise UserError(f"recipe {path} is not a mapping of sections (model, method, ...)",
                        "restore recipe.yaml (or re-render the run with `vdkit render`)")
    recipe = recipe_from_dict(data, source=str(path))
    # A recipe.yaml edited by hand gets the composed recipe's value rules (not its file checks: the run
    # may be read on another machine), so that a rank never trains on e.g. model.num_layers=-3 and
    # `vdkit check` / `status` / `report` never act on a recipe render would have refused.
    from vdkit.composition.fields import validate_fields
    from vdkit.rules import check_values

    try:
        check_values(recipe)
        validate_fields(recipe, host=False)
    except UserError as exc:
        raise UserError(f"{path}: {exc.what}", f"edit it ({exc.fix or 'correct the value'}), or re-render the run "
                        "with `vdkit render`") from None
    return recipe


def _prediction(data) -> Optional[Prediction]:
    if not data:
        return None
    interval = data.get("interval_s")
    return Prediction(StepTime(**data["step"]), int(data["target_steps"]), int(data["gpus"]),
                      interval_s=tuple(float(x) for x in interval) if interval else None,
                      interval_source=str(data.get("interval_source") or ""),
                      basis=tuple((str(a), str(b)) for a, b in data.get("basis") or ()))


def plan_json(plan, **extra) -> str:
    """plan.json's text: :func:`plan_record` plus named sections."""
    return json.dumps({**plan_record(plan), **extra}, indent=2) + "\n"


MAX_PLAN_BYTES = 4 * 1024 * 1024  # a plan.json is a few KB


def written_plan(run_dir) -> dict:
    """plan.json as written (its figures, e.g. ``seq_length``, as planned: a recipe.yaml edited since may differ);
    {} where it cannot be read (:func:`load_plan` says why)."""
    try:
        data = json.loads(_plan_text(run_dir))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _plan_text(run_dir) -> str:
    """plan.json's text; OSError / ValueError for a file that is not one vdkit wrote. A FIFO or a device
    is named, never opened (reading a FIFO blocks until someone writes to it)."""
    from vdkit.composition.files import not_a_regular_file

    path = Path(run_dir) / PLAN_FILE
    kind = not_a_regular_file(path)
    if kind:
        raise ValueError(f"it is {kind}")
    if path.stat().st_size > MAX_PLAN_BYTES:
        raise ValueError(f"{path.stat().st_size:,} bytes, too large for a plan")
    return path.read_text(encoding="utf-8", errors="replace")


def load_schedule(run_dir) -> dict:
    """The time plan recorded in a run directory's plan.json ({} when it has none)."""
    try:
        return dict(json.loads(_plan_text(run_dir)).get("schedule") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def load_plan(run_dir) -> Plan:
    """The plan a run directory was rendered with: recipe.yaml (its layout filled in) + plan.json (its time
    plan too), never re-planned.

    Raises UserError when either file is missing or unreadable.
    """
    from vdkit.planner.timeplan import TimePlan  # a type and pure arithmetic: no layout search, no prediction

    run_dir = Path(run_dir)
    recipe = load_recipe(run_dir)
    path = run_dir / PLAN_FILE
    try:
        data = json.loads(_plan_text(run_dir))
        mem = data["memory"]
        return Plan(recipe=recipe, dp=int(data["dp"]), grad_accum=int(data["grad_accum"]),
                    memory=Memory(**{f: float(mem[f]) for f in Memory.__dataclass_fields__}),
                    feasible=bool(data["feasible"]), borderline=bool(data["borderline"]), reason=data.get("reason"),
                    checkpoint_gb=float(data["checkpoint_gb"]), layout_source=str(data["layout_source"]),
                    notes=tuple(data.get("notes") or ()), prediction=_prediction(data.get("prediction")),
                    runner_up=data.get("runner_up"), params=int(data.get("params") or 0),
                    trainable_params=int(data.get("trainable_params") or 0),
                    time=TimePlan.from_dict(data["schedule"]) if data.get("schedule") else None)
    # OverflowError: int() of a JSON 1e999 / Infinity; AttributeError: a "schedule" that is not an object
    except (OSError, ValueError, KeyError, TypeError, OverflowError, AttributeError) as exc:
        detail = (f"no {exc.args[0]!r} entry" if isinstance(exc, KeyError)
                  else "not the JSON object vdkit writes" if isinstance(exc, (TypeError, AttributeError))
                  else str(exc) or type(exc).__name__)
        raise UserError(f"cannot read the plan of {run_dir} ({path.name}: {detail})",
                        "pass a run directory written by `vdkit render` / `vdkit run`") from None
