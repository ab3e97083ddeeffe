"""Checkpoint naming every engine the kit runs shares: where, what a step's checkpoint is called, which is latest.

A checkpoint of step N is ``step=<N>.ckpt`` (a file for the reference engine, a directory of per-rank
files for the megatron engine) in the run's checkpoint directory (:func:`vdkit.rundir.checkpoint_dir`);
the last :data:`KEEP` are kept. Resume finds either engine's checkpoints the same way.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Tuple

KEEP = 2  # checkpoints kept per run (older ones are removed after each save)
CHECKPOINT_NAME = re.compile(r"^step=(\d+)\.ckpt$")


def checkpoint_name(step: int) -> str:
    """The name of step ``step``'s checkpoint: ``step=<N>.ckpt``."""
    return f"step={step}.ckpt"


def checkpoints(ckpt_dir: Path) -> List[Tuple[int, Path]]:
    """(step, path) of every checkpoint in ``ckpt_dir``, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := CHECKPOINT_NAME.match(p.name)))


def latest(ckpt_dir: Path) -> Optional[Path]:
    """The checkpoint with the highest step in ``ckpt_dir``, or None."""
    found = checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def superseded(ckpt_dir: Path, keep: int = KEEP) -> List[Path]:
    """The checkpoints beyond the newest ``keep`` (what a save prunes)."""
    return [p for _, p in checkpoints(ckpt_dir)[:-keep]]


def resume_line(found: Path, step: int, global_batch_size: int) -> str:
    """The log line of a run resuming from checkpoint ``found`` (what validation and the tests read)."""
    return f"[vdkit I] resuming from {found} (global_step {step}, consumed_samples {step * global_batch_size})"
