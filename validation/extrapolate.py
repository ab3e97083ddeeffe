"""From a short run's step times to a long run's minutes, with a 95 % interval.

The choices, stated once here and repeated in every result's ``notes``:

* **Warm-up.** NVIDIA's auto-configurator drops the first 5 timing samples of a benchmark run
  and averages the rest; we drop the same 5 (fewer in runs under 10 steps, always keeping at
  least half), then keep dropping leading steps while they are outliers: more than
  ``OUTLIER_SIGMAS`` robust standard deviations (1.4826 x MAD, floored at 1 % of the median)
  above the median of the remaining steps. Warm-up never exceeds half the measured steps.
* **Steady state** is everything after the warm-up: mean, median, std (ddof 1), CV = std/mean,
  p5-p95, and the drift = (mean of second half - mean of first half) / mean.
* **Fluctuating** means CV > ``FLUCTUATION_CV`` (10 %), or a drift larger than
  ``DRIFT_FRACTION`` (5 %) that is also significant (over 3 standard errors of the
  difference of the half means). The design guide saw this for Llama 2 7B SFT.
* **Extrapolation.** A real N-step run pays the warm-up once, so the estimate is the measured
  warm-up time + (N - warm-up steps) x steady mean. (``steady_only_minutes`` gives
  N x steady mean for comparison.) When the run measured N steps or more, the minutes are the
  measured sum of its first N steps and nothing is extrapolated.
* **Interval (95 %).** Student's t interval of the steady mean, with the sample size reduced
  for lag-1 autocorrelation (n_eff = n (1 - r1) / (1 + r1)), widened by the full observed
  half-to-half drift because a trend inside the measurement may continue beyond it; scaled
  by the N - warm-up extrapolated steps.
* **Included / excluded.** Only ``train_step_timing in s`` is summed: model load, data load,
  validation and checkpoint saving are excluded (as in the design guide's Table 9).
  Validation and checkpoint overheads are added only when :class:`Overheads` are given.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

from vdkit.errors import UserError

NVIDIA_WARMUP_SAMPLES = 5
OUTLIER_SIGMAS = 3.0
FLUCTUATION_CV = 0.10
DRIFT_FRACTION = 0.05
MIN_STEADY_STEPS = 2


@dataclass(frozen=True)
class Overheads:
    """Per-event overheads to add to an estimate (seconds), with how often they happen."""

    val_every_n_steps: int = 0  # 0: no validation during the run
    val_seconds: float = 0.0
    checkpoint_every_n_steps: int = 0  # 0: one checkpoint at the end (NeMo's default)
    checkpoint_seconds: float = 0.0

    def events(self, steps: int) -> tuple:
        """(validations, checkpoints) in a run of ``steps`` steps."""
        vals = steps // self.val_every_n_steps if self.val_every_n_steps > 0 else 0
        if self.checkpoint_seconds <= 0:
            ckpts = 0
        elif self.checkpoint_every_n_steps > 0:
            ckpts = max(1, steps // self.checkpoint_every_n_steps)
        else:
            ckpts = 1
        return vals, ckpts

    def seconds(self, steps: int) -> float:
        vals, ckpts = self.events(steps)
        return vals * self.val_seconds + ckpts * self.checkpoint_seconds


@dataclass
class Estimate:
    """The steady state of a measured run and its extrapolation to ``target_steps``."""

    steps_measured: int
    warmup_steps: int
    warmup_reason: str
    step_time_mean_s: float
    step_time_median_s: float
    step_time_std_s: float
    step_time_cv: float
    step_time_p5_s: float
    step_time_p95_s: float
    drift: float
    fluctuating: bool
    fluctuation_reason: str
    target_steps: int
    extrapolated: bool  # False when the run measured target_steps or more
    extrapolated_minutes: float
    interval_minutes: List[float]
    steady_only_minutes: float
    warmup_seconds: float
    overhead_minutes: float = 0.0
    includes: List[str] = field(default_factory=list)
    excludes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- small statistics
def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _median(xs: Sequence[float]) -> float:
    return _percentile(xs, 50.0)


def _percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _lag1(xs: Sequence[float]) -> float:
    """Lag-1 autocorrelation (0 for fewer than 3 values or no variance)."""
    if len(xs) < 3:
        return 0.0
    m = _mean(xs)
    den = math.fsum((x - m) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return math.fsum((xs[i] - m) * (xs[i + 1] - m) for i in range(len(xs) - 1)) / den


def t_quantile_975(dof: float) -> float:
    """Student's t 0.975 quantile (scipy-free: Cornish-Fisher series, exact enough for dof >= 1)."""
    if dof < 3:  # below 3 the series is poor: use the exact value of the smaller integer (wider)
        dof = max(1, int(dof))
    if dof == 1:
        return 12.706204736
    if dof == 2:
        return 4.302652730
    z = 1.959963985
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3 + g4 / dof ** 4


