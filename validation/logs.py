"""Per-step timing from training logs: NeMo 1.x TQDM output, NeMo 2.x ProgressPrinter lines,
Megatron-LM / Megatron-Bridge ``training_log`` lines, and TensorBoard events.

Everything streams: text is read in 1 MiB chunks and split on ``\\r`` (TQDM's in-place updates,
also a literal ``^M`` pasted into a log) and ``\\n``; each short segment is parsed on its own (no
regex ever runs over the whole file). Each format has its own module (:mod:`.nemo1`,
:mod:`.nemo2`, :mod:`.megatron`); launcher prefixes (srun labels, torchx / NeMo-Run / Ray
prefixes, timestamps, rank tags, ANSI codes) are handled in :mod:`.prefixes`.

The result is a :class:`~.steps.StepLog`: one record per global step (the last update of a step
wins), the checkpoint / validation events seen between steps, and warnings for anything that
looked truncated, interleaved, restarted or written by two jobs. Values are kept as logged
(a glitched timer's negative value included): :mod:`.extrapolate` decides what they mean and
says so. A source with no steps at all is a :class:`UserError` naming the file.
"""
from __future__ import annotations

import codecs
import math
import os
import re
import struct
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

from vdkit.errors import UserError
# The metric names have one home, shared with the engines that write them.
from vdkit.logformat import CONSUMED_SAMPLES_KEY as SAMPLES_KEY, GLOBAL_STEP_KEY as STEP_KEY, LOSS_KEY, TIMING_KEY
from vdkit.validation.megatron import ANCHOR as MEGATRON_ANCHOR, MegatronParser, interval_spans
from vdkit.validation.nemo1 import Nemo1Parser
from vdkit.validation.nemo2 import ANCHOR as NEMO2_ANCHOR, Nemo2Parser
from vdkit.validation.prefixes import line_label, strip_ansi, timestamp
from vdkit.validation.steps import (EVENT_CHECKPOINT, EVENT_VALIDATION, TIMING_MEGATRON, TIMING_STEP,
                                    TIMING_TQDM_RATE, StepLog, StepRecord,
                                    step_ranges as _ranges)

__all__ = ["StepLog", "StepRecord", "TIMING_KEY", "LOSS_KEY", "STEP_KEY", "SAMPLES_KEY", "iter_segments",
           "parse_text_log", "parse_tensorboard", "merge_logs", "run_out_files", "read_source", "event_files",
           "steps_csv"]

MEGATRON_TB_TIME = "iteration-time"  # seconds per iteration, the mean over the log interval
MEGATRON_TB_LOSS = "lm loss"

CHUNK_BYTES = 1 << 20
# A segment longer than this without a '\r' or '\n' is not a progress update (binary junk,
# a corrupted file): it is dropped with a warning instead of growing memory without bound.
MAX_SEGMENT_CHARS = 1 << 20

PathLike = Union[str, Path]


