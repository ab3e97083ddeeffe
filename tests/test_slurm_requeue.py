"""Real jobs of the reference engine on the local Slurm (issue 12, items 1, 3 and 11).

- USR1 mid-run (``scancel --signal=USR1``) and a real one-minute time limit (Slurm's own
  ``--signal=USR1@lead``): the job checkpoints the step it is on, requeues itself and the requeued
  job (same id, output appended) resumes: the step sequence over all restarts is 1..N, unbroken.
- ``sbatch launch.sbatch`` twice: the second job stops at the run dir's lock; `vdkit status` names the holder.
- A ``%`` in the out dir reaches neither Slurm's pattern expansion nor a lost log.

Each test prints its figures (job id, restarts, where each segment stopped, seconds) for the note.
"""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from vdkit.cli import main
from vdkit.slurm import submit as sub

CELL = ["engine=reference", "model=tiny_llama", "data=synthetic", "method=lora", "cluster.gpus_per_node=1",
        "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1", "train.seq_length=128",
        "method.warmup_steps=0", "train.global_batch_size=4"]
STEP = re.compile(r"\| (\d+)/(\d+) \[")
STOPPED = re.compile(r"stopped after global_step (\d+)")


def _submit(tmp_path, capsys, *overrides) -> tuple:
    assert main(["submit", *CELL, *overrides, "--out", str(tmp_path)]) == 0
    run_dir, job_id = capsys.readouterr().out.strip().splitlines()[-1].split("\t")[:2]
    from pathlib import Path

    return Path(run_dir), job_id


def _log(run_dir, job_id) -> str:
    path = run_dir / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _steps(text: str):
    return [int(m.group(1)) for u in re.split(r"[\r\n]", text) if (m := STEP.search(u))]


def _restarts(job_id) -> int:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    m = re.search(r"Restarts=(\d+)", out)
    return int(m.group(1)) if m else -1


def _check_unbroken(run_dir, job_id, max_steps, checkpoint=None):
    """Every segment resumed at the step after the one it checkpointed; 1..max_steps overall.
    ``checkpoint``: a file the last checkpoint holds (default: the reference engine's file)."""
    text = _log(run_dir, job_id)
    steps = _steps(text)
    stops = [int(s) for s in STOPPED.findall(text)]
    resumes = [int(s) for s in re.findall(r"resuming from \S+step=(\d+)\.ckpt", text)]
    assert stops and resumes == stops, (stops, resumes)
    # One sequence with no gap and no repeat: the progress bar of each segment continues the last.
    assert steps == list(range(1, max_steps + 1)), [s for i, s in enumerate(steps) if i and s != steps[i - 1] + 1]
    assert (run_dir / "checkpoints" / (checkpoint or f"step={max_steps}.ckpt")).is_file()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    return stops


def test_usr1_mid_run_requeues_and_the_job_completes_unbroken(local_slurm, tmp_path, capsys):
    max_steps = 120
    run_dir, job_id = _submit(tmp_path, capsys, f"train.max_steps={max_steps}", "cluster.time_limit_min=10")
    t0 = time.monotonic()
    deadline = t0 + 180
    while not (_steps(_log(run_dir, job_id)) and _steps(_log(run_dir, job_id))[-1] >= 10):
        assert time.monotonic() < deadline and not sub.job_state(run_dir).done, _log(run_dir, job_id)[-2000:]
        time.sleep(0.2)
    signalled_at = _steps(_log(run_dir, job_id))[-1]
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    st = sub.wait(run_dir, timeout=300, poll_s=1)
    assert st.state == "COMPLETED", (st, _log(run_dir, job_id)[-3000:])
    stops = _check_unbroken(run_dir, job_id, max_steps)
    assert len(stops) == 1 and signalled_at <= stops[0] < max_steps and _restarts(job_id) == 1
    print(f"\nUSR1 figures: job {job_id}, USR1 sent after step {signalled_at}, stopped after step {stops[0]}, "
          f"restarts {_restarts(job_id)}, steps 1..{max_steps} unbroken, {time.monotonic() - t0:.0f} s to COMPLETED")


