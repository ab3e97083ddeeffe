"""`vdkit submit` (render + sbatch through submitit), `vdkit status` and `vdkit cluster up|down|status`."""
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


def _line(run_dir, job_id, state=None) -> str:
    parts = [str(run_dir), str(job_id)]
    if state is not None:
        text = state.state
        if state.exit_code and state.done:
            text += f" exit={state.exit_code}"
        if state.reason and not state.done:
            text += f" ({state.reason})"
        parts.append(text)
    return "\t".join(parts)


def _wait_all(pairs, timeout) -> int:
    """Wait for every (run_dir, job_id); print the final line of each; 0 when all COMPLETED."""
    from vdkit.slurm.submit import wait

    rc = 0
    for run_dir, job_id in pairs:
        st = wait(run_dir if run_dir is not None else job_id, timeout=timeout)
        print(_line(run_dir if run_dir is not None else "-", job_id, st), flush=True)
        rc |= 0 if st.ok else 1
    return rc


def run_submit(args) -> int:
    from vdkit.prepare import prepare_all
    from vdkit.slurm.submit import require_sbatch, submit_run
    from vdkit.sweep import feasible_plans

    require_sbatch()
    plans = feasible_plans(args.overrides, args.multirun, args.sweep, "submit")
    # The same step as `vdkit render`: every cell is planned, checked and rendered in memory before
    # any run directory is written or any job submitted.
    cells = prepare_all(plans, args.out, args.check_mounts)
    from vdkit.rundir import missing_parents, remove_empty
    from vdkit.slurm.submit import NoJobId

    created = missing_parents(cells[0].run_dir.parent) if cells else []
    submitted = []
    for cell in cells:
        run_dir = cell.write()
        try:
            sub = submit_run(run_dir, test_only=args.test_only)
        except NoJobId:
            raise  # the job may be queued: its run directory stays
        except BaseException:
            if not args.test_only:
                # A run directory that was never submitted would look like a lost job: remove it.
                shutil.rmtree(run_dir, ignore_errors=True)
                if not submitted:
                    remove_empty(created)
            if submitted:
                print(f"vdkit submit: {len(submitted)} job(s) were submitted before the error", file=sys.stderr)
            raise
        if sub.test_only:
            print(f"{run_dir}\ttest-only\t{sub.message}", flush=True)
        else:
            print(_line(run_dir, sub.job_id), flush=True)
            submitted.append((run_dir, sub.job_id))
    if args.wait and submitted:
        return _wait_all(submitted, args.timeout)
    return 0


def run_status(args) -> int:
    from vdkit.slurm.submit import job_state, resolve

    pairs = [resolve(t) for t in args.targets]  # all checked before any output
    if args.wait:
        return _wait_all(pairs, args.timeout)
    from vdkit.slurm.runlock import holder_note

    from vdkit.errors import UserError

    states = [job_state(run_dir if run_dir is not None else job_id) for run_dir, job_id in pairs]
    for (run_dir, job_id), st in zip(pairs, states):  # all checked before any output
        if run_dir is None and st.source == "none":
            raise UserError(f"Slurm does not know job {job_id} (not queued, running or recently ended; "
                            "accounting is off or has no record)",
                            "pass a job id that `squeue` or `scontrol show job` lists, or a run directory "
                            "written by `vdkit submit`")
    for (run_dir, job_id), st in zip(pairs, states):
        line = _line(run_dir if run_dir is not None else "-", job_id, st)
        note = holder_note(run_dir) if run_dir is not None else None
        print(line + (f"\t{note}" if note else ""))
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    from vdkit.slurm.localcluster import run_cluster_command

    return run_cluster_command(args)