# ----------------------------------------------------------------------------- streaming text
def iter_segments(path: PathLike, warnings: List[str]) -> Iterator[Tuple[str, str]]:
    """Yield ``(segment, line_head)`` for a text file split on ``\\n`` and ``\\r``, read in chunks.

    ``line_head`` is the first segment of the line the segment belongs to (where srun labels
    and other launcher prefixes sit; TQDM updates after a ``\\r`` carry none of their own).
    A literal ``^M`` counts as ``\\r``. Undecodable bytes are replaced (and counted in a
    warning); an over-long segment is dropped with a warning. The last segment is yielded even
    without a final newline (a truncated log).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    carry_starts_line = True
    head = ""
    dropped = 0
    bad_chars = 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.read(CHUNK_BYTES)
            text = decoder.decode(raw, final=not raw)
            if "\ufffd" in text or "\x00" in text:
                bad_chars += text.count("\ufffd") + text.count("\x00")
            if not raw and not text and not carry:
                break
            text = carry + text
            if "^M" in text:
                text = text.replace("^M", "\r")
            if "\r\n" in text:
                text = text.replace("\r\n", "\n")
            lines = text.split("\n")
            last = lines.pop() if raw else None  # at EOF the last line is complete
            starts = carry_starts_line
            for line in lines:
                if "\r" in line:
                    segs = line.split("\r")
                    if starts:
                        head = segs[0]
                    for seg in segs:
                        if seg:
                            yield seg, head
                elif line:
                    if starts:
                        head = line
                    yield line, head
                starts = True
            if last is None:
                carry = ""
                break
            if "\r" in last:
                segs = last.split("\r")
                if starts:
                    head = segs[0]
                for seg in segs[:-1]:
                    if seg:
                        yield seg, head
                carry, carry_starts_line = segs[-1], False
            else:
                carry, carry_starts_line = last, starts
            if len(carry) > MAX_SEGMENT_CHARS:
                dropped += 1
                carry, carry_starts_line = "", False
    if bad_chars:
        warnings.append(f"{path}: {bad_chars} undecodable or NUL characters (corrupt bytes?) were skipped")
    if dropped:
        warnings.append(f"{path}: {dropped} over-long segment(s) without a line break were skipped")


# ----------------------------------------------------------------------------- events between steps
# Lines that announce a checkpoint save or a validation pass (NeMo 1.x / 2.x, Megatron, Lightning).
_CHECKPOINT_MARKS = ("aving checkpoint", "heckpoint save", "heckpoint Save", "saved checkpoint", "saving model to",
                     "Saving latest checkpoint", "is saving checkpoint")
_VALIDATION_MARKS = ("Validation: iteration", "Validation DataLoader", "validation loss at iteration",
                     "alidation loss at the end", "'val_loss' reached", "'val_loss' was not in top",
                     "'validation_loss' was not in top", "Monitored metric val")


def _event_kind(segment: str) -> Optional[str]:
    if "heckpoint" in segment or "saving model" in segment:
        if any(mark in segment for mark in _CHECKPOINT_MARKS):
            return EVENT_CHECKPOINT
    if "alidation" in segment or "val_loss'" in segment or "Monitored metric" in segment:
        if any(mark in segment for mark in _VALIDATION_MARKS):
            return EVENT_VALIDATION
    return None


# ----------------------------------------------------------------------------- text files
def parse_text_log(path: PathLike) -> StepLog:
    """Parse one Slurm .out / NeMo / Megatron log file (every text format, mixed or not).

    Returns the steps found (possibly none; :func:`read_source` turns that into an error).
    When several processes print steps (interleaved ranks under ``srun -l``, two prefixes),
    one series is kept (the one with the most steps) and the others are named in a warning.
    """
    path = Path(path)
    name = str(path)
    warnings: List[str] = []
    by_label: Dict[Optional[str], Dict[int, StepRecord]] = {}
    label_order: List[Optional[str]] = []
    nemo1 = Nemo1Parser(warnings, name)
    nemo2 = Nemo2Parser()
    megatron = MegatronParser(warnings, name)
    events: List[Tuple[Optional[int], str]] = []
    restarts: List[Tuple[int, int]] = []
    prev_step: Dict[int, int] = {}  # per series: the step of its previous line
    last_step: Optional[int] = None
    first_time = last_time = None
    last_head: Optional[str] = None
    target: Dict[int, StepRecord] = {}
    try:
        for seg, head in iter_segments(path, warnings):
            if "\x1b" in seg:
                seg = strip_ansi(seg)
            if head is not last_head:  # a new line: who printed it (cheap unless a step is found)
                last_head = head
                label_known = False
            if NEMO2_ANCHOR in seg:
                parser_hit = "nemo2"
            elif MEGATRON_ANCHOR in seg:
                parser_hit = "megatron"
            elif "=" in seg and "[" in seg:
                parser_hit = "nemo1"
            else:
                parser_hit = None
            if parser_hit is not None:
                if not label_known:
                    label = line_label(strip_ansi(head))
                    label_known = True
                    target = by_label.get(label)
                    if target is None:
                        target = by_label[label] = {}
                        label_order.append(label)
                before = len(target)
                if parser_hit == "nemo2":
                    hit = nemo2.feed(seg, target)
                    step = nemo2.step
                elif parser_hit == "megatron":
                    hit = megatron.feed(seg, target)
                    step = megatron.step
                else:
                    hit = nemo1.feed(seg, target)
                    step = nemo1.last_step
                if hit:
                    if parser_hit != "nemo1" and step is not None:  # (TQDM re-prints: the bar parser's business)
                        prev = prev_step.get(id(target))
                        if prev is not None and step < prev - 1 and len(target) == before:
                            restarts.append((prev, step))  # the same output appended to by a requeued job
                        prev_step[id(target)] = step
                    if step is not None:  # events are placed after the latest step in the file's order
                        last_step = step if parser_hit != "nemo1" or last_step is None else max(last_step, step)
                    if first_time is None or len(target) != before:
                        stamp = timestamp(head)
                        if stamp:
                            first_time = first_time or stamp
                            last_time = stamp
                    if parser_hit != "nemo1":
                        continue  # a whole line: nothing else in it
                    if nemo1.end < 0 or nemo1.end + 1 >= len(seg):
                        continue  # a bare update
                    seg = seg[nemo1.end + 1:]  # a record glued after the update ([NeMo I ...] Saving ...)
            kind = _event_kind(seg) if ("heckpoint" in seg or "alidation" in seg or "val_loss'" in seg
                                        or "saving model" in seg or "Monitored metric" in seg) else None
            if kind is not None:
                if (last_step, kind) not in events[-3:]:
                    events.append((last_step, kind))
            if "[NeMo" in seg[:16] or "[20" in seg[:8]:  # a record with a wall-clock stamp
                stamp = timestamp(seg)
                if stamp:
                    first_time = first_time or stamp
                    last_time = stamp
    except OSError as exc:
        raise UserError(f"cannot read log {path}: {exc.strerror}", "check the path and its permissions") from None
    nemo1.finish()
    megatron.finish()
    restarts = nemo1.restarts + restarts

    counts = {"nemo1": nemo1.updates, "nemo2": nemo2.lines, "megatron": megatron.lines}
    fmt = max(counts, key=counts.get)
    # max_steps: the TQDM bar's total or Megatron's train_iters; never NeMo 2's within-epoch m.
    total = {"nemo1": nemo1.total, "megatron": megatron.total}.get(fmt)
    source_kind = TIMING_MEGATRON if fmt == "megatron" else TIMING_STEP

    if restarts:
        back = "; ".join(f"after step {a} back to step {b}" for a, b in restarts[:3])
        warnings.append(f"{name}: the run restarts inside the file ({back}{' ...' if len(restarts) > 3 else ''}: "
                        "a requeued job appending to the same output?); the rerun's values are used")
    chosen = _choose_series(by_label, label_order, warnings, name)
    steps = [chosen[k] for k in sorted(chosen)]
    if steps and not any(r.timing_s is not None for r in steps) and any(r.rate_s is not None for r in steps):
        for r in steps:
            r.timing_s, r.rate_s = r.rate_s, None
        source_kind = TIMING_TQDM_RATE
        warnings.append(f"{name}: no train_step_timing in the log: step times are TQDM's rate (s/it), a smoothed "
                        "average that also absorbs validation and checkpoint pauses; enable "
                        "exp_manager.log_step_timing for exact figures")
    log = StepLog(name, fmt, steps, warnings, [name], total,
                  [(s if s is not None else -1, k) for s, k in events], source_kind, (first_time, last_time))
    _warn_incomplete(log)
    return log


def _choose_series(by_label: Dict[Optional[str], Dict[int, StepRecord]], order: List[Optional[str]],
                   warnings: List[str], name: str) -> Dict[int, StepRecord]:
    """One process's steps out of several interleaved ones (srun -l ranks, two prefixes)."""
    filled = [lab for lab in order if by_label[lab]]
    if not filled:
        return {}
    if len(filled) == 1:
        return by_label[filled[0]]
    best = max(filled, key=lambda lab: (len(by_label[lab]), -filled.index(lab)))
    others = ", ".join(f"'{lab or 'no prefix'}' ({len(by_label[lab])} steps)" for lab in filled if lab != best)
    warnings.append(f"{name}: steps are printed by more than one process: using '{best or 'no prefix'}' "
                    f"({len(by_label[best])} steps) and ignoring {others}; they are not averaged")
    return by_label[best]


