"""Kill timings and a planted lock holder for the fault suite on the local Slurm (issue 37).

A rank is SIGKILLed at one of :data:`TIMINGS`: mid-step (between saves), during a save (the saving rank, while
its heartbeat says ``save``), or just after one (the moment a new checkpoint is published). With ``plant``, a
process of the failed job holds the run dir's lock after its batch shell has exited - the straggler that
stranded runs (a watchdog's ``sleep``, a writer's child, slurmstepd's clean-up): the test process takes a
duplicate of the batch shell's own lock descriptor (``pidfd_getfd``, the same open file, so the same flock)
and lets it go only once the successor says it waits for it. Used by tests/test_faults.py (CI's short runs)
and benchmarks/bench_recovery.py (the repeated loop).
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, Optional

TIMINGS = ("step", "save", "after-save")
SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 (Linux >= 5.6)


def rank_pids(run_dir, engine, module: str = "") -> Dict[int, int]:
    """{SLURM_PROCID: pid} of the run's rank processes on this machine (``python -m vdkit.recipes.ENGINE``, or
    ``module`` where the engine's ranks run another, e.g. Bridge's ``vdkit.recipes.bridge.rank``)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (module or f"vdkit.recipes.{engine}").encode() in cmd and str(run_dir).encode() in cmd:
            for item in env:
                if item.startswith(b"SLURM_PROCID="):
                    found[int(item.split(b"=")[1])] = int(pid)
    return found


def _checkpoint_steps(ckpt_dir: Path) -> list:
    """Steps of the published (not hidden, not set-aside) checkpoints in ``ckpt_dir``."""
    steps = []
    for p in ckpt_dir.iterdir() if ckpt_dir.is_dir() else ():
        m = re.fullmatch(r"step=(\d+)\.ckpt", p.name)
        if m:
            steps.append(int(m.group(1)))
    return steps


def _phase(run_dir, rank: int) -> str:
    try:
        return (Path(run_dir) / "heartbeat" / f"rank{rank}").read_text().split()[5]
    except (OSError, IndexError):
        return ""


def _alive(pids) -> bool:
    """Whether every process of ``pids`` still exists (one signal-0 syscall each: no /proc scan)."""
    try:
        for pid in pids:
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return bool(pids)


def kill_at(run_dir, engine: str, ckpt_dir: Path, timing: str, deadline_s: float = 600) -> int:
    """SIGKILL a rank of the run's current job at ``timing`` (the caller has waited until the job trains);
    returns the rank killed. ``save``: the saving rank (0) while its heartbeat says so; else rank 1.

    The ranks' pids are found once (a scan of every process's /proc entry, milliseconds to tens of them on a
    loaded machine) and again only when one has gone (a restarted job): the moment is then polled at the cost
    of a heartbeat read (~0.1 ms). A scan per poll made the poll slower than a tiny save lasts, so the save
    moment was missed under load (the run then ended without one)."""
    deadline = time.monotonic() + deadline_s
    before = max(_checkpoint_steps(ckpt_dir), default=0)
    ranks: Dict[int, int] = {}
    wanted = 0 if timing == "save" else 1
    while time.monotonic() < deadline:
        if wanted not in ranks or not _alive(ranks.values()):
            ranks = rank_pids(run_dir, engine)
        if timing == "step" and 1 in ranks:
            victim = 1
        elif timing == "save" and 0 in ranks and _phase(run_dir, 0) == "save":
            victim = 0
        elif timing == "after-save" and 1 in ranks and max(_checkpoint_steps(ckpt_dir), default=0) > before:
            victim = 1
        else:
            time.sleep(0.002 if timing != "step" else 0.2)  # a tiny save lasts milliseconds
            continue
        os.kill(ranks[victim], signal.SIGKILL)
        return victim
    raise AssertionError(f"no moment '{timing}' in {deadline_s} s in {run_dir}")


def batch_shell_lock(run_dir) -> Optional[int]:
    """A descriptor of this process for the run dir's lock as the batch shell holds it (its fd 9: the same open
    file, so the same flock), or None when no process holds one."""
    from vdkit.run.runlock import LOCK_FD

    lock = os.path.realpath(Path(run_dir) / "run.lock")
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.realpath(f"/proc/{pid}/fd/{LOCK_FD}") != lock:
                continue
            pidfd = os.pidfd_open(int(pid))
        except OSError:
            continue
        try:
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, LOCK_FD, 0)
        finally:
            os.close(pidfd)
        if fd >= 0:
            return fd
    return None


def release_when_waited(run_dir, fd: int, failed_job: str, job_ids, timeout_s: float = 300) -> str:
    """Hold ``fd`` (the planted straggler) until the failed job's successor says it waits for the lock, then
    close it; returns that successor's first line about the lock. An AssertionError when the successor refused
    instead (the stranding of issue 37)."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ids = job_ids(run_dir)
            later = ids[ids.index(failed_job) + 1:] if failed_job in ids else []
            for job in later:
                err = Path(run_dir) / f"slurm-{job}.err"
                text = err.read_text(errors="replace") if err.exists() else ""
                if "still hold the run directory" in text:
                    return next(ln for ln in text.splitlines() if "still hold the run directory" in ln)
                assert "did not start" not in text, f"job {job} was stranded: {text.strip()}"
            time.sleep(0.2)
        raise AssertionError(f"no successor of job {failed_job} waited for the lock within {timeout_s} s")
    finally:
        os.close(fd)
