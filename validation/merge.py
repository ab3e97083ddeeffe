"""The logs of one run directory joined into one :class:`~.steps.StepLog` by global step.

A requeued or restarted job's segments are joined (the rerun's values win the rerun steps, the
restart is reported); two different jobs that wrote the same steps are never averaged: the latest
job's log is used alone and both are named (:func:`merge_logs`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from vdkit.validation.steps import TIMING_STEP, StepLog, StepRecord, step_ranges as _ranges, warn_incomplete


def _same_job(a: StepLog, b: StepLog, shared: List[int]) -> Optional[bool]:
    """Whether two logs that share steps come from one job restarted (True), from two different
    jobs (False), or cannot tell (None).

    Two jobs: the shared steps report different consumed samples (another batch size or data
    order), or the logs' wall-clock stamps overlap (both were running at once). A restart
    resumes the same job: same samples for the same step, one log after the other.
    """
    a_by = {r.step: r for r in a.steps}
    b_by = {r.step: r for r in b.steps}
    compared = [(a_by[s].consumed_samples, b_by[s].consumed_samples) for s in shared
                if a_by[s].consumed_samples is not None and b_by[s].consumed_samples is not None]
    # 1 %: TQDM prints 3 significant digits (2.56e+5), another batch size differs by far more
    if compared and any(abs(x - y) > 0.01 * max(abs(x), abs(y), 1.0) for x, y in compared):
        return False
    (a0, a1), (b0, b1) = a.times, b.times
    if a0 and a1 and b0 and b1:
        if b0 < a1 and a0 < b1:
            return False
        return True
    return True if compared else None


def merge_logs(source: str, logs: Iterable[StepLog]) -> StepLog:
    """Join the logs of one run directory (oldest first) by global step.

    * A requeued / restarted job resumes from its last checkpoint and reruns a few steps: its
      segments are joined by step, the later run's values win the rerun steps, and the restart
      is reported.
    * Two different jobs that wrote the same steps (another batch size, or running at the same
      time) are never averaged or interleaved: the latest job's log is used alone and both are
      named in a warning.
    """
    logs = [log for log in logs]
    warnings: List[str] = []
    files: List[str] = []
    formats: List[str] = []
    for log in logs:
        warnings.extend(w for w in log.warnings if "stops at step" not in w)  # judged on the merge
        files.extend(log.files)
        if log.format not in formats and log.steps:
            formats.append(log.format)
    used = [log for log in logs if log.steps]
    # Two jobs: keep the latest job's logs only.
    for i in range(len(used) - 1, 0, -1):
        later = used[i]
        for earlier in used[:i]:
            shared = sorted({r.step for r in earlier.steps} & {r.step for r in later.steps})
            if shared and _same_job(earlier, later, shared) is False:
                dropped = ", ".join(Path(x.source).name for x in used[:i])
                warnings.append(
                    f"two different jobs wrote steps {_ranges(shared)} in {source} ({dropped} "
                    f"and {Path(later.source).name}: other consumed samples, or running at the same time): "
                    f"they are not averaged; only the latest, {Path(later.source).name}, is used. "
                    "Pass one log file to choose another")
                used = used[i:]
                break
        else:
            continue
        break
    steps: Dict[int, StepRecord] = {}
    events: List[Tuple[int, str]] = []
    for log in used:
        rerun = sorted(s for s in (r.step for r in log.steps) if s in steps)
        if rerun:
            warnings.append(f"restart: {Path(log.source).name} resumes at step {log.steps[0].step} and reruns "
                            f"steps {_ranges(rerun)}; the rerun's values are used (the run's segments are joined "
                            "by step)")
        elif steps and log.steps and log.steps[0].step > max(steps) + 1:
            warnings.append(f"{Path(log.source).name} starts at step {log.steps[0].step}, after a gap from step "
                            f"{max(steps)} (steps missing between the logs)")
        first_new = log.steps[0].step if log.steps else None
        if first_new is not None:
            events = [e for e in events if e[0] < first_new]  # the rerun's own events replace the old ones
        for rec in log.steps:
            steps[rec.step] = rec
        events.extend(log.events)
    total = None
    for log in used:
        total = log.total_steps or total
    timing = used[-1].timing_source if used else TIMING_STEP
    times = (used[0].times[0], used[-1].times[1]) if used else (None, None)
    merged = StepLog(source, "+".join(formats) or "none", [steps[k] for k in sorted(steps)], warnings, files, total,
                     events, timing, times)
    warn_incomplete(merged)
    return merged
