"""`vdkit run`: compose, plan, write a run directory and train it here (engines with RUNS_LOCALLY).

Local processes stand in for the ranks (cluster=local: cluster.nodes x cluster.gpus_per_node
processes); the logs land in the run directory exactly as a Slurm job's would. Groups the user
does not name default to the embedded CPU setup: engine=reference cluster=local model=tiny_llama
data=synthetic.
"""
from __future__ import annotations

import sys

from vdkit.args import add_override_args

# The embedded default: what `vdkit run` trains when the command line names no such group.
LOCAL_DEFAULTS = ("engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic")


def register(sub) -> None:
    p = sub.add_parser("run", help="train a recipe here (reference or megatron engine; local processes as ranks)",
                       description="Compose the recipe, plan it, write a run directory and train it on this "
                                   "machine with an engine that runs locally (reference, megatron): "
                                   "cluster.nodes x cluster.gpus_per_node local processes (gloo on CPU, NCCL on GPU). Unnamed groups default to "
                                   + " ".join(LOCAL_DEFAULTS) + ". Prints the run directory.")
    add_override_args(p, sweeps=False)
    from vdkit.args import out_path

    p.add_argument("--out", metavar="DIR", type=out_path, help="parent directory of the run directory (default: run.out_dir)")
    p.set_defaults(func=run)


def with_local_defaults(overrides) -> list:
    """``overrides`` preceded by the LOCAL_DEFAULTS whose group the user did not set."""
    # A group counts as given only when the group itself is chosen (model=...), not a key (model.x=...).
    chosen = {o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o}
    extra = [d for d in LOCAL_DEFAULTS if d.split("=", 1)[0] not in chosen]
    return extra + list(overrides)


def run(args) -> int:
    from vdkit.config import compose
    from vdkit.errors import UserError
    from vdkit.plan import make_plan
    from vdkit.prepare import engine_of, launcher_of, prepare

    from vdkit.rules import check_overrides

    check_overrides(args.overrides)  # the command line's own: a key twice, sweep syntax (run has no -m)
    recipe = compose(with_local_defaults(args.overrides))
    plan = make_plan(recipe)
    launcher = launcher_of(plan)
    if not launcher.executes_here:
        raise UserError(f"`vdkit run` starts the ranks on this machine; cluster={recipe.cluster.name} is a "
                        f"{recipe.cluster.launcher} cluster (its launcher hands runs to a scheduler)",
                        "use cluster=local here, or `vdkit submit` for that cluster")
    # The engine checks the plan and its local inputs (data, tokenizer) before anything is written.
    cell = prepare(plan, args.out)
    run_dir = cell.write()
    print(f"vdkit run: {run_dir}", file=sys.stderr, flush=True)
    rc = launcher.run(run_dir, plan, engine_of(plan).command(plan, run_dir))
    print(run_dir, flush=True)
    return 0 if rc == 0 else 1
