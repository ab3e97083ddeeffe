"""`vdkit render`: write one new run directory per recipe (launch.sbatch, recipe.yaml, nemo.yaml, ...).

  vdkit render [OVERRIDES...] [-m | --sweep NAME] [--out DIR] [--check-mounts | --no-check-mounts]

Prints each run directory's path, one per line. With -m or --sweep, cells the planner finds
infeasible (e.g. 70B SFT on 8 GPUs) are skipped with a one-line note on stderr; every other
problem stops the whole command before any run directory is written.
"""
from __future__ import annotations


from vdkit.cli import add_override_args


def register(sub) -> None:
    """Add the `render` verb."""
    p = sub.add_parser("render", help="write a run directory with launch.sbatch (+ NeMo config); print its path",
                       description="Compose and plan each recipe, then write a new run directory holding "
                                   "launch.sbatch, recipe.yaml, plan.json, overrides.txt and (engine=nemo) "
                                   "nemo.yaml. Earlier run directories are never overwritten. Prints the paths.")
    add_render_args(p)
    p.set_defaults(func=run)


def add_render_args(p) -> None:
    """The arguments of every verb that renders run directories (render, submit)."""
    add_override_args(p)
    p.add_argument("--out", metavar="DIR", help="parent directory of the run directories (default: run.out_dir)")
    mounts = p.add_mutually_exclusive_group()
    mounts.add_argument("--check-mounts", dest="check_mounts", action="store_true", default=None,
                        help="require the data dir, the base model and a squashfs image to exist here")
    mounts.add_argument("--no-check-mounts", dest="check_mounts", action="store_false",
                        help="do not check them (rendering away from the cluster's storage). Default: check "
                             "a path only when its top-level directory (e.g. /data) exists on this machine")


def run(args) -> int:
    from vdkit.cli import feasible_plans
    from vdkit.slurm.render import preflight, render_run

    plans = feasible_plans(args, "render")
    # Check every cell before writing anything, so a bad override leaves no run directory behind.
    for plan in plans:
        preflight(plan, args.out, args.check_mounts)
    for plan in plans:
        path = render_run(plan, args.out, check_mounts=args.check_mounts)
        print(path, flush=True)
    return 0