def _warn_incomplete(log: StepLog) -> None:
    """Warn when the log stops before the run's max_steps (job killed, timed out, or still running)."""
    if log.total_steps and log.steps:
        last = log.steps[-1].step + 1
        if last < log.total_steps:
            log.warnings.append(f"{log.source}: stops at step {last} of {log.total_steps} "
                                "(job killed, timed out or still running?)")


# ----------------------------------------------------------------------------- TensorBoard
_TB_TAGS = {TIMING_KEY: "timing_s", LOSS_KEY: "loss", SAMPLES_KEY: "consumed_samples",
            # Megatron-LM / Megatron-Bridge: one value per log interval, at the 1-based iteration
            MEGATRON_TB_TIME: "timing_s", MEGATRON_TB_LOSS: "loss"}


def _tfrecords(path: Path, warnings: List[str]) -> Iterator[bytes]:
    """The records of a TFRecord file; stops with a warning at a truncated or corrupt record.

    Header CRCs are checked for every record; data CRCs in :func:`parse_tensorboard` only for
    records that hold a tag we use (tensorboard's pure-Python crc32c is slow).
    """
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open(path, "rb") as fh:
        offset = 0
        while True:
            header = fh.read(12)
            if not header:
                return
            if len(header) < 12:
                warnings.append(f"{path}: truncated event record at byte {offset}; events after it are missing")
                return
            (length,), (crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            if masked_crc32c(header[:8]) != crc:
                warnings.append(f"{path}: corrupt event record header at byte {offset}; events after it are missing")
                return
            left = os.fstat(fh.fileno()).st_size - fh.tell()
            if length + 4 > left:  # a length header claiming more than the file holds (2**40 bytes...)
                warnings.append(f"{path}: truncated event record at byte {offset}; events after it are missing")
                return
            body = fh.read(length + 4)
            if len(body) < length + 4:
                warnings.append(f"{path}: truncated event record at byte {offset}; events after it are missing")
                return
            offset += 12 + length + 4
            yield body


def _scalar(value) -> Optional[float]:
    """A summary value's float: old-style simple_value or new-style (torch / Lightning) tensor."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        t = value.tensor
        if t.float_val:
            return float(t.float_val[0])
        if t.double_val:
            return float(t.double_val[0])
        from tensorboard.util import tensor_util

        arr = tensor_util.make_ndarray(t)
        return float(arr.reshape(-1)[0]) if arr.size else None
    return None


def event_files(directory: PathLike) -> List[Path]:
    """TensorBoard event files under ``directory`` (recursively), oldest first."""
    directory = Path(directory)
    if directory.is_file():
        return [directory]
    files = [p for p in directory.rglob("events.out.tfevents.*") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime, str(p)))


def parse_tensorboard(directory: PathLike) -> StepLog:
    """Per-step scalars from the TensorBoard event files under ``directory`` (or one event file).

    A step logged twice (a resumed run writing a second event file) keeps the later value, and
    the rewrite is reported. Values are kept as logged (non-positive ones included).
    """
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from google.protobuf.message import DecodeError

    warnings: List[str] = []
    steps: Dict[int, StepRecord] = {}
    files = event_files(directory)
    rewritten: Dict[str, List[int]] = {}
    megatron_tags = nemo_timing = False
    starts: List[Tuple[str, int]] = []  # (file, its first step): a resumed run writes a new event file
    for path in files:
        seen_here: set = set()
        for body in _tfrecords(path, warnings):
            data, (crc,) = body[:-4], struct.unpack("<I", body[-4:])
            try:
                event = event_pb2.Event.FromString(data)
            except DecodeError:
                warnings.append(f"{path}: an undecodable event record was skipped")
                continue
            if not event.HasField("summary"):
                continue
            wanted = [v for v in event.summary.value if v.tag in _TB_TAGS]
            if not wanted:
                continue
            if masked_crc32c(data) != crc:
                warnings.append(f"{path}: an event record failed its CRC check and was skipped")
                continue
            step = int(event.step)
            if not seen_here:
                starts.append((str(path), step))
            if step in steps and step not in seen_here:
                rewritten.setdefault(str(path), []).append(step)
                steps[step] = StepRecord(step)  # a later file rewrites the step: its values win whole
            seen_here.add(step)
            rec = steps.setdefault(step, StepRecord(step))
            for v in wanted:
                if v.tag in (MEGATRON_TB_TIME, MEGATRON_TB_LOSS):
                    megatron_tags = True
                elif v.tag == TIMING_KEY:
                    nemo_timing = True
                x = _scalar(v)
                if x is None or not math.isfinite(x):
                    continue
                setattr(rec, _TB_TAGS[v.tag], x)
    fmt, timing = "tensorboard", TIMING_STEP
    if megatron_tags and not nemo_timing:
        # Megatron's scalars sit at the 1-based iteration and stand for a log interval each.
        spans, gap = interval_spans([k for k, r in steps.items() if r.timing_s is not None] or list(steps))
        shifted: Dict[int, StepRecord] = {}
        for k, rec in steps.items():
            rec.step, rec.span = k - 1, spans.get(k, 1)
            shifted[k - 1] = rec
        steps, timing = shifted, TIMING_MEGATRON
        if gap:
            warnings.append(f"{directory}: {gap}")
    for path, again in rewritten.items():
        warnings.append(f"{path} logs steps {_ranges(again)} again (a restarted run resuming from a checkpoint?): "
                        "its values replace the earlier ones")
    resumed = [(Path(f).name, first) for f, first in starts[1:] if str(f) not in rewritten]
    if resumed:
        warnings.append(f"restart: the run continued in {len(starts)} segments (resumed at step "
                        + ", ".join(str(first) for _, first in resumed)
                        + "); each segment's first steps include its start-up")
    return StepLog(str(directory), fmt, [steps[k] for k in sorted(steps)], warnings, [str(p) for p in files],
                   timing_source=timing)



# ----------------------------------------------------------------------------- run directories
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
    _warn_incomplete(merged)
    return merged


def run_out_files(run_dir: PathLike) -> List[Path]:
    """The job stdout files of a run directory (slurm-<jobid>.out, local-<n>.out), oldest first."""
    run_dir = Path(run_dir)
    files = [p for p in run_dir.glob("*.out") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime, _natural(p.name)))


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def steps_csv(log: StepLog) -> str:
    """The parsed per-step figures as CSV with a header: ``step,seconds,loss`` (empty where the log has
    none). Values are as logged: a Megatron line is one row (its interval's mean, at the interval's
    last step); a glitched timer's negative value is printed as it is."""
    fmt = lambda x: "" if x is None else f"{x:.10g}"  # noqa: E731
    rows = ["step,seconds,loss"]
    rows += [f"{r.step},{fmt(r.timing_s)},{fmt(r.loss)}" for r in log.steps]
    return "\n".join(rows) + "\n"


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


def screen_steps(log: StepLog, require_timing: bool = True) -> None:
    """Leave out impossible steps and timings, saying how many; refuse when most of them are impossible.

    Impossible: a negative or astronomical global step; a timing that is NaN, infinite or above
    MAX_STEP_SECONDS. Zero and negative timings are left to the series cleaning (timer glitches pair up
    with the next step) - but when they are most of the run, no estimate can be honest: refused.
    """
    n = len(log.steps)
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
    nonpositive = [r for r in timed if math.isfinite(r.timing_s) and r.timing_s <= 0]
    unusable = len(absurd) + len(nonpositive)
    if require_timing and unusable * 2 > len(timed):
        raise UserError(f"{unusable} of {len(timed)} step timings in {log.source} are zero, negative, NaN or "
                        f"above {MAX_STEP_SECONDS:g} s: too few real measurements for an estimate",
                        "check the job's timer (exp_manager.log_step_timing) and pass a log with real step times; "
                        "`vdkit validate --steps` lists what was parsed")
    if absurd:
        for r in absurd:
            r.timing_s = None
        log.warnings.insert(0, f"{len(absurd)} of {len(timed)} step timings in {log.source} are NaN, infinite or "
                               f"above {MAX_STEP_SECONDS:g} s: left out of the estimate")


def read_source(path: PathLike, require_timing: bool = True) -> StepLog:
    """The steps of a run directory, a log file, or a TensorBoard event directory / file.

    A run directory uses its TensorBoard events under ``logs/`` when they hold step timings,
    else its ``*.out`` files merged by global step. Raises UserError when there are no steps
    at all, or (``require_timing``) no step times.
    """
    from vdkit.rundir import LOG_DIR

    from vdkit.files import not_a_regular_file

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
        raise UserError(f"no training steps found in {log.source}",
                        "pass a NeMo (1.x or 2.x), Megatron-LM / Megatron-Bridge training log, a run directory "
                        "or a TensorBoard event directory")
    if require_timing and not log.timed:
        raise UserError(f"no '{TIMING_KEY}' values in {log.source} ({len(log.steps)} steps without a time)",
                        "pass a NeMo training log (exp_manager.log_step_timing must be on) or its TensorBoard dir; "
                        "`vdkit validate --steps` still lists the steps it has")
    return log
