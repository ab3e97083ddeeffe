"""What launchers put in front of a training process's output, and how to see through it.

Seen in real logs (tests/fixtures/logs/SOURCES.md):

* srun ``-l`` labels: ``1:  iteration 25/73242187 | ...``, `` 0: Training epoch 0, ...``, and with the
  node: ``[lrdn3321:3]: [2025-03-31 05:54:07] iteration 50/242204 | ...``
* torchx / NeMo-Run: ``retraining/0 [default0]:Training epoch ...``, ``retraining/0 Training epoch ...``
* Ray (NeMo-Run's Ray / SkyPilot executors): ``(pretraining, pid=4112) Training epoch ...``
* Lightning's ``[rank: 1]`` and Megatron's ``[Rank 0]`` tags
* timestamps: ``[2025-10-06 03:27:07]``, ``[2025-11-20T14:55:23+08:00]``, ``[2025-12-17 04:54:49,774]``
* ANSI colour / cursor codes (``\\x1b[A``) and a literal ``^M`` where a carriage return was pasted

The parsers look for their own anchor (``Training epoch``, ``iteration N/M |``, a TQDM counter)
anywhere in a segment, so a prefix never hides a step. This module only answers two questions
about the *line* a step was found on: which process printed it (so interleaved ranks are not
mixed into one series) and when.
"""
from __future__ import annotations

import re
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]")

_LABELS = (
    re.compile(r"^\s*(\d+):\s"),  # srun -l
    re.compile(r"^\s*(?:\[[^\]]*\]\s*)?([A-Za-z_][\w.-]*/\d+)(?: \[(default\d+)\]:|:?\s)"),  # torchx / NeMo-Run
    re.compile(r"^\s*\(([^,()]+), pid=(\d+)\)\s"),  # Ray
    re.compile(r"\[[Rr]ank:? ?(\d+)\]"),  # Lightning [rank: N], Megatron [Rank N]
    re.compile(r"^\s*\[([\w.-]+:\d+)\]:"),  # srun --label with the node: [lrdn3321:3]:
)

_LABEL_STARTS = frozenset(" \t0123456789([")

_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def line_label(head: str) -> Optional[str]:
    """Who printed a line, from its start: ``'1'`` (srun), ``'retraining/0 default0'``, ``'pid=4112'``,
    ``'rank 1'``; None when the line carries no such prefix (one process, or a plain log)."""
    head = head[:200]
    if not head or (head[0] not in _LABEL_STARTS and "/" not in head[:48] and "ank" not in head[:64]):
        return None  # fast path: a line that starts with its own text (Training epoch ..., Epoch 0: ...)
    for i, pattern in enumerate(_LABELS):
        m = pattern.search(head) if i == 3 else pattern.match(head)
        if m:
            if i == 0:
                return m.group(1)
            if i == 1:
                return " ".join(g for g in m.groups() if g)
            if i == 2:
                return f"pid={m.group(2)}"
            if i == 3:
                return f"rank {m.group(1)}"
            return m.group(1)
    return None


def timestamp(text: str) -> Optional[str]:
    """The first ``YYYY-MM-DD HH:MM:SS`` stamp in ``text`` (ISO text, sortable), or None."""
    m = _STAMP.search(text[:120])
    return f"{m.group(1)}T{m.group(2)}" if m else None
