"""One job at a time in a run directory: the lock a job takes at start, and who holds it.

``sbatch launch.sbatch`` twice would otherwise run two jobs in one directory at once: they write
the same checkpoints and logs, and `vdkit validate` would merge their timings. The job script
opens ``<run_dir>/run.lock`` and takes an exclusive ``flock`` on it before anything else; the
lock is held by the batch shell and every process it starts that inherits the descriptor, and
released by the kernel when the last of them exits - a killed or requeued job cannot leave it
stale. The Slurm script closes it for the processes that could outlive its shell (srun, the watchdog:
``LOCK_FD>&-``), and a successor the run chained after a job whose last processes still hold it waits
for them, a bounded time (:func:`vdkit.slurm.recovery.handover_lines`). A second job finds it held, prints one line naming the holder and exits 1 without
touching anything. The file's text names the holder (``<launcher> <job id>``: ``slurm 1234`` or
``local 4321``) for ``vdkit status``; that text may outlive the job, so it is only reported while
that job is alive (asked of the launcher that wrote it, through :mod:`vdkit.launch.launchers`).

Launcher-neutral: a launcher whose job is a shell script takes the lock with :func:`lock_lines`,
one that starts processes here with :func:`acquire_local`.
"""
from __future__ import annotations

import fcntl
import os
import shlex
from pathlib import Path
from typing import List, Optional, Tuple

from vdkit.errors import UserError
from vdkit.run.rundir import LOCK_FILE, SHELL_STATE_FILES, STATE_FILES

LOCK_FD = 9  # the job script's descriptor for the lock (inherited by srun and the ranks)


def lock_lines(run_dir, launcher: str, job_id_expr: str, on_held: str = "") -> List[str]:
    """Bash lines for the job script: check the run's state files, then take the run dir's lock or stop with one
    line naming the holder.

    ``launcher`` names the holder's kind in the lock file; ``job_id_expr`` is the shell expression of
    the job's id (e.g. ``${SLURM_JOB_ID:-?}``). ``on_held`` (a shell command, e.g. Slurm's ``vdkit_handover``)
    runs when the lock is held: exit 0 when it has taken the lock after all (a successor that waited for its
    predecessor's last processes), non-zero for the refusal. Every state file the script reads or appends
    (:data:`vdkit.run.rundir.SHELL_STATE_FILES`) must be a regular file or missing; anything else stops the
    script before it writes anything, in one line naming the file, what it is and the fix."""
    run = Path(run_dir)
    lock = shlex.quote(str(run / LOCK_FILE))
    files = " ".join(shlex.quote(str(run / name)) for name in SHELL_STATE_FILES)
    return [
        "# The run's state files must be regular files (or missing): reading or appending a FIFO blocks this shell",
        "# for ever, a directory fails obscurely or reads as empty (the restart count reset), a symlink loop fails.",
        f"for f in {files}; do",
        '  if { [ -L "$f" ] && [ ! -e "$f" ]; } || { [ -e "$f" ] && [ ! -f "$f" ]; }; then',
        '    echo "vdkit: $f is not a regular file ($(stat -L -c %F "$f" 2>/dev/null || echo a broken link)), so job '
        f'{job_id_expr} cannot keep the run\'s state in it: remove it (rm -r $(printf %q "$f")); the next job creates it again" >&2',
        "    exit 1",
        "  fi",
        "done",
        "# One job at a time in this run directory (a second `sbatch launch.sbatch` stops here)",
        f"exec {LOCK_FD}>>{lock}",
        f"if ! flock -n {LOCK_FD}{' && ! ' + on_held if on_held else ''}; then",
        f'  echo "vdkit: the run directory is held by $(cat {lock} 2>/dev/null || echo another job); job '
        f'{job_id_expr} did not start: wait for that job or cancel it, or render a new run dir" >&2',
        "  exit 1",
        "fi",
        f'echo "{launcher} {job_id_expr}" > {lock}',
    ]


def _not_a_state_file(path: Path) -> str:
    """What ``path`` is when a launcher must not open it as a state file ("a FIFO (named pipe)", "a directory",
    "a broken symbolic link", ...), else '' (a regular file, or missing: the launcher creates it)."""
    from vdkit.composition.files import not_a_regular_file

    kind = not_a_regular_file(path)
    if kind == "missing":
        return "a broken symbolic link" if os.path.islink(path) else ""
    return kind


def check_lock_file(run_dir) -> None:
    """UserError when ``run.lock`` exists but is not a regular file: opening a FIFO blocks for ever, a
    directory raises. Checked by its type (stat), before anything opens it."""
    check_state_files(run_dir, (LOCK_FILE,))


def check_state_files(run_dir, names=STATE_FILES) -> None:
    """UserError (one line: the file, what it is, the fix) for the first of the run's state files (``names``,
    :data:`vdkit.run.rundir.STATE_FILES` by default) that exists but is not a regular file: a FIFO would block
    its reader for ever, a directory reads as nothing. By type (stat), before anything opens them; the door
    of every verb that reads them (`vdkit run --resume`, `vdkit status`), as the batch script's first lines."""
    for name in names:
        path = Path(run_dir) / name
        kind = _not_a_state_file(path)
        if kind:
            raise UserError(f"{path} is {kind}, not a regular file (the launcher reads and appends the run's state "
                            "there)", f"remove it (rm -r {shlex.quote(str(path))}); the next job creates it again")


def read_holder(run_dir) -> Optional[Tuple[str, str]]:
    """(kind, id) from the lock file - ("slurm", "1234") or ("local", "4321") - or None."""
    check_lock_file(run_dir)
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text().split()
    except OSError:
        return None
    return (text[0], text[1]) if len(text) == 2 else None


def is_held(run_dir) -> bool:
    """Whether some process on this machine (or, over NFSv4, anywhere) holds the run dir's lock now."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    check_lock_file(run_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


def acquire_local(run_dir, launcher: str = "local") -> int:
    """`vdkit run`: take the run dir's lock for this process (and its ranks); returns the descriptor.

    Raises UserError naming the holder when another job holds it.
    """
    path = Path(run_dir) / LOCK_FILE
    check_lock_file(run_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        held = read_holder(run_dir)
        raise UserError(f"the run directory {run_dir} is held by {' '.join(held) if held else 'another job'}",
                        "wait for that job or stop it, or start a new run") from None
    os.truncate(path, 0)
    os.write(fd, f"{launcher} {os.getpid()}\n".encode())
    return fd


def holder_note(run_dir) -> Optional[str]:
    """'held by slurm job 1234' (or 'held by local job 4321') while that job holds the run dir, else None.

    The lock is a flock: visible from this machine when the holder runs here (or over NFSv4). A job
    on another node is asked of the launcher that wrote the lock file (``job_alive``)."""
    held = read_holder(run_dir)
    if held is None:
        return None
    kind, ident = held
    from vdkit.launch import launchers

    launcher = launchers.optional(kind)
    try:
        alive = launcher is not None and launcher.job_alive(ident)
    except UserError:
        alive = False
    return f"held by {kind} job {ident}" if alive or is_held(run_dir) else None
