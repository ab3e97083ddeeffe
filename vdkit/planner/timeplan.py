"""Time as part of the plan: wall time of the whole run, allocations, ``--time``, checkpoint cadence.

Input: the predicted seconds per step (:mod:`vdkit.planner.predict`, or any figure), the checkpoint size
(:func:`vdkit.planner.plan.checkpoint_gb`) and the site's facts in the cluster config:

- ``cluster.max_time_min``: the partition's maximum time limit (``sinfo -o "%P %l"``);
- ``cluster.storage_write_gbps_per_node``: checkpoint write bandwidth per node writing (GB/s).
  Default 0.67: the PowerScale F710 figures of the training design guide (Table 4): Llama 2 7B on
  one node wrote 100 GB in 2:30 (0.67 GB/s), 70B on six nodes 1.1 TB in 3:28 (0.88 GB/s per node);
- ``cluster.startup_s``: an allocation's start before its first step, besides reading weights and
  checkpoint (container start, imports, NCCL set-up, model build);
- ``cluster.mtbf_h``: mean time between failures that end a job early (not the time limit);
- ``cluster.max_lost_work_min``: the most training a failure between checkpoints may lose.

(Their defaults and where they come from: the comments in :class:`vdkit.composition.schema.ClusterCfg`.)

The arithmetic (every constant below says where it comes from):

- checkpoint write time C = checkpoint size / (bandwidth per node x nodes);
- start-up of each allocation = ``cluster.startup_s`` + reading the model's bf16 weights (and, on
  a resumed allocation, the checkpoint) at the same bandwidth;
- checkpoints: :mod:`vdkit.planner.checkpoint_policy` (one policy for every engine): a timing run saves
  only when stopped; a train run every Young interval sqrt(2 C M) with M = ``cluster.mtbf_h``
  (interruptions other than the time limit: a node or fabric failure), at most
  ``cluster.max_lost_work_min`` of work (what a crash may lose), at least one step, and at its end;
  :data:`~vdkit.planner.checkpoint_policy.KEEP` kept;
- the stop before the limit needs a lead = one step + one checkpoint + :data:`EXIT_S` (exit,
  container teardown, submitting the successor) + :data:`SIGNAL_SLACK_S` (Slurm checks limits
  about every 30 s);
- an allocation trains for ``limit - start-up - lead``; the run needs as many allocations as that
  takes; ``--time`` is the predicted wall time plus :data:`MARGIN` and the lead when one
  allocation suffices, else the partition maximum.

Pure functions of the plan (no I/O). :func:`vdkit.planner.plan.make_plan` calls :func:`time_plan` once
and keeps the result as ``Plan.time``: launchers, engines, commands and ``plan.json`` (its ``schedule``
section, read back by :func:`vdkit.run.rundir.load_plan`) read that one value. Nothing derived is written
back into the recipe: ``recipe.yaml`` holds what the user set (``cluster.time_limit_min``,
``engine.checkpoint_every_n_steps`` when pinned) and the defaults.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from vdkit.planner import checkpoint_policy

EXIT_S = 60.0  # after the stop's checkpoint: process exit, container teardown, sbatch of the successor
SIGNAL_SLACK_S = 30.0  # Slurm sends the --signal up to its ~30 s time-limit check late (man sbatch)
MARGIN = 0.25  # on the predicted wall time of a one-allocation run (prediction error, queue noise)
MIN_TIME_LIMIT_MIN = 10  # a predicted-short run still gets ten minutes
FALLBACK_EVERY_N_STEPS = checkpoint_policy.FALLBACK_EVERY_N_STEPS  # (kept importable from here)
WEIGHT_BYTES = checkpoint_policy.WEIGHT_BYTES  # bf16 weights read at start-up
VALIDATION_NOTE = "one validation of"  # the start of the note when a validation, not a step, overruns an allocation
FORWARD_SHARE = 1 / 3  # a validation batch's share of a training step: forward only (backward ~ 2x forward)
# The cluster fields a site sets for the time plan (docs/cluster-guide.md "What a site must set").
SITE_FIELDS = ("max_time_min", "storage_write_gbps_per_node", "startup_s", "mtbf_h", "max_lost_work_min")


@dataclass(frozen=True)
class TimePlan:
    """The plan's time figures (seconds unless named otherwise); ``predicted`` False: none were predicted."""

    predicted: bool
    steps: int  # train.max_steps: what the job runs
    step_s: Optional[float]
    checkpoint_gb: float
    checkpoint_write_s: float
    startup_s: float
    lead_s: int  # the stop signal comes this long before the limit; the budget ends then
    every_n_steps: int  # checkpoint interval in steps (0: none periodic)
    every_source: str  # "plan", "pinned", "timing" (run.mode=timing: the stop's only) or "fallback"
    checkpoints: int  # periodic + the stops' own + the end's
    checkpoint_cost_s: float
    allocations: int
    wall_s: Optional[float]
    time_limit_min: int
    time_source: str  # "plan", "pinned" or "partition maximum"
    max_time_min: int
    max_lost_work_s: Optional[float]
    note: Optional[str] = None
    site: dict = field(default_factory=dict)  # the cluster's facts the plan used (SITE_FIELDS -> value)
    mode: str = "train"  # run.mode
    val_every: int = 0  # steps between validations (0: none, run.mode=timing)
    validation_s: float = 0.0  # the whole run's validation time (run.mode=train)
    keep: int = checkpoint_policy.KEEP  # checkpoints kept at most
    async_save: bool = False  # periodic saves written in the background where the engine can
    final: str = "full"  # the end's checkpoint: none | full | weights (vdkit.planner.checkpoint_policy)
    held_gb: float = 0.0  # checkpoint storage the run holds at its end
    room_gb: float = 0.0  # room its checkpoint file system needs: held + the one being written (checkpoint_policy.room_gb)

    @property
    def policy(self) -> checkpoint_policy.CheckpointPolicy:
        """The checkpoint policy every engine renders."""
        return checkpoint_policy.CheckpointPolicy(self.mode, self.every_n_steps, self.every_source, self.keep,
                                                  self.async_save, self.final)

    @property
    def checkpoint_share(self) -> Optional[float]:
        """The checkpoints' share of the run's wall time (None without a wall time)."""
        return self.checkpoint_cost_s / self.wall_s if self.wall_s else None

    @property
    def stop_after_s(self) -> int:
        """Seconds after the allocation starts at which a rank stops by its own clock (the budget)."""
        return max(1, self.time_limit_min * 60 - self.lead_s)

    def to_dict(self, rounded: bool = True) -> dict:
        """As plain data (``vdkit plan --json``: floats rounded; plan.json's ``schedule`` section unrounded,
        which :meth:`from_dict` reads back exactly)."""
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if rounded and isinstance(v, float):
                d[k] = round(v, 2)
        d["stop_after_s"] = self.stop_after_s
        share = self.checkpoint_share
        d["checkpoint_share"] = share if share is None or not rounded else round(share, 4)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "TimePlan":
        """The time plan :meth:`to_dict` wrote (derived keys such as ``stop_after_s`` are recomputed)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def checkpoint_write_s(checkpoint_gb: float, cluster) -> float:
    """Seconds to write one checkpoint: its size over the nodes' combined write bandwidth."""
    return checkpoint_gb / (cluster.storage_write_gbps_per_node * cluster.nodes)


