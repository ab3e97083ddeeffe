"""vdkit/planner/calibration.py: the calibration files are checked against their schema on load, and a GPU is
data - one cluster YAML plus one entry in conf/calibration/hf_step_time.yaml (docs/architecture.md)."""
from __future__ import annotations

import shutil

import pytest
import yaml

from vdkit.cli import main
from vdkit.composition.config import conf_dir
from vdkit.errors import UserError
from vdkit.planner import calibration

H200 = "H200-SXM5-141GB"
H200_PLAN = ["cluster=xe9680_h200", "model=llama2_70b", "method=lora"]


@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of the shipped conf/ tree that the kit reads instead (VDKIT_CONF_DIR)."""
    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    monkeypatch.setenv("VDKIT_CONF_DIR", str(copy))
    calibration.load.cache_clear()
    yield copy
    calibration.load.cache_clear()


def _edit(conf, name, edit):
    path = conf / "calibration" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize("name", ["hf_step_time", "memory", "step_time"])
def test_every_shipped_calibration_file_has_a_schema_and_meets_it(name):
    from vdkit.planner.calibration_schema import SCHEMAS

    assert name in SCHEMAS and isinstance(calibration.load(name), dict)
    assert sorted(SCHEMAS) == sorted(p.stem for p in (conf_dir() / "calibration").glob("*.yaml"))


@pytest.mark.parametrize("edit, said", [
    (lambda d: d["gpus"][H200].pop("hbm_gb_s"), f"gpus.{H200}.hbm_gb_s is missing"),
    (lambda d: d["gpus"][H200].update(peak_tflops_fp9=1979), f"gpus.{H200}.peak_tflops_fp9: Key 'peak_tflops_fp9' not in"),
    (lambda d: d["gpus"][H200].update(peak_tflops_bf16="fast"), f"gpus.{H200}.peak_tflops_bf16: Value 'fast'"),
    (lambda d: d["stack"].pop("op_overhead_us"), "stack.op_overhead_us is missing"),
    (lambda d: d.update(gpus=[H200]), "gpus: Invalid type assigned: list"),
])
def test_a_defective_gpu_entry_is_one_line_naming_the_file_and_key(conf_copy, capsys, edit, said):
    _edit(conf_copy, "hf_step_time", edit)
    with pytest.raises(UserError, match="hf_step_time.yaml: "):
        calibration.load("hf_step_time")
    assert main(["plan", *H200_PLAN]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "hf_step_time.yaml: " + said in err


def test_a_step_time_key_misspelt_is_one_line(conf_copy, capsys):
    _edit(conf_copy, "step_time", lambda d: d["fitted"].update(gemm_efficiency_fp8x=0.4))
    assert main(["plan", "model=llama2_7b"]) == 2
    assert "step_time.yaml: fitted.gemm_efficiency_fp8x: Key" in capsys.readouterr().err


def test_h200_plans_predicted_from_its_own_figures_and_cites_no_h100_figure(capsys):
    assert main(["plan", *H200_PLAN]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "no H200-SXM5-141GB run of this stack checked" in out
    assert "published" not in out  # Table 9 is an H100 table
    assert main(["plan", "model=llama2_70b", "method=lora"]) == 0  # the same cell on the H100 is cited
    assert "published   Table 9: 985 min" in capsys.readouterr().out


def test_h200_figures_come_from_its_calibration_entry():
    from vdkit.composition.config import compose
    from vdkit.planner.predict import calibration as step_time, gpu_hardware

    hw = gpu_hardware(step_time(), compose(H200_PLAN).cluster.gpu_type)
    gpu = calibration.load("hf_step_time")["gpus"][H200]
    assert (hw["hbm_gb_s"], hw["peak_tflops_fp8"], hw["gemm_scale"]) == (gpu["hbm_gb_s"], gpu["peak_tflops_fp8"], 1.0)
    assert compose(H200_PLAN).cluster.gpu_memory_gb == calibration.capacity_gb(H200)  # GB: 1e9 bytes of its 143,771 MiB


def test_a_gpu_without_an_fp8_peak_predicts_bf16_and_says_why_not_fp8(conf_copy, capsys):
    """The issue's first H200 plan was a KeyError: 'peak_tflops_fp8' traceback: an entry without one is a GPU
    without FP8 tensor cores (a BF16 plan is predicted, an FP8 plan says why not)."""
    _edit(conf_copy, "hf_step_time", lambda d: d["gpus"][H200].pop("peak_tflops_fp8"))
    assert main(["plan", *H200_PLAN]) == 0
    assert "predicted" in capsys.readouterr().out
    assert main(["plan", *H200_PLAN, "train.precision=fp8"]) == 0
    out = capsys.readouterr().out
    assert f"no FP8 peak for {H200} (peak_tflops_fp8)" in out and "Traceback" not in out


def test_a_cluster_file_with_a_misspelt_key_is_one_line_naming_file_and_key(conf_copy, capsys):
    (conf_copy / "cluster" / "typo.yaml").write_text("defaults:\n  - xe9680_h200\n  - _self_\nname: typo\n"
                                                    "gpu_memory_gb: lots\n")
    assert main(["plan", "cluster=typo"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "In 'cluster/typo'" in err and "(key cluster.gpu_memory_gb)" in err


def test_site_probe_names_an_h200_by_its_calibration_entry():
    """nvidia-smi's "NVIDIA H200" is the entry's product name: a probed site gets the gpu_type the kit predicts for."""
    from vdkit.composition.site import parse_nvidia_smi

    facts = parse_nvidia_smi("NVIDIA H200, 143771 MiB\n" * 8)
    assert (facts["gpu_type"], facts["node_gpus"]) == (H200, 8)
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559 MiB\n")["gpu_type"] == "H100-SXM5-80GB"
