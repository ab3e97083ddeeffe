"""Checkpoints: written atomically, found again after a restart.

A checkpoint is ``step=<N>.ckpt`` (torch.save of a dict): the trainable parameters, the
optimizer state, the step and the consumed samples. It is written to a hidden temporary file and
renamed into place, so a job killed while saving leaves the previous checkpoint as the latest.
The last ``KEEP`` checkpoints are kept.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError

KEEP = 2
_NAME = re.compile(r"^step=(\d+)\.ckpt$")


def checkpoint_dir(recipe, run_dir: Path) -> Path:
    """The run's checkpoint directory (the results-root rule lives in :func:`vdkit.rundir.checkpoint_dir`)."""
    from vdkit.rundir import checkpoint_dir as run_checkpoint_dir

    return run_checkpoint_dir(recipe, run_dir)


def latest(ckpt_dir: Path) -> Optional[Path]:
    """The checkpoint with the highest step in ``ckpt_dir``, or None."""
    best, best_step = None, -1
    if Path(ckpt_dir).is_dir():
        for p in Path(ckpt_dir).iterdir():
            m = _NAME.match(p.name)
            if m and int(m.group(1)) > best_step:
                best, best_step = p, int(m.group(1))
    return best


def save(ckpt_dir: Path, step: int, state: dict) -> Path:
    """Write ``state`` as ``step=<step>.ckpt`` atomically and prune old checkpoints. Rank 0 only."""
    import torch

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step={step}.ckpt"
    tmp = ckpt_dir / f".step={step}.ckpt.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())  # the data is on disk before the name says it is complete
    os.replace(tmp, final)
    steps = sorted((int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _NAME.match(p.name)))
    for _, old in steps[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def load(path: Path) -> dict:
    """Read a checkpoint (onto the CPU)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises RuntimeError / pickle errors / EOFError for a bad file
        raise UserError(f"cannot read checkpoint {path}: {exc}",
                        "delete the damaged checkpoint file; the run resumes from the previous one") from None
