"""The transformers-engine sweeps rendered: both MI300X fabrics with the ROCm image, the OPT sweep on the
H100 node; every script is valid bash and accepted by the local Slurm's `sbatch --test-only`."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.config import compose


def _render(sweep, tmp_path, capsys):
    assert main(["render", "--sweep", sweep, "--no-check-mounts", "--out", str(tmp_path)]) == 0
    return [Path(p) for p in capsys.readouterr().out.split()]


def test_llama31_roce_scripts_roce_and_tcp_with_the_rocm_image(tmp_path, capsys):
    dirs = _render("llama31_roce", tmp_path, capsys)
    assert [d.name for d in dirs] == ["llama3_1_8b_1n", "llama3_1_8b_2n_noroce", "llama3_1_8b_2n_roce",
                                      "llama3_1_70b_1n", "llama3_1_70b_2n_noroce", "llama3_1_70b_2n_roce"]
    image = compose(["cluster=xe9680_mi300x"]).cluster.container_image
    for d in dirs:
        text = (d / "launch.sbatch").read_text()
        assert subprocess.run(["bash", "-n", str(d / "launch.sbatch")]).returncode == 0
        assert f"--container-image={image}" in text and "python3 -m vdkit.recipes.reference" in text
        assert "NCCL_NVLS_ENABLE" not in text  # an NVIDIA setting, not in the MI300X clusters' data
        if d.name.endswith("_noroce"):
            assert "RCCL over TCP sockets" in text and "export NCCL_IB_DISABLE=1" in text
            assert "NCCL_IB_HCA" not in text and "NCCL_IB_GID_INDEX" not in text
        else:
            assert "RCCL over RoCE" in text and "export NCCL_IB_GID_INDEX=3" in text
            assert "export NCCL_IB_HCA==bnxt_re0,bnxt_re1," in text and "NCCL_IB_DISABLE" not in text
    assert "--nodes=2" in (dirs[2] / "launch.sbatch").read_text()


def test_alpaca_opt_render_writes_the_cells_that_fit(tmp_path, capsys):
    dirs = _render("alpaca_opt", tmp_path, capsys)
    assert [d.name for d in dirs] == ["opt_125m_sft_1n8g", "opt_350m_sft_1n8g", "opt_1_3b_sft_1n8g",
                                      "opt_2_7b_sft_1n8g", "opt_6_7b_sft_1n8g", "opt_13b_sft_1n8g"]
    text = (dirs[-1] / "launch.sbatch").read_text()
    assert "NCCL over native InfiniBand" in text and "--container-image" not in text  # host Python on xe9680
    assert subprocess.run(["bash", "-n", str(dirs[-1] / "launch.sbatch")]).returncode == 0
    # the one that does not fit, rendered alone: one line saying by how much, exit 2, nothing written
    assert main(["render", "model=opt_30b", "engine=reference", "parallelism.sharding=fsdp", "method=sft",
              "data=alpaca", "train.micro_batch_size=4", "train.global_batch_size=256", "train.seq_length=512",
              "parallelism.recompute=none", "--no-check-mounts", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"short by [0-9.]+ GB", err) and len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("sweep", ["llama31_roce", "alpaca_opt"])
def test_sbatch_test_only_accepts_every_script(local_slurm, tmp_path, capsys, sweep):
    rc = main(["submit", "--sweep", sweep, "--test-only", "--no-check-mounts", "--out", str(tmp_path)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "\t" in ln]
    assert rc == 0
    assert len(lines) == (6 if sweep == "llama31_roce" else 6)  # alpaca_opt: OPT-30B does not fit, not written
    for line in lines:
        run_dir, tag, message = line.split("\t")
        assert tag == "test-only" and "to start at" in message, line
        assert not (Path(run_dir) / "job_id.txt").exists()
