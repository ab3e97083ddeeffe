"""Per-step timing from NeMo logs: 1.x TQDM progress output, 2.x ProgressPrinter lines, TensorBoard events.

Everything streams: text is read in 1 MiB chunks and split on both ``\\r`` (TQDM's in-place
updates) and ``\\n``; each short segment is parsed on its own (no regex ever runs over the whole
file). The result is one :class:`StepRecord` per global step (the last update of that step wins),
plus warnings for what looked truncated or corrupt. A source with no step timing at all is a
:class:`UserError` naming the file.

Formats (see ../shared/reference/nemo.md):

* NeMo 1.x, one TQDM update (several per line, separated by ``\\r``)::

    Epoch 0: : 42%|████▏     | 21/50 [03:10<04:23, v_num=0, reduced_train_loss=1.234,
    global_step=20.00, consumed_samples=2688.0, train_step_timing in s=9.050][NeMo I ...] ...

  TQDM prints numbers in short form (``2e+3``, ``2.56e+5``), which loses digits past three
  significant figures; the exact step then comes from the bar counter ``21/50``.
* NeMo 2.x ``ProgressPrinter``: ``Training epoch 0, iteration 12/49 | global_step: 12 | ... |
  train_step_timing in s: 9.4 | consumed_samples: 1664``.
* TensorBoard: scalar ``train_step_timing in s`` (and ``reduced_train_loss``, ``consumed_samples``).
"""
from __future__ import annotations

import codecs
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

from vdkit.errors import UserError

# The metric names have one home, shared with the engines that write them.
from vdkit.logformat import CONSUMED_SAMPLES_KEY as SAMPLES_KEY  # noqa: E402
from vdkit.logformat import GLOBAL_STEP_KEY as STEP_KEY  # noqa: E402
from vdkit.logformat import LOSS_KEY, TIMING_KEY  # noqa: E402,F401

CHUNK_BYTES = 1 << 20
# A segment longer than this without a '\r' or '\n' is not a progress update (binary junk,
# a corrupted file): it is dropped with a warning instead of growing memory without bound.
MAX_SEGMENT_CHARS = 1 << 20

PathLike = Union[str, Path]


@dataclass(slots=True)  # slots: a 100,000-step log keeps 100,000 of these
class StepRecord:
    """The values logged for one global step (0-based, as NeMo's ``global_step``)."""

    step: int
    timing_s: Optional[float] = None
    loss: Optional[float] = None
    consumed_samples: Optional[float] = None


@dataclass
class StepLog:
    """The parsed steps of one run (from one or several files), sorted by step."""

    source: str
    format: str  # nemo1 | nemo2 | tensorboard (joined with '+' when files differ)
    steps: List[StepRecord]
    warnings: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    total_steps: Optional[int] = None  # the bar's total (max_steps) when the log shows it

    @property
    def timed(self) -> List[StepRecord]:
        """Steps that carry a step time, in step order."""
        return [s for s in self.steps if s.timing_s is not None]

    @property
    def timings(self) -> List[float]:
        return [s.timing_s for s in self.timed]


# ----------------------------------------------------------------------------- numbers
def _number(text: str) -> Optional[float]:
    """A TQDM / NeMo number (``9.050``, ``2e+3``, ``2.56e+5``); None for empty or non-numeric."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _exact_int(text: str) -> Optional[int]:
    """The integer a number shows exactly (``49.00``, ``1664``), None for short forms (``2e+3``)."""
    text = text.strip()
    if not text or "e" in text.lower():
        return None
    value = _number(text)
    if value is None or value != int(value):
        return None
    return int(value)


def _short_form_matches(step: int, value: float) -> bool:
    """Whether TQDM's 3-significant-figure form of ``step`` is ``value`` (a sanity check)."""
    return float(f"{float(step):.3g}") == value


