"""Checkpoints: written atomically, found again after a restart.

A checkpoint is ``step=<N>.ckpt`` (torch.save of a dict; the naming and :func:`latest` are every
engine's, :mod:`vdkit.recipes.common.checkpoint`): the trainable parameters, the optimizer state,
the step and the consumed samples. It is written to a hidden temporary file and renamed into place,
so a job killed while saving leaves the previous checkpoint as the latest. The last ``KEEP``
checkpoints are kept. The temporary file a killed save leaves behind is removed
by the next save (pruning) and on resume (:func:`remove_partial`), so none lingers. Its SHA-256 is
written beside it before the rename (:mod:`vdkit.recipes.common.trust`) and verified on resume; a save
that cannot write (full, read-only) removes its temporary file and says which path (exit 74).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from vdkit.errors import UserError
from vdkit.recipes.common import trust
from vdkit.recipes.common.checkpoint import checkpoint_name, superseded

_PARTIAL = re.compile(r"^\.step=\d+\.ckpt\.\d+\.tmp$")  # what save() writes before the rename


def _tmp_name(step: int) -> str:
    return f".step={step}.ckpt.{os.getpid()}.tmp"


def remove_partial(ckpt_dir: Path) -> list:
    """Delete the temporary files of saves that never finished (a job killed mid-write); returns them.

    Only called where no save is in flight: on resume, and by save() itself after its rename
    (one job holds a run dir at a time, see vdkit.run.rundir's lock).
    """
    removed = []
    if Path(ckpt_dir).is_dir():
        for p in Path(ckpt_dir).iterdir():
            orphan_sum = p.name.endswith(trust.SUM_SUFFIX) and trust.DAMAGED_MARK not in p.name \
                and not p.with_name(p.name[:-len(trust.SUM_SUFFIX)]).exists()
            if _PARTIAL.match(p.name) or orphan_sum or (p.name.startswith(".") and p.name.endswith(".tmp")):
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def save(ckpt_dir: Path, step: int, state: dict) -> Path:
    """Write ``state`` as ``step=<step>.ckpt`` atomically and prune old checkpoints. Rank 0 only."""
    import torch

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / checkpoint_name(step)
    tmp = ckpt_dir / _tmp_name(step)
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())  # the data is on disk before the name says it is complete
        trust.write_sum(tmp, final.name)  # the sum first: a published checkpoint always has one
    except (OSError, RuntimeError) as exc:  # torch wraps a failed write in RuntimeError
        tmp.unlink(missing_ok=True)
        trust.sum_file(final).unlink(missing_ok=True)
        raise trust.SaveRefused(f"writing checkpoint {final} failed: {getattr(exc, 'strerror', None) or exc}",
                                "free space there or point run.results_dir at a larger file system; the run "
                                "continues from its last checkpoint") from None
    os.replace(tmp, final)
    for old in superseded(ckpt_dir):
        old.unlink(missing_ok=True)
        trust.sum_file(old).unlink(missing_ok=True)
    remove_partial(ckpt_dir)
    return final


def load(path: Path) -> dict:
    """Read a checkpoint (onto the CPU)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises RuntimeError / pickle errors / EOFError for a bad file
        raise UserError(f"cannot read checkpoint {path} (it has no sum to check it by): {exc}",
                        f"move it aside (mv {path} {path}.damaged); the run then resumes from the previous one") from None
