"""Checks that run before a run dir exists (issue 12 items 5 and 13): torch missing, impossible lengths."""
from __future__ import annotations

import sys

import pytest

from vdkit.cli import main


@pytest.mark.parametrize("verb", [["run"], ["demo"], ["demo", "--slurm"]])
def test_missing_torch_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch, verb):
    monkeypatch.setitem(sys.modules, "torch", None)  # what a torch-less login-node install looks like
    monkeypatch.setattr("vdkit.slurm.localcluster.why_unavailable", lambda: "not here")
    assert main([*verb, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "needs torch" in err and any(f"vdkit[{x}]" in err for x in ("reference", "megatron", "bridge"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("recipe.yaml"))


@pytest.mark.parametrize("overrides,message", [
    (["train.seq_length=2"], "train.seq_length=2 leaves 2 token(s) per sample"),
    (["train.seq_length=1"], "train.seq_length=1 leaves 1 token(s)"),
    (["method=ptuning", "train.seq_length=12"], "next to 10 virtual tokens"),
    # the default engine (reference) runs DDP: TP 1 x PP 1, so the batch rule is the whole story
    (["cluster.gpus_per_node=3", "train.global_batch_size=4", "train.micro_batch_size=1"],
     "runs data parallel only: its layout, TP 1 x PP 1 on each of 3 GPUs, breaks a rule: GBS must be a multiple of MBS x DP"),
    (["engine=nemo"], "engine=nemo does not run on this machine"),
    (["cluster=xe9680"], "slurm cluster"),
    (["data=dolly", "data.data_dir=/nonexistent/dolly"], "does not exist"),
    (["method=ptuning", "data.packed=true", "train.micro_batch_size=1"], "data.packed=true with method=ptuning"),
])
def test_vdkit_run_refuses_before_the_run_dir_exists(tmp_path, capsys, overrides, message):
    """Refused at the door, one line (what, why, fix), no traceback, nothing written."""
    assert main(["run", *overrides, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "fix:" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_results_dir_without_room_for_the_checkpoints_is_refused_at_the_door(tmp_path, capsys):
    """A full results file system is named at render, not at the first save (issue 27): one line, exit 2,
    nothing written."""
    import subprocess

    import pytest

    from vdkit.cli import main

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        out = tmp_path / "out"
        rc = main(["render", "engine=reference", "model=tiny_llama", "data=synthetic", "method=sft",
                   "cluster.gpus_per_node=1", f"run.results_dir={small}/res", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and f"{small}/res" in err and "GB free" in err, err
        assert not out.exists()
    finally:
        subprocess.run(["umount", "-l", str(small)])
