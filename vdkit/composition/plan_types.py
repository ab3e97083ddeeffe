"""What the planner returns: :class:`Memory`, :class:`StepTime`, :class:`Prediction`, :class:`Candidate` and
:class:`Plan`. Dataclasses only, beside the recipe schema (:mod:`vdkit.composition.schema`) they carry.

Filled in by the planner (:mod:`vdkit.planner.plan`, :mod:`vdkit.planner.sharded`, predictions by
:mod:`vdkit.planner.predict`, the time plan by :mod:`vdkit.planner.timeplan`) and read back from a run directory's
``plan.json`` by :mod:`vdkit.run.rundir` without the layout search.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from vdkit.composition.schema import Recipe


@dataclass(frozen=True)
class Memory:
    """Per-GPU memory of the worst pipeline stage, in GB (1e9 bytes)."""

    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    overhead_gb: float

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.gradients_gb + self.optimizer_gb + self.activations_gb + self.overhead_gb


@dataclass(frozen=True)
class StepTime:
    """A predicted training step, in seconds, by term (per GPU; all GPUs take the same time)."""

    compute_s: float  # ideal GEMM time of the step's micro batches
    overhead_s: float  # per-micro-batch overhead (small micro batches, unfused gradient accumulation)
    communication_s: float  # TP collectives + PP sends + DP all-reduce (not overlapped)
    bubble_s: float  # pipeline fill and drain
    optimizer_s: float
    tokens_per_step: float  # tokens the step trains on (all GPUs)
    samples_per_step: float  # training samples per step (packed: samples per sequence x GBS)
    parts: Dict[str, float] = field(default_factory=dict)  # finer communication split

    @property
    def total_s(self) -> float:
        return self.compute_s + self.overhead_s + self.communication_s + self.bubble_s + self.optimizer_s

    def terms(self) -> Dict[str, float]:
        return {"compute": self.compute_s, "per-micro-batch overhead": self.overhead_s,
                "communication": self.communication_s, "pipeline bubble": self.bubble_s,
                "optimizer": self.optimizer_s}

    def dominant(self, k: int = 2):
        """The k largest terms as (name, seconds), largest first."""
        return sorted(self.terms().items(), key=lambda kv: -kv[1])[:k]


@dataclass(frozen=True)
class Prediction:
    """What `vdkit plan` reports: the step and what it adds up to."""

    step: StepTime
    target_steps: int
    gpus: int
    interval_s: Optional[Tuple[float, float]] = None  # seconds per step, low .. high (vdkit.planner.interval)
    interval_source: str = ""  # the published figures the range comes from
    basis: Tuple[Tuple[str, str], ...] = ()  # (term, physics or the fitted constant it rests on)

    @property
    def step_seconds(self) -> float:
        return self.step.total_s

    @property
    def minutes(self) -> float:
        return self.step.total_s * self.target_steps / 60.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.step.tokens_per_step / self.step.total_s / self.gpus

    @property
    def gpu_hours(self) -> float:
        return self.minutes / 60.0 * self.gpus

    def minutes_for_samples(self, samples: float) -> float:
        """Minutes to train on ``samples`` training samples (whole steps)."""
        return math.ceil(samples / self.step.samples_per_step) * self.step.total_s / 60.0

    def to_dict(self) -> dict:
        return {"predicted_step_seconds": round(self.step_seconds, 4),
                "predicted_minutes": round(self.minutes, 2),
                "predicted_tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
                "predicted_gpu_hours": round(self.gpu_hours, 3),
                "predicted_terms_s": {k: round(v, 4) for k, v in self.step.terms().items()},
                "samples_per_step": round(self.step.samples_per_step, 2),
                "predicted_step_interval_s": [round(x, 4) for x in self.interval_s] if self.interval_s else None,
                "predicted_basis": dict(self.basis)}


PREDICTION_KEYS = ("predicted_step_seconds", "predicted_minutes", "predicted_tokens_per_s_per_gpu",
                   "predicted_gpu_hours")  # what Prediction.to_dict adds to a plan's summary (None without one)


@dataclass(frozen=True)
class Candidate:
    """One layout the planner weighs: its memory, whether it fits (with headroom) and its step time."""

    tp: int
    pp: int
    vp: int
    recompute: str
    memory: Memory
    fits: bool  # within the GPU's memory
    roomy: bool  # within the GPU's memory less the planner's headroom
    step: Optional[StepTime] = None  # filled by vdkit.planner.plan.rank_candidates
    recompute_num_layers: Optional[int] = None  # partial full recompute: the first N layers of each stage (VP: chunk)

    @property
    def label(self) -> str:
        where = "per model chunk" if self.vp > 1 else "per stage"
        partial = f" (first {self.recompute_num_layers} layers {where})" if self.recompute_num_layers else ""
        return f"TP {self.tp} x PP {self.pp}" + (f" (VP {self.vp})" if self.vp > 1 else "") + \
               (f", recompute {self.recompute}{partial}" if self.recompute != "none" else "")


@dataclass(frozen=True)
class Plan:
    """A recipe with its layout decided, the memory it needs, whether it fits, and its prediction."""

    recipe: Recipe  # parallelism filled in (tp, pp, vp, sequence_parallel, recompute, distributed_optimizer)
    dp: int
    grad_accum: int
    memory: Memory
    feasible: bool
    borderline: bool
    reason: Optional[str]
    checkpoint_gb: float
    layout_source: str  # how the layout was chosen: "pinned", "auto" or "design guide" (sharded plans: "pinned")
    notes: Tuple[str, ...] = ()
    prediction: Optional[Prediction] = None  # feasible plans on a GPU the step-time model describes
    runner_up: Optional[str] = None  # the next-fastest layout and why it lost (automatic layouts)
    params: int = 0  # the model's parameters (vdkit.planner.arch.param_counts(...).total)
    trainable_params: int = 0  # what the method trains (vdkit.planner.arch.trainable_params)
    time: Optional["TimePlan"] = None  # vdkit.planner.timeplan.TimePlan: --time, allocations, checkpoints; decided once by make_plan

    @property
    def tp(self) -> int:
        return self.recipe.parallelism.tp

    @property
    def pp(self) -> int:
        return self.recipe.parallelism.pp

    def to_dict(self) -> dict:
        """The plan's summary as plain data (``vdkit plan --json``; rounded figures)."""
        r, p = self.recipe, self.recipe.parallelism
        return {
            "model": r.model.name, "method": r.method.name, "engine": r.engine.name, "cluster": r.cluster.name,
            "nodes": r.cluster.nodes, "gpus_per_node": r.cluster.gpus_per_node, "gpus": r.world_size,
            "tp": p.tp, "pp": p.pp, "vp": p.vp, "dp": self.dp, "grad_accum": self.grad_accum,
            "sequence_parallel": p.sequence_parallel, "recompute": p.recompute,
            "distributed_optimizer": p.distributed_optimizer, "precision": r.train.precision,
            "optimizer_dtype": r.train.optimizer_dtype,
            "micro_batch_size": r.train.micro_batch_size, "global_batch_size": r.train.global_batch_size,
            "seq_length": r.train.seq_length, "layout_source": self.layout_source,
            "params_b": round(self.params / 1e9, 3),
            "trainable_params": self.trainable_params,
            "memory": {k: round(v, 2) for k, v in dataclasses.asdict(self.memory).items()},
            "memory_per_gpu_gb": round(self.memory.total_gb, 2), "gpu_memory_gb": r.cluster.gpu_memory_gb,
            "feasible": self.feasible, "borderline": self.borderline, "reason": self.reason,
            "checkpoint_gb": round(self.checkpoint_gb, 1), "notes": list(self.notes),
            "runner_up": self.runner_up,
            **(self.prediction.to_dict() if self.prediction else dict.fromkeys(PREDICTION_KEYS)),
        }
