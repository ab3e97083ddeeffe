"""The fault suite's kill timing (tests/fault_kill.py) without Slurm: a stand-in rank (a sleeping process named as a
megatron rank of a run dir) and its heartbeat file, whose phase the test turns to ``save``.

A tiny megatron save lasts milliseconds; a poll that scanned every process's /proc entry each time (tens of ms on
a loaded machine) missed it, and ``sigkill-save-megatron`` timed out. The ranks are found once per job."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import fault_kill


def _rank(run_dir, rank: int) -> subprocess.Popen:
    """A process ``rank_pids`` takes for rank ``rank`` of ``run_dir``'s megatron job."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vdkit.recipes.megatron",
                             str(run_dir)], env={"SLURM_PROCID": str(rank), "PATH": "/usr/bin:/bin"})


def _phase(run_dir, phase: str) -> None:
    beat = run_dir / "heartbeat"
    beat.mkdir(exist_ok=True)
    (beat / ".rank0.tmp").write_text(f"0 0 24 50 xe9680-1 {phase} - cpu\n")
    (beat / ".rank0.tmp").replace(beat / "rank0")


def test_the_save_moment_is_polled_without_scanning_proc_each_time(tmp_path, monkeypatch):
    scans = []
    real = fault_kill.rank_pids
    monkeypatch.setattr(fault_kill, "rank_pids", lambda *a, **k: scans.append(1) or real(*a, **k))
    first, ckpts = _rank(tmp_path, 0), tmp_path / "checkpoints"
    ckpts.mkdir()
    second = None
    try:
        _phase(tmp_path, "train")
        time.sleep(0.5)  # the stand-in has started (its cmdline is in /proc)

        def restart_then_save():
            nonlocal second
            time.sleep(0.2)
            first.kill()  # the job restarted: its rank 0 is another process
            first.wait()
            second = _rank(tmp_path, 0)
            time.sleep(0.5)
            _phase(tmp_path, "save")

        threading.Thread(target=restart_then_save, daemon=True).start()
        assert fault_kill.kill_at(tmp_path, "megatron", ckpts, "save", deadline_s=20) == 0
        assert second.wait(timeout=10) == -9  # the successor's rank 0, killed in its save
        # ~0.7 s of polling every 2 ms (a scan each time: ~100): a scan for the first job's ranks, then for the
        # successor's until it is found
        assert len(scans) <= 5, len(scans)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
