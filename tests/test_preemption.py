"""Preemption (issue 12 items 1-2): USR1 -> finish the step, checkpoint, requeue, exit; no *.tmp left.

The Slurm end-to-end checks (scancel --signal=USR1 and a real one-minute time limit) are in
tests/test_slurm_requeue.py; these run without Slurm: a fake ``scontrol`` records the requeue.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vdkit.recipes import preemption
from vdkit.recipes.reference import reference_command

TINY = ["train.seq_length=128", "method.warmup_steps=0"]
STEP = re.compile(r"\| (\d+)/(\d+) \[[^,]*, reduced_train_loss=([^,]+), global_step=([^,]+), ")


def _steps(text: str):
    return [int(m.group(1)) for u in re.split(r"[\r\n]", text) if (m := STEP.search(u))]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _fake_scontrol(tmp_path: Path, rc: int = 0) -> Path:
    """A `scontrol` that appends its arguments to calls.txt (and exits ``rc``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/calls.txt\n'
                      + ('echo "scontrol: error: Requested operation is disabled" >&2\n' if rc else "")
                      + f"exit {rc}\n")
    script.chmod(0o755)
    return bin_dir


# ----------------------------------------------------------------------------- the shared mechanism
def test_flag_is_set_by_the_signal_and_summed_over_ranks():
    p = preemption.Preemption().install()
    try:
        assert not p.stop_now() and not p.stop_now(lambda f: f + 0)
        assert p.stop_now(lambda f: f + 1)  # another rank got it: this one stops too
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the handler
        time.sleep(0.05)
        assert p.received and p.stop_now()
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_signal_is_the_one_the_sbatch_asks_for():
    from vdkit.slurm import render

    assert preemption.REQUEUE_SIGNAL == signal.SIGUSR1 and render.SIGNAL_NAME == preemption.SIGNAL_NAME


