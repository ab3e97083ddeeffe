"""engine=megatron on Slurm: rendered for a real cluster, and a real 2-node job on the local Slurm."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vdkit.cli import main

MEGATRON_JOB = [
    "model=tiny_llama", "model.num_layers=4", "method=sft", "data=synthetic", "engine=megatron",
    "engine.container_image=null", "cluster=xe9680", "cluster.nodes=2", "cluster.gpus_per_node=1",
    "parallelism.pp=2", "train.max_steps=3", "train.micro_batch_size=2", "train.global_batch_size=4",
    "train.seq_length=128", "cluster.mpi=none", "cluster.socket_ifname=lo",
]


def test_render_runs_megatron_in_the_container_with_nccl(tmp_path, capsys):
    image = tmp_path / "pytorch-vdkit.sqsh"
    image.write_bytes(b"")
    rc = main(["render", "model=llama2_7b", "method=lora", "engine=megatron", f"engine.container_image={image}",
               "data=synthetic", "--out", str(tmp_path / "runs")])
    assert rc == 0, capsys.readouterr().err
    (run_dir,) = (tmp_path / "runs").iterdir()
    text = (run_dir / "launch.sbatch").read_text()
    assert f"--container-image={image}" in text and "  python -m vdkit.recipes.megatron " in text
    assert "NCCL_IB_HCA" in text and "srun" in text
    assert not (run_dir / "nemo.yaml").exists()


@pytest.mark.slow
def test_two_node_megatron_job_completes_on_the_local_slurm(local_slurm, tmp_path, capsys):
    pytest.importorskip("megatron.core")
    rc = main(["submit", *MEGATRON_JOB, "--out", str(tmp_path), "--wait", "--timeout", "400"])
    out = capsys.readouterr().out.splitlines()
    run_dir = Path(out[0].split("\t")[0])
    job_id = out[0].split("\t")[1]
    log = "".join((run_dir / f"slurm-{job_id}.{ext}").read_text() for ext in ("out", "err"))
    assert rc == 0, log
    assert out[-1].split("\t")[:3] == [str(run_dir), job_id, "COMPLETED exit=0:0"]
    # one pipeline stage per emulated node, met over gloo at the first node's address
    assert "2 rank(s) (slurm, cpu), tp=1 pp=2" in log and "done: global_step 3" in log, log
    nodes = local_slurm.run("scontrol", "-o", "show", "job", job_id, check=True).stdout
    assert "NumNodes=2 " in nodes
    report = json.loads((run_dir / "memory.json").read_text())
    assert [r["stage"] for r in report["ranks"]] == [0, 1]


@pytest.mark.slow
def test_usr1_requeues_the_megatron_job_and_it_completes_unbroken(local_slurm, tmp_path, capsys):
    """Issue 12 item 1 on Slurm: `scancel --signal=USR1` mid-run; both pipeline stages stop after the
    same step, checkpoint it, rank 0 requeues, and the requeued job (same id) finishes 1..N unbroken."""
    import subprocess
    import time

    from test_slurm_requeue import _check_unbroken, _log, _restarts, _steps

    from vdkit.slurm import submit as sub

    pytest.importorskip("megatron.core")
    max_steps = 30
    job = [o for o in MEGATRON_JOB if not o.startswith("train.max_steps=")]
    assert main(["submit", *job, f"train.max_steps={max_steps}", "--out", str(tmp_path)]) == 0
    run_dir, job_id = capsys.readouterr().out.strip().splitlines()[-1].split("\t")[:2]
    run_dir = Path(run_dir)
    t0 = time.monotonic()
    while not (_steps(_log(run_dir, job_id)) and _steps(_log(run_dir, job_id))[-1] >= 2):
        assert time.monotonic() < t0 + 240 and not sub.job_state(run_dir).done, _log(run_dir, job_id)[-2000:]
        time.sleep(0.2)
    signalled_at = _steps(_log(run_dir, job_id))[-1]
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    st = sub.wait(run_dir, timeout=400, poll_s=1)
    assert st.state == "COMPLETED", (st, _log(run_dir, job_id)[-3000:])
    (stop,) = _check_unbroken(run_dir, job_id, max_steps, checkpoint=f"step={max_steps}.ckpt/rank00001.pt")
    assert signalled_at <= stop < max_steps and _restarts(job_id) == 1
    print(f"\nmegatron USR1 figures: job {job_id}, USR1 sent after step {signalled_at}, stopped after step {stop}, "
          f"restarts 1, steps 1..{max_steps} unbroken, {time.monotonic() - t0:.0f} s to COMPLETED")
