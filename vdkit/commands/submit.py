"""`vdkit submit` (render + hand each run to its launcher), `vdkit status` and `vdkit cluster up|down|status`.

``submit`` and ``status`` go through the launcher registry (:mod:`vdkit.launchers`): each run
directory's launcher submits it, names its job and reports its state. ``cluster`` is the Slurm
launcher's own verb (the local emulated Slurm).
"""
from __future__ import annotations

import argparse
import shutil
import sys

from vdkit.args import add_render_args, finite_seconds


def register(sub) -> None:
    p = sub.add_parser("submit", help="render each recipe and hand it to its launcher's scheduler",
                       description="Render a run directory per recipe (as `vdkit render`) and submit it through "
                                   "its launcher (cluster.launcher: Slurm's sbatch through submitit, Kubernetes' "
                                   "kubectl apply). Prints one line per job: the run directory and the job as the "
                                   "launcher names it (recorded in the run directory's job_id.txt).")
    add_render_args(p)
    p.add_argument("--test-only", action="store_true",
                   help="the scheduler checks each run and says what it would do (Slurm: sbatch --test-only; "
                        "Kubernetes: a server-side dry run); nothing is queued (the run directories stay)")
    _add_wait_args(p)
    p.set_defaults(func=run_submit)

    s = sub.add_parser("status", help="the state of submitted run directories, from their launchers",
                       description="For each run directory: the run directory, its latest job as its launcher names "
                                   "it (a Slurm job id, a Kubernetes job name) and the job's state in the "
                                   "scheduler's words. A bare Slurm job id works too. (Slurm needs no accounting: "
                                   "sacct, then scontrol/squeue, then the job's own output.)")
    s.add_argument("targets", nargs="+", metavar="RUN_DIR",
                   help="run directories written by `vdkit submit` (or Slurm job ids)")
    _add_wait_args(s)
    s.set_defaults(func=run_status)

    c = sub.add_parser("cluster", help="an emulated six-node XE9680 Slurm on this machine (root; slurm-wlm, munge)",
                       description="Start, stop or show a real Slurm on localhost with six emulated XE9680 nodes "
                                   "(8 GPU gres each), to try `vdkit submit` without a cluster. After `up`, export "
                                   "the SLURM_CONF line it prints.")
    from vdkit.slurm.localcluster import add_cluster_args  # stdlib-only module: cheap to import

    add_cluster_args(c)
    c.set_defaults(func=run_cluster)


def _add_wait_args(p) -> None:
    """--wait and --timeout, the same for submit and status."""
    p.add_argument("--wait", action="store_true", help="poll until every job ends; exit 1 unless all COMPLETED")
    p.add_argument("--timeout", type=finite_seconds, default=None, metavar="S",
                   help="with --wait: stop waiting after S seconds")


def _line(run_dir, job_id, state: str = None) -> str:
    return "\t".join([str(run_dir), str(job_id)] + ([state] if state is not None else []))


def run_submit(args) -> int:
    from vdkit.launchers import succeeded
    from vdkit.prepare import launcher_of, prepare_all
    from vdkit.sweep import feasible_plans

    plans = feasible_plans(args.overrides, args.multirun, args.sweep, "submit")
    for launcher in {launcher_of(p).name: launcher_of(p) for p in plans}.values():
        launcher.require()  # a scheduler to hand the runs to, before anything is written
    # The same step as `vdkit render`: every cell is planned, checked and rendered in memory before
    # any run directory is written or any job submitted.
    cells = prepare_all(plans, args.out, args.check_mounts)
    from vdkit.errors import KeepRunDir
    from vdkit.rundir import missing_parents, remove_empty

    created = missing_parents(cells[0].run_dir.parent) if cells else []
    submitted = []
    for cell in cells:
        launcher = launcher_of(cell.plan)
        run_dir = cell.write()
        try:
            answer = launcher.test(run_dir) if args.test_only else launcher.submit(run_dir)
        except KeepRunDir:
            raise  # e.g. a job may be queued: its run directory stays
        except BaseException:
            if not args.test_only:
                # A run directory that was never submitted would look like a lost job: remove it.
                shutil.rmtree(run_dir, ignore_errors=True)
                if not submitted:
                    remove_empty(created)
            if submitted:
                print(f"vdkit submit: {len(submitted)} job(s) were submitted before the error", file=sys.stderr)
            raise
        if args.test_only:
            print(f"{run_dir}\ttest-only\t{answer}", flush=True)
        else:
            print(_line(run_dir, answer), flush=True)
            submitted.append((launcher, run_dir, answer))
    if args.wait and submitted:
        rc = 0
        for launcher, run_dir, job_id in submitted:
            state = launcher.wait(run_dir, timeout=args.timeout)
            print(_line(run_dir, job_id, state), flush=True)
            rc |= 0 if succeeded(state) else 1
        return rc
    return 0


def _target(target):
    """(launcher, run directory or None, job) of a ``vdkit status`` target.

    A run directory asks the launcher it was rendered for (``cluster.launcher`` in its recipe), which
    names its own job. Anything else is a Slurm job id (or a run directory without a recipe, found by its
    job_id.txt): Slurm's are the one kind of job id that names a job without its run directory."""
    from pathlib import Path

    from vdkit import launchers
    from vdkit.rundir import RECIPE_FILE, load_recipe

    path = Path(target)
    if (path / RECIPE_FILE).is_file():
        launcher = launchers.get(load_recipe(path).cluster.launcher)
        return launcher, path.absolute(), launcher.job(path)
    from vdkit.slurm.submit import resolve

    run_dir, job_id = resolve(target)
    return launchers.get("slurm"), run_dir, job_id


def run_status(args) -> int:
    from vdkit.faults import summary as fault_summary
    from vdkit.launchers import succeeded
    from vdkit.runlock import holder_note

    targets = [_target(t) for t in args.targets]  # all checked before any output
    if args.wait:  # each line as its job ends
        rc = 0
        for launcher, run_dir, job in targets:
            state = launcher.wait(run_dir if run_dir is not None else job, timeout=args.timeout)
            print(_line(run_dir if run_dir is not None else "-", launcher.job(run_dir) if run_dir else job, state),
                  flush=True)
            rc |= 0 if succeeded(state) else 1
        return rc
    states = [launcher.status(run_dir if run_dir is not None else job) for launcher, run_dir, job in targets]
    for (launcher, run_dir, job), state in zip(targets, states):  # all answered before any output
        notes = [holder_note(run_dir), fault_summary(run_dir)] if run_dir is not None else []
        print(_line(run_dir if run_dir is not None else "-", job, state) + "".join(f"\t{n}" for n in notes if n))
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    from vdkit.slurm.localcluster import run_cluster_command

    return run_cluster_command(args)
