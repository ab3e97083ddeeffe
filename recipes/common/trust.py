"""Checkpoints you can trust: a checksum per file, verified on load; a damaged latest set aside; room checked.

- After a checkpoint file is written (and fsync-ed), :func:`write_sum` puts its SHA-256 beside it in
  ``<file>.sha256`` (``sha256sum`` format: ``sha256sum -c`` checks it by hand). The reference engine's
  ``step=<N>.ckpt`` gets ``step=<N>.ckpt.sha256`` *before* it is renamed into place; a megatron rank's
  ``rank<R>.pt`` gets its sum inside the step's hidden directory, published with it. So a published
  checkpoint always has its sums; one without (an older kit's) is used unverified.
- On resume :func:`trusted_latest` verifies the latest checkpoint; a damaged or incomplete one (a sum
  that differs, a file shorter than written, a file missing) is renamed ``<name>.damaged-<UTC time>``
  (set aside, never deleted: the bytes may matter to someone) and the previous one is tried, said in one line.
- Before every save :func:`check_room` compares the file system's free bytes with what the save needs
  (the largest checkpoint already in the directory, else the plan's size) and its writability; a refusal
  is :class:`SaveRefused`, exit :data:`vdkit.run.faults.EXIT_NO_SPACE`, naming the path.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from vdkit.errors import UserError
from vdkit.run.faults import EXIT_NO_SPACE

SUM_SUFFIX = ".sha256"
DAMAGED_MARK = ".damaged-"
ROOM_MARGIN = 1.10  # a save needs its size plus 10 % (metadata, the file system's reserve)
_CHUNK = 1 << 22


class SaveRefused(UserError):
    """A checkpoint cannot be written here (no room, read-only, quota): the rank exits EXIT_NO_SPACE."""

    exit_code = EXIT_NO_SPACE


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sum_file(path: Path, name: Optional[str] = None) -> Path:
    """Where the sum of ``path`` lives (``name``: the file's final name when it is still a temporary)."""
    path = Path(path)
    return path.with_name((name or path.name) + SUM_SUFFIX)


def write_sum(path: Path, final_name: Optional[str] = None) -> Path:
    """Write ``path``'s SHA-256 (for the file that will be called ``final_name``) beside it, atomically."""
    path = Path(path)
    name = final_name or path.name
    target = sum_file(path, name)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{sha256_of(path)}  {name}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def check_file(path: Path) -> Optional[str]:
    """Why ``path`` is not the file its sum describes, or None (good, or no sum to check it by)."""
    path = Path(path)
    sums = sum_file(path)
    if not sums.is_file():
        return None if path.is_file() else f"{path.name} is missing"
    if not path.is_file():
        return f"{path.name} is missing (its sum is there)"
    try:
        want = sums.read_text().split()[0]
    except (OSError, IndexError):
        return f"{sums.name} is unreadable"
    got = sha256_of(path)
    return None if got == want else f"{path.name}: SHA-256 {got[:12]}... differs from its sum {want[:12]}..."


def check(path: Path, files: Optional[List[Path]] = None) -> Optional[str]:
    """Why checkpoint ``path`` (a file, or a directory of files) is damaged, or None. ``files``: only these
    files of a directory (a rank checks its own)."""
    path = Path(path)
    if path.is_dir():
        if files is None:
            files = sorted({p for p in path.iterdir() if not p.name.endswith(SUM_SUFFIX)}
                           | {p.with_name(p.name[:-len(SUM_SUFFIX)]) for p in path.glob("*" + SUM_SUFFIX)})
        for f in files:
            why = check_file(f)
            if why:
                return why
        return None
    return check_file(path)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (and its sum) out of the resume's way; returns the new name."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{DAMAGED_MARK}{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{DAMAGED_MARK}{stamp}.{n}")
    os.replace(path, target)
    if sum_file(path).exists():
        os.replace(sum_file(path), sum_file(target))
    return target


def trusted_latest(ckpt_dir: Path, candidates: Callable[[], List[Tuple[int, Path]]],
                   check_mine: Callable[[Path], Optional[str]], any_rank: Callable[[bool], bool],
                   leader: bool, barrier: Callable[[], None], say: Callable[[str], None],
                   first_damage: Optional[Callable[[Optional[str]], Optional[str]]] = None) -> Optional[Path]:
    """The newest checkpoint every rank verified, setting damaged ones aside; None when none is left.

    A collective: every rank calls it. ``candidates()``: (step, path) oldest first; ``check_mine(path)``:
    this rank's verdict (why it is damaged, or None); ``any_rank(flag)``: True when any rank's flag is;
    ``leader``: this rank renames; ``say``: rank 0's log line; ``first_damage(why)``, where the engine can
    gather words (a collective, in place of ``any_rank``): the first rank's verdict that is not None, naming
    that rank, else None - so the leader's line names the file another rank found damaged and why."""
    damaged = []
    while True:
        found = candidates()
        if not found:
            if damaged:
                say(f"[vdkit W] no good checkpoint left in {ckpt_dir} after setting aside {', '.join(damaged)}: "
                    "the run starts again from step 0")
            return None
        step, path = found[-1]
        try:
            why = check_mine(path)
        except OSError as exc:
            why = f"unreadable: {exc.strerror}"
        if first_damage is not None:
            why = first_damage(why)
            if why is None:
                return path
        elif not any_rank(why is not None):
            return path
        if leader:
            moved = set_aside(path)
            prev = f"step={found[-2][0]}" if len(found) > 1 else "step 0 (none is left)"
            say(f"[vdkit W] checkpoint {path.name} is damaged ({why or 'on another rank'}): set aside as "
                f"{moved.name}; resuming from {prev}")
        damaged.append(path.name)
        barrier()


def check_room(ckpt_dir: Path, need_bytes: int) -> None:
    """Refuse a save that cannot fit or cannot be written, before a byte is written (SaveRefused)."""
    ckpt_dir = Path(ckpt_dir)
    try:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(ckpt_dir).free
    except OSError as exc:
        raise SaveRefused(f"cannot write checkpoints in {ckpt_dir}: {exc.strerror}",
                          "make the directory writable, or point run.results_dir at shared storage that is") from None
    if not os.access(ckpt_dir, os.W_OK):
        raise SaveRefused(f"cannot write checkpoints in {ckpt_dir}: not writable",
                          "make it writable, or point run.results_dir at shared storage that is")
    need = int(need_bytes * ROOM_MARGIN)
    if free < need:
        raise SaveRefused(f"no room for the next checkpoint in {ckpt_dir}: {free / 1e6:.1f} MB free, the save "
                          f"needs {need / 1e6:.1f} MB",
                          f"free space there (the run continues from its last checkpoint by itself while "
                          f"restarts are left), or point run.results_dir at a larger file system")


def size_of(path: Path) -> int:
    """Bytes of a checkpoint file or directory (its sums included)."""
    path = Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0
