"""vdkit.launch.local (`vdkit run`) and the engine as real processes: 2-rank gloo run, failures, kill and resume.

`vdkit run --resume RUN_DIR` (issue 17 item 5): a local run stopped by a signal continues in its own
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
import threading
import time
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.recipes.reference import reference_command


TINY = ["train.seq_length=128", "method.warmup_steps=0"]
STEP = re.compile(r"\| (\d+)/(\d+) \[[^,]*, reduced_train_loss=([^,]+), global_step=([^,]+), "
                  r"consumed_samples=([^,]+), train_step_timing in s=([^\]]+)\]")


def _updates(text: str):
    """(n, loss string, global_step, consumed_samples) for every progress update in ``text``."""
    return [(int(m.group(1)), m.group(3), float(m.group(4)), float(m.group(5)))
            for u in re.split(r"[\r\n]", text) if (m := STEP.search(u))]


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_vdkit_run_two_ranks_end_to_end(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vdkit.recipes.common.checkpoint import read_best

    cmd = [sys.executable, "-m", "vdkit", "run", "method=lora", "cluster.gpus_per_node=2", "train.max_steps=12",
           "train.global_batch_size=8", "train.micro_batch_size=2", "engine.checkpoint_every_n_steps=5",
           *TINY, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert run_dir.parent == tmp_path and run_dir.name == "tiny_llama_lora_1n2g"
    out = (run_dir / "local-1.out").read_bytes().decode()  # keep the \r separators
    assert "2 rank(s) (local, cpu), dp=2 mbs=2 gbs=8 grad_accum=2" in out
    assert "Warning:" not in out, out[-2000:]  # peft's deprecated-property read is silenced (known_warnings)
    ups = _updates(out)
    assert [u[0] for u in ups] == list(range(1, 13))
    assert [(u[2], u[3]) for u in ups] == [(n - 1.0, 8.0 * n) for n in range(1, 13)]
    assert "\r" in out and "Epoch 0: : 100%|██████████| 12/12 [" in out
    assert ups[-1][0] == 12 and _updates(proc.stdout)  # tee'd to the terminal too
    assert (run_dir / "logs" / "rank1.out").is_file()
    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    assert len(acc.Scalars("train_step_timing in s")) == 12
    # every 5 steps and the end's, the last 2 kept, each with its .sha256; run.mode=train keeps the best too
    best = read_best(run_dir / "checkpoints")
    kept = sorted({10, 12, best["step"]})
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(
        ["best.json"] + [f"step={s}.ckpt" for s in kept] + [f"step={s}.ckpt.sha256" for s in kept])
    assert (run_dir / "recipe.yaml").is_file() and (run_dir / "plan.json").is_file()


def test_a_failing_rank_fails_the_run(tmp_path, capsys):
    """Two ranks for a one-rank recipe: each rank refuses (exit 2); the launcher reports it."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.launch.local import launch_local
    from vdkit.run.create import create_run_dir

    recipe = compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic"])
    run_dir = create_run_dir(make_plan(recipe), {}, tmp_path)
    rc = launch_local(run_dir, world=2, per_node=2, terminal=open(os.devnull, "wb"), command=reference_command(run_dir))
    assert rc == 2
    assert re.search(r"rank [01] exited with code 2; see ", capsys.readouterr().err)
    assert "2 processes were started" in (run_dir / "local-1.out").read_text()


@pytest.mark.slow  # real ranks or a Bridge import in a child: minutes under load, CI runs it
def test_killed_run_resumes_without_repeating_or_losing_a_step(tmp_path):
    """SIGKILL a real run after a checkpoint, restart it, and compare with an uninterrupted run."""
    import torch

    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.common.checkpoint import latest
    from vdkit.recipes.reference.checkpoint import load
    from vdkit.recipes.reference.train import train
    from vdkit.run.create import create_run_dir

    max_steps, gbs = 40, 16
    recipe = compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic", "method=sft",
                      "method.lr=3e-3", f"train.max_steps={max_steps}", f"train.global_batch_size={gbs}",
                      "engine.checkpoint_every_n_steps=5", *TINY])
    run_dir = create_run_dir(make_plan(recipe), {}, tmp_path / "killed")
    ckpts = run_dir / "checkpoints"

    first = subprocess.Popen(reference_command(run_dir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=_clean_env(), cwd=run_dir)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(first.stdout.fileno(), 4096), b"")))
    reader.start()
    deadline = time.monotonic() + 120
    while True:  # kill once a checkpoint exists and two more steps have finished after it
        assert first.poll() is None, "the run finished before it could be killed"
        assert time.monotonic() < deadline, "the run made no progress"
        ups = _updates(b"".join(chunks).decode())
        ck = latest(ckpts)
        if ck is not None and ups and ups[-1][0] >= int(ck.stem.split("=")[1]) + 2:
            first.kill()
            break
        time.sleep(0.01)
    first.wait()
    reader.join()
    killed = _updates(b"".join(chunks).decode())
    resume_from = int(latest(ckpts).stem.split("=")[1])
    assert killed[-1][0] > resume_from  # steps after the checkpoint were lost and must be redone

    second = subprocess.run(reference_command(run_dir), capture_output=True, text=True, env=_clean_env(),
                            cwd=run_dir, timeout=180)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resuming from {ckpts / f'step={resume_from}.ckpt'}" in second.stdout
    resumed = _updates(second.stdout)
    assert [u[0] for u in resumed] == list(range(resume_from + 1, max_steps + 1))
    assert resumed[-1][2:] == (max_steps - 1.0, float(max_steps * gbs))
    # The re-done steps saw the same batches from the same state: the same losses.
    again = {u[0]: u[1] for u in resumed}
    redone = [(u[0], u[1]) for u in killed if u[0] > resume_from]
    assert redone and all(again[n] == loss for n, loss in redone), (redone, again)

    # And the end state equals an uninterrupted run's.
    torch.set_num_threads(1)
    whole = create_run_dir(make_plan(recipe), {}, tmp_path / "whole")
    os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    assert train(whole, stream=open(os.devnull, "w")) == max_steps
    a = load(latest(ckpts))["model"]
    b = load(latest(whole / "checkpoints"))["model"]
    assert latest(ckpts).name == f"step={max_steps}.ckpt" and a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst


RUN = ["method=lora", "cluster.gpus_per_node=2", "train.max_steps=150", "train.global_batch_size=4",
       "train.seq_length=128", "method.warmup_steps=0"]
BAR_STEP = re.compile(r"\| (\d+)/(\d+) \[")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _steps(text: str):
    return [int(m.group(1)) for u in re.split(r"[\r\n]", text) if (m := BAR_STEP.search(u))]


def _losses(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("reduced_train_loss")}


@pytest.mark.slow  # real ranks or a Bridge import in a child: minutes under load, CI runs it
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
    # a finished run's count edited up: one line with the way on, not "nothing to do" (the edit would not train)
    recipe = run_dir / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("max_steps: 150\n", "max_steps: 160\n", 1))
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "has finished at step 150" in err and "train.max_steps=160" in err and "steps 151..160" in err
    print(f"\nlocal resume figures: stopped after step {stopped} of 150 (USR1 to the process group, exit 75), "
          f"resumed in the same run dir, steps 1..150 unbroken, final loss {got[149]:.6f} vs uninterrupted "
          f"{want[149]:.6f}")
