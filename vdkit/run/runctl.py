"""Acting on a run directory: read and follow its ranks' logs (`vdkit logs`), cancel it (`vdkit cancel`).

Logs: the run directory's job output (``slurm-<job>.out/.err``, ``local-1.out``, ``logs/rank<R>.out``),
the failing one first (the rank the launcher's fault record blames, else one holding a traceback);
a Kubernetes run's come from ``kubectl logs`` (its launcher's ``log_command``). Following (``-f``)
ends when the run ends (its state leaves the running words), after ``--timeout`` seconds, or on Ctrl-C.

Cancel: the launcher stops every job of the run and any successor it queued (:mod:`vdkit.launch.launchers`'
``cancel``), then ``cancelled`` records when, which jobs, and the command that continues the run;
`vdkit status` and `vdkit runs` read it before asking the scheduler (:mod:`vdkit.run.runs`).
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import BinaryIO, List, Optional

from vdkit.errors import UserError
from vdkit.run.rundir import CANCELLED_FILE, LOG_DIR, RECIPE_FILE

FOLLOW_POLL_S = 0.5  # how often `logs -f` reads what the files gained
STATE_POLL_S = 2.0  # ... and asks whether the run still runs
# A launcher's state words for a run that is still going (or about to): following goes on while it says one.
RUNNING_WORDS = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                           "STAGE_OUT", "SIGNALING", "CREATED", "INITIALIZING", "STARTING"})
_FAILURE = re.compile(rb"Traceback \(most recent call last\)|srun: error:|exited with code [1-9]|Error: ")


def _run_dir(target) -> Path:
    path = Path(target)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"{target} is not a run directory (no {RECIPE_FILE})",
                        "pass a run directory written by `vdkit render`, `submit` or `run` (`vdkit runs` lists them)")
    from vdkit.run.runlock import check_state_files

    check_state_files(path)
    return path.absolute()


def _launcher(run_dir: Path):
    from vdkit.launch import launchers
    from vdkit.run.rundir import load_recipe

    return launchers.get(load_recipe(run_dir).cluster.launcher)


def log_files(run_dir) -> List[Path]:
    """The run's log files, the failing one first, then in the order they were written."""
    from vdkit.run.faults import read_faults

    run_dir = Path(run_dir)
    files = [p for p in list(run_dir.glob("*.out")) + list(run_dir.glob("*.err")) + list((run_dir / LOG_DIR).glob(
        "rank*.out")) if p.is_file()]
    files.sort(key=lambda p: (p.stat().st_mtime, p.name))
    blamed = None
    faults = read_faults(run_dir)
    if faults:
        last = faults[-1]
        blamed = [p for p in files if str(last.get("job", "")) and str(last.get("job")) in p.name
                  or (last.get("rank") not in (None, "") and p.name == f"rank{last['rank']}.out")]
    if not blamed:
        blamed = [p for p in files if _FAILURE.search(_tail(p, 1 << 20))][:1]
    return blamed + [p for p in files if p not in blamed]


def _tail(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read()
    except OSError:
        return b""


def _write(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()


def show_logs(target, follow: bool = False, lines: Optional[int] = None, timeout: Optional[float] = None,
              out: Optional[BinaryIO] = None) -> int:
    """Print the run's logs (each under a ``==> FILE <==`` header, the failing one first); with ``follow``,
    go on printing what they gain until the run ends, ``timeout`` seconds pass, or Ctrl-C. Exit code 0."""
    run_dir = _run_dir(target)
    out = out if out is not None else sys.stdout.buffer
    launcher = _launcher(run_dir)
    command = launcher.log_command(run_dir, follow)
    if command is not None:  # a scheduler that keeps the logs itself (Kubernetes)
        import subprocess

        try:
            return subprocess.run(command, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 0
        except KeyboardInterrupt:
            return 0
    files = log_files(run_dir)
    # -f with nothing written and no job running or queued to write it (a rendered run never submitted): it printed
    # nothing and exited 0 at once, a dead end that reads as "the run is silent"
    word = _state_word(run_dir, launcher) if follow and not files else None
    if not files and (not follow or word not in RUNNING_WORDS):
        raise UserError(f"{run_dir} has no logs yet (no *.out, *.err or {LOG_DIR}/rank*.out)"
                        + (f" and its state is {word}, not a job running or queued to write them: nothing to follow"
                           if follow else ""), f"start the run, or see its state: vdkit status {run_dir}")
    offsets = {}
    for path in files:
        data = _tail(path, 1 << 30)
        if lines is not None:
            data = b"".join(data.splitlines(keepends=True)[-lines:]) if lines > 0 else b""
        _write(out, f"==> {path} <==\n".encode() + data + (b"" if data.endswith(b"\n") or not data else b"\n"))
        offsets[path] = path.stat().st_size
    if follow:
        try:
            _follow(run_dir, launcher, offsets, out, timeout)
        except KeyboardInterrupt:
            pass
    return 0


def _state_word(run_dir: Path, launcher) -> str:
    """The first word of the run's state (RUNNING, NOT_SUBMITTED, UNREACHABLE, ...; UNKNOWN where it cannot be read)."""
    from vdkit.run.runs import state

    try:
        return state(run_dir, launcher).split(" ", 1)[0]
    except UserError:
        return "UNKNOWN"


def _still_running(run_dir: Path, launcher) -> bool:
    return _state_word(run_dir, launcher) in RUNNING_WORDS


def _follow(run_dir: Path, launcher, offsets: dict, out: BinaryIO, timeout: Optional[float]) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    last, checked, running = None, 0.0, True
    while True:
        for path in log_files(run_dir):
            size = path.stat().st_size if path.exists() else 0
            start = offsets.get(path, 0)
            if size < start:  # truncated: read it again from its start
                start = 0
            if size > start:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(size - start)
                _write(out, (f"==> {path} <==\n".encode() if path != last else b"") + data)
                offsets[path], last = size, path
        if not running or (deadline is not None and time.monotonic() >= deadline):
            return
        if time.monotonic() - checked >= STATE_POLL_S:
            checked = time.monotonic()
            running = _still_running(run_dir, launcher)  # one more read after it ends: its last lines
            continue
        time.sleep(FOLLOW_POLL_S)


def cancel(target, settle_s: float = 60.0) -> dict:
    """Cancel the run in ``target`` on its launcher (its jobs and any successor it queued) and record it in the
    run directory's ``cancelled``; the record (when, jobs, the command that continues)."""
    from vdkit.run.rundir import FINISHED_FILE
    from vdkit.run.runs import now_text

    run_dir = _run_dir(target)
    if (run_dir / FINISHED_FILE).is_file():
        raise UserError(f"{run_dir} has finished (its file {FINISHED_FILE} says so); there is nothing to cancel",
                        "start a new run to train again")
    from vdkit.run.rundir import JOB_ID_FILE, JOB_STATE_FILE, LOCK_FILE

    if not any((run_dir / name).exists() for name in (JOB_ID_FILE, LOCK_FILE, JOB_STATE_FILE)):
        raise UserError(f"{run_dir} has never been started (no {JOB_ID_FILE}, {LOCK_FILE} or {JOB_STATE_FILE}); "
                        "there is nothing to cancel", "to drop a rendered run, remove its directory")
    launcher = _launcher(run_dir)
    jobs = launcher.cancel(run_dir, settle_s)
    record = {"at": now_text(), "launcher": launcher.name, "jobs": jobs,
              "continue": launcher.continue_command(run_dir)}
    tmp = run_dir / f".{CANCELLED_FILE}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(run_dir / CANCELLED_FILE)
    return record
