"""Benchmark: the kit's TensorBoard reader (vdkit.validation.tensorboard_events) beside tensorboard's own loaders.

Writes one event file of --steps steps x 10 scalars (NeMo's step timer and loss among them), then prints
the CPU seconds each reader takes to get the kit's tags out of it: ``parse_tensorboard``,
tensorboard's ``RawEventFileLoader`` + ``event_pb2`` and its ``EventFileLoader``. Why the kit keeps its
own reader (warnings for truncated records, the length check, CRCs only where a tag is used) is in
the module's docstring; these are the speed figures. Figures, no assertions.

    python benchmarks/bench_tensorboard_reader.py [--steps 20000]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from vdkit.run.logformat import CONSUMED_SAMPLES_KEY, LOSS_KEY, TIMING_KEY  # the metric names' home

OTHER_TAGS = ("lr", "epoch", "global_step", "grad_norm", "val_loss", "train_backward_timing in s",
              "train_forward_timing in s")


def write_events(directory: Path, steps: int) -> Path:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(directory))
    for step in range(steps):
        for tag in (TIMING_KEY, LOSS_KEY, CONSUMED_SAMPLES_KEY) + OTHER_TAGS:
            value = summary_pb2.Summary.Value(tag=tag, simple_value=1.0 + 0.001 * step)
            w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    w.close()
    return sorted(directory.glob("events.out.tfevents.*"))[-1]


def cpu(fn) -> tuple:
    t0 = time.process_time()
    n = fn()
    return time.process_time() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    args = ap.parse_args()
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader, RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    from vdkit.validation.tensorboard_events import _TB_TAGS, _scalar, parse_tensorboard

    def tb_loader(raw: bool) -> int:
        steps: dict = {}
        loader = RawEventFileLoader(str(path)) if raw else EventFileLoader(str(path))
        for item in loader.Load():
            event = event_pb2.Event.FromString(item) if raw else item
            if event.HasField("summary"):
                for v in event.summary.value:
                    if v.tag in _TB_TAGS:
                        steps.setdefault(event.step, {})[v.tag] = _scalar(v)
        return len(steps)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_events(Path(tmp), args.steps)
        print(f"event file: {path.stat().st_size / 1e6:.1f} MB, {args.steps} steps x {3 + len(OTHER_TAGS)} scalars")
        for name, fn in (("vdkit parse_tensorboard", lambda: len(parse_tensorboard(path).steps)),
                         ("tensorboard RawEventFileLoader + event_pb2", lambda: tb_loader(True)),
                         ("tensorboard EventFileLoader", lambda: tb_loader(False))):
            seconds, n = cpu(fn)
            print(f"{name:<44} {seconds:6.2f} s CPU  ({n} steps)")


if __name__ == "__main__":
    main()
