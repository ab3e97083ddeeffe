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

(Their defaults and where they come from: the comments in :class:`vdkit.schema.ClusterCfg`.)

The arithmetic (every constant below says where it comes from):

- checkpoint write time C = checkpoint size / (bandwidth per node x nodes);
- start-up of each allocation = ``cluster.startup_s`` + reading the model's bf16 weights (and, on
  a resumed allocation, the checkpoint) at the same bandwidth;
- checkpoint interval: Young's approximation sqrt(2 C M) with M = ``cluster.mtbf_h`` (interruptions
  other than the time limit: a node or fabric failure), at most ``cluster.max_lost_work_min`` of work
  (what a crash may lose), at least one step;
- the stop before the limit needs a lead = one step + one checkpoint + :data:`EXIT_S` (exit,
  container teardown, submitting the successor) + :data:`SIGNAL_SLACK_S` (Slurm checks limits
  about every 30 s);
- an allocation trains for ``limit - start-up - lead``; the run needs as many allocations as that
  takes; ``--time`` is the predicted wall time plus :data:`MARGIN` and the lead when one
  allocation suffices, else the partition maximum.

Pure functions of the plan (no I/O). :func:`resolve` writes the derived ``--time`` and checkpoint
interval into the recipe (``cluster.time_limit_min``, ``engine.checkpoint_every_n_steps``) unless
the user pinned them, so that every engine and launcher reads one value.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

EXIT_S = 60.0  # after the stop's checkpoint: process exit, container teardown, sbatch of the successor
SIGNAL_SLACK_S = 30.0  # Slurm sends the --signal up to its ~30 s time-limit check late (man sbatch)
MARGIN = 0.25  # on the predicted wall time of a one-allocation run (prediction error, queue noise)
MIN_TIME_LIMIT_MIN = 10  # a predicted-short run still gets ten minutes
FALLBACK_EVERY_N_STEPS = 10  # cadence when there is no step-time prediction (CPU runs, other GPUs, ...)
WEIGHT_BYTES = 2  # bf16 weights read at start-up
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
    every_n_steps: int  # checkpoint interval in steps (0: only at the end)
    every_source: str  # "plan", "pinned" or "fallback"
    checkpoints: int  # periodic + the stops' own + the last
    checkpoint_cost_s: float
    allocations: int
    wall_s: Optional[float]
    time_limit_min: int
    time_source: str  # "plan", "pinned" or "partition maximum"
    max_time_min: int
    max_lost_work_s: Optional[float]
    note: Optional[str] = None
    site: dict = field(default_factory=dict)  # the cluster's facts the plan used (SITE_FIELDS -> value)

    @property
    def stop_after_s(self) -> int:
        """Seconds after the allocation starts at which a rank stops by its own clock (the budget)."""
        return max(1, self.time_limit_min * 60 - self.lead_s)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 2)
        d["stop_after_s"] = self.stop_after_s
        return d


