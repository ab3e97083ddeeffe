"""Megatron-LM / Megatron-Bridge / Megatron-DeepSpeed ``training_log`` lines.

::

     iteration       25/73242187 | consumed samples:           50 | elapsed time per iteration (ms): 87.0 |
     learning rate: 1.638E-08 | global batch size:     2 | lm loss: 1.086954E+01 | loss scale: ...
     iteration      100/     300 | elapsed time per iteration (ms): 1048.5 | learning rate 1.258E-04 |
     lm loss 4.799004E+00 | loss scale 32768.0 |                       (2019 form: no colons)

One line per ``--log-interval`` iterations; its time and loss are means over the interval.
Such a line becomes one record of ``span`` = the interval at its mean (never ``span`` invented
samples). The interval is the usual spacing between consecutive lines; a larger jump is lines
missing from the log, not a longer interval. The first line of a log covers one interval too;
a lone line covers every iteration since the start (Megatron times the first interval from
the start of training). ``iteration N`` (1-based) is step ``N - 1``; ``N/M``'s M is train_iters.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Dict, List, Optional, Tuple

from vdkit.validation.numbers import loss, number, timing
from vdkit.validation.steps import StepRecord

ANCHOR = "elapsed time per iteration"
_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELDS = (("elapsed time per iteration (ms)", "ms"), ("lm loss", "loss"), ("consumed samples", "samples"))


class MegatronParser:
    """training_log lines -> interval records (spans assigned in :meth:`finish`)."""

    def __init__(self, warnings: List[str], name: str):
        self.warnings = warnings
        self.name = name
        self.lines = 0
        self.last_step: Optional[int] = None  # the highest step seen
        self.step: Optional[int] = None  # the step of the latest line
        self.total: Optional[int] = None
        self.order: List[Tuple[int, Dict[int, StepRecord]]] = []  # (iteration, the dict it went into)

    def feed(self, segment: str, steps: Dict[int, StepRecord]) -> bool:
        m = _ITER.search(segment)
        if not m:
            return False
        rest = segment[m.end():]
        values: Dict[str, Optional[float]] = {}
        for key, name in _FIELDS:
            i = rest.find(key)
            if i >= 0 and (i == 0 or rest[i - 1] in " |"):
                i += len(key)
                j = rest.find("|", i)
                text = (rest[i:] if j < 0 else rest[i:j]).lstrip(" :")
                values[name] = loss(text) if name == "loss" else timing(text) if name == "ms" else number(text)
        if "ms" not in values:
            return False
        iteration = int(m.group(1))
        self.total = int(m.group(2))
        ms = values["ms"]
        step = iteration - 1
        steps[step] = StepRecord(step, None if ms is None else ms / 1000.0, values.get("loss"), values.get("samples"))
        self.order.append((iteration, steps))
        self.lines += 1
        self.step = step
        self.last_step = step if self.last_step is None or step > self.last_step else self.last_step
        return True

    def finish(self) -> None:
        """Give every record its span (the log interval) and warn about iterations missing from the log."""
        by_dict: Dict[int, List[int]] = {}
        dicts: Dict[int, Dict[int, StepRecord]] = {}
        for iteration, steps in self.order:
            by_dict.setdefault(id(steps), []).append(iteration)
            dicts[id(steps)] = steps
        for key, iterations in by_dict.items():
            spans, warning = interval_spans(iterations)
            for it, span in spans.items():
                dicts[key][it - 1].span = span
            if warning:
                self.warnings.append(f"{self.name}: {warning}")


def interval_spans(iterations: List[int]) -> Tuple[Dict[int, int], Optional[str]]:
    """{iteration: iterations its logged mean stands for} for Megatron's logged iterations (1-based),
    and a warning naming iterations missing from the log (None when there are none)."""
    its = sorted(set(iterations))
    gaps = Counter(b - a for a, b in zip(its, its[1:]))
    interval = None
    if gaps:  # the most common spacing; the smallest wins a tie (a missing line makes a larger one)
        top = max(gaps.values())
        interval = min(g for g, c in gaps.items() if c == top)
    spans: Dict[int, int] = {}
    missing = []
    for i, it in enumerate(its):
        if interval is None:
            spans[it] = it  # a lone line: every iteration since the start of training
        elif i == 0:
            spans[it] = min(interval, it)
        else:
            spans[it] = min(interval, it - its[i - 1])
            if it - its[i - 1] > interval:
                missing.append((its[i - 1], it))
    warning = None
    if missing:
        first = ", ".join(f"{a + 1}-{b - interval}" for a, b in missing[:3])
        warning = (f"the log skips iteration(s) {first}{' ...' if len(missing) > 3 else ''} (lines missing; each "
                   f"line still stands for its own interval of {interval})")
    return spans, warning
