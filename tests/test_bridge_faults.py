"""A hung Megatron-Bridge rank on the local Slurm (issue 27): the watchdog kills it, the run finishes by itself.

Bridge's own loop trains for real on CPU under Slurm (two emulated nodes, one pipeline stage each: the stopped
rank's peer waits in a collective and keeps beating from its thread, so the watchdog must blame the silent one).
Its ranks beat through Bridge's callbacks (vdkit.recipes.bridge.job.heartbeat_callback); rank 1 is SIGSTOPped
after the first checkpoint; the batch shell's watchdog kills the step, records the fault and submits the next
allocation without that node; the resumed job trains every later step once. Short watchdog settings
(cluster.heartbeat_timeout_s, kill_grace_s, restart_delay_s): the production figures are vdkit.run.faults'.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fault_kill import rank_pids

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None,
                                                   reason="megatron-bridge not installed (extra [bridge])")]

MAX_STEPS, EVERY = 12, 6
CELL = ["cluster.heartbeat_timeout_s=8", "cluster.kill_grace_s=3", "cluster.restart_delay_s=3",
        "engine=bridge", "engine.container_image=null", "model=tiny_llama", "model.num_layers=2", "method=pretrain",
        "data=synthetic", "cluster.nodes=2", "cluster.gpus_per_node=1", "parallelism.pp=2",
        "parallelism.distributed_optimizer=false", "train.micro_batch_size=2", "train.global_batch_size=4",
        "train.seq_length=64", "method.warmup_steps=0", "cluster.mpi=none", "cluster.socket_ifname=lo",
        "cluster.cpus_per_task=1", "cluster.startup_s=60", f"engine.checkpoint_every_n_steps={EVERY}",
        f"train.max_steps={MAX_STEPS}"]


def _cli(*argv) -> str:
    res = subprocess.run([sys.executable, "-m", "vdkit.cli", *argv], capture_output=True, text=True)
    assert res.returncode == 0, (argv, res.stderr[-2000:])
    return res.stdout.strip()


def _steps(run_dir: Path, job_id: str) -> list:
    """The steps job ``job_id`` trained, from Bridge's own ``iteration N/M`` lines in its Slurm log."""
    from vdkit.validation.logs import parse_text_log

    path = run_dir / f"slurm-{job_id}.out"
    return [r.step + 1 for r in parse_text_log(path).steps] if path.exists() else []


def _rank_pids(run_dir: Path) -> dict:
    """{SLURM_PROCID: pid} of the run's Bridge rank processes (not their checkpoint writers' children)."""
    return rank_pids(run_dir, "bridge", module="vdkit.recipes.bridge.rank")


def _wait(what, pred, run_dir, timeout):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tails = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in sorted(run_dir.glob("slurm-*")))
            raise AssertionError(f"waited {timeout} s for {what}\n{tails}")
        time.sleep(0.3)


def test_a_hung_bridge_rank_is_killed_by_the_watchdog_and_the_run_finishes(local_slurm, tmp_path, monkeypatch):
    from vdkit.slurm import submit as sub

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the job's ranks (sbatch exports this environment) share 2 cores
    t0 = time.monotonic()
    run_dir, job = _cli("submit", *CELL, "--out", str(tmp_path)).splitlines()[-1].split("\t")[:2]
    run_dir = Path(run_dir)
    tracker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"

    def past_the_first_checkpoint():
        assert not sub.job_state(job).done, f"job {job} ended before its first checkpoint"
        return (tracker.is_file() and tracker.read_text().strip() == str(EVERY)
                and (run_dir / "checkpoints" / f"iter_{EVERY:07d}" / "run_config.yaml").is_file()
                and (_steps(run_dir, job) or [0])[-1] > EVERY)
    _wait(f"step {EVERY + 1}", past_the_first_checkpoint, run_dir, 240)
    os.kill(_rank_pids(run_dir)[1], signal.SIGSTOP)  # hung: no step, no beat, its peer waiting on it
    stopped_at = time.monotonic()
    _wait("the run to finish", lambda: (run_dir / "finished").exists(), run_dir, 300)
    jobs = sub.job_ids(run_dir)
    _wait("the last job to end", lambda: sub.job_state(jobs[-1]).done, run_dir, 60)

    by_job = [_steps(run_dir, j) for j in jobs]
    done = [s for steps in by_job for s in steps]
    assert len(jobs) == 2 and sorted(set(done)) == list(range(1, MAX_STEPS + 1)), by_job  # none lost
    assert by_job[1][0] == EVERY + 1  # resumed from the checkpoint; every step after it once
    redone = len(done) - MAX_STEPS
    assert redone == len(by_job[0]) - EVERY  # only the steps after the last checkpoint, redone
    err = (run_dir / f"slurm-{jobs[0]}.err").read_text(errors="replace")
    assert "vdkit: watchdog: rank 1 on xe9680-" in err and "stopped responding" in err
    status = _cli("status", str(run_dir))
    assert "rank 1 on xe9680-" in status and "stopped responding" in status
    assert f"latest checkpoint step {EVERY}" in status and f"restart 1 of 3: job {jobs[1]} continues" in status
    assert (run_dir / "excluded_nodes").read_text().strip().startswith("xe9680-")
    print(f"\nBRIDGE HANG | killed and continued: jobs {','.join(jobs)} | steps redone: {redone} | "
          f"{time.monotonic() - stopped_at:.0f} s from the hang to the finish, {time.monotonic() - t0:.0f} s in all | "
          f"status: {status.split(chr(9), 2)[-1]}")
