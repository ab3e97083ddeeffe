"""Settings that contradict each other, refused at the door in one line naming both keys (issue 36).

A rule here needs two fields that are each fine alone; one field's range is :mod:`.numbers`' table. A GPU's memory
follows ``cluster.gpu_type`` where the cluster file lets it (``${gpu_memory_gb:...}``, :mod:`vdkit.planner.calibration`);
a number written in a site's file is that site's GPU's, so a command line naming another GPU is refused.
What needs the plan (a validation that overruns an allocation) is the time plan's
(:mod:`vdkit.planner.timeplan`), and what only a run mode's wording can settle (a timing run with a
pinned checkpoint cadence: said in the plan's mode line) is not refused.
"""
from __future__ import annotations

from vdkit.errors import UserError


def check_contradictions(recipe) -> None:
    """Refuse run.mode=train whose train.val_every_n_steps exceeds train.max_steps (no periodic validation runs:
    the loss curve the mode promises has one point at most), sequence parallelism pinned on at TP 1, and a GPU named
    without its memory (:func:`check_gpu_memory`)."""
    check_gpu_memory(recipe)
    p = recipe.parallelism
    if p.sequence_parallel and p.tp == 1:  # (the planner turns an unpinned one off at TP 1: plan.effective_sp)
        raise UserError("parallelism.sequence_parallel=true with parallelism.tp=1: sequence parallelism splits the "
                        "activations over the tensor-parallel group, and TP 1 has none (NeMo silently turns it off, "
                        "megatron-core refuses it: Bridge's job would stop at start-up)",
                        "drop parallelism.sequence_parallel (on by itself when TP > 1), or use parallelism.tp=2 or more")
    t = recipe.train
    if recipe.run.mode == "train" and t.val_every_n_steps and t.val_every_n_steps > t.max_steps:
        raise UserError(f"train.val_every_n_steps={t.val_every_n_steps} is above train.max_steps={t.max_steps}: "
                        "run.mode=train would never validate along the way",
                        f"use train.val_every_n_steps <= {t.max_steps}, or leave it unset (a few validations per run)")


def check_gpu_memory(recipe) -> None:
    """Refuse a command-line cluster.gpu_type (without cluster.gpu_memory_gb) whose reported total the cluster's
    written cluster.gpu_memory_gb is not: a site file's figure is its own GPU's (what `vdkit site probe` measured),
    and the plan would fit the named GPU into another one's memory."""
    from vdkit.planner.calibration import capacity_gb

    given = {str(o).split("=", 1)[0].lstrip("+") for o in recipe.overrides}
    c = recipe.cluster
    if "cluster.gpu_type" not in given or "cluster.gpu_memory_gb" in given:
        return
    cap = capacity_gb(c.gpu_type)
    if cap is not None and cap != c.gpu_memory_gb:
        measured = " (measured on its node: cluster.probed)" if "gpu_memory_gb" in c.probed else ""
        raise UserError(f"cluster.gpu_type={c.gpu_type} reports {cap:g} GB, but cluster {c.name} states "
                        f"cluster.gpu_memory_gb={c.gpu_memory_gb:g}{measured}, another GPU's memory: the plan would "
                        "fit one GPU into the other's", f"add cluster.gpu_memory_gb={cap:g} for a {c.gpu_type}, or drop "
                        f"cluster.gpu_type to plan on cluster {c.name}'s own GPU")
