"""The RayJob's entrypoint runs for real: a local Ray cluster as KubeRay would build it from the manifest.

`vdkit render` on the CPU Kubernetes cluster (k8s_cpu: two pods, one rank each) writes a RayJob for the
transformers engine with DeepSpeed ZeRO-3 on the tiny Llama; tests/ray_submitter.py starts a Ray head
and a worker node from its rayStartParams inside a private network and PID namespace (loopback only)
and runs KubeRay's submitter command with its entrypoint: Ray Train starts 2 workers, each runs a rank.
After the first checkpoint every rank gets the preemption signal: the ranks stop cleanly (exit 75),
Ray Train restarts the worker group and the engine resumes from the checkpoint. The losses, step by
step, equal the kit's direct ZeRO-3 run (`vdkit run ... parallelism.sharding=zero3`, 2 local ranks).

Needs ray[default,train] (the `ray` extra) and unshare (root); VDKIT_REQUIRE_RAY=1 (CI) turns a skip
into a failure.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.ray

STEPS = 12
RECIPE = ["engine=reference", "model=tiny_llama", "method=sft", "data=synthetic", "parallelism.sharding=zero3",
          f"train.max_steps={STEPS}", "train.global_batch_size=8", "train.micro_batch_size=2", "train.seq_length=64",
          "method.warmup_steps=0", "method.lr=1e-3", "engine.checkpoint_every_n_steps=3"]


def _why_not() -> str:
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        return "ray[default,train] is not installed (pip install 'vdkit[ray]')"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs root, unshare and ip for a private network namespace"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"unshare refused here: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return ""


@pytest.fixture(scope="module")
def ray_ok():
    why = _why_not()
    if why:
        if os.environ.get("VDKIT_REQUIRE_RAY") == "1":
            pytest.fail(f"VDKIT_REQUIRE_RAY=1 but {why}")
        pytest.skip(why)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RAY_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    # RAY_AUTH_MODE explicit: with it unset, Ray 2.60 turns token auth on wherever ~/.ray/auth_token exists (any
    # earlier local ray.init() writes one, authentication_token_setup.py), and the test's nodes then disagree on it
    env.update(OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false", RAY_AUTH_MODE="disabled")
    return env


def _losses(run_dir: Path) -> dict:
    """step -> reduced_train_loss from the run's TensorBoard events (a later event for a step wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("reduced_train_loss")}


def test_rayjob_entrypoint_trains_resumes_and_matches_the_direct_zero3_run(tmp_path, ray_ok):
    import yaml

    t0 = time.monotonic()
    # The direct run, started first: it trains while the Ray cluster comes up.
    direct = subprocess.Popen([sys.executable, "-m", "vdkit", "run", *RECIPE, "cluster=local", "cluster.gpus_per_node=2",
                               "--out", str(tmp_path / "direct")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=_env())
    render = subprocess.run([sys.executable, "-m", "vdkit", "render", *RECIPE, "cluster=k8s_cpu",
                             f"cluster.kubernetes.storage=[{{mount_path:{tmp_path},host_path:{tmp_path}}}]",
                             "--out", str(tmp_path / "runs")], capture_output=True, text=True, env=_env(), timeout=120)
    assert render.returncode == 0, render.stderr
    run_dir = Path(render.stdout.strip().splitlines()[-1])
    manifest = yaml.safe_load((run_dir / "rayjob.yaml").read_text())
    assert "--workers 2" in manifest["spec"]["entrypoint"] and manifest["spec"]["rayClusterSpec"][
        "workerGroupSpecs"][0]["replicas"] == 1  # a head and one worker pod, one rank each

    ray_tmp = tempfile.mkdtemp(prefix="vdkit-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        proc = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", sys.executable,
                               str(HERE / "ray_submitter.py"), str(run_dir / "rayjob.yaml"), ray_tmp,
                               "--preempt-after-checkpoint"], capture_output=True, text=True, env=_env(), timeout=420)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "=== status SUCCEEDED" in out, out[-6000:]
    ray_s = time.monotonic() - t0

    d_out = direct.communicate(timeout=300)[0].decode(errors="replace")
    assert direct.returncode == 0, d_out[-3000:]
    direct_dir = Path(d_out.strip().splitlines()[-1])

    # Ray Train ran the two ranks, the clean stop restarted the worker group, the engine resumed.
    assert "world_rank=0" in out and "world_rank=1" in out
    assert "exited with code 75" in out and "RETRY" in out, out[-6000:]
    m = re.search(r"resuming from \S+/checkpoints/deepspeed/step=(\d+)/", out)
    assert m, out[-6000:]
    resumed_at = int(m.group(1))
    assert 3 <= resumed_at < STEPS
    assert (run_dir / "checkpoints" / "deepspeed" / f"step={STEPS}").is_dir()
    assert (run_dir / "checkpoints" / "deepspeed" / "latest").read_text().strip() == f"step={STEPS}"

    ray_losses, direct_losses = _losses(run_dir), _losses(direct_dir)
    assert sorted(ray_losses) == sorted(direct_losses) == list(range(STEPS))  # logged as global_step 0..11
    for step in range(STEPS):
        assert ray_losses[step] == pytest.approx(direct_losses[step], rel=1e-6, abs=1e-7), (step, ray_losses, direct_losses)
    # validate reads the Kubernetes run like any other: the engine's events on the shared run directory, and the
    # job's stdout with Ray's worker prefixes across the restart
    val = subprocess.run([sys.executable, "-m", "vdkit", "validate", str(run_dir)], capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert val.returncode == 0 and f"{STEPS} timed step(s)" in val.stdout, val.stdout + val.stderr
    logs = tmp_path / "stdout-only"
    logs.mkdir()
    (logs / "ray-job.out").write_text(out)
    val = subprocess.run([sys.executable, "-m", "vdkit", "validate", str(logs / "ray-job.out")], capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert val.returncode == 0 and f"{STEPS} timed step(s)" in val.stdout, val.stdout + val.stderr
    print(f"\nray job (cluster up + train + restart) and direct run: {ray_s:.1f} s wall; resumed at step {resumed_at}")
    for step in range(STEPS):
        print(f"step {step + 1:2d}  ray {ray_losses[step]:.6f}  direct {direct_losses[step]:.6f}")
