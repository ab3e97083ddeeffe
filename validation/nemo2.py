"""NeMo 2.x ``ProgressPrinter`` lines.

::

    Training epoch 0, iteration 12/49 | lr: 1.2e-05 | global_step: 12 | reduced_train_loss: 2.1 |
    train_step_timing in s: 9.4 | consumed_samples: 1664

``iteration i/m`` counts batches *within the epoch* (``m`` is the epoch's last batch index, not
max_steps: a run of 1000 steps over epochs of 19 batches prints ``iteration 10/999`` at step 29),
so the step is ``global_step`` when printed, else the iteration continued across epochs; the
total is never taken from here. A value is the number it starts with: anything a user or a
later field appended after it is ignored.
"""
from __future__ import annotations

import re
from typing import Dict, Optional

from vdkit.run.logformat import CONSUMED_SAMPLES_KEY as SAMPLES_KEY, GLOBAL_STEP_KEY as STEP_KEY, LOSS_KEY, TIMING_KEY
from vdkit.validation.numbers import exact_int, loss, number, timing
from vdkit.validation.steps import StepRecord

ANCHOR = "Training epoch"
_ITER = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+|\?)")


class Nemo2Parser:
    """ProgressPrinter lines -> steps."""

    def __init__(self):
        self.lines = 0
        self.epoch_start: Dict[int, int] = {}  # epoch -> global step of its iteration 0 (when global_step is absent)
        self.last_step: Optional[int] = None  # the highest step seen
        self.step: Optional[int] = None  # the step of the latest line

    def feed(self, segment: str, steps: Dict[int, StepRecord]) -> bool:
        """Parse one segment into ``steps``; True if it was a ProgressPrinter line."""
        m = _ITER.search(segment)
        if not m:
            return False
        rest = segment[m.end():]
        epoch, iteration = int(m.group(1)), int(m.group(2))
        step = exact_int(_field(rest, _STEP))
        if step is None:
            if epoch not in self.epoch_start:
                self.epoch_start[epoch] = 0 if self.last_step is None else self.last_step + 1 - iteration
            step = self.epoch_start[epoch] + iteration
        self.lines += 1
        self.step = step
        self.last_step = step if self.last_step is None or step > self.last_step else self.last_step
        steps[step] = StepRecord(step, timing(_field(rest, _TIMING)), loss(_field(rest, _LOSS)),
                                 number(_field(rest, _SAMPLES)))
        return True


_STEP, _TIMING, _LOSS, _SAMPLES = (f"| {key}:" for key in (STEP_KEY, TIMING_KEY, LOSS_KEY, SAMPLES_KEY))


def _field(rest: str, key: str) -> Optional[str]:
    """The text of field ``key`` (``'| name:'``) in the rest of a ProgressPrinter line, or None."""
    i = rest.find(key)
    if i < 0:
        return None
    i += len(key)
    j = rest.find("|", i)
    return rest[i:] if j < 0 else rest[i:j]
