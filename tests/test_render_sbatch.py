"""What launch.sbatch asks Slurm for and what its body sets, per cluster and layout."""
from __future__ import annotations

import dataclasses
import subprocess

import pytest

from helpers import directives  # sbatch's own reading of the #SBATCH lines
from vdkit.config import compose
from vdkit.errors import UserError
from vdkit.plan import make_plan
from vdkit.prepare import job_spec, sbatch_text
from vdkit.slurm import env as slurm_env
from vdkit.slurm import render

RUN_DIR = "/scratch/runs/r1"


def text_for(overrides, run_dir=RUN_DIR):
    plan = make_plan(compose(overrides))
    return plan, sbatch_text(plan, run_dir)


def exports(text: str) -> dict:
    """NAME -> value of the script's `export NAME=value` lines (values are simple here)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            name, value = line[len("export "):].split("=", 1)
            out[name] = value.strip("'\"")
    return out


@pytest.mark.parametrize("overrides", [
    ["cluster.nodes=1"],
    ["model=llama2_13b", "method=sft", "cluster.nodes=2"],
    ["model=llama2_7b", "cluster.nodes=1", "cluster.gpus_per_node=4"],
    ["model=llama2_70b", "method=pretrain", "cluster.nodes=6", "cluster=xe9680_4nic"],
])
def test_resources_come_from_the_recipe(overrides):
    from vdkit.schedule import time_plan

    plan, text = text_for(overrides)
    c = plan.recipe.cluster
    times = time_plan(plan)
    d = directives(text)
    assert d["--nodes"] == str(c.nodes)
    assert d["--ntasks-per-node"] == d["--gpus-per-node"] == str(c.gpus_per_node)
    assert d["--cpus-per-task"] == str(c.cpus_per_task)
    assert d["--time"] == str(times.time_limit_min) and 0 < times.time_limit_min <= c.max_time_min
    assert d["--mem"] == "0"
    assert d["--exclusive"] is True and d["--requeue"] is True
    assert d["--open-mode"] == "append"
    assert d["--job-name"] == plan.recipe.run_name
    assert d["--output"] == f"{RUN_DIR}/slurm-%j.out" and d["--error"] == f"{RUN_DIR}/slurm-%j.err"
    # To the batch shell only (B:), which passes it to ranks that catch it (the job contract).
    assert d["--signal"] == f"B:USR1@{times.lead_s}" and 0 < times.lead_s < times.time_limit_min * 60
    # Nothing site-hostile or unasked: no wckey, no per-task GPU binding, no --ntasks.
    assert not {"--wckey", "--gpus-per-task", "--ntasks", "--partition", "--account", "--qos", "--reservation",
                "--dependency"} & set(d)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_optional_site_directives():
    _, text = text_for(["cluster.partition=gpu", "cluster.account=ml team", "cluster.qos=high",
                        "cluster.reservation=xe9680_resv"])
    d = directives(text)
    assert (d["--partition"], d["--account"], d["--qos"], d["--reservation"]) == \
        ("gpu", "ml team", "high", "xe9680_resv")


def test_dependency_singleton_for_chained_runs():
    _, text = text_for(["cluster.dependency=singleton"])
    assert directives(text)["--dependency"] == "singleton"
    _, plain = text_for([])
    assert "--dependency" not in directives(plain)


def test_signal_stays_inside_a_short_time_limit():
    _, text = text_for(["cluster.time_limit_min=2"])
    assert directives(text)["--time"] == "2" and directives(text)["--signal"] == "B:USR1@30"  # a quarter of it


def test_time_limit_from_the_plan_capped_at_the_partition_maximum():
    """Issue 17's example: 70B LoRA at 1000 steps predicts ~762 min; a 240-min partition needs 4 allocations."""
    from vdkit.schedule import time_plan

    plan, text = text_for(["model=llama2_70b", "method=lora", "train.max_steps=1000"])
    times = time_plan(plan)
    assert directives(text)["--time"] == "240" and times.allocations == 4 and "not enough" in times.note
    assert times.wall_s / 60 > plan.prediction.step_seconds * 1000 / 60  # steps + start-ups + checkpoints
    plan, text = text_for(["model=llama2_70b", "method=lora", "train.max_steps=1000", "cluster.max_time_min=2880"])
    times = time_plan(plan)
    assert times.allocations == 1 and int(directives(text)["--time"]) == times.time_limit_min
    assert times.wall_s / 60 * 1.25 < times.time_limit_min <= 2880  # the stated margin, under the maximum
    with pytest.raises(UserError, match="exceeds the partition's maximum"):
        compose(["cluster.time_limit_min=300"])


@pytest.mark.parametrize("cluster,hcas", [
    ("xe9680", "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"),
    ("xe9680_4nic", "=mlx5_0,mlx5_3,mlx5_4,mlx5_5"),
])
def test_nccl_environment_for_native_infiniband(cluster, hcas):
    plan, text = text_for([f"cluster={cluster}"])
    e = exports(text)
    assert e["NCCL_IB_HCA"] == hcas == "=" + ",".join(plan.recipe.cluster.ib_hcas)
    assert e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == plan.recipe.cluster.socket_ifname
    assert e["NCCL_NVLS_ENABLE"] == "0" and e["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"
    assert e["MASTER_PORT"] == "$((20000 + SLURM_JOB_ID % 10000))"  # per job: see test_render_quoting
    assert e["SRUN_CPUS_PER_TASK"] == str(plan.recipe.cluster.cpus_per_task)
    for knob in ("NCCL_DEBUG", "NCCL_IB_GID_INDEX", "NCCL_ALGO", "NCCL_PROTO"):
        assert knob not in e


@pytest.mark.parametrize("overrides,tp", [
    (["model=llama2_7b", "method=lora"], 1),
    (["model=llama2_7b", "method=lora", "parallelism.tp=4"], 4),
])
def test_cuda_device_max_connections_only_with_tensor_parallelism(overrides, tp):
    plan, text = text_for(overrides)
    assert plan.tp == tp
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in exports(text)) == (tp > 1)


