"""The launcher registry: ``cluster.launcher`` -> the module that starts a run. Standard library only.

A launcher turns the engine's job request (:class:`vdkit.run.jobspec.JobSpec`) into the files of a run
directory, submits it, and reports its state. Adding a launcher takes three things and nothing else:

1. a cluster YAML ``conf/cluster/<name>.yaml`` with ``launcher: <launcher>``;
2. a module providing the interface below (e.g. ``k8s/launcher.py`` mapped to ``vdkit.k8s.launcher``);
3. one line in :data:`REGISTRY`: ``"<launcher>": "<module>"``.

``config`` (what ``cluster.launcher`` may be), :mod:`vdkit.render.prepare` (render / submit / run / demo)
and ``vdkit submit`` / ``vdkit status`` all go through :func:`get`; nothing else branches on a
launcher's name. The engine never learns which launcher runs it.

The interface (module-level names; ``files``, ``submit`` and ``status`` are required, the rest
default as shown). ``plan`` is a :class:`vdkit.composition.plan_types.Plan`, ``job`` the engine's
:class:`~vdkit.run.jobspec.JobSpec` for this run directory, ``run_dir`` the run directory's absolute
:class:`~pathlib.Path` (when rendering it does not exist yet: files need its final path):

``SETTINGS: str | tuple[str, ...]``  (default: none)
    The ``cluster`` field(s) this launcher alone reads (the Kubernetes launcher: ``kubernetes``, its
    ``cluster.kubernetes`` mapping; Slurm: ``partition``, ``reservation``, ``account``, ``qos``). A command line
    that sets one while another launcher runs the cluster is refused at composition
    (:func:`refuse_foreign_settings`): nothing else would read it.
``check_recipe(recipe) -> None``  (default: accept)
    Refuse, at composition (every verb, ``vdkit plan`` included), what is wrong in this launcher's own
    cluster settings (e.g. ``cluster.kubernetes``). Pure and light: :func:`vdkit.rules.check_recipe` calls it.
``check(plan, job) -> None``  (default: accept)
    Refuse (:class:`vdkit.errors.UserError`) what this launcher cannot start: a container image it
    cannot read, a value its scripts cannot carry, an engine that does not run here. Pure (no I/O).
``check_host(plan) -> None``  (default: accept)
    For a launcher that executes here: refuse what this machine cannot do for the run (the local
    launcher: FP8 / CPU offload without a GPU, the host's memory). Asked when a run directory is
    prepared (render, submit, run, demo), not by ``vdkit plan``.
``files(plan, job, run_dir) -> dict[str, str | bytes]``  (required)
    What the launcher writes into the run directory, rendered in memory for every cell before
    anything is written (names from :mod:`vdkit.run.rundir`): Slurm's ``launch.sbatch``; nothing for
    local processes. A text file starting with ``#!`` is written executable.
``require() -> None``  (default: accept)
    One-line UserError when no scheduler is reachable from here (``vdkit submit`` asks before
    anything is written).
``submit(run_dir) -> str``  (required)
    Hand the written run directory to the scheduler; returns the job id. One-line UserError when
    no scheduler is reachable from here or it refuses the files.
``test(run_dir) -> str``  (optional: ``vdkit submit --test-only``)
    Let the scheduler check the files without queueing anything; its one-line answer.
``status(run_dir) -> str``  (required)
    The run's latest job state: a state word in the scheduler's spelling (``RUNNING``,
    ``COMPLETED``, ``FAILED``, ...), optionally followed by details (``COMPLETED exit=0:0``).
``job(run_dir) -> str``  (default: ``-``, a launcher whose jobs have no name of their own)
    The run's latest job as this launcher names it (a Slurm job id, a Kubernetes namespace/kind/name);
    ``vdkit status`` prints it beside the state.
``run(run_dir, plan, command, terminal=None) -> int``  (optional: launchers that execute here)
    Start the ranks on this machine now and wait for them; the exit code (0 when all succeeded).
    A launcher with ``run`` *executes here*: :mod:`vdkit.render.prepare` then runs the engine's local
    checks (installed extras, data files, tokenizer) instead of the mount-source check, and the
    cluster's fabric rules (RDMA adapters) do not apply (:func:`vdkit.composition.config.validate`).
``wait(run_dir, timeout=None) -> str``  (default: poll ``status`` every 2 s until :data:`ENDED`)
    Block until the run's latest job ends (or ``timeout`` seconds pass); its last state. The job
    succeeded when its state word is :data:`COMPLETED` (:func:`succeeded`). A launcher whose scheduler has more end states
    (Slurm's TIMEOUT, CANCELLED, ...) provides its own.
``next_command(files) -> str``  (default: ``"sbatch {}/launch.sbatch"``)
    What the user runs to start a rendered run directory (``{}`` stands for it), from the files
    :func:`files` returned; ``vdkit render`` prints it.
``cancel(run_dir, settle_s) -> list[str]``  (default: refuse)
    Stop every job of the run and any successor it queued (`vdkit cancel`); the jobs it stopped, as
    :func:`job` names them ([] when none ran). Waits up to ``settle_s`` for them to end.
``continue_command(run_dir) -> str``  (default: ``sbatch RUN_DIR/launch.sbatch``)
    The command that continues a cancelled run from its latest checkpoint; `vdkit cancel` records it.
``log_command(run_dir, follow) -> list[str] | None``  (default: None: the run dir's own files)
    The argv that prints the run's logs where the scheduler keeps them (``kubectl logs``); `vdkit logs`.
``RUNS_FIRST: bool``  (default ``False``)
    Whether ``submit`` (and ``next_command``) honour the run directory's :data:`vdkit.run.rundir.FIRST_FILE`:
    its job scripts submitted first, the run only after they succeed (Slurm: ``--dependency=afterok``).
    An engine writes that file (Bridge's HF import) only for a launcher that does (:func:`runs_first`).
``job_alive(job_id) -> bool``  (default: ``False``)
    Whether job ``job_id`` of this launcher still runs; ``vdkit status`` names the holder of a
    run directory's lock (:mod:`vdkit.run.runlock`) only while it does.

Continuation (how a run that stopped before its time limit, checkpointed and exited with the job
contract's code is started again) is the launcher's decision and belongs in this interface; the
Slurm launcher renders it into its files. Engines know nothing of the scheduler.

Keep a launcher module's top level light (standard library, vdkit.errors / rundir / jobspec /
fabric): config validation and ``vdkit --help`` import it; import scheduler clients lazily.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from vdkit.errors import UserError

# cluster.launcher -> module. One line per launcher; the order is the order errors list them.
REGISTRY: Dict[str, str] = {
    "slurm": "vdkit.slurm.launcher",
    "local": "vdkit.launch.local",
    "kubernetes": "vdkit.k8s.launcher",
}


COMPLETED = "COMPLETED"  # the state every launcher reports for a run that ended successfully
FAILED = "FAILED"  # ... and for one that ended otherwise (a scheduler's launcher has more words: its own wait)
STOPPED = "STOPPED"  # stopped cleanly before its end (the job contract's exit 75) and not continued yet
ENDED = frozenset({COMPLETED, FAILED, STOPPED})


def names() -> Tuple[str, ...]:
    """Every registered launcher name."""
    return tuple(REGISTRY)


class Launcher:
    """A launcher module behind the interface above, with the optional parts defaulted."""

    def __init__(self, name: str, module: ModuleType):
        self.name, self.module = name, module
        for fn in ("files", "submit", "status"):
            if not callable(getattr(module, fn, None)):
                raise TypeError(f"launcher module {module.__name__} has no {fn}()")

    def check_recipe(self, recipe) -> None:
        fn = getattr(self.module, "check_recipe", None)
        if fn:
            fn(recipe)

    def check(self, plan, job) -> None:
        fn = getattr(self.module, "check", None)
        if fn:
            fn(plan, job)

    def check_host(self, plan) -> None:
        fn = getattr(self.module, "check_host", None)
        if fn:
            fn(plan)

    def files(self, plan, job, run_dir) -> Dict[str, object]:
        return dict(self.module.files(plan, job, Path(run_dir)))

    def require(self) -> None:
        fn = getattr(self.module, "require", None)
        if fn:
            fn()

    def submit(self, run_dir) -> str:
        return str(self.module.submit(Path(run_dir)))

    def test(self, run_dir) -> str:
        fn = getattr(self.module, "test", None)
        if fn is None:
            raise UserError(f"cluster.launcher={self.name} cannot check a run without starting it",
                            "drop --test-only")
        return str(fn(Path(run_dir)))

    def status(self, run_dir) -> str:
        return str(self.module.status(Path(run_dir)))

    def job(self, run_dir) -> str:
        fn = getattr(self.module, "job", None)
        return str(fn(Path(run_dir))) if fn else "-"

    def wait(self, run_dir, timeout: Optional[float] = None) -> str:
        fn = getattr(self.module, "wait", None)
        if fn:
            return str(fn(Path(run_dir), timeout=timeout))
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status(run_dir)
            if state.split(" ", 1)[0] in ENDED or (deadline is not None and time.monotonic() >= deadline):
                return state
            time.sleep(2.0)

    @property
    def executes_here(self) -> bool:
        """Whether this launcher starts the ranks on this machine (it has ``run``)."""
        return callable(getattr(self.module, "run", None))

    def run(self, run_dir, plan, command: List[str], terminal=None) -> int:
        if not self.executes_here:
            raise UserError(f"cluster.launcher={self.name} does not start runs on this machine",
                            "use `vdkit submit` for it, or cluster=local here")
        return int(self.module.run(Path(run_dir), plan, [str(a) for a in command], terminal=terminal))

    def next_command(self, files) -> str:
        fn = getattr(self.module, "next_command", None)
        return str(fn(files)) if fn else "sbatch {}/launch.sbatch"

    def cancel(self, run_dir, settle_s: float = 60.0) -> List[str]:
        fn = getattr(self.module, "cancel", None)
        if fn is None:
            raise UserError(f"cluster.launcher={self.name} cannot cancel a run", "stop its job with the scheduler")
        return [str(j) for j in fn(Path(run_dir), settle_s)]

    def continue_command(self, run_dir) -> str:
        fn = getattr(self.module, "continue_command", None)
        return str(fn(Path(run_dir))) if fn else f"sbatch {Path(run_dir)}/launch.sbatch"

    def log_command(self, run_dir, follow: bool = False) -> Optional[List[str]]:
        fn = getattr(self.module, "log_command", None)
        return fn(Path(run_dir), follow) if fn else None

    def job_alive(self, job_id: str) -> bool:
        fn = getattr(self.module, "job_alive", None)
        return bool(fn(job_id)) if fn else False


def settings_keys(name: str) -> Tuple[str, ...]:
    """The ``cluster`` fields launcher ``name`` alone reads (its module's ``SETTINGS``; none by default)."""
    keys = getattr(get(name).module, "SETTINGS", None) or ()
    return (keys,) if isinstance(keys, str) else tuple(keys)


def refuse_foreign_settings(launcher: str, overrides) -> None:
    """Refuse a command-line override of another launcher's settings (``+cluster.kubernetes.foo=1`` on a Slurm
    cluster): no code would read it. A cluster YAML may describe the same machines under two launchers (its
    ``kubernetes:`` block beside ``launcher: slurm``, for ``cluster.launcher=kubernetes``): only the command line,
    where a user meant the key to act, is held to this."""
    for other in names():
        for key, raw in ((k, o) for k in (settings_keys(other) if other != launcher else ()) for o in overrides):
            name, _, value = str(raw).partition("=")
            name = name.lstrip("+~")
            if value.strip() == "null":  # naming no partition / mapping sets nothing another launcher would miss
                continue
            if name == f"cluster.{key}" or name.startswith(f"cluster.{key}."):
                raise UserError(f"{name}: cluster.{key} is read only by the {other} launcher, and this cluster's "
                                f"launcher is {launcher}: the setting would be ignored",
                                f"drop it, or set cluster.launcher={other} to run this cluster under {other}")


def succeeded(state: str) -> bool:
    """Whether a launcher's state text (``status`` / ``wait``) says the run completed."""
    return state.split(" ", 1)[0] == COMPLETED


def get(name: str) -> Launcher:
    """The launcher registered as ``name`` (its module imported now); UserError for an unknown name."""
    if name not in REGISTRY:
        raise UserError(f"cluster.launcher={name!r} is not a launcher",
                        "use " + " or ".join(f"cluster.launcher={n}" for n in REGISTRY))
    return Launcher(name, importlib.import_module(REGISTRY[name]))


def executes_here(name: str) -> bool:
    """Whether launcher ``name`` starts the ranks on this machine (local processes), not on a cluster."""
    return get(name).executes_here


def runs_first(name: str) -> bool:
    """Whether launcher ``name`` submits a run directory's FIRST_FILE jobs before the run (``RUNS_FIRST``)."""
    return bool(getattr(get(name).module, "RUNS_FIRST", False))


def of(plan) -> Launcher:
    """The launcher that starts ``plan`` (its ``cluster.launcher``)."""
    return get(plan.recipe.cluster.launcher)


def optional(name: str) -> Optional[Launcher]:
    """:func:`get`, or None for a name that is not registered (e.g. a lock file from another kit version)."""
    return get(name) if name in REGISTRY else None