def _seconds_per_step(tmp_path) -> float:
    """This machine's speed now for the test's cell (20 steps in-process, the first two excluded)."""
    import os

    from vdkit.config import compose
    from vdkit.plan import make_plan
    from vdkit.recipes.reference.train import train
    from vdkit.rundir import create_run_dir
    from vdkit.validation.logs import read_source

    cell = [o for o in CELL if not o.startswith("cluster.")] + ["cluster=local", "train.max_steps=20"]
    run_dir = create_run_dir(make_plan(compose(cell)), {}, tmp_path / "calibrate")
    with open(os.devnull, "w") as sink:
        train(run_dir, stream=sink)
    timings = read_source(run_dir).timings[2:]
    return sum(timings) / len(timings)


def test_one_minute_time_limit_requeues_until_the_job_completes(local_slurm, tmp_path, capsys):
    # About 30 s of training. Slurm checks time limits every 30 s and sends the --signal up to that
    # much early ("up to 60 seconds earlier than specified", man sbatch): in a 1-minute allocation
    # USR1 comes 15-45 s after the start, while the job is still loading torch or training. So the
    # job meets its limit at least once, and each allocation still makes progress.
    per_step = _seconds_per_step(tmp_path)
    max_steps = max(60, int(30 / per_step))
    t0 = time.monotonic()
    run_dir, job_id = _submit(tmp_path / "runs", capsys, f"train.max_steps={max_steps}", "cluster.time_limit_min=1")
    st = sub.wait(run_dir, timeout=900, poll_s=2)
    assert st.state == "COMPLETED", (st, _log(run_dir, job_id)[-3000:])
    stops = _check_unbroken(run_dir, job_id, max_steps)
    assert "DUE TO TIME LIMIT" not in _log(run_dir, job_id) and _restarts(job_id) == len(stops) >= 1
    lead = re.search(r"--signal=USR1@(\d+)", (run_dir / "launch.sbatch").read_text()).group(1)
    print(f"\ntime-limit figures: job {job_id}, time limit 1 min, signal lead {lead} s, "
          f"calibrated {per_step:.3f} s/step, stopped after steps {stops}, restarts {_restarts(job_id)}, "
          f"steps 1..{max_steps} unbroken, "
          f"{time.monotonic() - t0:.0f} s to COMPLETED")


def test_a_second_job_in_a_run_dir_is_refused_and_status_names_the_holder(local_slurm, tmp_path, capsys):
    run_dir, first = _submit(tmp_path, capsys, "train.max_steps=2000", "cluster.time_limit_min=10")
    deadline = time.monotonic() + 120
    while sub.job_state(first).state != "RUNNING" or not (run_dir / "run.lock").exists():
        assert time.monotonic() < deadline
        time.sleep(0.5)
    second = sub.submit_run(run_dir).job_id  # `sbatch launch.sbatch` again, same directory
    st = sub.wait(second, timeout=120, poll_s=1)
    err = (run_dir / f"slurm-{second}.err").read_text()
    assert (st.state, st.exit_code) == ("FAILED", "1:0")
    assert f"held by slurm {first}; job {second} did not start" in err and len(err.strip().splitlines()) == 1
    assert main(["status", str(run_dir)]) == 0
    line = capsys.readouterr().out
    assert f"held by slurm job {first}" in line, line
    subprocess.run(["scancel", first], check=True)
    assert sub.wait(first, timeout=120, poll_s=1).done
    assert _steps(_log(run_dir, second)) == []  # the refused job trained nothing


def test_percent_in_the_out_dir_is_not_expanded_by_slurm(local_slurm, tmp_path, capsys):
    out = tmp_path / "100%_done %j %x"
    run_dir, job_id = _submit(out, capsys, "train.max_steps=2", "cluster.time_limit_min=5")
    assert "%%" in (run_dir / "launch.sbatch").read_text()
    st = sub.wait(run_dir, timeout=180, poll_s=1)
    assert st.state == "COMPLETED" and _steps(_log(run_dir, job_id))[-1] == 2
