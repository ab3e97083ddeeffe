"""The Slurm launcher's launch.sbatch (vdkit.slurm.render): what it asks Slurm for and what its body sets,
per cluster and layout; hostile names and paths; golden files.

Hostile names and paths: the rendered script runs exactly what was asked. The body of a rendered launch.sbatch is executed for real by bash, with ``srun`` and ``scontrol``
replaced by shell functions (srun writes its argv NUL-separated, scontrol answers like Slurm's
for an emulated node whose name does not resolve). The ``#SBATCH`` lines are read back with a
port of sbatch's own argument parser (src/sbatch/opt.c, ``_get_argument``).

Golden files: launch.sbatch for a few cells, compared byte for byte with tests/golden/*.sbatch.

The scripts are rendered through the whole path (`render_run` into a temporary directory), then
normalised: the run directory becomes ``@RUN_DIR@`` and the interpreter of the reference engine
``@PYTHON@`` (both vary by machine). A difference fails with a unified diff.

They pin submitit's private renderer (1.5.4) together with our body: a submitit upgrade or a change
of the rendered script shows up here. After a deliberate change, regenerate and review the diff:

    VDKIT_UPDATE_GOLDEN=1 python -m pytest tests/test_slurm_render.py -q -k golden
    git diff tests/golden/
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import directives, sbatch_of, sbatch_parse
from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.run.ports import PORT_BASE, job_port
from vdkit.render.prepare import job_spec, render_run
from vdkit.recipes import engines
from vdkit.run.rundir import SBATCH_FILE
from vdkit.slurm import env as slurm_env, render


RUN_DIR = "/scratch/runs/r1"


def text_for(overrides, out_dir="/scratch/runs"):
    """(plan, launch.sbatch) of ``overrides`` by the real render path (run directory: out_dir/the run name)."""
    plan = make_plan(compose(overrides))
    return plan, sbatch_of(plan, out_dir)[0]


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
    from vdkit.planner.timeplan import time_plan

    plan = make_plan(compose(overrides))
    text, run_dir = sbatch_of(plan, "/scratch/runs")
    c = plan.recipe.cluster
    times = time_plan(plan)
    assert times == plan.time  # the plan's own, decided once
    d = directives(text)
    assert d["--nodes"] == str(c.nodes)
    assert d["--ntasks-per-node"] == d["--gpus-per-node"] == str(c.gpus_per_node)
    assert d["--cpus-per-task"] == str(c.cpus_per_task)
    assert d["--time"] == str(times.time_limit_min) and 0 < times.time_limit_min <= c.max_time_min
    assert d["--mem"] == "0"
    assert d["--exclusive"] is True and d["--requeue"] is True
    assert d["--open-mode"] == "append"
    assert d["--job-name"] == plan.recipe.run_name
    assert d["--output"] == f"{run_dir}/slurm-%j.out" and d["--error"] == f"{run_dir}/slurm-%j.err"
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
    _, text = text_for(["cluster.time_limit_min=2", "cluster.startup_s=0"])  # (render refuses a limit no step fits)
    assert directives(text)["--time"] == "2" and directives(text)["--signal"] == "B:USR1@30"  # a quarter of it


def test_time_limit_from_the_plan_capped_at_the_partition_maximum():
    """Issue 17's example: 70B LoRA at 1000 steps predicts ~762 min; a 240-min partition needs 4 allocations."""
    from vdkit.planner.timeplan import time_plan

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
    # NeMo's script, with the run dir's heartbeat callbacks on PYTHONPATH (vdkit.recipes.nemo.command)
    assert argv[-3:-1] == ["bash", "-c"] and argv[-1].endswith(" exec " + shlex.join(nemo_command(plan, RUN_DIR)))
    flags = dict(a.split("=", 1) for a in argv if a.startswith("--container"))
    assert flags["--container-image"] == plan.recipe.engine.container_image
    assert flags["--container-mounts"].split(",") == [
        "/data/dolly:/data/dolly", "/models:/models", "/shared/results:/shared/results", f"{RUN_DIR}:{RUN_DIR}"]
    assert flags["--container-workdir"] == RUN_DIR
    assert "--no-container-mount-home" in argv
    env_names = flags["--container-env"].split(",")
    assert set(slurm_env.job_env(plan, job_spec(plan, RUN_DIR).env)) | {"MASTER_ADDR", "MASTER_PORT",
                                                                        "VDKIT_STOP_AT", "VDKIT_HEARTBEAT_DIR",
                                                                        "VDKIT_COLLECTIVE_TIMEOUT_S"} == set(env_names)
    text = sbatch_of(plan, "/scratch/runs")[0]
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


