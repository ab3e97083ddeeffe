"""`vdkit run`: compose, plan, write a run directory and train it here with the reference engine.

Local processes stand in for the ranks (cluster=local: cluster.nodes x cluster.gpus_per_node
processes); the logs land in the run directory exactly as a Slurm job's would. Groups the user
does not name default to the embedded CPU setup: engine=reference cluster=local model=tiny_llama
data=synthetic.
"""
from __future__ import annotations

import sys

from vdkit.cli import add_override_args

# The embedded default: what `vdkit run` trains when the command line names no such group.
LOCAL_DEFAULTS = ("engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic")
LOCAL_ENGINES = ("reference", "megatron")  # the engines that run outside a container


def local_command(engine: str, run_dir) -> list:
    """The command each local rank runs for ``engine``."""
    if engine == "megatron":
        from vdkit.recipes.megatron import megatron_command

        return megatron_command(run_dir)
    from vdkit.recipes.reference import reference_command

    return reference_command(run_dir)


def register(sub) -> None:
    p = sub.add_parser("run", help="train a recipe here with the reference or megatron engine (local processes as ranks)",
                       description="Compose the recipe, plan it, write a run directory and train it on this "
                                   "machine with the reference or megatron engine: cluster.nodes x cluster.gpus_per_node "
                                   "local processes (gloo on CPU, NCCL on GPU). Unnamed groups default to "
                                   + " ".join(LOCAL_DEFAULTS) + ". Prints the run directory.")
    add_override_args(p, sweeps=False)
    p.add_argument("--out", metavar="DIR", help="parent directory of the run directory (default: run.out_dir)")
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
    from vdkit.plan import make_plan, require_feasible
    from vdkit.recipes.reference.data import check_inputs
    from vdkit.rundir import create_run_dir

    recipe = compose(with_local_defaults(args.overrides))
    if recipe.engine.name not in LOCAL_ENGINES:
        raise UserError(f"`vdkit run` cannot run engine={recipe.engine.name}: NeMo runs only in its container "
                        "on the cluster", "use engine=reference or engine=megatron here, or `vdkit render` / "
                        "`vdkit submit` for NeMo")
    if recipe.cluster.launcher != "local":
        raise UserError(f"`vdkit run` starts local processes; cluster={recipe.cluster.name} is a "
                        f"{recipe.cluster.launcher} cluster", "use cluster=local here, or `vdkit submit` for Slurm")
    plan = require_feasible(make_plan(recipe))
    if recipe.engine.name == "reference" and plan.tp * plan.pp != 1:
        raise UserError(f"the reference engine runs data parallel only; the plan uses tp={plan.tp} pp={plan.pp}",
                        "pin parallelism.tp=1 parallelism.pp=1")
    check_inputs(plan.recipe)  # missing data / tokenizer: fail before anything is written
    run_dir = create_run_dir(plan, files={}, out_dir=args.out)
    print(f"vdkit run: {run_dir}", file=sys.stderr, flush=True)

    from vdkit.recipes.reference.launch import launch_local

    rc = launch_local(run_dir, plan.recipe.world_size, plan.recipe.cluster.gpus_per_node,
                      command=local_command(plan.recipe.engine.name, run_dir))
    print(run_dir, flush=True)
    return 0 if rc == 0 else 1
