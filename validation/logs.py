"""Per-step timing from training logs: the one entry :func:`read_source` (a run directory, a log file,
a TensorBoard event directory or file) and the run directory's listing.

Each source has its reader: text logs (NeMo 1.x TQDM output, NeMo 2.x ProgressPrinter lines,
Megatron-LM / Megatron-Bridge ``training_log`` lines, mixed or not) :mod:`.text_log`, streamed in
segments by :mod:`.segments`, one parser per format (:mod:`.nemo1`, :mod:`.nemo2`, :mod:`.megatron`),
launcher prefixes in :mod:`.prefixes`; TensorBoard events :mod:`.tensorboard_events`; a run
directory's several ``*.out`` files joined by step in :mod:`.merge`.

The result is a :class:`~.steps.StepLog`: one record per global step (the last update of a step
wins), the checkpoint / validation events seen between steps, and warnings for anything that
looked truncated, interleaved, restarted or written by two jobs. Values are kept as logged
(a glitched timer's negative value included): :mod:`.extrapolate` decides what they mean and
says so; :func:`screen_steps` leaves out only the impossible. A source with no steps at all is a
:class:`UserError` naming the file.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import List, Tuple, Union

from vdkit.errors import UserError
from vdkit.run.logformat import TIMING_KEY
from vdkit.validation.merge import merge_logs
from vdkit.validation.steps import StepLog
from vdkit.validation.tensorboard_events import event_files, parse_tensorboard
from vdkit.validation.text_log import parse_text_log

PathLike = Union[str, Path]


def run_out_files(run_dir: PathLike) -> List[Path]:
    """The job stdout files of a run directory (slurm-<jobid>.out, local-<n>.out), oldest first."""
    run_dir = Path(run_dir)
    files = [p for p in run_dir.glob("*.out") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime, _natural(p.name)))


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def distinct_files(files: List[Path]) -> Tuple[List[Path], int]:
    """``files`` without those that are the same file as an earlier one (symlinks, hard links), and how many
    were dropped: 3,000 links to one log are one log, not 2,999 restarts to merge pairwise."""
    seen, out = set(), []
    for f in files:
        try:
            st = f.stat()
            key = (st.st_dev, st.st_ino)
        except OSError:
            key = str(f)
        if key in seen:
            continue
        seen.add(key)
        out.append(f)
    return out, len(files) - len(out)


MAX_STEP = 10 ** 12  # no run logs a trillion steps: a larger (or negative) global step is a corrupt line
MAX_STEP_SECONDS = 1e6  # 11.6 days for one step: a larger timing is a corrupt value, not a measurement


MIN_STEP_SECONDS = 1e-3  # no training step of an LLM (even a tiny one on a GPU) takes under a millisecond
# The finest clock a step timer reads: CUDA events resolve ~0.5 us (cudaEventElapsedTime), time.time() /
# perf_counter() finer. A step time of 0 s or under this is a timer that did not run, not a measurement.
CLOCK_RESOLUTION_S = 1e-6
SLOW_STEP_SECONDS = 3600.0  # an hour per step: possible (a hung rank) but not a measurement to extrapolate


def _warn_losses_and_speed(log: StepLog) -> None:
    """Warnings for a diverged run (losses NaN / infinite) and step times no real step takes."""
    losses = [r.loss for r in log.steps if r.loss is not None]
    bad = [x for x in losses if not math.isfinite(x)]
    if log.diverged:
        log.warnings.insert(0, f"every loss in {log.source} ({len(losses)}) is NaN or infinite: the run diverged, so "
                               "its steps are not a training run's (fix the run: lower method.lr, check the data)")
    elif bad:
        log.warnings.insert(0, f"{len(bad)} of {len(losses)} losses in {log.source} are NaN or infinite: the run "
                               "diverged part-way")
    times = [r.timing_s for r in log.steps if r.timing_s is not None and math.isfinite(r.timing_s) and r.timing_s > 0]
    fast = sum(CLOCK_RESOLUTION_S <= t < MIN_STEP_SECONDS for t in times)  # below the clock: screen_steps' line
    slow = sum(SLOW_STEP_SECONDS < t <= MAX_STEP_SECONDS for t in times)
    if fast:
        log.warnings.insert(0, f"{fast} of {len(times)} step timings in {log.source} are under "
                               f"{MIN_STEP_SECONDS * 1e3:g} ms, faster than any training step: implausible (a "
                               "timer in other units?)")
    if slow:
        log.warnings.insert(0, f"{slow} of {len(times)} step timings in {log.source} are over "
                               f"{SLOW_STEP_SECONDS / 60:g} min per step: implausible (a hung rank?)")


def screen_steps(log: StepLog, require_timing: bool = True) -> None:
    """Leave out impossible steps and timings, saying how many; refuse when most of them are impossible.

    Impossible: a negative or astronomical global step; a timing that is NaN, infinite or above
    MAX_STEP_SECONDS; a timing of 0 s or under CLOCK_RESOLUTION_S (no timer ran: not a measured step).
    Negative timings are left to the series cleaning (timer glitches pair up with the next step) - but when
    unusable timings are most of the run, no estimate can be honest: refused.
    """
    n = len(log.steps)
    _warn_losses_and_speed(log)
    bad_steps = [r for r in log.steps if r.step < 0 or r.step > MAX_STEP]
    if bad_steps:
        if len(bad_steps) == n:
            raise UserError(f"no usable steps in {log.source}: {n} of {n} global step numbers are negative or above "
                            f"10^12 (a corrupt log)", "pass the job's own log file or run directory")
        log.warnings.insert(0, f"{len(bad_steps)} of {n} progress updates in {log.source} have impossible step "
                               "numbers (negative or above 10^12): left out")
        log.steps = [r for r in log.steps if 0 <= r.step <= MAX_STEP]
    timed = [r for r in log.steps if r.timing_s is not None]
    if not timed:
        return
    absurd = [r for r in timed if not math.isfinite(r.timing_s) or r.timing_s > MAX_STEP_SECONDS]
    below_clock = [r for r in timed if math.isfinite(r.timing_s) and r.timing_s < CLOCK_RESOLUTION_S]
    unusable = len(absurd) + len(below_clock)
    if require_timing and unusable * 2 > len(timed):
        raise UserError(f"{unusable} of {len(timed)} step timings in {log.source} are zero (or under the clock's "
                        f"resolution), negative, NaN or "
                        f"above {MAX_STEP_SECONDS:g} s: too few real measurements for an estimate",
                        "check the job's timer (exp_manager.log_step_timing) and pass a log with real step times; "
                        "`vdkit validate --steps` lists what was parsed")
    if absurd:
        for r in absurd:
            r.timing_s = None
        log.warnings.insert(0, f"{len(absurd)} of {len(timed)} step timings in {log.source} are NaN, infinite or "
                               f"above {MAX_STEP_SECONDS:g} s: left out of the estimate")
    unmeasured = [r for r in timed if r.timing_s is not None and 0 <= r.timing_s < CLOCK_RESOLUTION_S]
    if unmeasured:
        for r in unmeasured:
            r.timing_s = None
        log.warnings.insert(0, f"{len(unmeasured)} of {len(timed)} step timings in {log.source} are 0 s or under "
                               f"the clock's {CLOCK_RESOLUTION_S * 1e6:g} us resolution (no timer ran): not measured "
                               "steps, left out of the estimate")


def read_source(path: PathLike, require_timing: bool = True) -> StepLog:
    """The steps of a run directory, a log file, or a TensorBoard event directory / file.

    A run directory uses its TensorBoard events under ``logs/`` when they hold step timings,
    else its ``*.out`` files merged by global step. Raises UserError when there are no steps
    at all, or (``require_timing``) no step times.
    """
    from vdkit.run.rundir import LOG_DIR

    from vdkit.composition.files import not_a_regular_file

    p = Path(path)
    if not p.exists():
        raise UserError(f"{p} does not exist", "pass a run directory, a Slurm .out / NeMo / Megatron log file, "
                                               "or a TensorBoard event directory")
    kind = not_a_regular_file(p)
    if kind and not p.is_dir():  # a FIFO would block the read forever, a device never end
        raise UserError(f"{p} is {kind}, not a log file or a run directory",
                        "pass a run directory, a Slurm .out / NeMo / Megatron log file, or a TensorBoard event directory")
    if p.is_file():
        log = parse_tensorboard(p) if p.name.startswith("events.out.tfevents.") else parse_text_log(p)
    else:
        log = None
        tb_root = p / LOG_DIR if (p / LOG_DIR).is_dir() else p
        if event_files(tb_root):
            log = parse_tensorboard(tb_root)
            log.source = str(p)
        if log is None or not log.timed:
            outs, same = distinct_files(run_out_files(p))
            if outs:
                log = merge_logs(str(p), [parse_text_log(f) for f in outs])
                if same:
                    log.warnings.insert(0, f"{same} of {same + len(outs)} *.out files in {p} are the same log as "
                                           "another (links to one file): each log is read once")
        if log is None:
            raise UserError(f"no step timing in {p}: no TensorBoard events under it and no *.out files",
                            "pass a run directory after its job ran, a Slurm .out file, or an event directory")
    screen_steps(log, require_timing)
    if not log.steps:
        from vdkit.run.faults import summary

        stopped = summary(p) if p.is_dir() else None  # the run's job failed before its first step: say why
        if stopped:
            raise UserError(f"no training steps in {log.source}: its job stopped before the first step ({stopped})",
                            "fix what the fault says and submit again (`vdkit logs RUN_DIR` shows the failing rank)")
        raise UserError(f"no training steps found in {log.source}",
                        "pass a NeMo (1.x or 2.x), Megatron-LM / Megatron-Bridge training log, a run directory "
                        "or a TensorBoard event directory")
    if require_timing and not log.timed:
        raise UserError(f"no '{TIMING_KEY}' values in {log.source} ({len(log.steps)} steps without a time)",
                        "pass a NeMo training log (exp_manager.log_step_timing must be on) or its TensorBoard dir; "
                        "`vdkit validate --steps` still lists the steps it has")
    return log