JOB_ID = "1234567"  # what Slurm sets in the batch script (its rendezvous port: vdkit.run.ports.job_port)
HOSTILE = "we ird'$(touch PWNED);`touch PWNED2` \"q\" #x &&|<>*?~!"

FAKES = r"""
srun() {
  printf '%s\0' "$@" > "$FAKE_OUT/argv"
  pwd > "$FAKE_OUT/pwd"
  printf '%s\n' "$MASTER_ADDR" "$MASTER_PORT" "${HF_TOKEN:-}" "${NCCL_IB_HCA:-}" > "$FAKE_OUT/env"
}
scontrol() {
  if [ "$1 $2" = "show hostnames" ]; then printf 'xe9680-1\nxe9680-2\n'; return; fi
  if [ "$1 $2 $3" = "-o show node" ]; then
    echo "NodeName=$4 Arch=x86_64 CoresPerSocket=48 NodeAddr=127.0.0.7 NodeHostName=localhost Version=22.05.8"
    return
  fi
  echo "unexpected scontrol $*" >&2; return 1
}
sbatch() {  # the next allocation (an engine whose exit 0 is not finished without its line, e.g. NeMo)
  printf '%s\n' "$@" > "$FAKE_OUT/sbatch"; echo 1234568
}
export -f srun scontrol sbatch
"""


def _with(recipe, **sections):
    """A copy of ``recipe`` with fields of its sections replaced: _with(r, run={"name": ...})."""
    changes = {k: dataclasses.replace(getattr(recipe, k), **v) for k, v in sections.items()}
    return dataclasses.replace(recipe, **changes)


