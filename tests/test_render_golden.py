"""Golden files: launch.sbatch for a few cells, compared byte for byte with tests/golden/*.sbatch.

The scripts are rendered through the whole path (`render_run` into a temporary directory), then
normalised: the run directory becomes ``@RUN_DIR@`` and the interpreter of the reference engine
``@PYTHON@`` (both vary by machine). A difference fails with a unified diff.

They pin submitit's private renderer (1.5.4) together with our body: a submitit upgrade or a change
of the rendered script shows up here. After a deliberate change, regenerate and review the diff:

    VDKIT_UPDATE_GOLDEN=1 python -m pytest tests/test_render_golden.py -q
    git diff tests/golden/
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import pytest

from vdkit.config import compose
from vdkit.plan import make_plan
from vdkit.rundir import SBATCH_FILE
from vdkit.prepare import render_run

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
