"""A hand edit of a rendered run's step count against its time plan: one rule for every engine's `vdkit check`.

The rule for hand edits of a run dir (docs/checking-jobs.md "Hand edits and the plan"):

- an edit that changes what one step is (sequence length, layout, batch, model) is refused: the plan's memory
  and step time are for the rendered step (:func:`vdkit.recipes.common.edits.other_seq_length`, the stacks' own
  checks);
- an edit of how many steps run (NeMo's ``trainer.max_steps``, Bridge's ``train.train_iters``, recipe.yaml's
  ``train.max_steps`` for the megatron and reference engines) leaves every per-step figure true, so the check
  re-runs the planner's own time plan (:func:`vdkit.planner.timeplan.time_plan`) at the edited count with the
  plan's step seconds and prints its wall time and GPU-hours (plan.json's figures are the rendered count's);
- refused only where that time plan needs more than launch.sbatch asks (a longer ``--time`` or more
  allocations than rendered): the job would be cut at its limit off the plan, so the line gives the re-plan
  command (``vdkit render`` with the run's overrides and the edited count).

Pure arithmetic on the plan (no engine import): each engine's check calls :func:`check` with its key and value.
"""
from __future__ import annotations

import dataclasses
import shlex


def replan_command(run_dir, steps: int) -> str:
    """``vdkit render`` with the run's own overrides (its overrides.txt) and ``train.max_steps=steps``: the re-plan
    of an edited count."""
    from pathlib import Path

    from vdkit.run.rundir import OVERRIDES_FILE

    try:
        given = Path(run_dir, OVERRIDES_FILE).read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError:
        given = []  # no overrides.txt: the command with the count alone (the user adds the rest)
    kept = [o for o in given if o.strip() and not o.lstrip("+~").startswith("train.max_steps=")]
    return "vdkit render " + shlex.join([*kept, f"train.max_steps={steps}"])


def check(plan, run_dir, key: str, steps, rep) -> bool:
    """``steps``, the count the job's config at ``key`` runs, against ``plan``'s time plan (``plan.time``, read back
    from plan.json); its line into ``rep`` (:class:`vdkit.run.jobcheck.Report`). False (a defect) when the edited
    count needs a longer ``--time`` or more allocations than rendered; nothing said when it is the plan's."""
    from vdkit.planner.timeplan import time_plan

    was = plan.time
    if was is None or not isinstance(steps, int) or isinstance(steps, bool) or steps == was.steps:
        return True  # no time plan (a run dir from before it), a value the type checks refuse, or no edit
    if not was.predicted or not was.step_s:
        rep.checked(f"{key}={steps} (the plan's {was.steps}): no step-time prediction, so no time for it either; "
                    f"--time stays {was.time_limit_min} min ({was.time_source})")
        return True
    r = plan.recipe
    edited = dataclasses.replace(plan, recipe=dataclasses.replace(r, train=dataclasses.replace(r.train, max_steps=steps)))
    now = time_plan(edited, step_s=was.step_s)
    gpus = r.cluster.nodes * r.cluster.gpus_per_node
    if now.allocations and now.allocations <= was.allocations and now.time_limit_min <= was.time_limit_min:
        rep.checked(f"{key}={steps} (the plan's {was.steps}): the plan's time plan at {steps} steps of "
                    f"{was.step_s:.3g} s: {now.wall_s / 60:,.1f} min, {now.wall_s / 3600 * gpus:,.1f} GPU-hours in "
                    f"{now.allocations} allocation(s), within the rendered --time {was.time_limit_min} min x "
                    f"{was.allocations} (plan.json's figures are for {was.steps} steps)")
        return True
    need = (f"{now.wall_s / 60:,.1f} min in {now.allocations} allocation(s) of --time {now.time_limit_min} min"
            if now.allocations else f"more than one allocation of {now.time_limit_min} min allows ({now.note})")
    rep.defect(f"{key}={steps} is not the plan's {was.steps} steps: at the plan's {was.step_s:.3g} s per step the run "
               f"needs {need}, the rendered launch asks --time {was.time_limit_min} min x {was.allocations} "
               "allocation(s): the plan's time and cost no longer describe the job", key,
               f"re-plan it: `{replan_command(run_dir, steps)}` (or edit it back to {was.steps})")
    return False
