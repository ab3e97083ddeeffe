"""NeMo 1.x progress output: Lightning's TQDM bar, one update per step (several per line, ``\\r``-separated).

::

    Epoch 0: : 42%|████▏     | 21/50 [03:10<04:23, v_num=0, reduced_train_loss=1.234,
    global_step=20.00, consumed_samples=2688.0, train_step_timing in s=9.050][NeMo I ...] ...
    Epoch 1: : 1it [00:04,  4.36s/it, v_num=d3c7, ..., train_step_timing in s=3.370, ...]   (no total)

TQDM prints numbers in short form (``2e+3``, ``2.56e+5``), which loses digits past three
significant figures; the exact step then comes from the bar counter ``21/50``. A bar without
``train_step_timing`` still shows TQDM's rate (``41.36s/it``, ``1.27it/s``): it is kept apart
(``rate_s``) as a clearly labelled fallback.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

# The metric names have one home, shared with the engines that write them (vdkit.run.logformat).
from vdkit.run.logformat import CONSUMED_SAMPLES_KEY as SAMPLES_KEY, GLOBAL_STEP_KEY as STEP_KEY, LOSS_KEY, TIMING_KEY
from vdkit.validation.numbers import exact_int, loss, number, short_form_matches, timing as step_timing
from vdkit.validation.steps import StepRecord

_BAR_COUNTER = re.compile(r"(\d+)(?:/(\d+|\?)|it)\s*\[")
_EPOCH = re.compile(r"Epoch (\d+)")
_RATE = re.compile(r"([\d.]+)\s*(s/it|it/s)")


def split_bar(segment: str) -> Optional[Tuple[Optional[int], int, Optional[int], str, int, str]]:
    """One TQDM update -> (epoch, n, total, metrics text, end, timing text) or None.

    ``end`` is the index of the update's closing ``]``, -1 when it is missing (the file was cut
    mid-update).
    Only the update itself is looked at: text glued after its ``]`` (``[NeMo I ...]``) is ignored.
    The timing text is what precedes the first metric (``03:10<04:23, 0.11it/s``); the metrics
    text is ``k=v, k=v, ...`` (see :func:`parse_metrics`).
    """
    if "=" not in segment:
        return None
    for m in _BAR_COUNTER.finditer(segment):
        start = m.end()
        end = segment.find("]", start)
        body = segment[start:] if end < 0 else segment[start:end]
        eq = body.find("=")
        if eq < 0:
            continue
        cut = body.rfind(",", 0, eq)
        epoch_m = _EPOCH.search(segment, 0, m.start())
        epoch = int(epoch_m.group(1)) if epoch_m else None
        total = None if m.group(2) in (None, "?") else int(m.group(2))
        return epoch, int(m.group(1)), total, body[cut + 1:], end, body[:max(cut, 0)]
    return None


def parse_metrics(text: str) -> Dict[str, str]:
    """``v_num=0, reduced_train_loss=1.234`` -> {name: value text}."""
    return {k.strip(): v for k, sep, v in (item.partition("=") for item in text.split(",")) if sep}


def rate_seconds(timing_text: str) -> Optional[float]:
    """Seconds per iteration from TQDM's rate field (``41.36s/it`` or ``1.27it/s``)."""
    m = _RATE.search(timing_text)
    if not m:
        return None
    value = number(m.group(1))
    if not value or value <= 0:
        return None
    return value if m.group(2) == "s/it" else 1.0 / value