young_interval_s = checkpoint_policy.young_interval_s  # (kept importable from here)


def lead_s(step_s: float, write_s: float, limit_min: int) -> int:
    """Seconds before the limit the stop must start: a step, a checkpoint, exit, Slurm's slack.

    At most a quarter of the allocation: Slurm may send the signal up to 60 s before the time asked
    (man sbatch), so in a short pinned limit a larger lead would stop the ranks before they train."""
    need = step_s + write_s + EXIT_S + SIGNAL_SLACK_S
    return int(max(1, min(math.ceil(need), limit_min * 60 // 4)))


def _weights_gb(recipe) -> float:
    from vdkit.planner.arch import param_counts

    return param_counts(recipe.model).total * WEIGHT_BYTES / 1e9


def _no_prediction_note(plan, pinned_limit) -> str:
    """The time plan without a step time: why there is none (the plan's own reason: the layout, the GPU
    or the fabric, vdkit.planner.predict.why_no_prediction) and what that leaves --time at."""
    from vdkit.planner.predict import why_no_prediction

    why = why_no_prediction(plan.recipe, plan.tp, plan.pp) if plan.prediction is None else None
    return (f"no step-time prediction{f': {why}' if why else ''}; --time is "
            + ("the pinned limit" if pinned_limit else "the partition maximum")
            + " and the allocations needed are unknown")


def time_plan(plan, step_s: Optional[float] = None) -> TimePlan:
    """The time plan of ``plan``: ``step_s`` (default: the plan's predicted step seconds)."""
    from vdkit.planner.arch import trainable_params

    r = plan.recipe
    c, t = r.cluster, r.train
    if step_s is None and plan.prediction is not None:
        step_s = plan.prediction.step_seconds
    write_s = checkpoint_write_s(plan.checkpoint_gb, c)
    bandwidth = c.storage_write_gbps_per_node * c.nodes
    startup_s = c.startup_s + (_weights_gb(r) + plan.checkpoint_gb) / bandwidth
    pinned_limit = c.time_limit_min
    max_min = c.max_time_min
    steps = t.max_steps
    site = {k: getattr(c, k) for k in SITE_FIELDS}
    final_gb = trainable_params(r) * WEIGHT_BYTES / 1e9  # the end's weights-only checkpoint
    if step_s is None or step_s <= 0:
        pol = checkpoint_policy.decide(r, None, write_s, 0)
        limit = pinned_limit or max_min
        return TimePlan(False, steps, None, plan.checkpoint_gb, write_s, startup_s, lead_s(0.0, write_s, limit),
                        pol.every_n_steps, pol.every_source, 0, 0.0, 0, None, limit,
                        "pinned" if pinned_limit else "partition maximum", max_min, None,
                        note=_no_prediction_note(plan, pinned_limit), site=site, mode=r.run.mode,
                        val_every=r.val_every, keep=pol.keep, async_save=pol.async_save, final=pol.final,
                        room_gb=checkpoint_policy.room_gb(pol, None, plan.checkpoint_gb))  # allocations unknown
    # Cadence first (vdkit.planner.checkpoint_policy; it does not depend on the allocations), then the
    # allocations, then what the end saves.
    every = checkpoint_policy.decide(r, step_s, write_s, 0).every_n_steps
    # run.mode=train validates every r.val_every steps: val_batches global batches, forward only
    # (about a third of a training step's forward + backward work).
    validation_s = (t.val_batches * step_s * FORWARD_SHARE / r.val_every) if r.val_every else 0.0
    per_step = step_s + validation_s + (write_s / every if every else 0.0)
    limit = pinned_limit or max_min
    lead = lead_s(step_s, write_s, limit)
    usable = limit * 60 - startup_s - lead
    per_alloc = int(usable // per_step) if usable > 0 else 0
    note = None
    one_validation_s = t.val_batches * step_s * FORWARD_SHARE if r.val_every else 0.0
    if per_alloc < 1 and one_validation_s > 0 and step_s + (write_s / every if every else 0.0) < usable:
        allocations, wall = 0, None  # the steps fit: the validation is what does not (not the partition's limit)
        note = (f"{VALIDATION_NOTE} train.val_batches={t.val_batches} global batches (~{one_validation_s:,.3g} s) "
                f"does not fit in {limit} min with the steps between: lower train.val_batches (the default is 4), or "
                "raise train.val_every_n_steps")
    elif per_alloc < 1:
        allocations, wall = 0, None
        note = (f"one step ({step_s:.3g} s) with start-up ({startup_s:.0f} s) and the stop's lead ({lead} s) does "
                f"not fit in {limit} min: raise cluster.max_time_min (the partition's limit) or use more nodes")
    else:
        allocations = math.ceil(steps / per_alloc)
    pol = checkpoint_policy.decide(r, step_s, write_s, allocations)
    spent = checkpoint_policy.cost(pol, steps, allocations, plan.checkpoint_gb, final_gb, 1.0 / bandwidth)
    checkpoints, cost = spent.saves, spent.cost_s
    if allocations:
        wall = allocations * startup_s + steps * (step_s + validation_s) + cost
    time_source = "pinned" if pinned_limit else "partition maximum"
    if not pinned_limit and allocations == 1:
        want = math.ceil((wall * (1 + MARGIN) + lead) / 60)
        limit = max(MIN_TIME_LIMIT_MIN, min(max_min, want))
        time_source = "plan" if want < max_min else "partition maximum"
        lead = lead_s(step_s, write_s, limit)
    if allocations > 1:
        note = (f"one allocation of {limit} min is not enough: {allocations} allocations; each stops "
                f"{lead} s before its limit, checkpoints and the next continues (docs/cluster-guide.md)")
    lost = (every * step_s) if every else steps * step_s
    return TimePlan(True, steps, step_s, plan.checkpoint_gb, write_s, startup_s, lead, every, pol.every_source,
                    checkpoints, cost, allocations, wall, limit, time_source, max_min, lost, note, site,
                    mode=r.run.mode, val_every=r.val_every, validation_s=steps * validation_s, keep=pol.keep,
                    async_save=pol.async_save, final=pol.final, held_gb=spent.held_gb,
                    room_gb=spent.room_gb)


def hms(seconds: float) -> str:
    """``DD:HH:MM:SS`` (Lightning's and NeMo's ``max_time`` format)."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d:02d}:{h:02d}:{m:02d}:{s:02d}"


def describe(tp: TimePlan) -> list:
    """Lines for `vdkit plan` (each starts with its label)."""
    if tp.every_n_steps:
        every = f"every {tp.every_n_steps} steps ({tp.every_source})" + (", written in the background" if tp.async_save
                                                                          else "")
    else:
        every = "only when stopped" if tp.final == "none" else "at the end only"
    end = {"none": "", "full": "; the end's holds weights and optimizer states",
           "weights": "; the end's holds the weights only (nothing resumes from it)"}[tp.final]
    lines = [f"  mode        run.mode={tp.mode}: " + (
        ("the guides' timing run - no validation; checkpoints every "
         f"{tp.every_n_steps} steps as engine.checkpoint_every_n_steps pins them (not the guides' method: "
         "their timing runs save only when stopped)" if tp.every_n_steps and tp.every_source == "pinned" else
         "the guides' timing run - no validation, no checkpoint but the stop one") if tp.mode == "timing" else
        f"a real fine-tune - validation every {tp.val_every} steps, {tp.keep} checkpoints kept, final weights")]
    if tp.predicted:
        val = f" + validation {tp.validation_s / 60:,.1f} min" if tp.val_every else ""
        share = (f" (checkpoints {tp.checkpoint_cost_s / tp.wall_s:.0%} of the time)" if tp.wall_s else "")
        lines.append(f"  time        {tp.wall_s / 60:,.1f} min for {tp.steps} steps: start-up {tp.startup_s:.0f} s x "
                     f"{tp.allocations} allocation(s) + steps {tp.steps * tp.step_s / 60:,.1f} min{val} + "
                     f"{tp.checkpoints} checkpoint(s) {tp.checkpoint_cost_s / 60:,.1f} min{share}" if tp.wall_s else
                     "  time        does not fit one allocation")
    source = {"plan": f"predicted + {MARGIN:.0%} + the stop's lead", "pinned": "cluster.time_limit_min",
              "partition maximum": "the partition maximum"}[tp.time_source]
    lines.append(f"  allocation  --time={tp.time_limit_min} min ({source}; cluster.max_time_min={tp.max_time_min}), "
                 f"{tp.allocations or '?'} allocation(s); each stops {tp.lead_s} s before its limit")
    each = tp.checkpoint_cost_s / tp.checkpoints if tp.final == "weights" and tp.checkpoints else tp.checkpoint_write_s
    cost = f", {each:,.0f} s each" if tp.checkpoint_gb else ""
    lost = f", a crash loses at most {tp.max_lost_work_s / 60:,.1f} min" if tp.max_lost_work_s is not None else ""
    lines.append(f"  cadence     checkpoint {every}{cost}{lost}{end}")
    if tp.predicted and tp.wall_s:
        lines.append(f"  storage     {tp.checkpoints} checkpoint(s) written, at most {tp.keep} kept: {tp.held_gb:,.1f} GB "
                     f"held at the end; room for {tp.room_gb:,.1f} GB (held + the one being written)")
    if tp.site:
        lines.append("  site        " + ", ".join(f"cluster.{k}={v:g}" for k, v in tp.site.items())
                     + " (the site's facts: docs/cluster-guide.md)")
    if tp.note:
        lines.append(f"  note        {tp.note}")
    return lines


def every_n_steps(plan) -> int:
    """How often a run checkpoints: the plan's time plan (``plan.time``, from plan.json's ``schedule``),
    else the recipe's pinned ``engine.checkpoint_every_n_steps`` (``plan`` may be a bare recipe: a run
    directory rendered before the time plan was part of the plan carries its cadence in recipe.yaml),
    else the fallback."""
    times = getattr(plan, "time", None)
    if times is not None:
        return times.every_n_steps
    every = getattr(plan, "recipe", plan).engine.checkpoint_every_n_steps
    return FALLBACK_EVERY_N_STEPS if every is None else every
