"""Settings that contradict each other, refused at the door in one line naming both keys (issue 36).

A rule here needs two fields that are each fine alone; one field's range is :mod:`.numbers`' table.
What needs the plan (a validation that overruns an allocation) is the time plan's
(:mod:`vdkit.planner.timeplan`), and what only a run mode's wording can settle (a timing run with a
pinned checkpoint cadence: said in the plan's mode line) is not refused.
"""
from __future__ import annotations

from vdkit.errors import UserError


def check_contradictions(recipe) -> None:
    """Refuse run.mode=train whose train.val_every_n_steps exceeds train.max_steps (no periodic validation runs:
    the loss curve the mode promises has one point at most)."""
    t = recipe.train
    if recipe.run.mode == "train" and t.val_every_n_steps and t.val_every_n_steps > t.max_steps:
        raise UserError(f"train.val_every_n_steps={t.val_every_n_steps} is above train.max_steps={t.max_steps}: "
                        "run.mode=train would never validate along the way",
                        f"use train.val_every_n_steps <= {t.max_steps}, or leave it unset (a few validations per run)")
