"""From a short run's step times to a long run's minutes, with a 95 % interval.

The choices, stated once here and repeated in every result (``notes``, ``interval_method``):

* **Samples.** One sample per logged step; a Megatron line (the mean of a log interval of
  ``span`` iterations) is *one* sample standing for ``span`` iterations, never ``span``
  invented samples. Means are weighted by span; dispersion is over samples.
* **Timer glitches.** A non-positive step time is a broken timer, never a step. When it sits
  next to a spike and the two add up to one ordinary pair of steps (their mean within
  ``GLITCH_PAIR_TOLERANCE`` of the median step), the timer's boundary moved from one step to
  the next: both steps are counted at half the pair's sum. Otherwise the non-positive step
  (and a spike next to it) is left out. Either way a warning names the steps.
* **Checkpoint / validation slow-down.** Steps right after a checkpoint save or a validation
  pass that the log announces, and that stand out (over ``OUTLIER_SIGMAS`` robust standard
  deviations above the median of the other steps), carry checkpoint or validation work (an
  asynchronous save finishing in the background). Checkpoint and validation time are
  excluded from the estimate, so those steps are left out of the steady state too (and
  counted at the steady mean in a measured total); the warning gives their extra seconds.
  When too few clean steps would remain, they are kept and the text says so.
* **Warm-up.** NVIDIA's auto-configurator drops the first 5 timing samples of a benchmark run
  and averages the rest; we drop the leading samples that cover 5 iterations (fewer in runs
  under 10 samples, always keeping at least half), then keep dropping leading samples while
  they are outliers: more than ``OUTLIER_SIGMAS`` robust standard deviations (1.4826 x MAD,
  floored at 1 % of the median) above the median of the rest. Warm-up never exceeds half the
  samples.
* **One minimum.** An estimate needs ``MIN_STEADY_SAMPLES`` (3) steady samples after the
  warm-up: :func:`min_samples` timed samples in all (5). Fewer is refused with that rule.
* **Steady state** is everything after the warm-up (less the steps left out above): mean,
  median, std (ddof 1), CV = std/mean, p5-p95, and the drift = (mean of second half - mean of
  first half) / mean.
* **Fluctuating** means CV > ``FLUCTUATION_CV`` (10 %), or a drift larger than
  ``DRIFT_FRACTION`` (5 %) that is also significant (over 3 standard errors of the
  difference of the half means). The design guide saw this for Llama 2 7B SFT. A run on CPU
  (``on_cpu``) is flagged only for CV > ``CPU_FLUCTUATION_CV``: :func:`fluctuation`, the one
  rule ``vdkit validate``, ``vdkit report`` and the plots read through the estimate.
* **Extrapolation.** A real N-step run pays the warm-up once, so the estimate is the measured
  warm-up time + (N - warm-up iterations) x steady mean. (``steady_only_minutes`` gives
  N x steady mean for comparison.) When the run measured N iterations or more, the minutes
  are the measured sum of its first N and nothing is extrapolated.
* **Interval (95 %).** Student's t interval of the steady mean on n_eff = n (1 - r1) / (1 + r1)
  samples (r1: lag-1 autocorrelation of the steps less their half's mean), with the standard deviation floored at
  ``DISPERSION_FLOOR_CV`` (1 %) of the mean, because a handful of samples that happen to agree
  (or were printed with 4 digits) do not show that the step time never varies; widened by the
  full observed half-to-half drift (a trend may continue past the measurement); scaled by the
  extrapolated iterations. It is never zero wide for an extrapolation.
* **Included / excluded.** Only the step timer (``train_step_timing``, Megatron's elapsed time
  per iteration) is summed: model load, data load, validation and checkpoint saving are
  excluded (as in the design guide's Table 9). Validation and checkpoint overheads are added
  only when :class:`Overheads` are given.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Set, Tuple

from vdkit.errors import UserError
from vdkit.validation.stats import (lag1 as _lag1, mean as _mean, median as _median, percentile as _percentile,
                                    std as _std, t_quantile_975)
from vdkit.validation.steps import (EVENT_CHECKPOINT, TIMING_SOURCE_NOTES, TIMING_STEP, TIMING_TQDM_RATE,
                                    step_ranges as _ranges)

NVIDIA_WARMUP_SAMPLES = 5
OUTLIER_SIGMAS = 3.0
FLUCTUATION_CV = 0.10
# A run on CPU (cluster.gpu_type cpu: the demo's tiny model, ranks as local processes) is flagged only above
# this CV: its millisecond steps share the cores with the other ranks and every other process, so a 10-25 %
# spread is the machine's scheduling, not the run (`vdkit demo`'s six cells on 2 shared cores, load ~10,
# 2026-11-26: CV 15.2-22.4 %); above half the mean, something on the machine did stall it.
CPU_FLUCTUATION_CV = 0.50
DRIFT_FRACTION = 0.05
MIN_STEADY_SAMPLES = 3
DISPERSION_FLOOR_CV = 0.01
GLITCH_PAIR_TOLERANCE = 0.25
CONTAMINATION_WINDOW = 30  # samples after an event that may still be slowed by it
INTERVAL_METHOD = (f"95 % Student t interval of the steady mean (n_eff from the lag-1 autocorrelation within the "
                   f"halves; std floored at {DISPERSION_FLOOR_CV:.0%} of the mean), widened by the half-to-half drift")


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

    steps_measured: int  # timed samples (steps; Megatron log intervals)
    warmup_steps: int  # samples
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
    iterations_measured: int = 0  # iterations the samples stand for (= steps_measured unless Megatron intervals)
    steady_samples: int = 0
    timing_source: str = TIMING_STEP
    interval_method: str = INTERVAL_METHOD
    excluded_steps: List[int] = field(default_factory=list)  # left out of the steady state (glitch, slow-down)
    repaired_steps: List[int] = field(default_factory=list)  # glitch pairs counted at half their sum
    data_warnings: List[str] = field(default_factory=list)  # what was found in the series and what was done

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- the minimum
def warmup_base(spans: Sequence[int]) -> int:
    """Leading samples NVIDIA's practice drops: those covering the first 5 iterations, at most half."""
    n = len(spans)
    covered, k = 0, 0
    while k < n and covered < NVIDIA_WARMUP_SAMPLES:
        covered += spans[k]
        k += 1
    return min(k, n // 2)


def min_samples() -> int:
    """The fewest timed samples (steps) that leave MIN_STEADY_SAMPLES after the warm-up: the one rule."""
    n = 1
    while n - warmup_base([1] * n) < MIN_STEADY_SAMPLES:
        n += 1
    return n


# ----------------------------------------------------------------------------- warm-up
def detect_warmup(timings: Sequence[float], spans: Optional[Sequence[int]] = None) -> tuple:
    """(number of leading samples to exclude, why) for a series of step times."""
    n = len(timings)
    spans = list(spans) if spans is not None else [1] * n
    base = warmup_base(spans)
    limit = n // 2
    rest = list(timings[base:])
    med = _median(rest)
    mad = _median([abs(x - med) for x in rest])
    sigma = max(1.4826 * mad, 0.01 * med)
    k = base
    while k < limit and timings[k] > med + OUTLIER_SIGMAS * sigma:
        k += 1
    unit = "step(s)" if all(s == 1 for s in spans) else f"sample(s) ({sum(spans[:base])} iterations)"
    reason = f"first {base} {unit} dropped (NVIDIA's practice: the first 5 timing samples)"
    if base < NVIDIA_WARMUP_SAMPLES and sum(spans[:base]) < NVIDIA_WARMUP_SAMPLES:
        reason = f"first {base} {unit} dropped (NVIDIA drops 5; this run is short, so at most half)"
    if k > base:
        reason += (f", then {k - base} leading outlier(s) over median + {OUTLIER_SIGMAS:g} robust sigma "
                   f"({med + OUTLIER_SIGMAS * sigma:.3g} s)")
    return k, reason


# ----------------------------------------------------------------------------- glitches
def _robust(values: Sequence[float]) -> Tuple[float, float]:
    """(median, robust sigma = 1.4826 MAD floored at 1 % of the median) of ``values``."""
    med = _median(values)
    return med, max(1.4826 * _median([abs(x - med) for x in values]), 0.01 * abs(med))


def repair_glitches(values: List[float], spans: Sequence[int], steps: Sequence[int]
                    ) -> Tuple[List[float], Set[int], Set[int], List[str]]:
    """Repair or leave out non-positive step times (see the module docstring).

    Returns (values, indices left out, indices repaired, warnings).
    """
    bad = [i for i, v in enumerate(values) if v <= 0]
    if not bad:
        return values, set(), set(), []
    values = list(values)
    suspects = set(bad) | {j for i in bad for j in (i - 1, i + 1) if 0 <= j < len(values)}
    ordinary = [v for i, v in enumerate(values) if i not in suspects and v > 0]
    if not ordinary:
        ordinary = [v for v in values if v > 0]
    med, sigma = _robust(ordinary) if ordinary else (0.0, 0.0)
    excluded: Set[int] = set()
    repaired: Set[int] = set()
    notes: List[str] = []
    for i in bad:
        if i in repaired or i in excluded:
            continue
        best = None
        for j in (i - 1, i + 1):
            if not 0 <= j < len(values) or j in repaired or j in excluded or values[j] <= 0:
                continue
            total = values[i] * spans[i] + values[j] * spans[j]
            per = total / (spans[i] + spans[j])
            if total > 0 and med > 0 and abs(per - med) <= GLITCH_PAIR_TOLERANCE * med:
                if best is None or abs(per - med) < abs(best[1] - med):
                    best = (j, per, total)
        if best is not None:
            j, per, total = best
            lo, hi = sorted((i, j))
            notes.append(f"timer glitch at steps {steps[lo]}-{steps[hi]} ({values[lo]:.4g} s then {values[hi]:.4g} s): "
                         f"their sum {total:.4g} s is one ordinary pair of steps (median {med:.4g} s), so each "
                         f"counts as {per:.4g} s")
            values[i] = values[j] = per
            repaired.update((i, j))
        else:
            out = [i]
            for j in (i - 1, i + 1):
                if 0 <= j < len(values) and values[j] > med + OUTLIER_SIGMAS * sigma and j not in repaired:
                    out.append(j)
            excluded.update(out)
            shown = ", ".join(f"step {steps[k]} ({values[k]:.4g} s)" for k in sorted(out))
            notes.append(f"timer glitch: {shown} cannot be paired into ordinary steps (median {med:.4g} s): "
                         f"left out of the estimate")
    return values, excluded, repaired, notes


# ----------------------------------------------------------------------------- checkpoint / validation slow-down
def slowed_after_events(values: Sequence[float], steps: Sequence[int], events: Sequence[Tuple[int, str]],
                        ignore: Set[int]) -> Tuple[Set[int], List[str]]:
    """Samples right after a logged checkpoint / validation that stand out (see the module docstring)."""
    if not events or len(values) < 2:
        return set(), []
    windows: List[Tuple[int, int, str]] = []  # (first index after the event, event step, kinds)
    for ev_step, kind in events:
        first = next((i for i, s in enumerate(steps) if s > ev_step), None)
        if first is None:
            continue
        if windows and windows[-1][0] == first:
            if kind not in windows[-1][2]:
                windows[-1] = (first, windows[-1][1], windows[-1][2] + " and " + kind)
            continue
        windows.append((first, ev_step, kind))
    if not windows:
        return set(), []
    in_window = {i for first, _, _ in windows for i in range(first, min(first + CONTAMINATION_WINDOW, len(values)))}
    clean = [v for i, v in enumerate(values) if i and i not in in_window and i not in ignore]
    if len(clean) < MIN_STEADY_SAMPLES:
        clean = [v for i, v in enumerate(values) if i and i not in ignore]
    if not clean:
        return set(), []
    med, sigma = _robust(clean)
    threshold = med + OUTLIER_SIGMAS * sigma
    slowed: Set[int] = set()
    notes: List[str] = []
    for first, ev_step, kinds in windows:
        i = first
        while i < len(values) and i < first + 2 and values[i] <= threshold:
            i += 1  # the slow-down may begin a step late
        run = []
        while i < len(values) and i < first + CONTAMINATION_WINDOW and values[i] > threshold and i not in ignore:
            run.append(i)
            i += 1
        if not run:
            continue
        slowed.update(run)
        extra = sum(values[k] - med for k in run)
        what = "checkpoint save" if kinds == EVENT_CHECKPOINT else kinds.replace("checkpoint", "checkpoint save")
        notes.append(f"steps {_ranges([steps[k] for k in run])} ran right after a {what} at step {ev_step} and stand "
                     f"out ({min(values[k] for k in run):.4g}-{max(values[k] for k in run):.4g} s against a median of "
                     f"{med:.4g} s, {extra:.3g} s extra in all): left out of the steady state, because checkpoint and "
                     "validation time is excluded from the estimate (add it with --checkpoint-seconds / --val-*)")
    return slowed, notes


# ----------------------------------------------------------------------------- the flag
def fluctuation(cv: float, drift: float, drift_significant: bool, on_cpu: bool = False) -> Tuple[bool, str]:
    """(flagged, why) for a steady state with this CV and half-to-half drift (see the module docstring); on CPU
    only a CV over ``CPU_FLUCTUATION_CV`` is flagged, a smaller spread (or drift) is named, not flagged."""
    reasons = []
    if cv > FLUCTUATION_CV:
        reasons.append(f"CV {cv:.1%} > {FLUCTUATION_CV:.0%}")
    if abs(drift) > DRIFT_FRACTION and drift_significant:
        reasons.append(f"step time drifts {drift:+.1%} between the halves of the steady state")
    if not on_cpu or not reasons:
        return bool(reasons), "; ".join(reasons) or "steady"
    if cv > CPU_FLUCTUATION_CV:
        return True, f"CV {cv:.1%} > {CPU_FLUCTUATION_CV:.0%} (a CPU run's threshold)" + "".join(
            "; " + r for r in reasons[1:])
    return False, (f"spread of a CPU run ({'; '.join(reasons)}; flagged only over CV {CPU_FLUCTUATION_CV:.0%}: "
                   "the ranks share the machine's cores)")


# ----------------------------------------------------------------------------- the estimate
def estimate(timings: Sequence[float], target_steps: int, overheads: Optional[Overheads] = None, *,
             spans: Optional[Sequence[int]] = None, steps: Optional[Sequence[int]] = None,
             events: Sequence[Tuple[int, str]] = (), timing_source: str = TIMING_STEP,
             on_cpu: bool = False) -> Estimate:
    """Steady-state statistics of ``timings`` (seconds per iteration, in step order; one value per
    sample standing for ``spans[i]`` iterations) and the minutes for ``target_steps`` with a 95 %
    interval. ``steps`` and ``events`` (checkpoint / validation after a step) let slowed steps be
    found and named; ``on_cpu``: the run's ranks were CPU processes (the flag's CPU threshold).
    See the module docstring for every choice made.
    """
    values = [float(t) for t in timings]
    n = len(values)
    spans = [int(s) for s in spans] if spans is not None else [1] * n
    steps = list(steps) if steps is not None else list(range(n))
    if target_steps < 1:
        raise UserError(f"target steps {target_steps} must be >= 1", "pass --target-steps 1000")
    if n < min_samples():
        raise UserError(f"only {n} timed step(s): too few to estimate a steady state (the rule: "
                        f"{MIN_STEADY_SAMPLES} steps after dropping the warm-up, so at least {min_samples()} "
                        "timed steps or log intervals)",
                        "run more steps (the design guide measured 50); `vdkit validate --steps` lists what the "
                        "log has")
    values, glitched, repaired, notes = repair_glitches(values, spans, steps)
    slowed, slow_notes = slowed_after_events(values, steps, events, glitched)

    # Warm-up is judged on the series with the glitches repaired and left-out samples set aside.
    usable = [i for i in range(n) if i not in glitched]
    warm_k, warm_reason = detect_warmup([values[i] for i in usable], [spans[i] for i in usable])
    warm_idx = set(usable[:warm_k])
    last_warm = usable[warm_k - 1] if warm_k else -1
    steady_idx = [i for i in usable if i > last_warm]
    kept_slowed = False
    if slowed:
        clean = [i for i in steady_idx if i not in slowed]
        if len(clean) >= MIN_STEADY_SAMPLES:
            steady_idx = clean
            notes.extend(slow_notes)
        else:
            kept_slowed = True
            notes.extend(n.split(": left out")[0] + ": KEPT in the steady state, because fewer than "
                         f"{MIN_STEADY_SAMPLES} clean steps would remain; the estimate includes that slow-down"
                         for n in slow_notes)
            slowed = set()
    if len(steady_idx) < MIN_STEADY_SAMPLES:
        raise UserError(f"only {len(steady_idx)} usable steady step(s) after the warm-up and the timer glitches: "
                        f"too few to estimate a steady state (the rule: {MIN_STEADY_SAMPLES})",
                        "run more steps; `vdkit validate --steps` lists what the log has")
    steady = [values[i] for i in steady_idx]
    w = [spans[i] for i in steady_idx]
    ns = len(steady)
    mean = math.fsum(v * s for v, s in zip(steady, w)) / sum(w)
    median, std = _median(steady), _std(steady)
    cv = std / mean if mean > 0 else 0.0
    half = ns // 2
    first, second = steady[:half], steady[ns - half:]
    m1, m2 = _mean(first), _mean(second)
    drift = (m2 - m1) / mean if mean > 0 else 0.0
    # Standard error of the difference of the two half means (independent-sample approximation).
    se_diff = math.sqrt(_std(first) ** 2 / len(first) + _std(second) ** 2 / len(second)) if half >= 2 else 0.0
    drift_significant = abs(m2 - m1) > 3 * se_diff
    fluctuating, fluctuation_reason = fluctuation(cv, drift, drift_significant, on_cpu)

    # Lag-1 autocorrelation of what is left after the half means: the drift is added on its own below,
    # so a trend must not also shrink the sample size.
    residuals = [v - (m1 if i < ns - half else m2) for i, v in enumerate(steady)] if half else steady
    r1 = max(0.0, _lag1(residuals))
    n_eff = max(2.0, min(float(ns), ns * (1 - r1) / (1 + r1)))
    spread = max(std, DISPERSION_FLOOR_CV * mean)
    half_width = t_quantile_975(n_eff - 1) * spread / math.sqrt(n_eff) + abs(m2 - m1)

    # Iterations: warm-up counted once, as measured; left-out samples count at the steady mean.
    counted = [values[i] if (i not in glitched and i not in slowed) else mean for i in range(n)]
    its_total = sum(spans)
    warm_its = sum(spans[i] for i in range(n) if i <= last_warm)
    warm_s = math.fsum(counted[i] * spans[i] for i in range(n) if i <= last_warm)
    if its_total >= target_steps:
        remaining, acc = target_steps, 0.0
        for i in range(n):
            take = min(spans[i], remaining)
            acc += counted[i] * take
            remaining -= take
            if remaining <= 0:
                break
        measured = acc / 60.0
        minutes, lo, hi, extrapolated = measured, measured, measured, False
    else:
        remaining = target_steps - warm_its
        minutes = (warm_s + remaining * mean) / 60.0
        lo = (warm_s + remaining * max(0.0, mean - half_width)) / 60.0
        hi = (warm_s + remaining * (mean + half_width)) / 60.0
        extrapolated = True
    source_note = TIMING_SOURCE_NOTES.get(timing_source, timing_source)
    # The counts add up to target_steps: what is listed is exactly what the formula above sums.
    if extrapolated:
        includes = [f"{source_note}: {warm_its} warm-up iteration(s) as measured ({warm_s:.1f} s)",
                    f"{target_steps - warm_its} iteration(s) at the steady mean of {its_total - warm_its} measured"]
    else:
        includes = [f"{source_note}: {target_steps} measured iteration(s)"]
    left = sorted((glitched | slowed) - warm_idx)
    if left:
        includes.append(f"among them, {len(left)} left-out step(s) counted at the steady mean where measured")
    if kept_slowed:
        includes.append("the slow-down after a checkpoint / validation (too few clean steps to leave it out)")
    excludes = ["model load", "data load", "validation", "checkpoint saving"]
    if timing_source == TIMING_TQDM_RATE:
        excludes = ["model load", "data load"]
        includes.append("whatever TQDM's rate absorbed (validation and checkpoint pauses included)")
    overhead_min = 0.0
    if overheads is not None:
        vals, ckpts = overheads.events(target_steps)
        overhead_min = overheads.seconds(target_steps) / 60.0
        if vals:
            includes.append(f"{vals} validation(s) x {overheads.val_seconds:g} s")
            if "validation" in excludes:
                excludes.remove("validation")
        if ckpts:
            includes.append(f"{ckpts} checkpoint(s) x {overheads.checkpoint_seconds:g} s")
            if "checkpoint saving" in excludes:
                excludes.remove("checkpoint saving")
        minutes, lo, hi = minutes + overhead_min, lo + overhead_min, hi + overhead_min
    return Estimate(
        steps_measured=n, warmup_steps=warm_k, warmup_reason=warm_reason,
        step_time_mean_s=mean, step_time_median_s=median, step_time_std_s=std, step_time_cv=cv,
        step_time_p5_s=_percentile(steady, 5), step_time_p95_s=_percentile(steady, 95),
        drift=drift, fluctuating=fluctuating, fluctuation_reason=fluctuation_reason,
        target_steps=int(target_steps), extrapolated=extrapolated, extrapolated_minutes=minutes,
        interval_minutes=[lo, hi], steady_only_minutes=target_steps * mean / 60.0, warmup_seconds=warm_s,
        overhead_minutes=overhead_min, includes=includes, excludes=excludes, iterations_measured=its_total,
        steady_samples=ns, timing_source=timing_source,
        excluded_steps=[steps[i] for i in sorted(glitched | slowed)],
        repaired_steps=[steps[i] for i in sorted(repaired)],
        data_warnings=notes)


def estimate_log(log, target_steps: int, overheads: Optional[Overheads] = None, on_cpu: bool = False) -> Estimate:
    """:func:`estimate` over a parsed :class:`~vdkit.validation.steps.StepLog` (spans, steps, events)."""
    timed = log.timed
    return estimate([r.timing_s for r in timed], target_steps, overheads, spans=[r.span for r in timed],
                    steps=[r.step for r in timed], events=log.events, timing_source=log.timing_source,
                    on_cpu=on_cpu)
