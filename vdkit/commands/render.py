"""`vdkit render`: write one new run directory per recipe (launch.sbatch, recipe.yaml, nemo.yaml, ...).

  vdkit render [OVERRIDES...] [-m | --sweep NAME] [--out DIR] [--check-mounts | --no-check-mounts]

Prints each run directory's path, one per line. With -m or --sweep, cells the planner finds
infeasible (e.g. 70B SFT on 8 GPUs) are skipped with a one-line note on stderr; every other
problem stops the whole command before any run directory is written.
"""
from __future__ import annotations

from vdkit.args import add_render_args


def register(sub) -> None:
    """Add the `render` verb."""
    p = sub.add_parser("render", help="write a run directory with launch.sbatch (+ NeMo config); print its path",
                       description="Compose and plan each recipe, then write a new run directory holding "
                                   "launch.sbatch, recipe.yaml, plan.json, overrides.txt and (engine=nemo) "
                                   "nemo.yaml. Earlier run directories are never overwritten. Prints the paths.")
    add_render_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from vdkit.prepare import prepare_all
    from vdkit.sweep import feasible_plans

    plans = feasible_plans(args.overrides, args.multirun, args.sweep, "render")
    # Every cell is checked and rendered in memory before any run directory is written.
    for cell in prepare_all(plans, args.out, args.check_mounts):
        print(cell.write(), flush=True)
    return 0
