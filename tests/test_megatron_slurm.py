"""engine=megatron on Slurm: rendered for a real cluster, and a real 2-node job on the local Slurm."""
from __future__ import annotations

import json

import pytest

from helpers import submit_and_wait
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
    rc, run_dir, job_id, log, last = submit_and_wait(main, capsys, MEGATRON_JOB, tmp_path, 400)
    assert rc == 0, log
    assert last == [str(run_dir), job_id, "COMPLETED exit=0:0"]
    # one pipeline stage per emulated node, met over gloo at the first node's address
    assert "2 rank(s) (slurm, cpu), tp=1 pp=2" in log and "done: global_step 3" in log, log
    nodes = local_slurm.run("scontrol", "-o", "show", "job", job_id, check=True).stdout
    assert "NumNodes=2 " in nodes
    report = json.loads((run_dir / "memory.json").read_text())
    assert [r["stage"] for r in report["ranks"]] == [0, 1]


# The megatron job across allocations (USR1 to the batch shell, as Slurm sends it at the limit; the container
# stand-in): tests/test_slurm_continuation.py
