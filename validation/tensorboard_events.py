"""Per-step scalars from TensorBoard event files: NeMo's / the kit's engines' tags and Megatron-LM /
Megatron-Bridge's ``iteration-time`` / ``lm loss`` (one value per log interval, at the 1-based iteration).

The records are read here rather than through tensorboard's ``EventFileLoader`` /
``RawEventFileLoader``: those stop at a truncated or corrupt record with a debug-level log line only
(``event_file_loader.py`` swallows ``DataLossError``), where a run's figures need a warning naming the
file and the byte offset; a length header claiming more than the file holds is refused here before it
is read; and a record's data CRC is checked only when it holds a tag we use (``EventFileLoader``,
which also converts every value to a tensor, took 4x this reader's CPU time on a 20,000-step file). The events themselves are decoded with
tensorboard's own protobuf (``event_pb2``) and its tensor reader.
"""
from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

# The metric names have one home, shared with the engines that write them.
from vdkit.run.logformat import CONSUMED_SAMPLES_KEY as SAMPLES_KEY, LOSS_KEY, TIMING_KEY
from vdkit.validation.megatron import interval_spans
from vdkit.validation.steps import TIMING_MEGATRON, TIMING_STEP, StepLog, StepRecord, step_ranges as _ranges

MEGATRON_TB_TIME = "iteration-time"  # seconds per iteration, the mean over the log interval
MEGATRON_TB_LOSS = "lm loss"

PathLike = Union[str, Path]


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