# ----------------------------------------------------------------------------- streaming text
def iter_segments(path: PathLike, warnings: List[str]) -> Iterator[str]:
    """Yield the segments of a text file split on ``\\r`` and ``\\n``, reading it in chunks.

    Undecodable bytes are replaced (and counted in a warning); an over-long segment is dropped
    with a warning. The last segment is yielded even without a final newline (a truncated log).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    dropped = 0
    bad_chars = 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.read(CHUNK_BYTES)
            text = decoder.decode(raw, final=not raw)
            if "\ufffd" in text or "\x00" in text:
                bad_chars += text.count("\ufffd") + text.count("\x00")
            if not raw and not text:
                break
            text = carry + text
            parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            carry = parts.pop()
            if len(carry) > MAX_SEGMENT_CHARS:
                dropped += 1
                carry = ""
            yield from parts
            if not raw:
                break
    if carry:
        yield carry
    if bad_chars:
        warnings.append(f"{path}: {bad_chars} undecodable or NUL characters (corrupt bytes?) were skipped")
    if dropped:
        warnings.append(f"{path}: {dropped} over-long segment(s) without a line break were skipped")


# ----------------------------------------------------------------------------- NeMo 1.x (TQDM)
_BAR_COUNTER = re.compile(r"(\d+)/(\d+|\?)\s*\[")
_EPOCH = re.compile(r"Epoch (\d+)")


def _split_bar(segment: str) -> Optional[Tuple[Optional[int], int, Optional[int], Dict[str, str], bool]]:
    """One TQDM update -> (epoch, n, total, {metric: text}, complete) or None if it is not one.

    ``complete`` is False when the closing ``]`` is missing (the file was cut mid-update).
    Only the update itself is looked at: text glued after its ``]`` (``[NeMo I ...]``) is ignored.
    """
    if "=" not in segment or "/" not in segment:
        return None
    for m in _BAR_COUNTER.finditer(segment):
        start = m.end()
        end = segment.find("]", start)
        body = segment[start:] if end < 0 else segment[start:end]
        if "=" not in body:
            continue
        metrics: Dict[str, str] = {}
        for item in body.split(","):
            key, sep, value = item.partition("=")
            if sep:
                metrics[key.strip()] = value.strip()
        epoch_m = _EPOCH.search(segment, 0, m.start())
        epoch = int(epoch_m.group(1)) if epoch_m else None
        total = None if m.group(2) == "?" else int(m.group(2))
        return epoch, int(m.group(1)), total, metrics, end >= 0
    return None


class _Nemo1Parser:
    """Turns TQDM updates into steps; remembers per-epoch offsets between bar counter and step.

    Lightning prints the bar twice per step: once right after moving the counter n (still
    showing the previous step's metrics: a *stale* print) and once after setting the new
    metrics. Keyed by an exact ``global_step`` the stale print just repeats the previous step.
    Keyed by the counter (short-form steps), the stale print would claim step n-1 with old
    metrics; it is held back and dropped when the next update has the same n.
    """

    def __init__(self, steps: Dict[int, StepRecord], warnings: List[str], name: str):
        self.steps = steps
        self.warnings = warnings
        self.name = name
        self.offsets: Dict[Optional[int], int] = {}  # epoch -> bar n minus global step
        self.last_step: Optional[int] = None
        self.last_n: Optional[int] = None
        self.last_metrics: Optional[Dict[str, str]] = None
        self.pending: Optional[Tuple[Optional[int], int, Dict[str, str]]] = None  # a possible stale print
        self.total: Optional[int] = None
        self.truncated = 0
        self.approximate = 0
        self.updates = 0

    def feed(self, segment: str) -> bool:
        parsed = _split_bar(segment)
        if parsed is None:
            return False
        epoch, n, total, metrics, complete = parsed
        if not complete:
            # A cut-off update may hold a cut-off number: do not trust any of it.
            self.truncated += 1
            return True
        self.updates += 1
        if total is not None:
            self.total = total
        shown = metrics.get(STEP_KEY)
        exact = _exact_int(shown) if shown is not None else None
        same = metrics == self.last_metrics
        if exact is None and same and self.last_n is not None and n == self.last_n + 1:
            self.pending = (epoch, n, metrics)
            self.last_n = n
            return True
        if self.pending is not None and self.pending[1] != n:
            # The held-back update was not followed by its fresh print: a real step after all.
            p_epoch, p_n, p_metrics = self.pending
            self._record(self._counter_step(p_epoch, p_n, p_metrics.get(STEP_KEY)), p_n, p_metrics)
        self.pending = None
        if exact is not None:
            if not same:  # a stale re-print (n one ahead) must not shift the offset
                self.offsets[epoch] = n - exact
            step = exact
        else:
            step = self._counter_step(epoch, n, shown)
        self._record(step, n, metrics)
        return True

    def _record(self, step: int, n: int, metrics: Dict[str, str]) -> None:
        self.steps[step] = StepRecord(step, _positive(metrics.get(TIMING_KEY)), _number(metrics.get(LOSS_KEY, "")),
                                      _number(metrics.get(SAMPLES_KEY, "")))  # the last update of a step wins
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        self.last_n = n
        self.last_metrics = metrics

    def _counter_step(self, epoch: Optional[int], n: int, shown: Optional[str]) -> int:
        """The step of an update without an exact global_step: bar counter minus the epoch's offset."""
        if epoch not in self.offsets:
            # NeMo shows n = global_step + 1; a later epoch continues after the last step seen.
            self.offsets[epoch] = 1 if self.last_step is None else n - (self.last_step + 1)
        step = n - self.offsets[epoch]
        approx = _number(shown) if shown is not None else None
        if approx is not None and not _short_form_matches(step, approx):
            self.approximate += 1
            step = int(round(approx))
        return step

    def finish(self) -> None:
        if self.truncated:
            self.warnings.append(f"{self.name}: {self.truncated} progress update(s) cut off mid-line were ignored "
                                 "(truncated log?)")
        if self.approximate:
            self.warnings.append(f"{self.name}: {self.approximate} step number(s) known only from TQDM's short "
                                 "form (3 significant digits)")


def _positive(text: Optional[str]) -> Optional[float]:
    value = _number(text) if text is not None else None
    return value if value is not None and value > 0 else None


# ----------------------------------------------------------------------------- NeMo 2.x (ProgressPrinter)
_NEMO2_ITER = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+|\?)")