def checkpoint_write_s(checkpoint_gb: float, cluster) -> float:
    """Seconds to write one checkpoint: its size over the nodes' combined write bandwidth."""
    return checkpoint_gb / (cluster.storage_write_gbps_per_node * cluster.nodes)


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's approximation of the optimal checkpoint interval: sqrt(2 C M), M the mean time between failures."""
    return math.sqrt(2.0 * write_s * mtbf_s)


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
    r = plan.recipe
    c, e, t = r.cluster, r.engine, r.train
    if step_s is None and plan.prediction is not None:
        step_s = plan.prediction.step_seconds
    write_s = checkpoint_write_s(plan.checkpoint_gb, c)
    bandwidth = c.storage_write_gbps_per_node * c.nodes
    startup_s = c.startup_s + (_weights_gb(r) + plan.checkpoint_gb) / bandwidth
    pinned_limit = c.time_limit_min
    max_min = c.max_time_min
    steps = t.max_steps
    site = {k: getattr(c, k) for k in SITE_FIELDS}
    if step_s is None or step_s <= 0:
        every = e.checkpoint_every_n_steps
        limit = pinned_limit or max_min
        return TimePlan(False, steps, None, plan.checkpoint_gb, write_s, startup_s, lead_s(0.0, write_s, limit),
                        FALLBACK_EVERY_N_STEPS if every is None else every,
                        "fallback" if every is None else "pinned", 0, 0.0, 0, None, limit,
                        "pinned" if pinned_limit else "partition maximum", max_min, None,
                        note=_no_prediction_note(plan, pinned_limit), site=site)
    # Cadence: Young's interval, bounded by the work a crash may lose, at least one step.
    if e.checkpoint_every_n_steps is not None:
        every, every_source = e.checkpoint_every_n_steps, "pinned"
    else:
        interval = min(young_interval_s(write_s, c.mtbf_h * 3600), c.max_lost_work_min * 60)
        every, every_source = max(1, int(interval // step_s)), "plan"
        if every >= steps:
            every = 0  # the run is shorter than the interval: the checkpoint at the end (and at stops)
    per_step = step_s + (write_s / every if every else 0.0)
    limit = pinned_limit or max_min
    lead = lead_s(step_s, write_s, limit)
    usable = limit * 60 - startup_s - lead
    per_alloc = int(usable // per_step) if usable > 0 else 0
    note = None
    if per_alloc < 1:
        allocations, wall = 0, None
        note = (f"one step ({step_s:.3g} s) with start-up ({startup_s:.0f} s) and the stop's lead ({lead} s) does "
                f"not fit in {limit} min: raise cluster.max_time_min (the partition's limit) or use more nodes")
    else:
        allocations = math.ceil(steps / per_alloc)
    periodic = steps // every if every else 0
    checkpoints = periodic + max(allocations - 1, 0) + (0 if every and steps % every == 0 else 1)
    cost = checkpoints * write_s
    if allocations:
        wall = allocations * startup_s + steps * step_s + cost
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
    return TimePlan(True, steps, step_s, plan.checkpoint_gb, write_s, startup_s, lead, every, every_source,
                    checkpoints, cost, allocations, wall, limit, time_source, max_min, lost, note, site)


def resolve(plan):
    """``plan`` with its recipe's ``cluster.time_limit_min`` and ``engine.checkpoint_every_n_steps`` set
    from :func:`time_plan` (pinned values are kept): what render, submit and run write and read."""
    tp = time_plan(plan)
    r = plan.recipe
    recipe = dataclasses.replace(
        r, cluster=dataclasses.replace(r.cluster, time_limit_min=tp.time_limit_min),
        engine=dataclasses.replace(r.engine, checkpoint_every_n_steps=tp.every_n_steps))
    return dataclasses.replace(plan, recipe=recipe)


def hms(seconds: float) -> str:
    """``DD:HH:MM:SS`` (Lightning's and NeMo's ``max_time`` format)."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d:02d}:{h:02d}:{m:02d}:{s:02d}"


def describe(tp: TimePlan) -> list:
    """Lines for `vdkit plan` (each starts with its label)."""
    every = (f"every {tp.every_n_steps} steps" if tp.every_n_steps else "at the end only") + f" ({tp.every_source})"
    lines = []
    if tp.predicted:
        lines.append(f"  time        {tp.wall_s / 60:,.1f} min for {tp.steps} steps: start-up {tp.startup_s:.0f} s x "
                     f"{tp.allocations} allocation(s) + steps {tp.steps * tp.step_s / 60:,.1f} min + "
                     f"{tp.checkpoints} checkpoint(s) {tp.checkpoint_cost_s / 60:,.1f} min" if tp.wall_s else
                     "  time        does not fit one allocation")
    source = {"plan": f"predicted + {MARGIN:.0%} + the stop's lead", "pinned": "cluster.time_limit_min",
              "partition maximum": "the partition maximum"}[tp.time_source]
    lines.append(f"  allocation  --time={tp.time_limit_min} min ({source}; cluster.max_time_min={tp.max_time_min}), "
                 f"{tp.allocations or '?'} allocation(s); each stops {tp.lead_s} s before its limit")
    cost = f", {tp.checkpoint_write_s:,.0f} s each" if tp.checkpoint_gb else ""
    lost = f", a crash loses at most {tp.max_lost_work_s / 60:,.1f} min" if tp.max_lost_work_s is not None else ""
    lines.append(f"  cadence     checkpoint {every}{cost}{lost}")
    if tp.site:
        lines.append("  site        " + ", ".join(f"cluster.{k}={v:g}" for k, v in tp.site.items())
                     + " (the site's facts: docs/cluster-guide.md)")
    if tp.note:
        lines.append(f"  note        {tp.note}")
    return lines


def every_n_steps(recipe) -> int:
    """How often a run checkpoints: ``engine.checkpoint_every_n_steps`` as :func:`resolve` set it when
    the run was planned, else (a run directory written without the plan's cadence) the fallback."""
    every = recipe.engine.checkpoint_every_n_steps
    return FALLBACK_EVERY_N_STEPS if every is None else every
