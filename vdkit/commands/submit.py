"""`vdkit submit`: render each recipe and hand its run directory to its launcher.

It goes through the launcher registry (:mod:`vdkit.launch.launchers`): each run directory's launcher
submits it and names its job; ``--wait`` polls them as `vdkit status --wait` does (:mod:`.status`).
"""
from __future__ import annotations

import shutil
import sys

from vdkit.commands.args import add_render_args, run_dir_files_help
from vdkit.commands.status import add_wait_args, job_line


def register(sub) -> None:
    """Add the `vdkit submit` verb to ``sub``."""
    p = sub.add_parser("submit", help="render each recipe and hand it to its launcher's scheduler",
                       description="Render a run directory per recipe (as `vdkit render`) and submit it through "
                                   "its launcher (cluster.launcher: Slurm's sbatch through submitit, Kubernetes' "
                                   "kubectl apply). Prints one line per job: the run directory and the job as the "
                                   "launcher names it (recorded in the run directory's job_id.txt). "
                                   + run_dir_files_help())
    add_render_args(p)
    p.add_argument("--test-only", action="store_true",
                   help="the scheduler checks each run and says what it would do (Slurm: sbatch --test-only; "
                        "Kubernetes: a server-side dry run); nothing is queued (the run directories stay)")
    add_wait_args(p)
    p.set_defaults(func=run_submit)


def run_submit(args) -> int:
    """`vdkit submit`: each recipe rendered and handed to its launcher's scheduler; the exit code."""
    from vdkit.launch.launchers import succeeded
    from vdkit.render.prepare import launcher_of, prepare_all
    from vdkit.render.sweep import feasible_plans

    plans = feasible_plans(args.overrides, args.multirun, args.sweep, "submit")
    for launcher in {launcher_of(p).name: launcher_of(p) for p in plans}.values():
        launcher.require()  # a scheduler to hand the runs to, before anything is written
    # The same step as `vdkit render`: every cell is planned, checked and rendered in memory before
    # any run directory is written or any job submitted.
    cells = prepare_all(plans, args.out, args.check_mounts)
    from vdkit.errors import KeepRunDir
    from vdkit.run.create import missing_parents, remove_empty

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
            print(job_line(run_dir, answer), flush=True)
            submitted.append((launcher, run_dir, answer))
    if args.wait and submitted:
        rc = 0
        for launcher, run_dir, job_id in submitted:
            state = launcher.wait(run_dir, timeout=args.timeout)
            print(job_line(run_dir, job_id, state), flush=True)
            rc |= 0 if succeeded(state) else 1
        return rc
    return 0
