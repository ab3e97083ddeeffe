"""Hostile names and paths: the rendered script runs exactly what was asked.

The body of a rendered launch.sbatch is executed for real by bash, with ``srun`` and ``scontrol``
replaced by shell functions (srun writes its argv NUL-separated, scontrol answers like Slurm's
for an emulated node whose name does not resolve). The ``#SBATCH`` lines are read back with a
port of sbatch's own argument parser (src/sbatch/opt.c, ``_get_argument``).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from vdkit.config import compose
from vdkit.errors import UserError
from vdkit.plan import make_plan
from vdkit.prepare import job_spec, sbatch_text
from vdkit.recipes import engines
from vdkit.ports import PORT_BASE, job_port
from vdkit.slurm import render

from helpers import directives, sbatch_parse

JOB_ID = "1234567"  # what Slurm sets in the batch script (its rendezvous port: vdkit.ports.job_port)
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
    run_dir = tmp_path / f"runs {HOSTILE}" / "r1"
    run_dir.mkdir(parents=True)
    text = sbatch_text(plan, run_dir)

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
    got = run_script(sbatch_text(plan, tmp_path), tmp_path)
    assert got["env"][:2] == ["127.0.0.7", str(job_port(int(JOB_ID)))]


def test_two_jobs_on_one_host_get_two_rendezvous_ports(tmp_path, fake_engine):
    """A fixed MASTER_PORT made the second job sharing a host fail with EADDRINUSE: the script
    derives it from SLURM_JOB_ID, by the rule the engines use (vdkit.ports), below the ephemeral range."""
    text = sbatch_text(make_plan(compose(["cluster.nodes=2"])), tmp_path)
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
    text = sbatch_text(make_plan(recipe), tmp_path)
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
        sbatch_text(plan, "/runs/x")


def test_mount_paths_pyxis_cannot_express_are_refused(fake_engine):
    plan = make_plan(_with(compose([]), data={"data_dir": "/data/a,b"}))
    with pytest.raises(UserError, match="--container-mounts"):
        sbatch_text(plan, "/runs/x")
    plan = make_plan(compose([]))
    with pytest.raises(UserError, match="--container-mounts"):
        sbatch_text(plan, "/runs/x:y")


def test_sbatch_parser_port_reads_shell_quoting_like_sbatch():
    # Check the port itself on what shlex.quote produces (single quotes, the '"'"' idiom, '#').
    for value in ["plain", "a b", "it's", 'say "hi"', "x#y", "$(id);`id`"]:
        assert sbatch_parse(f"#SBATCH --job-name={shlex.quote(value)}") == [f"--job-name={value}"]
    assert sbatch_parse("#SBATCH --time=5 # a comment") == ["--time=5"]
