"""One checkpoint policy for every engine, decided by the plan: when to save, what to keep, how to write.

The time plan (:func:`vdkit.planner.timeplan.time_plan`) decides it once from the failure model and the site's
storage; each engine renders it in its own words (Bridge: ``save_interval``, ``most_recent_k``,
``async_save``, ``save_optim``; NeMo 1.23: ``every_n_train_steps``, ``save_top_k``, ``save_last``,
``save_nemo_on_train_end``; the kit's own engines: the cadence).

- ``run.mode``: a **timing** run (the guides' 50 measured steps) saves only when it is
  stopped before its end (the continuation's checkpoint): no periodic save, none at the end. A **train**
  run saves periodically and at the end.
- Cadence (train): Young's interval sqrt(2 C M) (C the write time of one checkpoint at the site's
  bandwidth, M ``cluster.mtbf_h``: Young 1974; Daly 2006 shows it is the first-order optimum), at most
  ``cluster.max_lost_work_min`` of work, at least one step; no periodic save when the run is shorter.
- Retention: :data:`KEEP` checkpoints at most (the newest may still be in flight or damaged; the one
  before is the fallback that recovery sets aside to), the end's included.
- The end's checkpoint holds the weights only when nothing will resume from it within the run (no
  periodic save, one allocation): the optimizer states are what a resume needs, not what a fine-tune
  produces (7B SFT: 13.5 of 94 GB).
- Asynchronous writes where the stack has them (Bridge's torch_dist ``async_save``), for the periodic
  saves; the plan still counts every write in full (an upper bound: the ranks block only for the copy
  to host memory).

Where an engine cannot follow it, the plan's count is a lower bound, said here: the kit's own engines
(megatron, reference) also save at the end of a timing run (cheap on CPU; their resume tests use it);
NeMo 1.23 (Lightning 2.0.7) writes its ``-last`` checkpoint after every validation of a train run.

Pure functions (no I/O); imports nothing from the kit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KEEP = 2  # checkpoints a run holds at most: the newest and the fallback before it
FALLBACK_EVERY_N_STEPS = 10  # a train run's cadence when there is no step-time prediction (CPU runs, other GPUs, ...)
WEIGHT_BYTES = 2  # bf16 weights: what the end's weights-only checkpoint and a start-up read hold per parameter


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's approximation of the optimal checkpoint interval: sqrt(2 C M), M the mean time between failures."""
    return math.sqrt(2.0 * write_s * mtbf_s)


@dataclass(frozen=True)
class CheckpointPolicy:
    """What every engine renders for a run's checkpoints (see the module docstring)."""

    mode: str  # timing | train
    every_n_steps: int  # periodic saves every N steps (0: none)
    every_source: str  # plan | pinned | fallback | timing
    keep: int  # checkpoints kept at most (Bridge most_recent_k; NeMo save_top_k + the last)
    async_save: bool  # periodic saves written in the background where the stack can
    final: str  # none (timing: only a stop saves) | full | weights (the end's holds the weights only)

    @property
    def saves_optimizer(self) -> bool:
        """Whether the run's checkpoints carry the optimizer states (False: the end's weights-only save)."""
        return self.final != "weights"


def decide(recipe, step_s, write_s: float, allocations: int) -> CheckpointPolicy:
    """The policy for ``recipe`` with ``step_s`` seconds per step (None: unknown), ``write_s`` per
    checkpoint and the run's ``allocations`` (0: unknown). A pinned ``engine.checkpoint_every_n_steps``
    wins over the cadence (0: no periodic save); what the end saves is the mode's either way."""
    c, e, steps = recipe.cluster, recipe.engine, recipe.train.max_steps
    mode = recipe.run.mode  # timing | train (vdkit.composition.schema.RUN_MODES)
    if e.checkpoint_every_n_steps is not None:
        every, source = e.checkpoint_every_n_steps, "pinned"
    elif mode == "timing":
        every, source = 0, "timing"
    elif not step_s:
        every, source = FALLBACK_EVERY_N_STEPS, "fallback"
    else:
        interval = min(young_interval_s(write_s, c.mtbf_h * 3600), c.max_lost_work_min * 60)
        every, source = max(1, int(interval // step_s)), "plan"
    if every >= steps:
        every = 0  # the run is shorter than the interval: the end's checkpoint (and a stop's) only
    if mode == "timing":
        final = "none"
    elif every == 0 and allocations == 1:
        final = "weights"
    else:
        final = "full"
    return CheckpointPolicy(mode, every, source, KEEP, async_save=every > 0, final=final)


@dataclass(frozen=True)
class CheckpointCost:
    """What the policy costs a run: saves, seconds of wall time, storage held at the end."""

    saves: int  # periodic + stops + the end's
    cost_s: float
    held_gb: float
    room_gb: float = 0.0  # the most the checkpoint directory holds at once (:func:`room_gb`)


def room_gb(policy: CheckpointPolicy, saves, checkpoint_gb: float) -> float:
    """The room a run's checkpoint file system needs: the checkpoints it holds plus the one being written.

    ``saves``: the run's saves (None: unknown, as many as retention allows). A stop's save can come to any
    run (the time limit, a preemption), so even a timing run that plans none needs room for that one; a
    train run holding :data:`KEEP` needs ``KEEP + 1`` while the next is written (retention removes the
    oldest only after it). Counted at the full checkpoint's size (a stop's save carries the optimizer):
    an upper bound. The one home of the figure: ``vdkit plan`` prints it, ``vdkit render`` checks it
    (:func:`vdkit.run.rundir.check_results_room`) and every job's pre-flight checks it again (:mod:`vdkit.preflight`)."""
    writes = policy.keep + 1 if saves is None else max(int(saves), 1)
    return min(writes, policy.keep + 1) * checkpoint_gb


def cost(policy: CheckpointPolicy, steps: int, allocations: int, checkpoint_gb: float, weights_gb: float,
         write_s_per_gb: float) -> CheckpointCost:
    """The saves ``policy`` makes over ``steps`` in ``allocations`` (each allocation but the last ends with
    a stop's save), their write time and the storage the run holds at its end (an upper bound: the end's
    save is counted even where it falls on a periodic step)."""
    periodic = steps // policy.every_n_steps if policy.every_n_steps else 0
    stops = max(allocations - 1, 0)
    size = checkpoint_gb if policy.saves_optimizer else weights_gb
    end = 0 if policy.final == "none" else 1
    saves = periodic + stops + end
    held = min(saves, policy.keep) * size
    return CheckpointCost(saves, saves * size * write_s_per_gb, held, room_gb(policy, saves, checkpoint_gb))
