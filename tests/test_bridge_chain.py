"""engine=bridge from staged HF weights alone (issue 36, "no dead ends"): the render writes the conversion
(import_hf.sbatch) and chains training after it - `vdkit submit` submits the import first and launch.sbatch with
``--dependency=afterok`` (the render's next line does the same in one shell line) - and the training job itself
refuses a base checkpoint that is not there instead of fine-tuning random weights."""
from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.render.prepare import prepare
from vdkit.run import rundir

CELL = ["engine=bridge", "model=llama3_1_8b", "method=lora"]  # the command: no model.megatron_path


def test_render_from_hf_weights_chains_the_import_before_training(tmp_path):
    plan = make_plan(compose(CELL))
    assert plan.recipe.model.megatron_path is None and plan.recipe.model.hf_path
    cell = prepare(plan, tmp_path, check_mounts=False)  # refused today: "model.megatron_path is not set"
    from vdkit.launch.launchers import of
    from vdkit.recipes.bridge.convert import default_base

    base = default_base(plan.recipe)
    cfg = yaml.safe_load(cell.files["bridge.yaml"])
    assert cfg["checkpoint"]["pretrained_checkpoint"] == base
    assert cell.files[rundir.FIRST_FILE].split() == [rundir.IMPORT_FILE]
    srun = [ln for ln in cell.files[rundir.IMPORT_FILE].splitlines() if ln.startswith("srun ")][0]
    assert shlex.split(srun)[-2:] == [plan.recipe.model.hf_path, base]  # the import writes what training loads
    assert f"{base}:{base}" in cell.files["launch.sbatch"]  # and the training job mounts it
    line = of(plan).next_command(cell.files).format("RUN")
    assert line.startswith("j0=$(sbatch --parsable RUN/import_hf.sbatch) && sbatch --dependency=afterok:$j0 "
                           "RUN/launch.sbatch")


def test_a_given_megatron_path_is_not_chained(tmp_path):
    cell = prepare(make_plan(compose([*CELL, "model.megatron_path=/models/l31-bridge"])), tmp_path, check_mounts=False)
    assert rundir.FIRST_FILE not in cell.files and rundir.IMPORT_FILE in cell.files  # the site's one-time step, run by hand
    assert yaml.safe_load(cell.files["bridge.yaml"])["checkpoint"]["pretrained_checkpoint"] == "/models/l31-bridge"


def test_the_training_job_refuses_a_missing_base_in_one_line(tmp_path, capsys):
    from vdkit.recipes.bridge import job

    cfg = SimpleNamespace(peft=object(), checkpoint=SimpleNamespace(pretrained_checkpoint=str(tmp_path / "none"),
                                                                     load=None))
    assert job.run(cfg) == 2  # today: Bridge starts and fine-tunes random weights
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "checkpoint.pretrained_checkpoint" in err[0] and "import_hf.sbatch" in err[0], err


def _wait_state(job_id: str, states, timeout_s: float = 60) -> str:
    end = time.time() + timeout_s
    text = ""
    while time.time() < end:
        text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        if any(f"JobState={s}" in text or f"Reason={s}" in text for s in states):
            return text
        time.sleep(1)
    raise AssertionError(f"job {job_id} never reached {states}: {text[:400]}")


@pytest.mark.slurm
def test_submit_runs_training_only_after_the_import_succeeds(local_slurm, tmp_path):
    from vdkit.slurm.submit import submit_run

    for name, rc in (("ok", 0), ("failing", 1)):
        run = tmp_path / name
        run.mkdir()
        (run / rundir.IMPORT_FILE).write_text(f"#!/bin/bash\n#SBATCH --time=1\nsleep 2; exit {rc}\n")
        (run / "launch.sbatch").write_text("#!/bin/bash\n#SBATCH --time=1\necho trained > trained.txt\n")
        (run / rundir.FIRST_FILE).write_text(rundir.IMPORT_FILE + "\n")
        train = submit_run(run).job_id
        assert "Dependency=afterok:" in subprocess.run(["scontrol", "show", "job", train], capture_output=True,
                                                       text=True).stdout
        if rc == 0:
            _wait_state(train, ("COMPLETED",))
            assert (run / "trained.txt").is_file()
        else:  # the import failed: training never starts
            _wait_state(train, ("DependencyNeverSatisfied",))
            assert not (run / "trained.txt").exists()
            subprocess.run(["scancel", train], check=False)