def _nemo2_line(segment: str) -> Optional[Tuple[int, Optional[int], Dict[str, str]]]:
    """One ProgressPrinter line -> (iteration, total, {metric: text}) or None."""
    if "Training epoch" not in segment:
        return None
    m = _NEMO2_ITER.search(segment)
    if not m:
        return None
    metrics: Dict[str, str] = {}
    for field_text in segment[m.end():].split(" | "):
        key, sep, value = field_text.partition(":")
        if sep:
            metrics[key.strip()] = value.strip()
    total = None if m.group(3) == "?" else int(m.group(3))
    return int(m.group(2)), total, metrics


# ----------------------------------------------------------------------------- text files
def parse_text_log(path: PathLike) -> StepLog:
    """Parse one Slurm .out / NeMo log file (1.x TQDM and 2.x ProgressPrinter lines alike).

    Returns the steps found (possibly none; :func:`read_source` turns that into an error).
    """
    path = Path(path)
    warnings: List[str] = []
    steps: Dict[int, StepRecord] = {}
    nemo1 = _Nemo1Parser(steps, warnings, str(path))
    nemo2_total: Optional[int] = None
    nemo2_lines = 0
    try:
        for segment in iter_segments(path, warnings):
            if nemo1.feed(segment):
                continue
            line = _nemo2_line(segment)
            if line is None:
                continue
            iteration, total, metrics = line
            nemo2_lines += 1
            nemo2_total = total if total is not None else nemo2_total
            step = _exact_int(metrics.get(STEP_KEY, "")) if STEP_KEY in metrics else None
            step = iteration if step is None else step
            steps[step] = StepRecord(step, _positive(metrics.get(TIMING_KEY)), _number(metrics.get(LOSS_KEY, "")),
                                     _number(metrics.get(SAMPLES_KEY, "")))
    except OSError as exc:
        raise UserError(f"cannot read log {path}: {exc.strerror}", "check the path and its permissions") from None
    nemo1.finish()
    fmt = "nemo2" if nemo2_lines > nemo1.updates else "nemo1"
    total = nemo2_total if fmt == "nemo2" else nemo1.total
    if fmt == "nemo2" and total is not None:
        total += 1  # ProgressPrinter shows the last iteration index (49 of 0..49)
    log = StepLog(str(path), fmt, [steps[k] for k in sorted(steps)], warnings, [str(path)], total)
    _warn_incomplete(log)
    return log


