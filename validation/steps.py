"""The parsed form of a training log: one :class:`StepRecord` per step, gathered in a :class:`StepLog`.

Steps are 0-based global steps, as NeMo's ``global_step``: Megatron's 1-based ``iteration N`` is
step ``N - 1``. A record may stand for more than one iteration: Megatron-LM prints one line per
``--log-interval`` iterations with their *mean* time, so that line is one record with ``span`` =
the interval, never ``span`` invented samples.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Tuple

# What a record's ``timing_s`` was read from (StepLog.timing_source).
TIMING_STEP = "train_step_timing"  # NeMo's per-step timer (1.x and 2.x), also every vdkit engine
TIMING_MEGATRON = "elapsed time per iteration"  # Megatron-LM / Megatron-Bridge, a mean over the log interval
TIMING_TQDM_RATE = "TQDM rate"  # the progress bar's smoothed s/it: a fallback when the log has no step timer

TIMING_SOURCE_NOTES = {
    TIMING_STEP: "NeMo's train_step_timing (one value per step)",
    TIMING_MEGATRON: "Megatron's 'elapsed time per iteration (ms)' (a mean over each log interval)",
    TIMING_TQDM_RATE: "FALLBACK: the TQDM bar's rate (s/it, smoothed by TQDM over recent steps, and it includes "
                      "validation and checkpoint pauses); the log has no train_step_timing",
}

# Event kinds seen between steps (they may slow the steps right after them).
EVENT_CHECKPOINT = "checkpoint"
EVENT_VALIDATION = "validation"


@dataclass(slots=True)  # slots: a 100,000-step log keeps 100,000 of these
class StepRecord:
    """The values logged for one global step (0-based, as NeMo's ``global_step``).

    ``timing_s`` is seconds per iteration as logged (it may be zero or negative when the
    job's timer glitched: the series cleaning decides what to do with it). ``span`` is how
    many iterations the value stands for (Megatron log intervals; 1 otherwise).
    """

    step: int
    timing_s: Optional[float] = None
    loss: Optional[float] = None
    consumed_samples: Optional[float] = None
    span: int = 1
    rate_s: Optional[float] = None  # the TQDM bar's s/it, kept only when the update had no step timer


@dataclass
class StepLog:
    """The parsed steps of one run (from one or several files), sorted by step."""

    source: str
    format: str  # nemo1 | nemo2 | megatron | tensorboard (joined with '+' when files differ)
    steps: List[StepRecord]
    warnings: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    total_steps: Optional[int] = None  # max_steps when the log shows it (TQDM total, Megatron's N/M)
    events: List[Tuple[int, str]] = field(default_factory=list)  # (last step before it, kind), in order
    timing_source: str = TIMING_STEP
    times: Tuple[Optional[str], Optional[str]] = (None, None)  # first / last wall-clock stamp seen, ISO text

    @property
    def timed(self) -> List[StepRecord]:
        """Steps that carry a step time, in step order."""
        return [s for s in self.steps if s.timing_s is not None]

    @property
    def timings(self) -> List[float]:
        return [s.timing_s for s in self.timed]

    @property
    def diverged(self) -> bool:
        """Every logged loss is NaN or infinite (and there is at least one): the run trained nothing."""
        losses = [s.loss for s in self.steps if s.loss is not None]
        return bool(losses) and not any(math.isfinite(x) for x in losses)


def step_ranges(steps: Iterable[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``'3-5, 9'`` (how warnings name steps)."""
    out: List[str] = []
    s = sorted(set(steps))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ", ".join(out)


def warn_incomplete(log: StepLog) -> None:
    """Warn when the log stops before the run's max_steps (job killed, timed out, or still running)."""
    if log.total_steps and log.steps:
        last = log.steps[-1].step + 1
        if last < log.total_steps:
            log.warnings.append(f"{log.source}: stops at step {last} of {log.total_steps} "
                                "(job killed, timed out or still running?)")


def steps_csv(log: StepLog) -> str:
    """The parsed per-step figures as CSV with a header: ``step,seconds,loss`` (empty where the log has
    none). Values are as logged: a Megatron line is one row (its interval's mean, at the interval's
    last step); a glitched timer's negative value is printed as it is."""
    fmt = lambda x: "" if x is None else f"{x:.10g}"  # noqa: E731
    rows = ["step,seconds,loss"]
    rows += [f"{r.step},{fmt(r.timing_s)},{fmt(r.loss)}" for r in log.steps]
    return "\n".join(rows) + "\n"
