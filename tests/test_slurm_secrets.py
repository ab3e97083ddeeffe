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
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from helpers import sbatch_of

    plan = make_plan(compose(["engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
                              f"run.secrets_file={tmp_path}/s.env"]))
    text = sbatch_of(plan, tmp_path / "runs")[0]
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
    from vdkit.composition.config import compose
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
    from vdkit.launch.local import read_secrets_file

    f = tmp_path / "s.env"
    f.write_text("# c\nexport HF_TOKEN='hf_abc'\nWANDB_API_KEY=\"k e y\"\n")
    f.chmod(0o600)  # yours alone (an open file is refused: test_a_secrets_file_open_to_others_is_refused_at_the_door)
    assert read_secrets_file(str(f)) == {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k e y"}


# ----------------------------------------------------------------------------- the file's mode
TINY = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1"]
TOKEN = "hf_mode_test_token_never_printed_0123"


def _secrets(tmp_path, mode: int):
    import os

    f = tmp_path / "my secrets.env"
    f.write_text(f"HF_TOKEN={TOKEN}\n")
    os.chmod(f, mode)
    return f


@pytest.mark.parametrize("mode, who", [(0o644, "its group and other users"), (0o640, "its group"),
                                       (0o604, "other users"), (0o620, "its group"), (0o666, "its group and other users")],
                         ids=lambda v: f"{v:04o}" if isinstance(v, int) else "")
def test_a_secrets_file_open_to_others_is_refused_at_the_door(tmp_path, mode, who):
    """As ssh refuses a private key that is 'too open': the file, its mode and the chmod, never the token."""
    from vdkit.composition.config import compose
    from vdkit.errors import UserError

    f = _secrets(tmp_path, mode)
    with pytest.raises(UserError) as info:
        compose([*TINY, f"run.secrets_file={f}"])
    msg = str(info.value)
    assert f"run.secrets_file {f} has mode {mode:04o}: it is open to {who}," in msg
    assert msg.endswith(f"(fix: chmod 600 '{f}')")  # the path quoted as a shell would need it
    assert "\n" not in msg and TOKEN not in msg


@pytest.mark.parametrize("verb", ["plan", "render", "run"])
def test_the_cli_refuses_it_in_one_line_and_writes_nothing(tmp_path, capsys, verb):
    from vdkit.cli import main

    f = _secrets(tmp_path, 0o644)
    out = tmp_path / "out"
    argv = [verb, *TINY, f"run.secrets_file={f}"] + ([] if verb == "plan" else ["--out", str(out)])
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"vdkit {verb}: error: run.secrets_file {f} has mode 0644" in err[0], captured.err
    assert "chmod 600" in err[0] and "Traceback" not in captured.err
    assert TOKEN not in captured.out + captured.err
    assert not out.exists()


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_secrets_file_passes(tmp_path, mode):
    from vdkit.composition.config import compose
    from vdkit.launch.local import read_secrets_file

    f = _secrets(tmp_path, mode)
    assert compose([*TINY, f"run.secrets_file={f}"]).run.secrets_file == str(f)
    assert read_secrets_file(str(f)) == {"HF_TOKEN": TOKEN}


def test_the_local_reader_refuses_an_open_file_too(tmp_path):
    """`vdkit run` exports the file to its ranks: the same rule, whatever path reaches the reader."""
    from vdkit.errors import UserError
    from vdkit.launch.local import read_secrets_file

    f = _secrets(tmp_path, 0o644)
    with pytest.raises(UserError, match="chmod 600"):
        read_secrets_file(str(f))


def test_another_users_file_is_theirs_to_protect(tmp_path):
    """As ssh: only a file the caller owns is checked (a team's token file kept by its owner, group-readable)."""
    import os

    from vdkit.rules.secrets import check_secrets_file

    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    f = _secrets(tmp_path, 0o640)
    os.chown(f, 65534, -1)  # nobody
    check_secrets_file(str(f), required=True)  # root still reads it; not refused
    os.chown(f, os.getuid(), -1)
    with pytest.raises(Exception, match="has mode 0640"):
        check_secrets_file(str(f), required=True)


def test_the_munge_key_the_kit_writes_is_owner_only_whatever_the_umask(tmp_path):
    """The one secret the kit itself writes (the local Slurm's munge key): 0400 from creation, under umask 0."""
    import os
    import stat

    from vdkit.slurm.localcluster import write_munge_key

    old = os.umask(0)
    try:
        write_munge_key(tmp_path / "munge.key")
    finally:
        os.umask(old)
    st = os.stat(tmp_path / "munge.key")
    assert stat.S_IMODE(st.st_mode) == 0o400 and st.st_size == 1024
    with pytest.raises(FileExistsError):  # never rewrites (nor re-modes) a key that is there
        write_munge_key(tmp_path / "munge.key")