def test_nccl_debug_only_when_asked():
    _, text = text_for(["cluster.nccl_debug=info"])
    assert exports(text)["NCCL_DEBUG"] == "INFO"
    with pytest.raises(UserError, match="NCCL_DEBUG"):
        text_for(["cluster.nccl_debug=loud"])


def test_nemo_srun_has_the_pyxis_flags_and_nemo_command():
    from vdkit.recipes.nemo import nemo_command

    plan = make_plan(compose(["model=llama2_13b", "method=lora", "run.results_dir=/shared/results"]))
    argv = render.srun_argv(plan, RUN_DIR, job_spec(plan, RUN_DIR))
    assert argv[:3] == ["srun", "--kill-on-bad-exit=1", "--wait=60"]
    assert not [a for a in argv if a.startswith("--mpi")]  # no PMI bootstrap needed (no userbuffers)
    assert argv[-len(nemo_command(plan, RUN_DIR)):] == nemo_command(plan, RUN_DIR)
    flags = dict(a.split("=", 1) for a in argv if a.startswith("--container"))
    assert flags["--container-image"] == plan.recipe.engine.container_image
    assert flags["--container-mounts"].split(",") == [
        "/data/dolly:/data/dolly", "/models:/models", "/shared/results:/shared/results", f"{RUN_DIR}:{RUN_DIR}"]
    assert flags["--container-workdir"] == RUN_DIR
    assert "--no-container-mount-home" in argv
    env_names = flags["--container-env"].split(",")
    assert set(slurm_env.job_env(plan, job_spec(plan, RUN_DIR).env)) | {"MASTER_ADDR", "MASTER_PORT",
                                                                        "VDKIT_STOP_AT"} == set(env_names)
    text = sbatch_text(plan, RUN_DIR)
    assert "mkdir -p /shared/results" in text
    assert text.count("\nsrun ") == 1


def test_mpi_only_where_a_pmi_bootstrap_is_needed():
    plan = make_plan(compose(["cluster.mpi=pmi2"]))
    job = job_spec(plan, RUN_DIR)
    assert not [a for a in render.srun_argv(plan, RUN_DIR, job) if a.startswith("--mpi")]
    pmi_job = dataclasses.replace(job, pmi=True)  # e.g. NeMo's userbuffers TP overlap
    assert "--mpi=pmi2" in render.srun_argv(plan, RUN_DIR, pmi_job)
    none = make_plan(compose(["cluster.mpi=none"]))
    assert not [a for a in render.srun_argv(none, RUN_DIR, pmi_job) if a.startswith("--mpi")]


def test_one_dead_rank_ends_the_step():
    plan = make_plan(compose([]))
    argv = render.srun_argv(plan, RUN_DIR, job_spec(plan, RUN_DIR))
    assert "--kill-on-bad-exit=1" in argv and "--wait=60" in argv


def test_reference_engine_runs_without_a_container():
    from vdkit.recipes.reference import reference_command

    plan = make_plan(compose(["model=tiny_llama", "engine=reference", "data=synthetic", "cluster.nodes=2"]))
    argv = render.srun_argv(plan, RUN_DIR, job_spec(plan, RUN_DIR))
    assert not [a for a in argv if a.startswith("--container")]
    assert argv == ["srun", "--kill-on-bad-exit=1", "--wait=60"] + reference_command(RUN_DIR)


@pytest.mark.parametrize("image,message", [
    (None, "needs engine.container_image"),
    ("", "needs engine.container_image"),
    ("containers/nemo.sqsh", "must start with / or ./"),
    ("nemo.sqsh", "must start with / or ./"),
    ("nvcr.io/nvidia/nemo:24.01.01.framework", "separate the registry with '#'"),
    ("docker://nvcr.io#nvidia/nemo:24.01", "URI scheme"),
    ("nvcr.io#nvidia/nemo:24.01 extra", "whitespace"),
])
def test_images_pyxis_cannot_read_are_refused(image, message):
    with pytest.raises(UserError, match=message):
        slurm_env.check_image(image)


@pytest.mark.parametrize("image", ["/shared/containers/nemo.sqsh", "./nemo.sqsh", "nvcr.io#nvidia/nemo:24.01.01.framework",
                                   "user@nvcr.io#nvidia/nemo:24.03", "nvidia/cuda:12.2.0-base", "ubuntu"])
def test_images_pyxis_reads_pass_unchanged(image):
    assert slurm_env.check_image(image) == image


def test_image_with_hash_reaches_srun_intact():
    # Hydra's override grammar needs the '#' quoted: engine.container_image='nvcr.io#nvidia/nemo:TAG'
    r = compose(["engine.container_image='nvcr.io#nvidia/nemo:24.01.01.framework'"])
    assert r.engine.container_image == "nvcr.io#nvidia/nemo:24.01.01.framework"
    plan = make_plan(r)
    assert f"--container-image={r.engine.container_image}" in render.srun_argv(plan, RUN_DIR, job_spec(plan, RUN_DIR))
