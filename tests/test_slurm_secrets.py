"""run.secrets_file is read as data by the job (issue 12, item 12): no `source`, nothing executed or printed."""
from __future__ import annotations

import subprocess

import pytest

from vdkit.slurm.secrets import secrets_lines

HOSTILE = r"""# a comment
HF_TOKEN=hf_ab$cd&ef
  WANDB_API_KEY="quoted value with spaces"
export SINGLE='it''s $(touch {marker})'
RAW=$(touch {marker}) `touch {marker}` ${{HOME}}
EMPTY=
9BAD=nope
not a line
BAD-NAME=x
CRLF=value\r
LAST=no newline at the end"""


def _run(tmp_path, text: str):
    marker = tmp_path / "executed"
    secrets = tmp_path / "secrets.env"
    secrets.write_text(text.format(marker=marker).replace("\\r", "\r"))
    script = "set -euo pipefail\n" + "\n".join(secrets_lines(str(secrets))) + "\nenv -0\n"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, env={"PATH": "/usr/bin:/bin"})
    env = dict(item.split(b"=", 1) for item in proc.stdout.split(b"\0") if b"=" in item)
    return proc, {k.decode(): v.decode() for k, v in env.items()}, marker


def test_values_are_literal_and_nothing_runs(tmp_path):
    proc, env, marker = _run(tmp_path, HOSTILE)
    assert proc.returncode == 0, proc.stderr
    assert env["HF_TOKEN"] == "hf_ab$cd&ef"  # `source` under set -u failed on $cd
    assert env["WANDB_API_KEY"] == "quoted value with spaces"
    assert env["SINGLE"] == f"it''s $(touch {marker})"
    assert env["RAW"] == f"$(touch {marker}) `touch {marker}` ${{HOME}}"
    assert env["EMPTY"] == "" and env["CRLF"] == "value" and env["LAST"] == "no newline at the end"
    assert not marker.exists()
    assert "9BAD" not in env and "BAD-NAME" not in env
    assert not any(k.startswith("vdkit_") for k in env)  # the reader's own variables are gone


def test_bad_lines_are_named_by_number_and_values_never_printed(tmp_path):
    proc, _, _ = _run(tmp_path, HOSTILE)
    err = proc.stderr.decode()
    skipped = [line.split("skipped line ")[1].split(" ")[0] for line in err.splitlines()]
    assert skipped == ["7", "8", "9"] and len(err.splitlines()) == 3
    for value in ("hf_ab", "quoted value", "nope", "not a line", "BAD-NAME", "no newline"):
        assert value not in err


def test_unreadable_file_stops_the_job_with_one_line(tmp_path):
    script = "set -euo pipefail\n" + "\n".join(secrets_lines(str(tmp_path / "missing.env"))) + "\necho ran\n"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert proc.stderr.strip().startswith("vdkit: cannot read run.secrets_file")


def test_rendered_script_reads_the_file_as_data(tmp_path):
    from vdkit.config import compose
    from vdkit.plan import make_plan
    from vdkit.prepare import sbatch_text

    plan = make_plan(compose(["engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
                              f"run.secrets_file={tmp_path}/s.env"]))
    text = sbatch_text(plan, tmp_path / "run")
    assert "source" not in text and "read -r vdkit_line" in text


@pytest.mark.parametrize("override", [
    "run.name=${oc.env:HF_TOKEN}",
    "run.name=x_${oc.env:HF_TOKEN,default}",
    "run.out_dir=${oc.env:HOME}/runs",
    "run.results_dir=${oc.env:SCRATCH}",
    "data.data_dir='${oc.env:DATA}'",
    "cluster.account=${oc.env:SLURM_ACCOUNT}",
])
def test_environment_interpolation_is_refused(override, monkeypatch):
    from vdkit.config import compose
    from vdkit.errors import UserError

    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    with pytest.raises(UserError) as info:
        compose(["engine=reference", "model=tiny_llama", "data=synthetic", override])
    msg = str(info.value)
    assert "oc.env" in msg and "fix:" in msg and "\n" not in msg and "hf_secret_token_value" not in msg


def test_names_that_break_the_job_are_skipped_at_run_time(tmp_path):
    """A file changed after rendering (or checked only on the cluster): PATH=, UID=, LD_*, SLURM_* are
    never exported (issue 21: `PATH=` broke srun, `UID=` ended the script); the secrets still are."""
    proc, env, _ = _run(tmp_path, "PATH=/nowhere\nUID=0\nLD_PRELOAD=/tmp/x.so\nSLURM_JOB_ID=1\nHF_TOKEN=hf_kept\n")
    assert proc.returncode == 0, proc.stderr
    assert env["HF_TOKEN"] == "hf_kept" and env["PATH"] == "/usr/bin:/bin"
    assert "LD_PRELOAD" not in env and "SLURM_JOB_ID" not in env
    err = proc.stderr.decode()
    assert [ln.split("skipped line ")[1].split(" ")[0] for ln in err.splitlines()] == ["1", "2", "3", "4"]
    assert "/nowhere" not in err and "/tmp/x.so" not in err


def test_the_local_launchers_secrets_reader(tmp_path):
    """What `vdkit run` exports to its ranks from run.secrets_file (it used to ignore the file)."""
    from vdkit.rules import read_secrets_file

    f = tmp_path / "s.env"
    f.write_text("# c\nexport HF_TOKEN='hf_abc'\nWANDB_API_KEY=\"k e y\"\n")
    assert read_secrets_file(str(f)) == {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k e y"}
