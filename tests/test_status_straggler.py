"""`vdkit status` names a slowed rank on the local Slurm (issue 36).

A tiny reference LoRA run on two emulated nodes (one rank each, data parallel over gloo): every rank leaves the
gradient all-reduce together, so the heartbeats' step times are equal. The test slows rank 1 for real - the
process is stopped (SIGSTOP) for most of every short cycle, as a throttled or oversubscribed node would run it -
and status must name rank 1 and its node from the compute times the ranks write (vdkit.recipes.common.heartbeat),
never rank 0.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fault_kill import rank_pids
from vdkit.run.runs import heartbeats

CELL = ("engine=reference", "method=lora", "model=tiny_llama", "data=synthetic", "cluster.nodes=2",
        "cluster.gpus_per_node=1", "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1",
        "train.seq_length=128", "method.warmup_steps=0", "train.global_batch_size=4", "train.max_steps=400",
        "cluster.startup_s=30", "engine.checkpoint_every_n_steps=0", "cluster.heartbeat_timeout_s=8",
        "cluster.kill_grace_s=3",
        # a wider toy, so that a step is mostly compute (~45 ms of a ~55 ms step on 2 cores): the stopped cycles then
        # land in rank 1's compute, not in its optimizer step or data loading (at 4 ms of a 158 ms step they
        # missed it, and CI saw no straggler)
        "model.hidden_size=512", "model.ffn_hidden_size=1408", "model.num_layers=4", "model.num_attention_heads=8",
        "model.num_query_groups=4")
STOPPED_S, RUNNING_S = 0.3, 0.05  # rank 1 runs 1/7 of the time: its compute takes ~7x its peer's (CPU steps on
#                                   shared cores vary ~3x between ranks by chance: a milder slowing is not told apart)


def _cli(*argv) -> str:
    res = subprocess.run([sys.executable, "-m", "vdkit.cli", *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (argv, res.stderr[-2000:])
    return res.stdout.strip()


def _throttle(pid: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(STOPPED_S)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(RUNNING_S)


def _wait(what, pred, run_dir, timeout=120):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tails = [p.name + ": " + p.read_text(errors="replace")[-1500:] for p in sorted(run_dir.glob("slurm-*"))]
            raise AssertionError(f"waited {timeout} s for {what}: " + "\n".join(tails))
        time.sleep(0.2)


@pytest.mark.slow
def test_status_names_a_slowed_rank_on_the_local_slurm(local_slurm, tmp_path):
    run_dir, job = _cli("submit", *CELL, "--out", str(tmp_path)).splitlines()[-1].split("\t")[:2]
    run_dir = Path(run_dir)
    stop = threading.Event()
    try:
        _wait("both ranks to train", lambda: len(rank_pids(run_dir, "reference")) == 2 and len(heartbeats(run_dir)) == 2
              and all(b.steps >= 1 for b in heartbeats(run_dir).values()), run_dir)
        slowed = threading.Thread(target=_throttle, args=(rank_pids(run_dir, "reference")[1], stop), daemon=True)
        slowed.start()
        start = {r: b.steps for r, b in heartbeats(run_dir).items()}
        # the heartbeat's compute time is the median of the last 5 steps: after 6 slowed ones (the first steps'
        # warm-up out of the window too) status must name rank 1, and no other rank before it
        _wait("six slowed steps", lambda: all(b.steps >= start[r] + 6 for r, b in heartbeats(run_dir).items()),
              run_dir)
        said = ""
        deadline = time.monotonic() + 30  # the heartbeat thread writes within 2 s
        while "straggler" not in said and time.monotonic() < deadline:
            said = _cli("status", str(run_dir))
        beats = heartbeats(run_dir)
        print(f"\nstatus with rank 1 slowed: {said}\nlast step s (equal in DP): {[b.step_s for b in beats.values()]}, "
              f"compute s: {[getattr(b, 'compute_s', None) for b in beats.values()]}")
        assert f"straggler: rank 1 on {beats[1].node}: " in said and "rank 0" not in said, said
    finally:
        stop.set()
        for pid in rank_pids(run_dir, "reference").values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        local_slurm.run("scancel", job)
