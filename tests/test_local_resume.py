"""`vdkit run --resume RUN_DIR` (issue 17 item 5): a local run stopped by a signal continues in its own
run directory; logs append; `validate` sees the restart; a finished run is left alone.

USR1 goes to the whole process group (`kill -USR1 -PGID`, what a batch system or a user does): the
`vdkit run` launcher passes it on and waits while every rank finishes its step and checkpoints.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vdkit.cli import main

RUN = ["method=lora", "cluster.gpus_per_node=2", "train.max_steps=150", "train.global_batch_size=4",
       "train.seq_length=128", "method.warmup_steps=0"]
STEP = re.compile(r"\| (\d+)/(\d+) \[")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _steps(text: str):
    return [int(m.group(1)) for u in re.split(r"[\r\n]", text) if (m := STEP.search(u))]


def _losses(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("reduced_train_loss")}


def test_a_stopped_local_run_resumes_in_its_run_dir_and_finishes_unbroken(tmp_path, capsys):
    vdkit = [sys.executable, "-m", "vdkit", "run"]
    whole = subprocess.Popen([*vdkit, *RUN, "--out", str(tmp_path / "whole")], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    first = subprocess.Popen([*vdkit, *RUN, "--out", str(tmp_path / "runs")], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = tmp_path / "runs" / "tiny_llama_lora_1n2g"
    deadline = time.monotonic() + 240
    while not ((run_dir / "local-1.out").exists() and _steps((run_dir / "local-1.out").read_text())
               and _steps((run_dir / "local-1.out").read_text())[-1] >= 5):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-2000:]
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGUSR1)  # launcher and ranks alike
    out, err = first.communicate(timeout=120)
    assert first.returncode == 75, err[-2000:]
    assert f"continue with: vdkit run --resume {run_dir}" in err and out.strip().splitlines()[-1] == str(run_dir)
    stopped = _steps((run_dir / "local-1.out").read_text())[-1]
    assert stopped < 150 and not (run_dir / "finished").exists()
    assert "Traceback" not in (run_dir / "local-1.out").read_text() + (run_dir / "logs" / "rank1.out").read_text()

    # Overrides make no sense on a resume: refused in one line.
    assert main(["run", "--resume", str(run_dir), "train.max_steps=9"]) == 2
    assert "takes no overrides" in capsys.readouterr().err

    old = dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        assert main(["run", "--resume", str(run_dir)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(old)
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run_dir.name]  # no `-2` run dir
    text = (run_dir / "local-1.out").read_text()
    assert _steps(text) == list(range(1, 151))  # one log, appended: every step once
    assert f"resuming from {run_dir / 'checkpoints' / f'step={stopped}.ckpt'}" in text
    assert (run_dir / "finished").is_file()
    whole.communicate(timeout=600)
    want, got = _losses(tmp_path / "whole" / "tiny_llama_lora_1n2g"), _losses(run_dir)
    assert sorted(got) == list(range(150))
    assert [got[s] for s in range(150)] == pytest.approx([want[s] for s in range(150)], rel=1e-5, abs=1e-6)

    assert main(["validate", str(run_dir)]) == 0
    assert f"restart: the run continued in 2 segments (resumed at step {stopped})" in capsys.readouterr().out
    assert main(["run", "--resume", str(run_dir)]) == 0  # finished: nothing runs again
    assert "has finished already" in capsys.readouterr().err
    assert _steps((run_dir / "local-1.out").read_text()) == list(range(1, 151))
    print(f"\nlocal resume figures: stopped after step {stopped} of 150 (USR1 to the process group, exit 75), "
          f"resumed in the same run dir, steps 1..150 unbroken, final loss {got[149]:.6f} vs uninterrupted "
          f"{want[149]:.6f}")
