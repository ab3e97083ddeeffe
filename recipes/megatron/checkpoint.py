"""Per-rank checkpoints, published atomically as one directory per step.

``<checkpoints>/step=<N>.ckpt/rank<R>.pt`` holds rank R's trainable parameters, its optimizer's
inner state (Adam moments and step counters; fp32 master copies under mixed precision) and the step.
Each rank writes its file under a hidden ``.step=<N>.ckpt.tmp`` directory (write, fsync, rename);
after a barrier rank 0 renames the directory into place, so a job killed while saving leaves the
previous step as the latest. What a killed save leaves (the hidden directory, a rank's
``.rank<R>.pt.<pid>.tmp``) is removed before every save and on resume (:func:`remove_partial`), so a
published ``step=<N>.ckpt`` holds exactly one ``rank<R>.pt`` per rank and nothing else. The location and
the name pattern are every engine's (:mod:`vdkit.recipes.common.checkpoint`): resume finds either
engine's checkpoints the same way.
A checkpoint resumes only the layout that wrote it (same TP, PP, VP, DP, method).
Each rank's file gets its SHA-256 beside it (``rank<R>.pt.sha256``, :mod:`vdkit.recipes.common.trust`)
before the directory is published; each rank verifies its own on resume.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from vdkit.errors import UserError
from vdkit.recipes.common import trust
from vdkit.recipes.common.checkpoint import checkpoint_name, superseded


_PARTIAL_DIR = re.compile(r"^\.step=\d+\.ckpt\.tmp$")


def remove_partial(ckpt_dir: Path) -> list:
    """Rank 0, while no save is in flight: delete what killed saves left; returns the removed paths."""
    removed = []
    if Path(ckpt_dir).is_dir():
        for p in Path(ckpt_dir).iterdir():
            if _PARTIAL_DIR.match(p.name):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def _tmp_dir(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f".step={step}.ckpt.tmp"


def rank_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rank{rank:05d}.pt"


def write_rank(ckpt_dir: Path, step: int, rank: int, state: dict) -> None:
    """Rank ``rank``'s part of step ``step`` (into the hidden directory; :func:`publish` makes it visible)."""
    import torch

    tmp_dir = _tmp_dir(ckpt_dir, step)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    final = rank_file(tmp_dir, rank)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        trust.write_sum(tmp, final.name)
    except (OSError, RuntimeError) as exc:  # torch wraps a failed write in RuntimeError
        tmp.unlink(missing_ok=True)
        raise trust.SaveRefused(f"writing checkpoint {final} failed: {getattr(exc, 'strerror', None) or exc}",
                                "free space there or point run.results_dir at a larger file system; the run "
                                "continues from its last checkpoint") from None
    os.replace(tmp, final)


def publish(ckpt_dir: Path, step: int, world: int) -> Path:
    """Rank 0, after every rank wrote: rename the step's directory into place; keep the last KEEP."""
    ckpt_dir = Path(ckpt_dir)
    tmp_dir, final = _tmp_dir(ckpt_dir, step), ckpt_dir / checkpoint_name(step)
    missing = [r for r in range(world)
               if not (rank_file(tmp_dir, r).is_file() and trust.sum_file(rank_file(tmp_dir, r)).is_file())]
    if missing:
        raise RuntimeError(f"checkpoint step {step}: ranks {missing[:4]} wrote nothing")
    expected = {n for r in range(world) for n in (rank_file(tmp_dir, r).name, trust.sum_file(rank_file(tmp_dir, r)).name)}
    for stray in tmp_dir.iterdir():  # nothing but this save's rank files is published
        if stray.name not in expected:
            shutil.rmtree(stray, ignore_errors=True) if stray.is_dir() else stray.unlink(missing_ok=True)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp_dir, final)
    for old in superseded(ckpt_dir):
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    return final


def load_rank(path: Path, rank: int) -> dict:
    """Rank ``rank``'s part of a checkpoint directory."""
    import torch

    f = rank_file(path, rank)
    if not f.is_file():
        raise UserError(f"checkpoint {path} has no file for rank {rank} (written by another layout?)",
                        "resume with the layout that wrote it, or move the checkpoints away")
    try:
        return torch.load(f, map_location="cpu", weights_only=False)
    except Exception as exc:  # a damaged file: torch raises RuntimeError / pickle errors / EOFError
        raise UserError(f"cannot read checkpoint {f}: {exc}",
                        "delete the damaged checkpoint directory; the run resumes from the previous one") from None