def run_script(text: str, tmp: Path, job_id: str = JOB_ID) -> dict:
    """Run a rendered script under bash with the fakes; return srun's argv, cwd and environment."""
    out = tmp / "fake_out"
    out.mkdir()
    script = tmp / "launch.sbatch"
    script.write_text(text)
    fakes = tmp / "fakes.sh"
    fakes.write_text(FAKES)
    env = {"PATH": os.environ["PATH"], "FAKE_OUT": str(out), "SLURM_JOB_NODELIST": "xe9680-[1-2]",
           "SLURM_JOB_ID": job_id, "HOME": str(tmp)}
    proc = subprocess.run(["bash", "-c", '. "$1" && bash "$2"', "_", str(fakes), str(script)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    argv = (out / "argv").read_bytes().split(b"\0")[:-1]
    return {"argv": [a.decode() for a in argv], "pwd": (out / "pwd").read_text().rstrip("\n"),
            "env": (out / "env").read_text().split("\n")[:4], "stderr": proc.stderr}


@pytest.fixture
def fake_engine(monkeypatch):
    """The engine's command, with hostile arguments of its own (the command tail is quoted too)."""
    argv = ["python", "/opt/NeMo/x.py", f"--config-path={HOSTILE}", "a;b", "$(id)", ""]
    monkeypatch.setattr(engines.Engine, "command", lambda self, plan, run_dir: list(argv))
    return argv


@pytest.mark.parametrize("engine", ["nemo", "reference"])
def test_hostile_job_name_paths_and_secrets_run_exactly_as_asked(tmp_path, fake_engine, engine):
    base = compose(["model=llama2_7b", "method=lora", "cluster.nodes=2", f"engine={engine}"])
    secrets = tmp_path / f"sec {HOSTILE}.env"
    secrets.write_text("HF_TOKEN=hf_s3cr3t_value\n")
    recipe = _with(base, run={"name": HOSTILE, "secrets_file": str(secrets)},
                   data={"data_dir": str(tmp_path / f"data {HOSTILE}")})
    plan = make_plan(recipe)
    (tmp_path / f"runs {HOSTILE}").mkdir()
    text, run_dir = sbatch_of(plan, tmp_path / f"runs {HOSTILE}")
    run_dir.mkdir()

    assert "hf_s3cr3t_value" not in text  # the secret itself is never in the script
    got = run_script(text, tmp_path)
    assert ["srun"] + got["argv"] == render.srun_argv(plan, str(run_dir), job_spec(plan, run_dir))
    assert got["argv"][-len(fake_engine):] == fake_engine
    assert got["pwd"] == str(run_dir)
    assert got["env"] == ["127.0.0.7", str(job_port(int(JOB_ID))), "hf_s3cr3t_value", "=" + ",".join(base.cluster.ib_hcas)]
    assert not list(tmp_path.rglob("PWNED*")), "a command substitution ran"
    if engine == "nemo":
        argv = got["argv"]
        assert f"--container-workdir={run_dir}" in argv
        mounts = next(a for a in argv if a.startswith("--container-mounts="))
        assert f"{run_dir}:{run_dir}" in mounts.split("=", 1)[1].split(",")
        assert f"{recipe.data.data_dir}:{recipe.data.data_dir}" in mounts.split("=", 1)[1].split(",")

    d = directives(text)
    assert d["--job-name"] == HOSTILE
    assert d["--output"] == f"{run_dir}/slurm-%j.out"
    assert d["--error"] == f"{run_dir}/slurm-%j.err"


def test_rendezvous_uses_node_address_not_name(tmp_path, fake_engine):
    plan = make_plan(compose(["cluster.nodes=2"]))
    text, run_dir = sbatch_of(plan, tmp_path)
    run_dir.mkdir()
    got = run_script(text, tmp_path)
    assert got["env"][:2] == ["127.0.0.7", str(job_port(int(JOB_ID)))]


def test_two_jobs_on_one_host_get_two_rendezvous_ports(tmp_path, fake_engine):
    """A fixed MASTER_PORT made the second job sharing a host fail with EADDRINUSE: the script
    derives it from SLURM_JOB_ID, by the rule the engines use (vdkit.run.ports), below the ephemeral range."""
    text, run_dir = sbatch_of(make_plan(compose(["cluster.nodes=2"])), tmp_path)
    run_dir.mkdir()
    syntax = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    ports = []
    for job_id in ("1234567", "1234568"):
        (tmp_path / job_id).mkdir()
        ports.append(int(run_script(text, tmp_path / job_id, job_id)["env"][1]))
    assert ports == [24567, 24568] == [job_port(1234567), job_port(1234568)]
    assert all(PORT_BASE <= p < 32768 for p in ports)  # ephemeral ports start at 32768 (Linux default)


def test_unreadable_secrets_file_stops_the_job_before_srun(tmp_path, fake_engine):
    recipe = _with(compose([]), run={"secrets_file": str(tmp_path / "missing.env")})
    text, run_dir = sbatch_of(make_plan(recipe), tmp_path)
    run_dir.mkdir()
    (tmp_path / "fake_out").mkdir()
    (tmp_path / "f.sh").write_text(FAKES)
    proc = subprocess.run(["bash", "-c", '. "$1" && bash "$2"', "_", str(tmp_path / "f.sh"), "/dev/stdin"],
                          input=text, text=True, capture_output=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "FAKE_OUT": str(tmp_path / "fake_out"),
                               "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": JOB_ID})
    assert proc.returncode == 1
    assert "cannot read run.secrets_file" in proc.stderr
    assert not (tmp_path / "fake_out" / "argv").exists()


@pytest.mark.parametrize("bad", ["a\\b", "two\nlines", "cr\rname"])
def test_values_an_sbatch_line_cannot_carry_are_refused(bad, fake_engine):
    plan = make_plan(_with(compose([]), run={"name": bad}))
    with pytest.raises(UserError, match="backslash or a control character"):
        sbatch_of(plan, "/runs/x")


def test_mount_paths_pyxis_cannot_express_are_refused(fake_engine):
    plan = make_plan(_with(compose([]), data={"data_dir": "/data/a,b"}))
    with pytest.raises(UserError, match="--container-mounts"):
        sbatch_of(plan, "/runs/x")
    plan = make_plan(compose([]))
    with pytest.raises(UserError, match="--container-mounts"):
        sbatch_of(plan, "/runs/x:y")


def test_sbatch_parser_port_reads_shell_quoting_like_sbatch():
    # Check the port itself on what shlex.quote produces (single quotes, the '"'"' idiom, '#').
    for value in ["plain", "a b", "it's", 'say "hi"', "x#y", "$(id);`id`"]:
        assert sbatch_parse(f"#SBATCH --job-name={shlex.quote(value)}") == [f"--job-name={value}"]
    assert sbatch_parse("#SBATCH --time=5 # a comment") == ["--time=5"]


GOLDEN = Path(__file__).resolve().parent / "golden"

CELLS = {
    # 1 node, TP 1, 8 adapters: 7B LoRA, the design guide's smallest full-node cell.
    "llama2_7b_lora_1node_tp1_8nic": ["model=llama2_7b", "method=lora", "cluster.nodes=1"],
    # 2 nodes, TP 4, 4 adapters ("configuration 2"), with site directives and a secrets file.
    "llama2_13b_sft_2node_tp4_4nic": ["model=llama2_13b", "method=sft", "cluster=xe9680_4nic", "cluster.nodes=2",
                                      "parallelism.tp=4", "cluster.partition=xe9680", "cluster.account=ml",
                                      "cluster.qos=normal", "run.secrets_file=/home/me/.vdkit/secrets.env"],
    # 6 nodes, TP 4 PP 4, 8 adapters: the training guide's 70B pretraining cell, shared results dir.
    "llama2_70b_pretrain_6node_tp4_8nic": ["model=llama2_70b", "method=pretrain", "cluster.nodes=6",
                                           "parallelism.tp=4", "parallelism.pp=4", "train.max_steps=40",
                                           "run.results_dir=/shared/results", "cluster.nccl_debug=INFO"],
    # The reference engine on 2 nodes: the same shape without the container.
    "tiny_llama_reference_2node": ["model=tiny_llama", "method=lora", "engine=reference", "data=synthetic",
                                   "cluster.nodes=2", "cluster.mpi=none"],
}


def rendered(overrides, out_dir: Path) -> str:
    run_dir = render_run(make_plan(compose(overrides)), out_dir, check_mounts=False)
    text = (run_dir / SBATCH_FILE).read_text()
    return text.replace(str(run_dir), "@RUN_DIR@").replace(sys.executable, "@PYTHON@")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_golden(name, tmp_path):
    got = rendered(CELLS[name], tmp_path)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("VDKIT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.is_file(), f"{path} missing: regenerate with VDKIT_UPDATE_GOLDEN=1"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "rendered"))
        pytest.fail(f"launch.sbatch differs from {path.name} (VDKIT_UPDATE_GOLDEN=1 regenerates):\n{diff}")


def test_goldens_cover_the_cells_asked_for():
    # 1, 2 and 6 nodes; TP 1 and TP 4; 8 and 4 adapters (the list), read from the files themselves.
    texts = [p.read_text() for p in sorted(GOLDEN.glob("*.sbatch"))]
    assert {t.split("--nodes=")[1].split()[0] for t in texts} >= {"1", "2", "6"}
    assert sum("CUDA_DEVICE_MAX_CONNECTIONS" in t for t in texts) and sum(
        "CUDA_DEVICE_MAX_CONNECTIONS" not in t and "--container-image" in t for t in texts)
    hca_counts = {t.split("NCCL_IB_HCA=")[1].split()[0].count("mlx5") for t in texts if "NCCL_IB_HCA" in t}
    assert hca_counts >= {4, 8}