def test_requeue_calls_scontrol_with_the_job_id(tmp_path, monkeypatch):
    bin_dir = _fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ok, line = preemption.Preemption().requeue({"SLURM_JOB_ID": "4242"})
    assert ok and "requeued Slurm job 4242" in line
    ok, _ = preemption.Preemption().requeue({"SLURM_JOB_ID": "10", "SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "3"})
    assert (bin_dir / "calls.txt").read_text().splitlines() == ["requeue 4242", "requeue 9_3"]
    ok, line = preemption.Preemption().requeue({})
    assert not ok and "not a Slurm job" in line
    ok, line = preemption.Preemption().requeue({"SLURM_JOB_ID": "1; rm -rf /"})
    assert not ok  # never passed to scontrol


def test_refused_requeue_says_so_and_how_to_resume(tmp_path, monkeypatch):
    bin_dir = _fake_scontrol(tmp_path, rc=1)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ok, line = preemption.Preemption().requeue({"SLURM_JOB_ID": "7"})
    assert not ok and "disabled" in line and "resubmit" in line
    assert preemption.Preempted(3, False).exit_code == preemption.EXIT_NOT_REQUEUED
    assert preemption.Preempted(3, True).exit_code == 0


# ----------------------------------------------------------------------------- checkpoint *.tmp (item 2)
def test_save_and_resume_remove_partial_checkpoint_files(tmp_path):
    from vdkit.recipes.reference import checkpoint as ckpt

    d = tmp_path / "checkpoints"
    d.mkdir()
    stale = [d / ".step=5.ckpt.12345.tmp", d / ".step=10.ckpt.999.tmp"]
    for p in stale:
        p.write_bytes(b"half a checkpoint")
    (d / "notes.txt").write_text("mine")  # not the kit's: left alone
    assert sorted(ckpt.remove_partial(d)) == sorted(stale)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    stale[0].write_bytes(b"again")
    ckpt.save(d, 6, {"step": 6})
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt", "step=6.ckpt"]
    assert ckpt.latest(d).name == "step=6.ckpt"


# ----------------------------------------------------------------------------- the reference engine
def _run_until_step(cmd, env, cwd, at_step: int, timeout: float = 150):
    """Start the engine, wait until ``at_step`` is logged; returns (process, output chunks, reader)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    chunks: list = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(proc.stdout.fileno(), 4096), b"")))
    reader.start()
    deadline = time.monotonic() + timeout
    while not (_steps(b"".join(chunks).decode()) and _steps(b"".join(chunks).decode())[-1] >= at_step):
        assert proc.poll() is None, b"".join(chunks).decode()[-2000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)
    return proc, chunks, reader


def test_usr1_checkpoints_the_step_requeues_and_the_rerun_loses_and_repeats_nothing(tmp_path):
    from vdkit.config import compose
    from vdkit.plan import make_plan
    from vdkit.recipes.reference.checkpoint import latest
    from vdkit.rundir import create_run_dir

    max_steps = 400  # far more than the test lets it run before the signal
    recipe = compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic", "method=lora",
                      f"train.max_steps={max_steps}", "train.global_batch_size=2", *TINY])
    run_dir = create_run_dir(make_plan(recipe), {}, tmp_path / "runs")
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / ".step=1.ckpt.1.tmp").write_bytes(b"left by a kill mid-save")
    bin_dir = _fake_scontrol(tmp_path)
    env = _env(SLURM_JOB_ID="4242", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    proc, chunks, reader = _run_until_step(reference_command(run_dir), env, run_dir, at_step=3)
    proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=60)
    reader.join()
    out = b"".join(chunks).decode()
    first = _steps(out)
    stopped = first[-1]
    assert rc == 0, out[-2000:]  # requeued: a clean exit, Slurm starts the job again
    assert stopped < max_steps and first == list(range(1, stopped + 1))
    assert f"USR1 received: stopped after global_step {stopped}" in out and "requeued Slurm job 4242" in out
    assert latest(ckpts).name == f"step={stopped}.ckpt"  # the checkpoint of the very step it stopped at
    assert not list(ckpts.glob("*.tmp"))
    assert (bin_dir / "calls.txt").read_text() == "requeue 4242\n"

    # The requeued job: resumes at stopped + 1; signal it again, this time without Slurm (exit 75).
    proc, chunks, reader = _run_until_step(reference_command(run_dir), _env(), run_dir, at_step=stopped + 2)
    proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=60)
    reader.join()
    out = b"".join(chunks).decode()
    second = _steps(out)
    assert f"resuming from {ckpts / f'step={stopped}.ckpt'}" in out
    assert second == list(range(stopped + 1, second[-1] + 1))
    assert rc == preemption.EXIT_NOT_REQUEUED and "not a Slurm job" in out
    assert latest(ckpts).name == f"step={second[-1]}.ckpt"


def test_usr1_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Two ranks (gloo); only rank 1 gets the signal: both stop after the same step, rank 0 saves it."""
    from vdkit.recipes.reference.checkpoint import latest

    cmd = [sys.executable, "-m", "vdkit", "run", "method=lora", "cluster.gpus_per_node=2", "train.max_steps=400",
           "train.global_batch_size=4", *TINY, "--out", str(tmp_path)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env())
    chunks: list = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(launcher.stdout.fileno(), 4096), b"")))
    reader.start()
    deadline = time.monotonic() + 150
    while not (_steps(b"".join(chunks).decode()) and _steps(b"".join(chunks).decode())[-1] >= 3):
        assert launcher.poll() is None and time.monotonic() < deadline, b"".join(chunks).decode()[-2000:]
        time.sleep(0.02)
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    ranks = {}
    for pid in children:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        ranks[int(next(e for e in env if e.startswith(b"RANK=")).split(b"=")[1])] = int(pid)
    os.kill(ranks[1], signal.SIGUSR1)
    launcher.wait(timeout=60)
    reader.join()
    out = b"".join(chunks).decode()
    run_dir = tmp_path / "tiny_llama_lora_1n2g"
    steps = _steps((run_dir / "local-1.out").read_text())
    stopped = steps[-1]
    assert f"stopped after global_step {stopped}" in out and stopped < 400
    assert latest(run_dir / "checkpoints").name == f"step={stopped}.ckpt"
    assert "Traceback" not in out and "Traceback" not in (run_dir / "logs" / "rank1.out").read_text()


