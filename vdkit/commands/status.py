"""`vdkit status`: the state of submitted run directories (or Slurm job ids), each from its launcher.

A run directory asks the launcher it was rendered for (:mod:`vdkit.launch.launchers`), which names its own
job and reports its state in the scheduler's words; the run directory's lock holder is named beside it.
"""
from __future__ import annotations

from vdkit.commands.args import finite_seconds


def register(sub) -> None:
    """Add the `vdkit status` verb to ``sub``."""
    s = sub.add_parser("status", help="the state of submitted run directories, from their launchers",
                       description="For each run directory: the run directory, its latest job as its launcher names "
                                   "it (a Slurm job id, a Kubernetes job name) and the job's state in the "
                                   "scheduler's words. A bare Slurm job id works too. (Slurm needs no accounting: "
                                   "sacct, then scontrol/squeue, then the job's own output.)")
    s.add_argument("targets", nargs="+", metavar="RUN_DIR",
                   help="run directories written by `vdkit submit` (or Slurm job ids)")
    add_wait_args(s)
    s.set_defaults(func=run_status)


def add_wait_args(p) -> None:
    """--wait and --timeout, the same for submit and status."""
    p.add_argument("--wait", action="store_true", help="poll until every job ends; exit 1 unless all COMPLETED")
    p.add_argument("--timeout", type=finite_seconds, default=None, metavar="S",
                   help="with --wait: stop waiting after S seconds")


def job_line(run_dir, job_id, state: str = None) -> str:
    """One output line: the run directory, its job as the launcher names it, and (optionally) its state."""
    return "\t".join([str(run_dir), str(job_id)] + ([state] if state is not None else []))


def _target(target):
    """(launcher, run directory or None, job) of a ``vdkit status`` target.

    A run directory asks the launcher it was rendered for (``cluster.launcher`` in its recipe), which
    names its own job. Anything else is a Slurm job id (or a run directory without a recipe, found by its
    job_id.txt): Slurm's are the one kind of job id that names a job without its run directory."""
    from pathlib import Path

    from vdkit.launch import launchers
    from vdkit.run.rundir import RECIPE_FILE, load_recipe

    path = Path(target)
    if (path / RECIPE_FILE).is_file():
        from vdkit.run.runlock import check_state_files

        check_state_files(path)  # a FIFO among them would hang this answer, a directory would read as no record
        launcher = launchers.get(load_recipe(path).cluster.launcher)
        return launcher, path.absolute(), launcher.job(path)
    if path.is_dir():  # the results root given for a run directory: "no job was submitted from runs/" misleads
        from vdkit.errors import UserError
        from vdkit.run.runs import find_runs

        inside = find_runs(path)
        if inside:
            raise UserError(f"{path} is not a run directory (no {RECIPE_FILE}); it holds {len(inside)} run "
                            f"director{'y' if len(inside) == 1 else 'ies'}",
                            f"`vdkit runs {path}` lists them with their states; `vdkit status {path}/*` asks about each")
    from vdkit.slurm.submit import resolve

    run_dir, job_id = resolve(target)
    return launchers.get("slurm"), run_dir, job_id


def _answer(target):
    """(launcher, run dir or None, job, or the UserError that made ``target`` unreadable)."""
    from vdkit.errors import UserError

    try:
        return _target(target) + (None,)
    except UserError as exc:
        return None, None, None, exc


def _state(launcher, run_dir, job) -> str:
    """The run dir's own markers (finished, cancelled) before the scheduler, which may be down or have forgotten."""
    if run_dir is None:
        return launcher.status(job)
    from vdkit.run.runs import state

    return state(run_dir, launcher)


def _watch(run_dir, state: str = ""):
    """'step 30/50, 0.21 s/step (plan 0.18-0.25), ETA 4 s, straggler: ...' (None before the first step; no ETA once
    ``state`` says the run ended: completed, failed, stopped or cancelled)."""
    from vdkit.launch.launchers import ENDED
    from vdkit.run.rundir import load_recipe
    from vdkit.run.runs import CANCELLED, progress

    try:
        recipe = load_recipe(run_dir)
        p = progress(run_dir, recipe.train.max_steps, recipe.cluster.gpu_type)
    except Exception:  # noqa: BLE001 - progress is a note: status answers without it
        return None
    ended = state.split(" ", 1)[0] in ENDED | {CANCELLED}
    return p.text(eta=not ended) if p.done is not None else None


def run_status(args) -> int:
    """One line per target, every target answered (an unreadable one says why on its line); exit 2 when one
    could not be read, else 0 (with --wait: 1 unless every job COMPLETED)."""
    import sys

    from vdkit.errors import UserError
    from vdkit.launch.launchers import succeeded
    from vdkit.run.faults import summary as fault_summary
    from vdkit.run.runlock import holder_note

    answers = [_answer(t) for t in args.targets]
    bad = 0
    for target, (_, _, _, exc) in zip(args.targets, answers):
        if exc is not None:  # said first, on stderr: the lines below are the answers
            print(f"vdkit status: error: {target}: {exc}", file=sys.stderr)
            bad = 2
    targets = [a[:3] for a in answers if a[3] is None]
    if args.wait:  # each line as its job ends
        rc = 0
        for launcher, run_dir, job in targets:
            from vdkit.run.runs import marker_state

            state = (run_dir is not None and marker_state(run_dir)) or \
                launcher.wait(run_dir if run_dir is not None else job, timeout=args.timeout)
            print(job_line(run_dir if run_dir is not None else "-", launcher.job(run_dir) if run_dir else job, state),
                  flush=True)
            rc |= 0 if succeeded(state) else 1
        return bad or rc
    lines = []
    for launcher, run_dir, job in targets:  # all answered before any output
        try:
            state = _state(launcher, run_dir, job)
        except UserError as exc:
            print(f"vdkit status: error: {run_dir or job}: {exc}", file=sys.stderr)
            bad = 2
            continue
        notes = [holder_note(run_dir), _watch(run_dir, state), fault_summary(run_dir, job, state)] if run_dir is not None else []
        lines.append(job_line(run_dir if run_dir is not None else "-", job, state) + "".join(f"\t{n}" for n in notes if n))
    for line in lines:
        print(line)
    return bad
