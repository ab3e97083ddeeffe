"""`vdkit render`: one new run directory per recipe, sweeps, refusals that leave nothing behind."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import directives  # sbatch's own reading of the #SBATCH lines
from vdkit.cli import main
from vdkit.run.rundir import NEMO_CONFIG_FILE, OVERRIDES_FILE, PLAN_FILE, RECIPE_FILE, SBATCH_FILE

NO_MOUNTS = "--no-check-mounts"  # the default conf's /data and /models are cluster storage


def render(capsys, *args):
    """Run `vdkit render ARGS` in-process; return (exit code, printed run dirs, stderr)."""
    code = main(["render", *args])
    out, err = capsys.readouterr()
    return code, [Path(p) for p in out.splitlines() if p], err


def listing(out: Path) -> list:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def test_render_writes_a_complete_run_dir(tmp_path, capsys):
    code, dirs, err = render(capsys, "model=llama2_70b", "method=lora", "cluster.nodes=2", "--out", str(tmp_path),
                             NO_MOUNTS)
    assert code == 0, err
    (run_dir,) = dirs
    assert run_dir.parent == tmp_path
    assert {SBATCH_FILE, NEMO_CONFIG_FILE, RECIPE_FILE, PLAN_FILE, OVERRIDES_FILE} <= set(listing(run_dir))
    assert os.access(run_dir / SBATCH_FILE, os.X_OK)
    text = (run_dir / SBATCH_FILE).read_text()
    assert f"--config-path={run_dir}" in text
    assert directives(text)["--nodes"] == "2"
    assert (run_dir / OVERRIDES_FILE).read_text().splitlines() == ["model=llama2_70b", "method=lora", "cluster.nodes=2"]
    assert yaml.safe_load((run_dir / RECIPE_FILE).read_text())["cluster"]["nodes"] == 2


def test_render_says_the_layout_the_prediction_and_what_it_did_not_check(tmp_path, capsys):
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan

    args = ["model=llama2_70b", "method=lora", "cluster.nodes=5"]
    code, (run_dir,), err = render(capsys, *args, "--out", str(tmp_path), NO_MOUNTS)
    assert code == 0, err
    plan = make_plan(compose(args))
    assert (plan.tp, plan.pp, plan.dp) == (8, 5, 1)  # 70B LoRA does have a layout on 5 nodes
    lines = err.splitlines()
    assert lines[0] == "  layout     TP 8 x PP 5 x DP 1 (auto), gradient accumulation 128; " \
                       f"{plan.memory.total_gb:.1f} of 85.5 GB per GPU"
    assert lines[1].startswith(f"  predicted  {plan.prediction.step_seconds:.3g} s/step, "
                               f"{plan.prediction.minutes:,.1f} min for 1000 steps")
    assert lines[3].startswith("  fabric     IB: 400 GB/s per node, 10 us per inter-node ring step (8 adapter(s)")
    unchecked = next(ln for ln in lines if ln.startswith("not checked (--no-check-mounts): "))
    recipe = plan.recipe
    # the .nemo is named with the job that makes it from model.hf_path (issue 29's staging)
    for what, path in (("data.data_dir", recipe.data.data_dir),
                       ("model.nemo_path (make it: sbatch import_hf.sbatch)", recipe.model.nemo_path),
                       ("engine.container_image", recipe.engine.container_image)):
        assert f"{what} {path}" in unchecked
    assert (run_dir / "import_hf.sbatch").is_file()
    assert lines[-1] == f"next: sbatch {run_dir}/launch.sbatch"


def test_a_sites_own_nemo_is_not_told_to_run_a_conversion_job_it_does_not_have(tmp_path, capsys):
    # model.hf_path=null: the site brings its .nemo; no import_hf.sbatch is written, so none is named
    code, (run_dir,), err = render(capsys, "model=llama2_70b", "method=lora", "cluster.nodes=5",
                                   "model.hf_path=null", "--out", str(tmp_path), NO_MOUNTS)
    assert code == 0, err
    unchecked = next(ln for ln in err.splitlines() if ln.startswith("not checked (--no-check-mounts): "))
    assert "model.nemo_path /models/llama2-70b.nemo" in unchecked
    assert "import_hf.sbatch" not in unchecked and not (run_dir / "import_hf.sbatch").exists()


def test_render_with_every_input_checked_lists_none_unchecked(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    code, dirs, err = render(capsys, "engine=reference", "model=tiny_llama", "data=synthetic",
                             f"data.data_dir={data}", "cluster.gpus_per_node=1", "--out", str(tmp_path / "runs"),
                             "--check-mounts")
    assert code == 0, err
    assert "not checked" not in err and "  predicted  " in err


def test_render_never_overwrites(tmp_path, capsys):
    args = ["model=llama2_7b", "--out", str(tmp_path), NO_MOUNTS]
    _, (first,), _ = render(capsys, *args)
    before = (first / SBATCH_FILE).read_text()
    _, (second,), _ = render(capsys, *args)
    assert first != second and second.name == first.name + "-2"
    assert (first / SBATCH_FILE).read_text() == before
    assert f"--output={second}/slurm-%j.out" in (second / SBATCH_FILE).read_text()


def test_multirun_over_nodes_changes_resources_per_cell(tmp_path, capsys):
    # GBS 480 divides by DP = 8 x nodes for every node count (GBS 128 has no layout on 3, 5 or 6 nodes).
    code, dirs, err = render(capsys, "-m", "model=llama2_7b", "cluster.nodes=1,2,3,4,5,6", "train.global_batch_size=480",
                             "--out", str(tmp_path), NO_MOUNTS)
    assert code == 0, err
    assert len(dirs) == len(set(dirs)) == 6 and "skipped" not in err
    assert err.count("  layout     TP ") == 6 and "for each of the 6 run directories" in err
    for n, run_dir in enumerate(dirs, start=1):
        d = directives((run_dir / SBATCH_FILE).read_text())
        assert (d["--nodes"], d["--gpus-per-node"], d["--ntasks-per-node"]) == (str(n), "8", "8")
        assert yaml.safe_load((run_dir / RECIPE_FILE).read_text())["cluster"]["nodes"] == n


def test_multirun_skips_cells_without_a_layout(tmp_path, capsys):
    code, dirs, err = render(capsys, "-m", "model=llama2_7b", "cluster.nodes=2,3", "--out", str(tmp_path), NO_MOUNTS)
    assert code == 0 and len(dirs) == 1
    assert err.startswith("vdkit render: skipped model=llama2_7b cluster.nodes=3: no valid layout")
    assert len([ln for ln in err.splitlines() if "skipped" in ln]) == 1


def test_sweep_table9_renders_every_feasible_cell(tmp_path, capsys):
    from vdkit.composition.config import compose
    from vdkit.render.sweep import sweep_cells
    from vdkit.planner.plan import make_plan

    cells = sweep_cells("table9")
    feasible = [c for c in cells if make_plan(compose(c)).feasible]
    code, dirs, err = render(capsys, "--sweep", "table9", "--out", str(tmp_path), NO_MOUNTS)
    assert code == 0, err
    assert len(dirs) == len(set(dirs)) == len(feasible) == len(listing(tmp_path))
    skipped = [line for line in err.splitlines() if line.startswith("vdkit render: skipped")]
    assert len(skipped) == len(cells) - len(feasible) > 0  # e.g. 70B SFT on 8 GPUs
    assert any("llama2_70b" in s and "method=sft" in s for s in skipped)
    seen = set()
    for run_dir in dirs:
        recipe = yaml.safe_load((run_dir / RECIPE_FILE).read_text())
        d = directives((run_dir / SBATCH_FILE).read_text())
        assert d["--nodes"] == str(recipe["cluster"]["nodes"])
        assert d["--gpus-per-node"] == d["--ntasks-per-node"] == str(recipe["cluster"]["gpus_per_node"])
        seen.add((d["--nodes"], d["--gpus-per-node"]))
    assert seen == {("1", "4"), ("1", "8"), ("2", "8")}  # resources really change per cell


@pytest.mark.parametrize("args,message", [
    (["cluster.nodes=7"], "cluster.nodes=7 is outside 1-6"),
    (["model=llama2_70b", "method=sft", "cluster.nodes=1"], "does not fit"),
    (["engine.container_image=nemo.sqsh"], "must start with / or ./"),
    (["run.name=bad\\name"], "backslash"),
])
def test_bad_input_is_one_line_and_no_run_dir(tmp_path, capsys, args, message):
    code, dirs, err = render(capsys, *args, "--out", str(tmp_path / "runs"), NO_MOUNTS)
    assert code == 2 and not dirs
    assert message in err and len(err.strip().splitlines()) == 1
    assert listing(tmp_path / "runs") == []


def test_missing_local_mount_source_is_refused_unless_told(tmp_path, capsys):
    missing = tmp_path / "no-such-data"
    # A registry image: nothing local to check for it.
    args = [f"data.data_dir={missing}", "engine.container_image=ubuntu", "--out", str(tmp_path / "runs")]
    code, _, err = render(capsys, *args)
    assert code == 2 and "data.data_dir" in err and "does not exist" in err
    assert listing(tmp_path / "runs") == []
    missing.mkdir()  # now the data dir exists; the base model /models/... is off this machine: not checked
    code, dirs, err = render(capsys, *args)
    assert code == 0 and len(dirs) == 1, err
    code, _, err = render(capsys, *args, "--check-mounts")  # forced: /models/llama2-7b.nemo is checked too
    assert code == 2 and "model.nemo_path" in err


def test_a_bad_cell_in_a_sweep_stops_before_anything_is_written(tmp_path, capsys):
    code, dirs, err = render(capsys, "-m", "cluster.nodes=1,2", "engine.container_image=x.sqsh",
                             "--out", str(tmp_path), NO_MOUNTS)
    assert code == 2 and not dirs and listing(tmp_path) == []
    # A cell that fails only while its files are rendered (a ':' pyxis' mount list cannot carry).
    code, dirs, err = render(capsys, "-m", "data.data_dir=/data/ok,/data/a:b", "--out", str(tmp_path), NO_MOUNTS)
    assert code == 2 and "--container-mounts" in err and not dirs and listing(tmp_path) == []


def test_cli_exit_code_and_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vdkit", "render", "cluster.nodes=9", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert listing(tmp_path) == []
