"""engine=bridge executed for real: Megatron-Bridge 0.3.1's own loop on CPU over gloo (`vdkit run`).

One shared starting checkpoint - a toy HF Llama converted with Bridge's import path
(``python -m vdkit.recipes.bridge.convert``) - so that every layout starts from the same weights
(Bridge seeds its initialisation per pipeline rank; its load reshards to any TP / PP). Then:
SFT in one rank, TP2 + SP, PP2, PP2 x VP2, DP2 + distributed optimizer (losses equal to one rank's),
LoRA (only the adapters train), pretraining on Bridge's mock data; the loss falls against an lr = 0 control; ``memory.json`` agrees with the plan per rank within 2 %; a run
SIGKILLed after a checkpoint resumes with the uninterrupted losses; ``validate --steps`` parses
Bridge's own log lines. A tiny model and 4 steps: ~40 s per run on an idle 2-core machine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import assert_memory_agrees

try:  # not imported here: `import megatron.bridge` needs the shim on a CPU
    import importlib.util

    _HAVE_BRIDGE = importlib.util.find_spec("megatron.bridge") is not None
except (ImportError, ValueError):
    _HAVE_BRIDGE = False
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _HAVE_BRIDGE, reason="megatron-bridge not installed (extra [bridge])")]

STEPS = 4
BASE = ["engine=bridge", "model=tiny_llama", "model.num_layers=4", "data=synthetic", "train.seq_length=64",
        "method.warmup_steps=0", "train.global_batch_size=8", "train.micro_batch_size=2", f"train.max_steps={STEPS}",
        "engine.checkpoint_every_n_steps=2"]
LR = {"sft": ["method.lr=1e-3"], "lora": ["method.lr=1e-2"], "pretrain": ["method.lr=1e-3", "method.min_lr=1e-4"]}
LAYOUTS = {
    "one": ["cluster.gpus_per_node=1"],
    "tp2sp": ["cluster.gpus_per_node=2", "parallelism.tp=2", "parallelism.sequence_parallel=true"],
    "pp2": ["cluster.gpus_per_node=2", "parallelism.pp=2"],
    "pp2vp2": ["cluster.gpus_per_node=2", "parallelism.pp=2", "parallelism.vp=2"],
    "dp2": ["cluster.gpus_per_node=2", "parallelism.tp=1", "parallelism.pp=1", "parallelism.distributed_optimizer=true"],
}
WORLD = {"one": 1, "tp2sp": 2, "pp2": 2, "pp2vp2": 2, "dp2": 2}

def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _losses(run_dir: Path):
    """Per-step losses as `vdkit validate --steps` reads them (Bridge's own log lines / TensorBoard)."""
    from vdkit.validation.logs import read_source

    return [r.loss for r in read_source(run_dir).steps]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The shared starting checkpoint: a seeded toy HF Llama of the runs' size, converted to a Bridge
    checkpoint by ``python -m vdkit.recipes.bridge.convert`` (what the demo does too)."""
    from vdkit.composition.config import compose
    from vdkit.recipes.bridge.convert import make_base

    out = make_base(compose(BASE), tmp_path_factory.mktemp("bridge_base"))
    assert (out / "iter_0000000" / "metadata.json").is_file() and (out / "iter_0000000" / "tokenizer").is_dir()
    return out


# One-rank runs use one of the machine's two cores: each starts together with a partner, so the two share
# the machine (the multi-rank layouts use both cores themselves).
PARTNERS = {("sft", "one", False): ("sft", "one", True), ("lora", "one", False): ("pretrain", "one", False)}
PARTNERS.update({v: k for k, v in PARTNERS.items()})


class Runs:
    """Each (method, layout, lr0) trained once per module, on first use (a one-rank run with its partner)."""

    def __init__(self, root: Path, base: Path):
        self.root, self.base, self.started, self.done = root, base, {}, {}

    def _start(self, key) -> None:
        if key in self.started:
            return
        method, layout, lr0 = key
        lr = ["method.lr=0.0", "method.min_lr=0.0"] if lr0 else LR[method]
        start = [] if method == "pretrain" else [f"model.megatron_path={self.base}"]
        out = self.root / f"{method}_{layout}{'_lr0' if lr0 else ''}"
        with open(f"{out}.stdout", "wb") as fo, open(f"{out}.stderr", "wb") as fe:  # files: a pipe would fill
            self.started[key] = (out, subprocess.Popen(
                [sys.executable, "-m", "vdkit", "run", *BASE, f"method={method}", *lr, *start, *LAYOUTS[layout],
                 "--out", str(out)], stdout=fo, stderr=fe, env=_env()))

    def get(self, method: str, layout: str, lr0: bool = False) -> Path:
        key = (method, layout, lr0)
        if key not in self.done:
            self._start(key)
            if key in PARTNERS:
                self._start(PARTNERS[key])
            where, proc = self.started[key]
            proc.wait(timeout=900)
            out, err = (Path(f"{where}.{n}").read_text(errors="replace") for n in ("stdout", "stderr"))
            assert proc.returncode == 0, out[-4000:] + err[-4000:]
            self.done[key] = Path(out.strip().splitlines()[-1])
        return self.done[key]

    def close(self) -> None:
        for _where, proc in self.started.values():  # a partner no test asked for (a -k selection)
            if proc.poll() is None:
                proc.terminate()  # vdkit run stops its ranks on TERM
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, base):
    r = Runs(tmp_path_factory.mktemp("bridge"), base)
    yield r
    r.close()


def yaml_model(run_dir: Path) -> dict:
    """The model section of the run's bridge.yaml (what the ranks ran)."""
    import yaml

    return yaml.safe_load((run_dir / "bridge.yaml").read_text())["model"]


@pytest.mark.parametrize("layout", ["tp2sp", "pp2", "dp2"])
def test_parallel_layout_trains_like_one_rank(runs, layout):
    one, par = runs.get("sft", "one"), runs.get("sft", layout)
    a, b = _losses(one), _losses(par)
    assert len(a) == len(b) == STEPS
    # equal, not close: the same model, data and gradient in every layout (fine-tuning's per-token loss,
    # config.per_token_loss); measured: at most 1.6e-7 apart over 10 steps (benchmarks/bench_bridge_layouts.py)
    assert b == pytest.approx(a, rel=1e-5), (a, b)
    assert_memory_agrees(par, WORLD[layout])
    assert_memory_agrees(one, 1)
    out = (par / "local-1.out").read_text()
    assert "bridge engine on CPU (Megatron-Bridge 0.3.1, megatron-core 0.16.1, pinned shim)" in out


def test_interleaved_pipeline_trains_like_one_rank(runs):
    """PP2 x VP2 (one layer per model chunk): the interleaved schedule's sends are NVIDIA's unbatched,
    overlapped ones (config.INTERLEAVED_P2P); with the model's default batched sends the two stages
    swapped activations and gradients from the third micro-batch on (0.2 % off at step 1)."""
    a, b = _losses(runs.get("sft", "one")), _losses(runs.get("sft", "pp2vp2"))
    assert len(a) == len(b) == STEPS
    assert b == pytest.approx(a, rel=1e-5), (a, b)  # the same operations in the same order: equal
    par = runs.get("sft", "pp2vp2")
    assert yaml_model(par)["batch_p2p_comm"] is False and yaml_model(par)["overlap_p2p_comm"] is True


def test_interleaved_pipeline_trains_with_bridges_loop(runs):
    par = runs.get("sft", "pp2vp2")
    losses, control = _losses(par), _losses(runs.get("sft", "one", lr0=True))
    assert len(losses) == STEPS and losses[-1] < control[-1] - 0.05, (losses, control)
    assert_memory_agrees(par, 2)


@pytest.mark.parametrize("method", ["sft", "lora"])
def test_loss_falls_against_an_lr0_control(runs, method):
    # LoRA starts as the base model (B = 0): SFT's lr = 0 run is its control too
    trained, control = _losses(runs.get(method, "one")), _losses(runs.get("sft", "one", lr0=True))
    assert trained[0] == pytest.approx(control[0], rel=1e-5)  # same weights, same first batch
    assert trained[-1] < control[-1] - 0.05, (trained, control)


def test_lora_trains_only_the_adapters(runs):
    """memory.json: gradients (and Adam states) exist for the adapters only - the plan's LoRA count."""
    from vdkit.planner.arch import trainable_params
    from vdkit.run.rundir import load_plan

    run = runs.get("lora", "one")
    report = assert_memory_agrees(run, 1)
    plan = load_plan(run)
    lora_params = trainable_params(plan.recipe)
    measured = report["ranks"][0]["measured"]
    assert measured["gradients"] == 4 * lora_params  # fp32 gradients: the adapters' and nothing else
    assert measured["weights"] - 4 * lora_params > 4 * lora_params  # the frozen base weights, without gradients
    out = (run / "local-1.out").read_text()
    assert "Adding lora to: decoder.layers.0.self_attention.linear_qkv" in out


def test_pretraining_from_scratch(runs):
    run = runs.get("pretrain", "one")
    losses = _losses(run)
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert_memory_agrees(run, 1)
    out = (run / "local-1.out").read_text()
    assert "MockGPTDataset" in out or "mock" in (run / "bridge.yaml").read_text().lower()
    # megatron-core's GPTDataset loss-mask cache: fixed by the job itself (job.keep_loss_mask_cache), once
    assert out.count("patched GPTDataset's loss-mask cache") == 1, out[-3000:]


def test_validate_steps_parses_bridges_own_lines(runs):
    """`vdkit validate --steps RUN_DIR` on a Bridge run: the per-step CSV from Bridge's log lines."""
    run = runs.get("sft", "one")
    text = (run / "local-1.out").read_text()
    lines = [l for l in text.splitlines() if "iteration" in l and "elapsed time per iteration (ms)" in l]
    assert len(lines) == STEPS and "lm loss:" in lines[0]
    out = subprocess.run([sys.executable, "-m", "vdkit", "validate", "--steps", str(run / "local-1.out")],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [r.split(",") for r in out.stdout.strip().splitlines()[1:]]
    assert len(rows) == STEPS
    for row, line in zip(rows, lines):
        ms = float(line.split("elapsed time per iteration (ms):")[1].split("|")[0])
        loss = float(line.split("lm loss:")[1].split("|")[0])
        assert float(row[1]) == pytest.approx(ms / 1000, rel=1e-6) and float(row[2]) == pytest.approx(loss, rel=1e-6)


def test_killed_run_resumes_with_the_uninterrupted_losses(runs, tmp_path):
    """SIGKILL a DP2 + distributed-optimizer SFT run after its step-2 checkpoint; the restart loads it
    (Bridge's own resume: checkpoint.load, the optimizer's torch_dist ``dp_reshardable`` state) and every
    loss equals the uninterrupted run's - Adam's moments and its step count restored (the shim's
    distrib_optimizer.py:825 / :940 patches: without them step 4 was 0.2 % off)."""
    from vdkit.commands.run import with_local_defaults
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import prepare

    recipe = compose(with_local_defaults([*BASE, "method=sft", *LR["sft"], f"model.megatron_path={runs.base}",
                                          *LAYOUTS["dp2"]]))
    plan = make_plan(recipe)
    assert plan.recipe.parallelism.distributed_optimizer and plan.dp == 2
    run_dir = prepare(plan, tmp_path / "runs").write()
    from vdkit.recipes import engines

    rank_argv = engines.get("bridge").command(plan, run_dir)  # what `vdkit run` starts per rank
    launch = ("import sys; from vdkit.launch.local import launch_local; "
              "sys.exit(launch_local(sys.argv[1], 2, 2, terminal=open('/dev/null', 'wb'), command=sys.argv[2:]))")
    proc = subprocess.Popen([sys.executable, "-c", launch, str(run_dir), *rank_argv], env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        # published and complete (Bridge writes the tracker before the checkpoint's run_config.yaml)
        if marker.is_file() and marker.read_text().strip() == "2" and (marker.parent / "iter_0000002" / "run_config.yaml").is_file():
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the ranks and their checkpoint-writer children
    proc.wait(60)
    from vdkit.run.runlock import is_held

    deadline = time.monotonic() + 60
    while is_held(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = run_dir / "logs" / "rank1.out"  # the last rank prints Bridge's step lines; segments append
    first = log.stat().st_size if log.is_file() else 0
    done = subprocess.run([sys.executable, "-c", launch, str(run_dir), *rank_argv], env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = log.read_bytes()[first:].decode(errors="replace")
    assert "iteration        3/       4" in out and "iteration        1/       4" not in out  # resumed at 3
    resumed = [float(l.split("lm loss:")[1].split("|")[0]) for l in out.splitlines() if "lm loss:" in l]
    assert resumed == pytest.approx(_losses(runs.get("sft", "dp2"))[2:], rel=1e-5)


BRIDGE_SLURM_JOB = [
    "engine=bridge", "model=tiny_llama", "model.num_layers=4", "method=pretrain", "data=synthetic",
    "engine.container_image=null", "cluster=xe9680", "cluster.nodes=2", "cluster.gpus_per_node=1",
    "parallelism.pp=2", "train.max_steps=3", "train.micro_batch_size=2", "train.global_batch_size=4",
    "train.seq_length=64", "method.warmup_steps=0", "cluster.mpi=none", "cluster.socket_ifname=lo",
    "cluster.cpus_per_task=1",
]


def test_two_node_bridge_job_completes_on_the_local_slurm(local_slurm, tmp_path, capsys):
    """Two emulated nodes, one srun task each (no torchrun): Bridge finds its ranks from Slurm's
    variables and meets over gloo at the first node's address; one pipeline stage per node."""
    from vdkit.cli import main

    rc = main(["submit", *BRIDGE_SLURM_JOB, "--out", str(tmp_path), "--wait", "--timeout", "600"])
    out = capsys.readouterr().out.splitlines()
    run_dir, job_id = Path(out[0].split("\t")[0]), out[0].split("\t")[1]
    log = "".join((run_dir / f"slurm-{job_id}.{ext}").read_text() for ext in ("out", "err")
                  if (run_dir / f"slurm-{job_id}.{ext}").exists())
    assert rc == 0, log[-4000:]
    assert out[-1].split("\t")[:3] == [str(run_dir), job_id, "COMPLETED exit=0:0"]
    assert "-m vdkit.recipes.bridge.rank" in (run_dir / "launch.sbatch").read_text()
    assert "torchrun" not in (run_dir / "launch.sbatch").read_text()
    assert "iteration        3/       3 |" in log and "lm loss:" in log, log[-4000:]
    nodes = local_slurm.run("scontrol", "-o", "show", "job", job_id, check=True).stdout
    assert "NumNodes=2 " in nodes
    report = json.loads((run_dir / "memory.json").read_text())
    assert [r["stage"] for r in report["ranks"]] == [0, 1]
    assert_memory_agrees(run_dir, 2)