# ----------------------------------------------------------------------------- warm-up
def detect_warmup(timings: Sequence[float]) -> tuple:
    """(number of leading steps to exclude, why) for a series of step times."""
    n = len(timings)
    base = NVIDIA_WARMUP_SAMPLES if n >= 2 * NVIDIA_WARMUP_SAMPLES else n // 2
    limit = n // 2
    rest = list(timings[base:])
    med = _median(rest)
    mad = _median([abs(x - med) for x in rest])
    sigma = max(1.4826 * mad, 0.01 * med)
    k = base
    while k < limit and timings[k] > med + OUTLIER_SIGMAS * sigma:
        k += 1
    reason = f"first {base} step(s) dropped (NVIDIA's practice: the first 5 timing samples)"
    if base < NVIDIA_WARMUP_SAMPLES:
        reason = f"first {base} step(s) dropped (NVIDIA drops 5; this run is short, so at most half)"
    if k > base:
        reason += (f", then {k - base} leading outlier(s) over median + {OUTLIER_SIGMAS:g} robust sigma "
                   f"({med + OUTLIER_SIGMAS * sigma:.3g} s)")
    return k, reason


# ----------------------------------------------------------------------------- the estimate
def estimate(timings: Sequence[float], target_steps: int, overheads: Optional[Overheads] = None) -> Estimate:
    """Steady-state statistics of ``timings`` (seconds per step, in step order) and the minutes for
    ``target_steps`` with a 95 % interval. See the module docstring for every choice made.
    """
    timings = [float(t) for t in timings]
    n = len(timings)
    if target_steps < 1:
        raise UserError(f"target steps {target_steps} must be >= 1", "pass --target-steps 1000")
    if n < MIN_STEADY_STEPS + 1:
        raise UserError(f"only {n} timed step(s): too few to estimate a steady state",
                        f"run at least {NVIDIA_WARMUP_SAMPLES + 10} steps (the design guide measured 50)")
    warm, warm_reason = detect_warmup(timings)
    steady = timings[warm:]
    ns = len(steady)
    mean, median, std = _mean(steady), _median(steady), _std(steady)
    cv = std / mean if mean > 0 else 0.0
    half = ns // 2
    first, second = steady[:half], steady[ns - half:]
    m1, m2 = _mean(first), _mean(second)
    drift = (m2 - m1) / mean if mean > 0 else 0.0
    # Standard error of the difference of the two half means (independent-sample approximation).
    se_diff = math.sqrt(_std(first) ** 2 / len(first) + _std(second) ** 2 / len(second)) if half >= 2 else 0.0
    drift_significant = abs(m2 - m1) > 3 * se_diff
    reasons = []
    if cv > FLUCTUATION_CV:
        reasons.append(f"CV {cv:.1%} > {FLUCTUATION_CV:.0%}")
    if abs(drift) > DRIFT_FRACTION and drift_significant:
        reasons.append(f"step time drifts {drift:+.1%} between the halves of the steady state")
    fluctuating = bool(reasons)

    # 95 % interval of the steady mean: t interval on an autocorrelation-reduced sample size,
    # plus the observed drift (a trend may continue past the measured window).
    r1 = max(0.0, _lag1(steady))
    n_eff = max(2.0, min(float(ns), ns * (1 - r1) / (1 + r1)))
    half_width = t_quantile_975(n_eff - 1) * std / math.sqrt(n_eff) + abs(m2 - m1)

    warm_s = math.fsum(timings[:warm])
    if n >= target_steps:
        measured = math.fsum(timings[:target_steps]) / 60.0
        minutes, lo, hi, extrapolated = measured, measured, measured, False
    else:
        remaining = target_steps - warm
        minutes = (warm_s + remaining * mean) / 60.0
        lo = (warm_s + remaining * max(0.0, mean - half_width)) / 60.0
        hi = (warm_s + remaining * (mean + half_width)) / 60.0
        extrapolated = True
    # The parts add up to target_steps: what is summed is exactly what the formula above sums.
    if extrapolated:
        includes = [f"{warm} warm-up step(s) as measured ({warm_s:.1f} s)",
                    f"{target_steps - warm} step(s) at the steady mean of {n - warm} measured"]
    else:
        includes = [f"{target_steps} measured step(s) of train_step_timing"]
    excludes = ["model load", "data load", "validation", "checkpoint saving"]
    overhead_min = 0.0
    if overheads is not None:
        vals, ckpts = overheads.events(target_steps)
        overhead_min = overheads.seconds(target_steps) / 60.0
        if vals:
            includes.append(f"{vals} validation(s) x {overheads.val_seconds:g} s")
            excludes.remove("validation")
        if ckpts:
            includes.append(f"{ckpts} checkpoint(s) x {overheads.checkpoint_seconds:g} s")
            excludes.remove("checkpoint saving")
        minutes, lo, hi = minutes + overhead_min, lo + overhead_min, hi + overhead_min
    return Estimate(
        steps_measured=n, warmup_steps=warm, warmup_reason=warm_reason,
        step_time_mean_s=mean, step_time_median_s=median, step_time_std_s=std, step_time_cv=cv,
        step_time_p5_s=_percentile(steady, 5), step_time_p95_s=_percentile(steady, 95),
        drift=drift, fluctuating=fluctuating, fluctuation_reason="; ".join(reasons) or "steady",
        target_steps=int(target_steps), extrapolated=extrapolated, extrapolated_minutes=minutes,
        interval_minutes=[lo, hi], steady_only_minutes=target_steps * mean / 60.0, warmup_seconds=warm_s,
        overhead_minutes=overhead_min, includes=includes, excludes=excludes)
