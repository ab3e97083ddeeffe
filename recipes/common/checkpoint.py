"""Checkpoint naming every engine the kit runs shares: where, what a step's checkpoint is called, which is latest.

A checkpoint of step N is ``step=<N>.ckpt`` (a file for the reference engine, a directory of per-rank
files for the megatron engine) in the run's checkpoint directory (:func:`vdkit.run.rundir.checkpoint_dir`);
the last :data:`KEEP` are kept. Resume finds either engine's checkpoints the same way.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Tuple

# Checkpoints kept per run (older ones are removed after each save), besides the best (run.mode=train): the plan's
# retention, whose one home is the checkpoint policy (pure, imports nothing from the kit: light for a rank).
from vdkit.planner.checkpoint_policy import KEEP
BEST_FILE = "best.json"  # run.mode=train: {"step", "validation_loss"} of the lowest validation loss so far
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
    """The checkpoints beyond the newest ``keep`` (what a save prunes); the best (best.json) is kept."""
    best = read_best(ckpt_dir)
    keep_step = best["step"] if best else None
    return [p for s, p in checkpoints(ckpt_dir)[:-keep] if s != keep_step]


def read_best(ckpt_dir: Path) -> Optional[dict]:
    """best.json of ``ckpt_dir`` ({"step", "validation_loss"}), or None."""
    import json

    try:
        return json.loads((Path(ckpt_dir) / BEST_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_best(ckpt_dir: Path, step: int, validation_loss: float) -> dict:
    """Record step ``step``'s checkpoint as the best (written whole: temporary file, then rename)."""
    import json
    import os

    best = {"step": int(step), "validation_loss": float(validation_loss), "checkpoint": checkpoint_name(step)}
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)  # the first save may come right after
    tmp = Path(ckpt_dir) / f".{BEST_FILE}.tmp"
    tmp.write_text(json.dumps(best) + "\n")
    os.replace(tmp, Path(ckpt_dir) / BEST_FILE)
    return best


def resume_line(found: Path, step: int, global_batch_size: int) -> str:
    """The log line of a run resuming from checkpoint ``found`` (what validation and the tests read)."""
    return f"[vdkit I] resuming from {found} (global_step {step}, consumed_samples {step * global_batch_size})"
