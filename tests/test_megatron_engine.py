"""engine=megatron for real: every parallel layout trains the same model as one rank does.

Real multi-rank runs of megatron-core on CPU over gloo (`vdkit run engine=megatron`), a 4-layer
tiny Llama, a few steps each. Losses are read at full precision from TensorBoard. The runs are
shared by the tests of this module (each is started once, on first use).

- equal to a one-rank run of the same recipe: TP2 (LoRA), PP2 (P-tuning), TP2 x PP2 with VP2 and
  DP2 with the distributed optimizer (SFT);
- loss falls against an lr = 0 control for SFT, LoRA and P-tuning, each on a parallel layout;
- memory.json agrees with the planner within 2 % on every rank of every run (weights, gradients,
  optimizer), and each layer's activation bytes within 5 %;
- a run killed after a checkpoint resumes with the same losses (DP2, distributed optimizer).
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

from helpers import assert_memory_agrees

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # a dozen real multi-rank runs: minutes on 2 cores

BASE = ["engine=megatron", "model.num_layers=4", "train.seq_length=128", "method.warmup_steps=0",
        "train.global_batch_size=8", "train.micro_batch_size=2", "train.max_steps=6",
        "engine.checkpoint_every_n_steps=2"]
LR = {"sft": "method.lr=1e-3", "lora": "method.lr=1e-2", "ptuning": "method.lr=1e-2"}
# LoRA on every linear (method.lora_targets; row-parallel proj / fc2 too): the layouts below train alike and each rank's
# weights, gradients, optimizer state and activations agree with the plan, at no extra run
METHOD_EXTRA = {"lora": ["method.lora_targets=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"]}
LAYOUTS = {
    "one": ["cluster.gpus_per_node=1"],
    # activation recomputation changes no loss: selective under TP, full under PP
    "tp2": ["cluster.gpus_per_node=2", "parallelism.tp=2", "parallelism.recompute=selective"],
    "pp2": ["cluster.gpus_per_node=2", "parallelism.pp=2", "parallelism.recompute=full"],
    "tp2pp2vp2": ["cluster.gpus_per_node=4", "parallelism.tp=2", "parallelism.pp=2", "parallelism.vp=2"],
    "dp2": ["cluster.gpus_per_node=2", "parallelism.tp=1", "parallelism.pp=1", "parallelism.distributed_optimizer=true"],
}
STEP = re.compile(r"\| (\d+)/\d+ \[[^,]*, reduced_train_loss=")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _vdkit_run(out: Path, overrides) -> Path:
    cmd = [sys.executable, "-m", "vdkit", "run", *overrides, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=400)
    assert proc.returncode == 0, (proc.stderr[-3000:], proc.stdout[-3000:])
    return Path(proc.stdout.strip().splitlines()[-1])


def _losses(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    by_step = {}
    for e in sorted(acc.Scalars("reduced_train_loss"), key=lambda e: e.wall_time):
        by_step[e.step] = e.value  # a step redone after a restart: the later value counts
    return [by_step[k] for k in sorted(by_step)]


class Runs:
    """Each (method, layout, lr) trained once per module, on first use."""

    def __init__(self, root: Path):
        self.root, self.done = root, {}

    def get(self, method: str, layout: str, lr0: bool = False, extra=()) -> Path:
        key = (method, layout, lr0, tuple(extra))
        if key not in self.done:
            name = f"{method}_{layout}{'_lr0' if lr0 else ''}"
            lr = ["method.lr=0.0", "method.min_lr=0.0"] if lr0 else [LR[method]]
            self.done[key] = _vdkit_run(self.root / name, [*BASE, f"method={method}", *METHOD_EXTRA.get(method, ()), *lr,
                                                           *LAYOUTS[layout], *extra])
        return self.done[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("megatron"))


def _run_again(run_dir: Path) -> None:
    """The job started again (a requeue, a resume): the same command on the same run directory, 2 x 2 ranks
    of one thread each; it must succeed."""
    from vdkit.launch.local import launch_local
    from vdkit.recipes.megatron import megatron_command

    with open(os.devnull, "wb") as sink:
        old = dict(os.environ)
        os.environ.update(OMP_NUM_THREADS="1")
        try:
            assert launch_local(run_dir, 2, 2, terminal=sink, command=megatron_command(run_dir)) == 0
        finally:
            os.environ.clear()
            os.environ.update(old)


@pytest.mark.parametrize("method,layout,world", [
    ("lora", "tp2", 2), ("ptuning", "pp2", 2), ("sft", "tp2pp2vp2", 4), ("sft", "dp2", 2)])
def test_parallel_layout_trains_exactly_like_one_rank(runs, method, layout, world):
    one, par = runs.get(method, "one"), runs.get(method, layout)
    a, b = _losses(one), _losses(par)
    assert len(a) == len(b) == 6
    assert b == pytest.approx(a, rel=1e-4, abs=1e-5), (a, b)
    out = (par / "local-1.out").read_text()
    assert f"{world} rank(s) (local, cpu)" in out
    # megatron-core's known-harmless CPU warnings are silenced at their source (vdkit.recipes.common.known_warnings)
    assert "Warning:" not in out, out[-2000:]
    assert_memory_agrees(par, world, activations=True)
    assert_memory_agrees(one, 1, activations=True)


# LoRA starts as the base model (B = 0), so SFT's lr = 0 run is its control too; the equal first
# losses below check that.
CONTROL = {"sft": "sft", "lora": "sft", "ptuning": "ptuning"}


@pytest.mark.parametrize("method,layout", [("sft", "tp2pp2vp2"), ("lora", "tp2"), ("ptuning", "pp2")])
def test_loss_falls_against_an_lr0_control(runs, method, layout):
    trained, control = _losses(runs.get(method, layout)), _losses(runs.get(CONTROL[method], "one", lr0=True))
    assert trained[0] == pytest.approx(control[0], rel=1e-4)  # same model, same first batch
    assert trained[-1] < control[-1] - 0.05, (trained, control)
    assert_memory_agrees(runs.get(CONTROL[method], "one", lr0=True), 1, activations=True)


# Llama 3.1's blocks at toy size (conf/model/tiny_llama3.yaml): GQA, RoPE theta 500000 with llama3 scaling,
# partial recompute (block: the first layer of each stage) under PP2.
LLAMA3 = ["model=tiny_llama3", "parallelism.recompute_num_layers=1"]  # the pp2 layout recomputes (full)


def test_llama3_trains_exactly_like_one_rank(runs):
    one = _losses(runs.get("sft", "one", extra=["model=tiny_llama3"]))
    pp2 = _losses(runs.get("sft", "pp2", extra=LLAMA3))
    assert len(one) == len(pp2) == 6 and pp2 == pytest.approx(one, rel=1e-4, abs=1e-5), (one, pp2)
    # (that the scaling is built as transformers builds it: tests/test_context.py)
    assert one[-1] < one[0] - 0.05  # and it learns


def test_layout_line_names_what_megatron_runs(runs):
    out = (runs.get("sft", "tp2pp2vp2") / "local-1.out").read_text()
    assert "tp=2 pp=2 vp=2 dp=1 sp=True" in out and "megatron-core 0.16.1" in out
    assert "train_step_timing in s=" in out and "Epoch 0: : 100%|██████████| 6/6 [" in out


def test_killed_run_resumes_with_the_same_losses(runs, tmp_path):
    """SIGKILL a DP2 distributed-optimizer run after a checkpoint; the restart redoes the lost steps
    and every loss equals the uninterrupted run's."""
    whole = runs.get("sft", "dp2")
    cmd = [sys.executable, "-m", "vdkit", "run", *BASE, "method=sft", LR["sft"], *LAYOUTS["dp2"],
           "--out", str(tmp_path)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                             start_new_session=True)
    run_dir = tmp_path / "tiny_llama_sft_1n2g"
    deadline = time.monotonic() + 300
    while True:  # kill once a checkpoint exists and a step after it has finished
        assert first.poll() is None, "the run finished before it could be killed"
        assert time.monotonic() < deadline, "the run made no progress"
        log = run_dir / "local-1.out"
        steps = [int(m.group(1)) for m in STEP.finditer(log.read_text())] if log.is_file() else []
        if (run_dir / "checkpoints" / "step=2.ckpt").is_dir() and steps and steps[-1] >= 3:
            os.killpg(first.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    first.wait()
    from vdkit.run.runlock import is_held

    deadline = time.monotonic() + 60  # the killed ranks hold the run-dir lock until the kernel has torn them down
    while is_held(run_dir):
        assert time.monotonic() < deadline, "the killed ranks still hold the run directory"
        time.sleep(0.05)
    assert not (run_dir / "checkpoints" / "step=6.ckpt").exists()
    _run_again(run_dir)
    text = (run_dir / "local-1.out").read_text()
    assert "resuming from" in text and "global_step" in text
    assert _losses(run_dir) == pytest.approx(_losses(whole), rel=1e-5, abs=1e-6)
    # run.mode=train (the default) also saves each validation's best: the resumed run ends with the uninterrupted
    # run's checkpoints and the same best (its validation losses are the same too)
    from vdkit.recipes.common.checkpoint import read_best

    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        sorted(p.name for p in (whole / "checkpoints").iterdir())
    assert "step=6.ckpt" in {p.name for p in (run_dir / "checkpoints").iterdir()}
    from vdkit.recipes.megatron.checkpoint import check_resume
    from vdkit.run.rundir import load_plan

    # each checkpoint records the layout that wrote it: what `vdkit check` / `vdkit run --resume` compare
    assert "written by this run's layout (TP 1 PP 1 VP 1 DP 2, distributed optimizer True" in \
        check_resume(load_plan(run_dir), run_dir)
    got, want = read_best(run_dir / "checkpoints"), read_best(whole / "checkpoints")
    assert got["step"] == want["step"] and got["validation_loss"] == pytest.approx(want["validation_loss"], rel=1e-5)


def test_usr1_to_one_rank_checkpoints_exits_75_and_the_resume_loses_and_repeats_nothing(runs, tmp_path):
    """The job contract for the megatron engine: USR1 reaches only rank 1 of a DP2 run (no Slurm client
    on PATH, as in a container); both ranks stop after the same step, that step's checkpoint is written,
    both exit 75. The resumed run goes on at the next step, and every loss equals the uninterrupted run's."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.launch.local import rank_env
    from vdkit.recipes.common.checkpoint import latest
    from vdkit.recipes.megatron import megatron_command
    from vdkit.run.ports import free_port
    from vdkit.commands.run import with_local_defaults
    from vdkit.run.create import create_run_dir
    from helpers import no_slurm_path as _no_slurm_path

    whole = runs.get("sft", "dp2")
    # run.mode=timing: no validation saves either, so the signal's checkpoint is the only one (train mode's
    # resume after a kill is test_killed_run_resumes_with_the_same_losses); the losses are still the train-mode
    # run's: validation changes no training step
    overrides = [*BASE, "method=sft", LR["sft"], *LAYOUTS["dp2"], "engine.checkpoint_every_n_steps=0",
                 "run.mode=timing"]
    run_dir = create_run_dir(make_plan(compose(with_local_defaults(overrides))), {}, tmp_path / "runs")
    container_path = _no_slurm_path(tmp_path)
    port = free_port()
    first_out = tmp_path / "first.out"
    procs = []
    with open(first_out, "wb") as rank0_out, open(tmp_path / "rank1.out", "wb") as rank1_out:
        for rank, sink in enumerate((rank0_out, rank1_out)):
            env = rank_env(rank, 2, 2, port, base=_env())
            env.update(SLURM_JOB_ID="4242", PATH=container_path)
            procs.append(subprocess.Popen(megatron_command(run_dir), env=env, cwd=run_dir, stdout=sink,
                                          stderr=subprocess.STDOUT))
        try:
            deadline = time.monotonic() + 120
            while not [int(m.group(1)) for m in STEP.finditer(first_out.read_text())]:
                assert all(p.poll() is None for p in procs), first_out.read_text()[-3000:]
                assert time.monotonic() < deadline, "the run made no progress"
                time.sleep(0.01)
            procs[1].send_signal(signal.SIGUSR1)  # only rank 1: rank 0 learns it from the all-reduce
            rcs = [p.wait(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    out = first_out.read_text()
    first = [int(m.group(1)) for m in STEP.finditer(out)]
    stopped = first[-1]
    assert rcs == [75, 75], (rcs, out[-3000:], (tmp_path / "rank1.out").read_text()[-3000:])
    assert stopped < 6 and first == list(range(1, stopped + 1))
    assert f"another rank's signal: stopped after global_step {stopped}" in out  # rank 0 learnt it from rank 1
    assert "Traceback" not in (tmp_path / "rank1.out").read_text()
    # checkpoint_every_n_steps=0: the only checkpoint is the one the signal asked for
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"step={stopped}.ckpt"]
    assert latest(run_dir / "checkpoints").name == f"step={stopped}.ckpt"

    _run_again(run_dir)  # the requeued job: same command, same run dir
    text = (run_dir / "local-1.out").read_text()
    assert f"resuming from {run_dir / 'checkpoints' / f'step={stopped}.ckpt'} (global_step {stopped}" in text
    assert [int(m.group(1)) for m in STEP.finditer(text)] == list(range(stopped + 1, 7))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    assert sorted(e.step for e in acc.Scalars("reduced_train_loss")) == list(range(6))  # none lost, none twice
    assert _losses(run_dir) == pytest.approx(_losses(whole), rel=1e-5, abs=1e-6)


def test_run_mode_train_validates_on_every_rank_and_keeps_the_best(tmp_path):
    """run.mode=train at TP 2: the validation loss is all-reduced, every rank agrees on the best (no hang),
    best.json names a kept checkpoint."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "vdkit", "run", "engine=megatron", "model=tiny_llama", "method=lora",
                           "parallelism.tp=2", "cluster.gpus_per_node=2", "train.max_steps=6",
                           "train.global_batch_size=4", "train.val_every_n_steps=3", "train.val_batches=1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "tiny_llama_lora_1n2g"
    log = (run / "local-1.out").read_text()
    assert log.count("validation_loss") == 2
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert (run / "checkpoints" / best["checkpoint"]).is_dir()
