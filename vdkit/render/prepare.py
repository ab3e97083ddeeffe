"""Prepare every cell, then act: the one step `render`, `submit`, `run` and `demo` share.

For each plan: the engine (looked up in :mod:`vdkit.recipes.engines`) and the launcher (its
``cluster.launcher``, looked up in :mod:`vdkit.launch.launchers`) check it, the local inputs are checked,
the run directory's path is reserved, and every file (the engine's, plus the launcher's:
``launch.sbatch`` for Slurm) is rendered in memory. Only when every cell has prepared does a verb
write run directories (:meth:`Prepared.write`) and then submit or start them, so a bad cell stops
the command before anything exists anywhere. This module composes the engine and the launcher;
a launcher never imports an engine: it gets the engine's :class:`~vdkit.run.jobspec.JobSpec`.

Mount-source check (``check_mounts``): ``True`` checks every local input, ``False`` none, ``None``
(default, "auto") checks a path only when its top-level directory exists on this machine: on a
login node that mounts /data, a missing /data/dolly is an error; on a laptop without /data the
path is cluster storage and cannot be checked.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Union

from vdkit.errors import UserError
from vdkit.run.jobspec import JobSpec

PathLike = Union[str, Path]


def engine_of(plan):
    """The registered engine that runs ``plan`` (vdkit.recipes.engines.Engine)."""
    from vdkit.recipes import engines

    return engines.get(plan.recipe.engine.name)


def launcher_of(plan):
    """The registered launcher that starts ``plan`` (vdkit.launch.launchers.Launcher, from cluster.launcher)."""
    from vdkit.launch import launchers

    return launchers.of(plan)


def job_spec(plan, run_dir: PathLike) -> JobSpec:
    """What a launcher needs from the engine: rank argv, engine env, container (or None), PMI, runs here,
    and its side of the job contract (whether it catches the stop signals; its finished line)."""
    from vdkit.run.jobspec import PREEMPT_SIGNAL

    import sys

    from vdkit.run.rundir import PREFLIGHT_FILE, PREFLIGHT_SCRIPT

    engine = engine_of(plan)
    run_dir = Path(run_dir)
    container = engine.container(plan, run_dir)
    # The pre-flight runs where the launcher starts the job (Slurm: the batch shell on the first node, outside
    # any container: the node's python3, standard library only; the container mounts the same paths there).
    python = "python3" if container is not None else sys.executable
    preflight = (python, str(run_dir / PREFLIGHT_SCRIPT), str(run_dir / PREFLIGHT_FILE))
    return JobSpec(argv=engine.command(plan, run_dir), env=engine.env(plan, run_dir),
                   container=container, pmi=engine.needs_pmi, runs_locally=engine.runs_locally,
                   stop_signal=PREEMPT_SIGNAL if engine.catches_stop_signals else None,
                   finished_line=engine.finished_line(plan), heartbeat=engine.writes_heartbeat, preflight=preflight)


def preflight_files(plan, run_dir: PathLike) -> Dict[str, str]:
    """The run dir's pre-flight (:mod:`vdkit.recipes.common.preflight`): its needs as ``preflight.json`` - the common set
    (data.data_dir, data.tokenizer_model, a squashfs image, the run's secrets file), the engine's own (its base
    model as its stack reads it, data files, tokenizer; same ``what``: the engine's wins) and the room the plan's
    checkpoints need (vdkit.run.rundir.room_gb) - and the checker itself as ``vdkit_preflight.py``."""
    import json

    from vdkit.recipes.common import preflight
    from vdkit.run.rundir import PREFLIGHT_FILE, PREFLIGHT_SCRIPT, checkpoint_dir, room_gb

    kinds = {"data.data_dir": "data_dir", "data.tokenizer_model": "tokenizer", "run.secrets_file": "file"}
    needs: Dict[str, tuple] = {}
    for what, path, is_dir in _common_inputs(plan, run_dir):
        kind = "image" if what.endswith("container_image") else kinds.get(what, "dir" if is_dir else "file")
        needs[what] = (what, path, kind)
    own = engine_of(plan).preflight(plan, run_dir)
    for what, path, kind in own:
        needs.pop(what, None)
    listed = [dict(what=w, path=str(p), kind=k) for w, p, k in list(needs.values()) + own]
    for need in listed:
        if need["kind"] not in preflight.KINDS:
            raise ValueError(f"pre-flight kind {need['kind']!r} of {need['what']} is not one of {preflight.KINDS}")
    spec = {"run": str(run_dir), "needs": listed,
            "room": {"path": str(checkpoint_dir(plan.recipe, run_dir)), "gb": round(room_gb(plan), 3)}}
    c = plan.recipe.cluster  # the interface the ranks bootstrap on, the adapters NCCL spans nodes on (vdkit.launch.fabric)
    fabric = {"socket_ifname": c.socket_ifname, "ib_hcas": list(c.ib_hcas) if c.nodes > 1 else []}
    if any(fabric.values()):
        spec["fabric"] = fabric
    return {PREFLIGHT_FILE: json.dumps(spec, indent=1) + "\n", PREFLIGHT_SCRIPT: Path(preflight.__file__).read_text()}


# ----------------------------------------------------------------------------- local inputs
def _is_local(path: Path) -> bool:
    """Auto mode: a path is on this machine when its top-level directory exists here."""
    from vdkit.composition.files import on_this_machine

    return on_this_machine(path)


def local_inputs(plan, run_dir: PathLike) -> List[tuple]:
    """(what, path, must_be_dir) the job reads: data.data_dir, the engine's own inputs, a squashfs image."""
    r = plan.recipe
    engine = engine_of(plan)
    wanted = [w for w in _common_inputs(plan, run_dir) if w[0] == "data.data_dir"] + engine.inputs(plan)
    wanted += [w for w in _common_inputs(plan, run_dir)
               if w[0] != "data.data_dir" and not any(x[0] == w[0] for x in wanted)]
    return wanted


def _common_inputs(plan, run_dir: PathLike) -> List[tuple]:
    """(what, path, must_be_dir) every engine's job reads: data.data_dir, data.tokenizer_model, the run's
    secrets file, a squashfs image."""
    r = plan.recipe
    wanted = []
    if r.data.data_dir:
        wanted.append(("data.data_dir", r.data.data_dir, True))
    if r.data.tokenizer_model:
        wanted.append(("data.tokenizer_model", r.data.tokenizer_model, False))
    if r.run.secrets_file:  # read by the job's shell at run time; its names were checked at composition
        wanted.append(("run.secrets_file", r.run.secrets_file, False))
    container = engine_of(plan).container(plan, Path(run_dir))
    image = (container.image or "") if container is not None else ""
    if image.startswith("/") or image.startswith("./"):
        wanted.append((container.image_key, image, False))
    return wanted


def unchecked_inputs(plan, run_dir: PathLike, check_mounts: Optional[bool] = None) -> List[tuple]:
    """(what, path) of the :func:`local_inputs` the ``check_mounts`` rule leaves unchecked on this machine:
    all with ``False``, those whose top-level directory is not here with ``None``, none with ``True``."""
    if check_mounts is True:
        return []
    return [(what, path) for what, path, _ in local_inputs(plan, run_dir)
            if check_mounts is False or not _is_local(Path(path).expanduser())]


def check_results_room(plan, run_dir: PathLike, check_mounts: Optional[bool] = None) -> None:
    """Refuse a results directory (on this machine, under the ``check_mounts`` rule) that is not writable or
    has no room for the checkpoints the run keeps plus the one being written (vdkit.run.rundir holds the check)."""
    from vdkit.run.rundir import check_results_room as check

    check(plan, run_dir, check_mounts)


def check_local_paths(plan, run_dir: PathLike, check_mounts: Optional[bool] = None) -> None:
    """Refuse a missing input of :func:`local_inputs` on this machine (under the ``check_mounts`` rule)."""
    if check_mounts is False:
        return
    skipped = set(unchecked_inputs(plan, run_dir, check_mounts))
    missing = []  # every missing input in one line: three runs to find three would be two too many
    for what, path, is_dir in local_inputs(plan, run_dir):
        p = Path(path).expanduser()
        if (what, path) in skipped:
            continue
        ok = p.is_dir() if is_dir else p.exists()
        if not ok:
            missing.append((what, path))
    if len(missing) == 1:
        what, path = missing[0]
        if Path(path).expanduser().exists():  # a file where a directory belongs
            raise UserError(f"{what} {path} is a file, not a directory", f"point {what} at the directory")
        raise UserError(f"{what} {path} does not exist on this machine",
                        f"create it, point {what.split()[-1]} elsewhere, or pass --no-check-mounts "
                        "when rendering away from the cluster's storage")
    if missing:
        raise UserError(f"{len(missing)} inputs do not exist on this machine: "
                        + "; ".join(f"{what} {path}" for what, path in missing),
                        "create them, point the keys elsewhere, or pass --no-check-mounts when rendering away "
                        "from the cluster's storage")


# ----------------------------------------------------------------------------- prepare, then act
@dataclass
class Prepared:
    """One cell, checked and rendered in memory: its plan, its reserved run directory, its files."""

    plan: object
    run_dir: Path
    files: Dict[str, Union[str, bytes]]

    def write(self) -> Path:
        """Write the run directory (whole or not at all); returns its path.

        When a concurrent render took the reserved name meanwhile, the cell is rendered again for the
        next free name (its files name their own run directory) instead of failing.
        """
        from vdkit.run.create import RunDirTaken, create_run_dir

        taken = []
        for _ in range(100):
            try:
                return create_run_dir(self.plan, self.files, run_dir=self.run_dir)
            except RunDirTaken:
                taken.append(self.run_dir)
                again = prepare(self.plan, self.run_dir.parent, False, taken=taken)
                self.run_dir, self.files = again.run_dir, again.files
        raise UserError(f"100 renders in a row took the run directory names next to {self.run_dir}",
                        "render into another --out directory, or set run.name")


def prepare(plan, out_dir: Optional[PathLike] = None, check_mounts: Optional[bool] = None,
            taken: Iterable = ()) -> Prepared:
    """Check ``plan`` and render its run directory in memory (nothing is written).

    The launcher is ``cluster.launcher``'s. One that executes here (local processes) has the engine
    run its local checks (installed extras, data files, tokenizer); one that hands the run to a
    scheduler has the local inputs checked under the ``check_mounts`` rule. Raises UserError for an
    infeasible plan, a plan the engine or the launcher cannot run, a missing local input, an image
    the launcher cannot read, or a value a script cannot carry.
    """
    from vdkit.planner.attention_rate import check_renders
    from vdkit.planner.plan import require_feasible
    from vdkit.run.rundir import PLAN_FILE, plan_json
    from vdkit.run.create import reserve_run_dir

    times = plan.time  # decided once by the planner (vdkit.planner.timeplan); every file below reads it
    if times.predicted and times.allocations == 0 and plan.feasible:
        # not one step fits between start-up and the stop's lead: every allocation would end before a
        # checkpoint, and a continued job would start over for ever
        from vdkit.planner.timeplan import VALIDATION_NOTE

        if (times.note or "").startswith(VALIDATION_NOTE):  # the steps fit: the validation does not
            what, _, fix = times.note.partition(": ")
            raise UserError(what + ", so the job would never reach a checkpoint", fix)
        key = "cluster.time_limit_min" if times.time_source == "pinned" else "cluster.max_time_min"
        raise UserError(f"{key}={times.time_limit_min}: one step ({times.step_s:.3g} s) after start-up "
                        f"({times.startup_s:.0f} s) and before the stop's lead ({times.lead_s} s) does not fit in one "
                        "allocation, so the job would never reach a checkpoint",
                        ("unset cluster.time_limit_min (the plan picks --time)" if key == "cluster.time_limit_min"
                         else "raise cluster.max_time_min to the partition's limit, or use more nodes")
                        + f", or set cluster.startup_s to your site's start-up if it is shorter than {times.startup_s:.0f} s")
    from vdkit.composition.limits import MAX_ALLOCATIONS

    if times.allocations > MAX_ALLOCATIONS:  # 2**40 steps: allocations without end, each queued in turn
        raise UserError(f"train.max_steps={plan.recipe.train.max_steps:,} needs {times.allocations:,} allocations of "
                        f"{times.time_limit_min} min, more than the {MAX_ALLOCATIONS:,} one run may chain",
                        "train fewer steps (train.max_steps), or use more nodes")
    engine = engine_of(plan)
    launcher = launcher_of(plan)
    run_dir = reserve_run_dir(plan.recipe, out_dir, taken)
    job = job_spec(plan, run_dir)
    launcher.check(plan, job)
    launcher.check_host(plan)  # a run here: FP8 / CPU offload without a GPU, host memory (before the GPU verdict)
    require_feasible(plan)
    check_renders(plan.recipe)  # engine.transformer_engine names the stack the job runs, not another
    engine.check(plan)
    # every input this machine reads must exist here (all missing ones are named in one line)
    check_local_paths(plan, run_dir, True if launcher.executes_here else check_mounts)
    check_results_room(plan, run_dir, True if launcher.executes_here else check_mounts)
    if launcher.executes_here:
        engine.local_check(plan)
    files = files_for(plan, run_dir)
    files[PLAN_FILE] = plan_json(plan)
    return Prepared(plan, run_dir, files)


def files_for(plan, run_dir: PathLike) -> Dict[str, Union[str, bytes]]:
    """The engine's and the launcher's files of a run directory (name -> content), rendered in memory:
    what render writes, and what `vdkit check` compares a run directory's files with (:mod:`vdkit.render.rendercheck`)."""
    return {**engine_of(plan).files(plan, run_dir), **preflight_files(plan, run_dir),
            **launcher_of(plan).files(plan, job_spec(plan, run_dir), Path(run_dir))}


def prepare_all(plans, out_dir: Optional[PathLike] = None, check_mounts: Optional[bool] = None) -> List[Prepared]:
    """:func:`prepare` every plan (distinct run directories even for equal run names) before any is written."""
    out: List[Prepared] = []
    for plan in plans:
        out.append(prepare(plan, out_dir, check_mounts, taken={p.run_dir: p.plan.recipe.engine.name for p in out}))
    return out


def render_run(plan, out_dir: Optional[PathLike] = None, check_mounts: Optional[bool] = None) -> Path:
    """Prepare one plan and write its run directory; returns the path."""
    return prepare(plan, out_dir, check_mounts).write()
