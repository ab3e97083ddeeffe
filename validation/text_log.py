"""One text log (a Slurm .out, a NeMo or Megatron log) -> a :class:`~.steps.StepLog`, every text format, mixed or not.

The file streams in segments (:mod:`.segments`); each segment goes to the parser of the format whose
anchor it carries (:mod:`.nemo1` TQDM bars, :mod:`.nemo2` ProgressPrinter lines, :mod:`.megatron`
``training_log`` lines); launcher prefixes (srun labels, torchx / NeMo-Run / Ray prefixes,
timestamps, rank tags, ANSI codes) are read by :mod:`.prefixes`. Checkpoint and validation events
between steps, restarts inside the file and several processes' interleaved steps are recorded or
named in a warning; values are kept as logged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from vdkit.errors import UserError
from vdkit.validation.megatron import ANCHOR as MEGATRON_ANCHOR, MegatronParser
from vdkit.validation.nemo1 import Nemo1Parser
from vdkit.validation.nemo2 import ANCHOR as NEMO2_ANCHOR, Nemo2Parser
from vdkit.validation.prefixes import line_label, strip_ansi, timestamp
from vdkit.validation.segments import PathLike, iter_segments
from vdkit.validation.steps import (EVENT_CHECKPOINT, EVENT_VALIDATION, TIMING_MEGATRON, TIMING_STEP,
                                    TIMING_TQDM_RATE, StepLog, StepRecord, warn_incomplete)


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
    backwards = repeats = 0
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
                        elif prev is not None and step < prev and len(target) != before:
                            backwards += 1  # a new step below the last: a counter that goes down
                        elif prev is not None and step == prev and len(target) == before:
                            repeats += 1  # the same line again: ranks writing one file without labels
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
    if backwards:
        warnings.append(f"{name}: the step counter goes backwards {backwards} time(s) (a new step below the one "
                        "before it): not one run's log in order? the steps are used in step order")
    if repeats:
        warnings.append(f"{name}: {repeats} progress line(s) repeat an earlier line unlabelled (several ranks "
                        "writing one file without srun --label?): each step is counted once")
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
    warn_incomplete(log)
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
