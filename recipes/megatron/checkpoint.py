"""Per-rank checkpoints, published atomically as one directory per step.

``<checkpoints>/step=<N>.ckpt/rank<R>.pt`` holds rank R's trainable parameters, its optimizer's
inner state (Adam moments and step counters; fp32 master copies under mixed precision) and the step.
Each rank writes its file under a hidden ``.step=<N>.ckpt.tmp`` directory (write, fsync, rename);
after a barrier rank 0 renames the directory into place, so a job killed while saving leaves the
previous step as the latest. What a killed save leaves (the hidden directory, a rank's
``.rank<R>.pt.<pid>.tmp``) is removed before every save and on resume (:func:`remove_partial`), so a
published ``step=<N>.ckpt`` holds exactly one ``rank<R>.pt`` per rank and the layout that wrote them
(``layout.json``: TP, PP, VP, DP, distributed optimizer, method; rank 0 at :func:`publish`). The location and
the name pattern are every engine's (:mod:`vdkit.recipes.common.checkpoint`): resume finds either
engine's checkpoints the same way.
A checkpoint resumes only the layout that wrote it (same TP, PP, VP, DP, method): :func:`check_resume` compares
the record with a run's layout at the door (`vdkit check`, `vdkit run --resume`), not in every rank.
Each rank's file gets its SHA-256 beside it (``rank<R>.pt.sha256``, :mod:`vdkit.recipes.common.trust`)
before the directory is published; each rank verifies its own on resume.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError
from vdkit.recipes.common import trust
from vdkit.recipes.common.checkpoint import checkpoint_name, superseded


_PARTIAL_DIR = re.compile(r"^\.step=\d+\.ckpt\.tmp$")
LAYOUT_FILE = "layout.json"  # in each published step=<N>.ckpt: the layout that wrote it (layout_of)


def layout_of(plan) -> dict:
    """What a checkpoint resumes only under: the ranks' parallel layout and the method that shapes their state."""
    p = plan.recipe.parallelism
    return {"tp": p.tp, "pp": p.pp, "vp": p.vp or 1, "dp": plan.dp,
            "distributed_optimizer": bool(p.distributed_optimizer), "method": plan.recipe.method.name}


def _describe(layout: dict) -> str:
    return (f"TP {layout.get('tp')} PP {layout.get('pp')} VP {layout.get('vp')} DP {layout.get('dp')}, distributed "
            f"optimizer {layout.get('distributed_optimizer')}, method {layout.get('method')}")


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


def publish(ckpt_dir: Path, step: int, world: int, layout: Optional[dict] = None) -> Path:
    """Rank 0, after every rank wrote: record ``layout`` (:func:`layout_of`) beside the rank files, rename the
    step's directory into place; keep the last KEEP."""
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
    if layout is not None:  # with its sum, as the rank files (a whole-directory trust.check finds it intact)
        record = tmp_dir / LAYOUT_FILE
        record.write_text(json.dumps(layout, sort_keys=True) + "\n")
        trust.write_sum(record)
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


def check_resume(plan, run_dir) -> Optional[str]:
    """The checkpoint a stopped run resumes from (its latest) against this run: as many rank files as ranks and,
    where recorded (``layout.json``), the same layout. Returns the line of what matched (None: no checkpoint);
    UserError (one line) where every rank would stop at resume ('checkpoint does not match the model')."""
    from vdkit.recipes.common.checkpoint import latest
    from vdkit.run.rundir import checkpoint_dir

    found = latest(checkpoint_dir(plan.recipe, run_dir))
    if found is None:
        return None
    world = plan.recipe.world_size
    wrote = sum(1 for f in found.glob("rank*.pt") if f.is_file())  # published: exactly one per rank that wrote it
    line = f"the checkpoint the job resumes from, {found}, holds {wrote} rank file(s); this run has {world} rank(s)"
    fix = ("edit recipe.yaml back to the layout that wrote the checkpoint, or start a new run (vdkit render); "
           "a checkpoint resumes only the layout that wrote it")
    if wrote != world:
        raise UserError(line, fix)
    record = found / LAYOUT_FILE
    try:  # is_file first: a FIFO there would block the read
        recorded = json.loads(record.read_text()) if record.is_file() else None
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):  # none (written before the record) or unreadable: the rank count is what is known
        return line + f" (its layout is not recorded: no readable {LAYOUT_FILE})"
    mine = layout_of(plan)
    if any(recorded.get(k) != v for k, v in mine.items()):
        raise UserError(f"the checkpoint the job resumes from, {found}, was written by {_describe(recorded)}; "
                        f"this run is {_describe(mine)}", fix)
    return line + f", written by this run's layout ({_describe(mine)})"