def _warn_incomplete(log: StepLog) -> None:
    """Warn when the log stops before the bar's total (job killed, timed out, or still running)."""
    if log.total_steps and log.steps and log.steps[-1].step + 1 < log.total_steps:
        log.warnings.append(f"{log.source}: stops at step {log.steps[-1].step + 1} of {log.total_steps} "
                            "(job killed, timed out or still running?)")


# ----------------------------------------------------------------------------- TensorBoard
_TB_TAGS = {TIMING_KEY: "timing_s", LOSS_KEY: "loss", SAMPLES_KEY: "consumed_samples"}


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

    A step logged twice (a resumed run writing a second event file) keeps the later value.
    """
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from google.protobuf.message import DecodeError

    warnings: List[str] = []
    steps: Dict[int, StepRecord] = {}
    files = event_files(directory)
    for path in files:
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
            rec = steps.setdefault(int(event.step), StepRecord(int(event.step)))
            for v in wanted:
                x = _scalar(v)
                if x is None or not math.isfinite(x):
                    continue
                if v.tag == TIMING_KEY and x <= 0:
                    continue
                setattr(rec, _TB_TAGS[v.tag], x)
    return StepLog(str(directory), "tensorboard", [steps[k] for k in sorted(steps)], warnings,
                   [str(p) for p in files])


# ----------------------------------------------------------------------------- sources
def merge_logs(source: str, logs: Iterable[StepLog]) -> StepLog:
    """Merge several logs of one run (Slurm requeues) by global step; later logs win a step."""
    logs = list(logs)
    steps: Dict[int, StepRecord] = {}
    warnings: List[str] = []
    files: List[str] = []
    formats: List[str] = []
    total = None
    for log in logs:
        for rec in log.steps:
            steps[rec.step] = rec
        warnings.extend(log.warnings)
        files.extend(log.files)
        total = log.total_steps or total
        if log.format not in formats:
            formats.append(log.format)
    merged = StepLog(source, "+".join(formats) or "none", [steps[k] for k in sorted(steps)], [], files, total)
    # A requeued job's earlier file stopping early is expected: judge completeness on the merge.
    merged.warnings = [w for w in warnings if "stops at step" not in w]
    _warn_incomplete(merged)
    return merged


def run_out_files(run_dir: PathLike) -> List[Path]:
    """The job stdout files of a run directory (slurm-<jobid>.out, local-<n>.out), oldest first."""
    run_dir = Path(run_dir)
    files = [p for p in run_dir.glob("*.out") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime, _natural(p.name)))


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def read_source(path: PathLike) -> StepLog:
    """The steps of a run directory, a log file, or a TensorBoard event directory / file.

    A run directory uses its TensorBoard events under ``logs/`` when they hold step timings,
    else its ``*.out`` files merged by global step. Raises UserError when there is no step
    timing at all.
    """
    from vdkit.rundir import LOG_DIR

    p = Path(path)
    if not p.exists():
        raise UserError(f"{p} does not exist", "pass a run directory, a Slurm .out / NeMo log file, "
                                               "or a TensorBoard event directory")
    if p.is_file():
        log = parse_tensorboard(p) if p.name.startswith("events.out.tfevents.") else parse_text_log(p)
    else:
        log = None
        tb_root = p / LOG_DIR if (p / LOG_DIR).is_dir() else p
        if event_files(tb_root):
            log = parse_tensorboard(tb_root)
            log.source = str(p)
        if log is None or not log.timed:
            outs = run_out_files(p)
            if outs:
                log = merge_logs(str(p), [parse_text_log(f) for f in outs])
        if log is None:
            raise UserError(f"no step timing in {p}: no TensorBoard events under it and no *.out files",
                            "pass a run directory after its job ran, a Slurm .out file, or an event directory")
    if not log.timed:
        raise UserError(f"no '{TIMING_KEY}' values in {log.source}",
                        "pass a NeMo training log (exp_manager.log_step_timing must be on) or its TensorBoard dir")
    return log
