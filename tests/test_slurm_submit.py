"""`vdkit submit` / `vdkit status` against the real local Slurm (and their errors without one)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from helpers import submit_and_wait
from vdkit.cli import main
from vdkit.errors import UserError


def _feasible_cells(sweep: str, extra):
    """How many cells of a sweep the planner accepts (what render/submit write), computed, not typed."""
    from vdkit.composition.config import compose
    from vdkit.render.sweep import override_sets
    from vdkit.planner.plan import make_plan

    return sum(1 for o in override_sets(list(extra), sweep=sweep) if make_plan(compose(o)).feasible)


@pytest.mark.parametrize("sweep", ["table9", "training"])
def test_test_only_accepts_every_nemo_script_of_the_sweep(local_slurm, tmp_path, capsys, sweep):
    rc = main(["submit", "--sweep", sweep, "engine=nemo", "--test-only", "--no-check-mounts", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == _feasible_cells(sweep, ["engine=nemo"]) > 0
    for line in lines:
        run_dir, tag, message = line.split("\t")
        assert tag == "test-only" and "to start at" in message, line
        # Slurm placed the job on as many emulated nodes as the rendered script asked for.
        text = (Path(run_dir) / "launch.sbatch").read_text()
        nodes = int(next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --nodes=")).split("=")[1])
        assert ("xe9680-1 " in message) if nodes == 1 else (f"xe9680-[1-{nodes}]" in message), line
        assert not (Path(run_dir) / "job_id.txt").exists()  # nothing was queued


REFERENCE_JOB = [
    "model=tiny_llama", "method=lora", "data=synthetic", "engine=reference", "cluster=xe9680",
    "cluster.nodes=2", "cluster.gpus_per_node=1", "train.max_steps=3",
    "train.micro_batch_size=4", "train.global_batch_size=8", "train.seq_length=256",
    # This "site": no PMIx library in the local Slurm, and its nodes talk over lo, not bond0.
    "cluster.mpi=none", "cluster.socket_ifname=lo",
]


def test_reference_engine_two_node_job_runs_to_completion(local_slurm, tmp_path, capsys):
    pytest.importorskip("lightning", reason="the reference engine needs the [reference] extra")
    rc, run_dir, job_id, log, last = submit_and_wait(main, capsys, REFERENCE_JOB, tmp_path, 240)
    assert rc == 0, log
    assert last == [str(run_dir), job_id, "COMPLETED exit=0:0"]
    assert (run_dir / "job_id.txt").read_text().split() == [job_id]

    assert main(["status", str(run_dir)]) == 0
    assert capsys.readouterr().out.split("\t")[2].startswith("COMPLETED")

    # Two ranks on two emulated nodes met (gloo): world size 2 in the engine's log, one rank per node.
    assert "2 rank(s) (slurm" in log and "done: global_step 3" in log, log
    nodes = local_slurm.run("scontrol", "-o", "show", "job", job_id, check=True).stdout
    assert "NumNodes=2 " in nodes and " NodeList=xe9680-[1-2] " in nodes
    # The node names do not resolve, so they met at the address the script derived from NodeAddr.
    with pytest.raises(OSError):
        socket.getaddrinfo("xe9680-1", None)
    assert "NodeAddr" in (run_dir / "launch.sbatch").read_text()


def test_rejected_submission_is_one_line_and_leaves_no_run_dir(local_slurm, tmp_path, capsys):
    rc = main(["submit", "model=tiny_llama", "engine=reference", "data=synthetic", "cluster.partition=nosuch",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "partition" in err and "Traceback" not in err, err
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


# ----------------------------------------------------------------------------- no Slurm needed
def test_submit_without_sbatch_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc = main(["submit", "model=tiny_llama", "engine=reference", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "sbatch is not on PATH" in err and "vdkit cluster up" in err
    assert not (tmp_path / "runs").exists()


def test_test_only_without_a_controller_says_so_not_to_fix_the_resources(tmp_path, capsys, monkeypatch):
    """`vdkit submit --test-only` on a machine with Slurm's clients but no controller answering: its line told the
    user to 'fix the resources in the recipe (cluster.*)'. It says the controller cannot be reached, as a real
    submission does (sbatch's own words, here from a stand-in printing what Debian's sbatch printed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: "
                                    "Unknown host' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rc = main(["submit", "model=tiny_llama", "engine=reference", "cluster.gpus_per_node=1", "--test-only",
               "--no-check-mounts", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "Slurm's controller cannot be reached from this machine" in err, err
    assert "fix the resources" not in err and len(err.strip().splitlines()) == 1


def test_status_of_something_that_is_not_a_run(tmp_path, capsys):
    assert main(["status", str(tmp_path / "missing")]) == 2
    assert "neither a run directory nor a Slurm job id" in capsys.readouterr().err
    with pytest.raises(UserError):
        from vdkit.slurm.submit import job_state

        job_state(tmp_path)


SWEEP_WITH_A_BAD_CELL = ["-m", "method=lora,ptuning", "parallelism.pp=2", "method.min_lr=1e-5"]


def test_submit_prepares_every_cell_before_submitting_any(tmp_path, capsys, monkeypatch):
    """The lora cell renders, the ptuning cell does not: nothing is written, nothing reaches sbatch."""
    from vdkit.slurm import submit as slurm_submit

    calls = []
    monkeypatch.setattr(slurm_submit, "require_sbatch", lambda: None)
    monkeypatch.setattr(slurm_submit, "submit_run", lambda run_dir, test_only=False: calls.append(run_dir))
    out = tmp_path / "runs"
    rc = main(["submit", *SWEEP_WITH_A_BAD_CELL, "--no-check-mounts", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 2 and calls == [] and captured.out == ""
    assert "P-tuning and PP=2" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not out.exists() or not list(out.iterdir())


def test_submit_sweep_with_a_bad_cell_queues_nothing_on_slurm(local_slurm, tmp_path, capsys):
    import subprocess

    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    rc = main(["submit", *SWEEP_WITH_A_BAD_CELL, "--no-check-mounts", "--out", str(tmp_path / "runs")])
    assert rc == 2 and capsys.readouterr().out == ""
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(after) <= set(before)
    assert not list(tmp_path.rglob("job_id.txt"))