class Nemo1Parser:
    """Turns TQDM updates into steps; remembers per-epoch offsets between bar counter and step.

    Lightning prints the bar twice per step: once right after moving the counter n (still
    showing the previous step's metrics: a *stale* print) and once after setting the new
    metrics. Keyed by an exact ``global_step`` the stale print just repeats the previous step.
    Keyed by the counter (short-form steps), the stale print would claim step n-1 with old
    metrics; it is held back and dropped when the next update has the same n.
    """

    def __init__(self, warnings: List[str], name: str):
        self.warnings = warnings
        self.name = name
        self.offsets: Dict[Optional[int], int] = {}  # epoch -> bar n minus global step
        self.last_step: Optional[int] = None
        self.last_n: Optional[int] = None
        self.last_metrics: Optional[Dict[str, str]] = None
        self.last_text: Optional[str] = None
        self.pending: Optional[Tuple[Optional[int], int, Dict[str, str], str, dict]] = None  # a possible stale print
        self.total: Optional[int] = None
        self.truncated = 0
        self.approximate = 0
        self.updates = 0
        self.restarts: List[Tuple[int, int]] = []  # (last step, the step it went back to)
        self.end = -1  # where the latest update closed in its segment (text glued after it follows)

    def feed(self, segment: str, steps: Dict[int, StepRecord]) -> bool:
        """Parse one segment into ``steps``; True if it was a TQDM update."""
        parsed = split_bar(segment)
        if parsed is None:
            return False
        epoch, n, total, metrics_text, end, timing_text = parsed
        self.end = end
        if end < 0:
            # A cut-off update may hold a cut-off number: do not trust any of it.
            self.truncated += 1
            return True
        self.updates += 1
        if total is not None:
            self.total = total
        same = metrics_text == self.last_text
        metrics = self.last_metrics if same else parse_metrics(metrics_text)
        shown = metrics.get(STEP_KEY)
        exact = exact_int(shown)
        if same and exact is not None and exact == self.last_step and self.pending is None:
            self.last_n = n  # Lightning's stale re-print of the step just recorded
            return True
        if exact is None and same and self.last_n is not None and n == self.last_n + 1:
            self.pending = (epoch, n, metrics, timing_text, steps)
            self.last_n = n
            return True
        if self.pending is not None and self.pending[1] != n:
            # The held-back update was not followed by its fresh print: a real step after all.
            p_epoch, p_n, p_metrics, p_timing, p_steps = self.pending
            self._record(p_steps, self._counter_step(p_epoch, p_n, p_metrics.get(STEP_KEY)), p_n, p_metrics, p_timing)
        self.pending = None
        if exact is not None:
            if not same and self.last_step is not None and exact < self.last_step - 1 and exact in steps:
                self.restarts.append((self.last_step, exact))  # a requeued job appending to the same file
                self.last_step = exact
            if not same:  # a stale re-print (n one ahead) must not shift the offset
                self.offsets[epoch] = n - exact
            step = exact
        else:
            step = self._counter_step(epoch, n, shown)
        self._record(steps, step, n, metrics, timing_text)
        self.last_text = metrics_text
        return True

    def _record(self, steps: Dict[int, StepRecord], step: int, n: int, metrics: Dict[str, str],
                timing_text: str) -> None:
        timing_value = metrics.get(TIMING_KEY)
        rate = rate_seconds(timing_text) if timing_value is None else None
        timing = step_timing(timing_value)  # kept: read_source counts and reports non-finite timings
        steps[step] = StepRecord(step, timing, loss(metrics.get(LOSS_KEY)),
                                 number(metrics.get(SAMPLES_KEY)), 1, rate)  # the last update of a step wins
        self.last_step = step if self.last_step is None or step > self.last_step else self.last_step
        self.last_n = n
        self.last_metrics = metrics

    def _counter_step(self, epoch: Optional[int], n: int, shown: Optional[str]) -> int:
        """The step of an update without an exact global_step: bar counter minus the epoch's offset."""
        if epoch not in self.offsets:
            # NeMo shows n = global_step + 1; a later epoch continues after the last step seen.
            self.offsets[epoch] = 1 if self.last_step is None else n - (self.last_step + 1)
        step = n - self.offsets[epoch]
        approx = number(shown)
        if approx is not None and not short_form_matches(step, approx):
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
