"""`vdkit submit` (render + hand each run to its launcher), `vdkit status` and `vdkit cluster up|down|status`.

``submit`` goes through the launcher registry (:mod:`vdkit.launchers`); ``status`` and ``cluster``
are the Slurm launcher's own verbs (job ids, the local emulated Slurm).
"""
from __future__ import annotations

import argparse
import shutil
import sys

from vdkit.args import add_render_args, finite_seconds


def register(sub) -> None:
    p = sub.add_parser("submit", help="render each recipe and submit it with sbatch (through submitit)",
                       description="Render a run directory per recipe (as `vdkit render`) and submit its "
                                   "launch.sbatch with sbatch through submitit. Prints one line per job: the run "
                                   "directory and the Slurm job id (recorded in the run directory's job_id.txt).")
    add_render_args(p)
    p.add_argument("--test-only", action="store_true",
                   help="sbatch --test-only: Slurm checks each script and says where it would start; nothing is "
                        "queued (the run directories stay, for inspection)")
    p.add_argument("--wait", action="store_true", help="poll until every job ends; exit 1 unless all COMPLETED")
    p.add_argument("--timeout", type=finite_seconds, default=None, metavar="S",
                   help="with --wait: stop waiting after S seconds")
    p.set_defaults(func=run_submit)

    s = sub.add_parser("status", help="the Slurm state of submitted run directories",
                       description="For each run directory (or job id): run directory, latest job id and its Slurm "
                                   "state. Works without Slurm accounting (sacct, then scontrol/squeue, then the "
                                   "job's own output).")
    s.add_argument("targets", nargs="+", metavar="RUN_DIR", help="run directories written by `vdkit submit` (or job ids)")
    s.add_argument("--wait", action="store_true", help="poll until every job ends; exit 1 unless all COMPLETED")
    s.add_argument("--timeout", type=finite_seconds, default=None, metavar="S",
                   help="with --wait: stop waiting after S seconds")
    s.set_defaults(func=run_status)

    c = sub.add_parser("cluster", help="an emulated six-node XE9680 Slurm on this machine (root; slurm-wlm, munge)",
                       description="Start, stop or show a real Slurm on localhost with six emulated XE9680 nodes "
                                   "(8 GPU gres each), to try `vdkit submit` without a cluster. After `up`, export "
                                   "the SLURM_CONF line it prints.")
    from vdkit.slurm.localcluster import add_cluster_args  # stdlib-only module: cheap to import

    add_cluster_args(c)
    c.set_defaults(func=run_cluster)


def _line(run_dir, job_id, state: str = None) -> str:
    return "\t".join([str(run_dir), str(job_id)] + ([state] if state is not None else []))


def _wait_all(pairs, timeout) -> int:
    """Wait for every (run_dir, job_id) of Slurm; print the final line of each; 0 when all COMPLETED."""
    from vdkit.slurm.launcher import describe
    from vdkit.slurm.submit import wait

    rc = 0
    for run_dir, job_id in pairs:
        st = wait(run_dir if run_dir is not None else job_id, timeout=timeout)
        print(_line(run_dir if run_dir is not None else "-", job_id, describe(st)), flush=True)
        rc |= 0 if st.ok else 1
    return rc


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


def _scheduler_of(target):
    """The launcher of a run directory rendered for a scheduler other than Slurm (e.g. kubernetes), else None."""
    from pathlib import Path

    from vdkit import launchers
    from vdkit.rundir import RECIPE_FILE

    if not (Path(target) / RECIPE_FILE).is_file():
        return None
    from vdkit.rundir import load_recipe

    name = load_recipe(target).cluster.launcher
    if name == "slurm" or name not in launchers.REGISTRY or launchers.get(name).executes_here:
        return None
    return launchers.get(name)


def _last_job(run_dir) -> str:
    from pathlib import Path

    from vdkit.rundir import JOB_ID_FILE

    path = Path(run_dir) / JOB_ID_FILE
    ids = path.read_text().split() if path.is_file() else []
    return ids[-1] if ids else "-"


def run_status(args) -> int:
    from vdkit.slurm.submit import job_state, resolve

    # Run directories of another scheduler (Kubernetes) ask their launcher; the rest is Slurm's.
    others = [(t, launcher) for t in args.targets if (launcher := _scheduler_of(t)) is not None]
    if others:
        rc = 0
        lines = [(t, launcher.wait(t, timeout=args.timeout) if args.wait else launcher.status(t)) for t, launcher in others]
        for t, state in lines:  # all answered before any output
            print(_line(t, _last_job(t), state), flush=True)
            rc |= 0 if (not args.wait or state.split(" ", 1)[0] == "COMPLETED") else 1
        args.targets = [t for t in args.targets if t not in dict(others)]
        if not args.targets:
            return rc
    pairs = [resolve(t) for t in args.targets]  # all checked before any output
    if args.wait:
        return _wait_all(pairs, args.timeout)
    from vdkit.errors import UserError
    from vdkit.runlock import holder_note
    from vdkit.slurm.launcher import describe

    states = [job_state(run_dir if run_dir is not None else job_id) for run_dir, job_id in pairs]
    for (run_dir, job_id), st in zip(pairs, states):  # all checked before any output
        if run_dir is None and st.source == "none":
            raise UserError(f"Slurm does not know job {job_id} (not queued, running or recently ended; "
                            "accounting is off or has no record)",
                            "pass a job id that `squeue` or `scontrol show job` lists, or a run directory "
                            "written by `vdkit submit`")
    for (run_dir, job_id), st in zip(pairs, states):
        line = _line(run_dir if run_dir is not None else "-", job_id, describe(st))
        note = holder_note(run_dir) if run_dir is not None else None
        print(line + (f"\t{note}" if note else ""))
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    from vdkit.slurm.localcluster import run_cluster_command

    return run_cluster_command(args)
