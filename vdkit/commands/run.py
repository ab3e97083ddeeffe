"""`vdkit run`: compose, plan, write a run directory and train it here (engines whose spec says runs_locally).

Local processes stand in for the ranks (cluster=local: cluster.nodes x cluster.gpus_per_node
processes); the logs land in the run directory exactly as a Slurm job's would. Groups the user
does not name default to the embedded CPU setup: engine=reference cluster=local model=tiny_llama
data=synthetic.
"""
from __future__ import annotations

import sys

from vdkit.commands.args import add_override_args

# The embedded default: what `vdkit run` trains when the command line names no such group.
LOCAL_DEFAULTS = ("engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic")


def register(sub) -> None:
    """Add the `vdkit run` verb to ``sub``."""
    from vdkit.commands.args import run_dir_files_help

    p = sub.add_parser("run", help="train a recipe here (reference, megatron or bridge engine; local processes as ranks)",
                       description="Compose the recipe, plan it, write a run directory and train it on this "
                                   "machine with an engine that runs locally (reference, megatron, bridge; "
                                   "engine=nemo runs only in its container on a cluster): " + run_dir_files_help() +
                                   " The ranks add logs/, checkpoints/, local-1.out (and engine=megatron / bridge "
                                   "memory.json). Ranks: "
                                   "cluster.nodes x cluster.gpus_per_node local processes (gloo on CPU, NCCL on GPU). Unnamed groups default to "
                                   + " ".join(LOCAL_DEFAULTS) + ". Prints the run directory.")
    add_override_args(p, sweeps=False)
    from vdkit.commands.args import out_path

    p.add_argument("--out", metavar="DIR", type=out_path, help="parent directory of the run directory (default: run.out_dir)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped run in its own run directory (from its latest checkpoint; logs "
                        "append); a finished run is left alone. Takes no overrides.")
    p.set_defaults(func=run)


def with_local_defaults(overrides) -> list:
    """``overrides`` preceded by the LOCAL_DEFAULTS whose group the user did not set."""
    # A group counts as given only when the group itself is chosen (model=...), not a key (model.x=...).
    chosen = {o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o}
    extra = [d for d in LOCAL_DEFAULTS if d.split("=", 1)[0] not in chosen]
    return extra + list(overrides)


def _finish(run_dir, rc: int) -> int:
    """Print the run dir (stdout) and, for a clean stop, how to continue; the verb's exit code."""
    from vdkit.run.jobspec import EXIT_REFUSED, EXIT_STOPPED

    if rc == EXIT_REFUSED:  # the pre-flight or a rank refused the recipe (one line said why): the recipe's fault
        print(run_dir, flush=True)
        return EXIT_REFUSED
    if rc == EXIT_STOPPED:
        print(f"vdkit run: stopped cleanly after a checkpoint; continue with: vdkit run --resume {run_dir}",
              file=sys.stderr, flush=True)
    print(run_dir, flush=True)
    return 0 if rc == 0 else (EXIT_STOPPED if rc == EXIT_STOPPED else 1)


def _finished_but_lengthened(run_dir) -> None:
    """A finished run whose recipe.yaml was edited to more steps than it trained (the megatron / reference engines'
    count, docs/checking-jobs.md "Hand edits and the plan"): a finished run never starts again, so saying "nothing
    to do" would drop the edit in silence; UserError with the way on (the marker removed, the last checkpoint)."""
    from vdkit.run.rundir import FINISHED_FILE, load_recipe
    from vdkit.run.runs import progress

    from vdkit.errors import UserError

    try:
        asked = load_recipe(run_dir).train.max_steps
    except UserError:
        return  # an unreadable recipe: the finished run is left as it is, as before
    done = progress(run_dir, asked).done
    if done is not None and asked > done:
        raise UserError(f"{run_dir} has finished at step {done} (its file {FINISHED_FILE} says so), but its recipe.yaml "
                        f"now asks train.max_steps={asked}: a finished run never starts again, so the edit would not "
                        "train", f"to train steps {done + 1}..{asked} from its last checkpoint, delete "
                        f"{run_dir / FINISHED_FILE} and run `vdkit run --resume {run_dir}` again; or put "
                        f"train.max_steps back to {done}")


def resume(args) -> int:
    """`vdkit run --resume RUN_DIR`: the same ranks again in the same run dir, from its latest checkpoint."""
    from pathlib import Path

    from vdkit.errors import UserError
    from vdkit.render.prepare import engine_of, launcher_of
    from vdkit.run.rundir import FINISHED_FILE, RECIPE_FILE, load_plan

    if not str(args.resume).strip():
        raise UserError("--resume was given an empty path", "pass the run directory to continue: vdkit run --resume RUN_DIR")
    run_dir = Path(args.resume).absolute()
    if args.overrides or args.out:
        raise UserError("--resume continues a run with the recipe in its run directory; it takes no overrides "
                        "or --out", f"drop {' '.join(args.overrides) or '--out'}, or start a new run without --resume")
    if not (run_dir / RECIPE_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {RECIPE_FILE})",
                        "pass a run directory written by `vdkit run`")
    from vdkit.run.runlock import check_state_files

    check_state_files(run_dir)  # a FIFO or directory among them: one line now, not a hang or a run that "finished"
    if (run_dir / FINISHED_FILE).exists():
        _finished_but_lengthened(run_dir)
        print(f"vdkit run: {run_dir} has finished already (its file {FINISHED_FILE} says so); nothing to do",
              file=sys.stderr)
        print(run_dir, flush=True)
        return 0
    plan = load_plan(run_dir)
    r = plan.recipe
    launcher = launcher_of(plan)
    if not launcher.executes_here:
        raise UserError(f"{run_dir} was rendered for cluster={r.cluster.name} ({r.cluster.launcher}); `vdkit run` "
                        "resumes runs on this machine", f"submit it again (`vdkit status {run_dir}` shows its jobs): "
                        f"sbatch {run_dir}/launch.sbatch")
    engine = engine_of(plan)
    engine.local_check(plan)
    engine.resume_check(plan, run_dir)  # the engine's files as the stack takes them: an edit refused here, not per rank
    print(f"vdkit run: resuming {run_dir}", file=sys.stderr, flush=True)
    rc = launcher.run(run_dir, plan, engine.command(plan, run_dir))
    return _finish(run_dir, rc)


def run(args) -> int:
    """`vdkit run`: the recipe rendered and trained here, its ranks local processes; the exit code."""
    from vdkit.composition.config import compose
    from vdkit.errors import UserError
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import engine_of, launcher_of, prepare

    if args.resume is not None:
        return resume(args)

    from vdkit.rules.overrides import check_overrides

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
    plan = cell.plan  # with the plan's time and cadence (vdkit.planner.timeplan)
    rc = launcher.run(run_dir, plan, engine_of(plan).command(plan, run_dir))
    return _finish(run_dir, rc)