# ----------------------------------------------------------------------------- NeMo: Lightning's own requeue
def test_nemo_jobs_arm_lightnings_slurm_requeue_on_the_same_signal(tmp_path):
    """NeMo trains with Lightning: its SLURMEnvironment (auto_requeue) catches USR1, saves an HPC
    checkpoint and runs `scontrol requeue`. Show the rendered job arms exactly that."""
    import yaml
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from vdkit.config import compose
    from vdkit.plan import make_plan
    from vdkit.prepare import prepare

    plan = make_plan(compose(["model=llama2_7b", "method=lora", "engine.container_image='nvcr.io#nvidia/nemo:24.01'"]))
    files = prepare(plan, tmp_path, check_mounts=False).files
    sbatch = files["launch.sbatch"]
    sig = re.search(r"^#SBATCH --signal=(\S+)$", sbatch, re.M).group(1)
    # No "B:" prefix: the signal goes to the srun tasks (the Python processes), not the batch shell.
    name, _, lead = sig.partition("@")
    assert name == preemption.SIGNAL_NAME and int(lead) > 0
    assert re.search(r"^#SBATCH --requeue$", sbatch, re.M)
    job_name = re.search(r"^#SBATCH --job-name=(\S+)$", sbatch, re.M).group(1)
    per_node = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", sbatch, re.M).group(1)
    env = {"SLURM_NTASKS": per_node, "SLURM_NTASKS_PER_NODE": per_node, "SLURM_JOB_NAME": job_name,
           "SLURM_JOB_ID": "1"}
    old = dict(os.environ)
    try:
        os.environ.update(env)
        assert SLURMEnvironment.detect()  # Lightning sees a SLURM-managed job (not "bash"/"interactive")
        lightning_env = SLURMEnvironment()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert lightning_env.auto_requeue and lightning_env.requeue_signal == getattr(signal, "SIG" + name)
    cfg = yaml.safe_load(files["nemo.yaml"])
    # Nothing replaces Lightning's SLURM environment (NeMo does for cluster_type=BCP), and the
    # requeued job picks up where it stopped.
    assert "cluster_type" not in cfg and "plugins" not in cfg["trainer"]
    assert cfg["exp_manager"]["resume_if_exists"] and cfg["exp_manager"]["resume_ignore_no_checkpoint"]


# ----------------------------------------------------------------------------- one job per run dir (item 3)
def test_rendered_script_takes_the_run_dir_lock_first(tmp_path):
    """The lock lines, run by bash: the first holder wins, a second is refused naming it, release frees it."""
    from vdkit.runlock import holder_note, is_held, lock_lines

    script = "set -euo pipefail\n" + "\n".join(lock_lines(tmp_path, "slurm", "${SLURM_JOB_ID:-?}")) + "\necho started\n"
    first = subprocess.Popen(["bash", "-c", script + "sleep 30\n"], env={**_env(), "SLURM_JOB_ID": "111"},
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "started"
    try:
        assert is_held(tmp_path) and (tmp_path / "run.lock").read_text() == "slurm 111\n"
        second = subprocess.run(["bash", "-c", script], env={**_env(), "SLURM_JOB_ID": "222"},
                                capture_output=True, text=True)
        assert second.returncode == 1 and "started" not in second.stdout
        assert second.stderr.strip() == ("vdkit: the run directory is held by slurm 111; job 222 did not start: "
                                          "wait for that job or cancel it, or render a new run dir")
        assert holder_note(tmp_path) == "held by slurm job 111"  # no Slurm here: the lock itself says so
    finally:
        first.kill()
        first.wait()
    assert not is_held(tmp_path) and holder_note(tmp_path) is None


def test_vdkit_run_launcher_holds_the_lock_too(tmp_path):
    from vdkit.errors import UserError
    from vdkit.runlock import acquire_local

    fd = acquire_local(tmp_path)
    try:
        with pytest.raises(UserError, match=f"held by local {os.getpid()}"):
            acquire_local(tmp_path)
    finally:
        os.close(fd)
    os.close(acquire_local(tmp_path))
