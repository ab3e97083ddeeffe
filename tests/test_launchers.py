"""The launcher seam (vdkit.launch.launchers): a launcher and an engine are each one module plus a registry line.

The throwaway launcher and engine below are registered by monkeypatching the two registries only
(and sys.modules, where an installed module would live): no file of the kit is touched.
"""
from __future__ import annotations

import os
import stat
import sys
import types
from pathlib import Path

import pytest

from vdkit.launch import launchers
from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.recipes import engines
from helpers import toy_engine_module
from vdkit.run.rundir import LOCK_FILE, PLAN_FILE, PREFLIGHT_FILE, PREFLIGHT_SCRIPT, RECIPE_FILE, SBATCH_FILE

TINY = ["model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=2"]


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


@pytest.fixture
def toy(monkeypatch):
    """Register launcher "toy" and engine "toy"; returns what the launcher saw."""
    seen = {}

    def files(plan, job, run_dir):
        seen["job"] = job
        return {"toy-job.sh": "#!/bin/sh\n" + " ".join(job.argv) + "\n", "toy-manifest.txt": f"ranks {plan.recipe.world_size}\n"}

    def check(plan, job):
        if plan.recipe.cluster.nodes > 1:
            raise UserError("the toy scheduler has one node", "use cluster.nodes=1")

    launcher = _module("toy_launcher", files=files, check=check, submit=lambda run_dir: "toy-1",
                       status=lambda run_dir: "COMPLETED")
    engine = toy_engine_module("toy_engine", command=lambda plan, run_dir: ["toy-train", str(run_dir)],
                               env=lambda plan: {"TOY_THREADS": "3"},
                               files=lambda plan, run_dir: {"toy.yaml": f"model: {plan.recipe.model.name}\n"})
    monkeypatch.setitem(sys.modules, "toy_launcher", launcher)
    monkeypatch.setitem(sys.modules, "toy_engine", engine)
    monkeypatch.setitem(launchers.REGISTRY, "toy", "toy_launcher")
    monkeypatch.setitem(engines.REGISTRY, "toy", "toy_engine")
    return seen


def test_a_throwaway_launcher_and_engine_render_a_run(toy, tmp_path, capsys):
    rc = main(["render", *TINY, "cluster.launcher=toy", "engine.name=toy", "--no-check-mounts", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    run_dir = Path(capsys.readouterr().out.strip())
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == sorted([RECIPE_FILE, PLAN_FILE, "overrides.txt", "toy.yaml", "toy-job.sh", "toy-manifest.txt",
                            PREFLIGHT_FILE, PREFLIGHT_SCRIPT])  # every engine's job gets the pre-flight
    assert (run_dir / "toy-job.sh").read_text() == f"#!/bin/sh\ntoy-train {run_dir}\n"
    assert os.stat(run_dir / "toy-job.sh").st_mode & stat.S_IXUSR  # a script is written executable
    assert not os.stat(run_dir / "toy-manifest.txt").st_mode & stat.S_IXUSR
    assert (run_dir / "toy.yaml").read_text() == "model: tiny_llama\n"
    job = toy["job"]  # the engine's request reached the launcher as data
    assert job.argv == ["toy-train", str(run_dir)] and job.env == {"TOY_THREADS": "3"} and job.container is None


def test_the_throwaway_launcher_refuses_before_anything_is_written(toy, tmp_path, capsys):
    rc = main(["render", *TINY, "cluster.launcher=toy", "cluster.nodes=2", "engine.name=toy", "--no-check-mounts",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "the toy scheduler has one node" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_config_takes_launcher_names_from_the_registry(toy):
    assert compose(["cluster.launcher=toy"]).cluster.launcher == "toy"
    with pytest.raises(UserError, match=r"cluster.launcher='nope' is not a launcher.*cluster.launcher=toy"):
        compose(["cluster.launcher=nope"])


def test_render_cluster_local_goes_through_the_local_launcher(tmp_path, capsys):
    rc = main(["render", "cluster=local", "engine=reference", *TINY[:2], "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    run_dir = Path(out.strip())
    assert not (run_dir / SBATCH_FILE).exists() and (run_dir / PLAN_FILE).is_file()
    assert f"next: vdkit run --resume {run_dir}" in err and "sbatch" not in err  # not a script that is not there
    local = launchers.get("local")
    assert local.executes_here and local.status(run_dir) == "NOT_STARTED"
    with pytest.raises(UserError, match="no scheduler"):
        local.require()


def test_local_launcher_refuses_an_engine_that_does_not_run_here(tmp_path, capsys):
    rc = main(["render", "cluster=local", "engine=nemo", "--no-check-mounts", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "engine=nemo does not run on this machine" in err and not list(tmp_path.iterdir())


def test_an_engine_that_needs_pmi_gets_srun_mpi(monkeypatch, tmp_path):
    """JobSpec.pmi comes from the engine spec's needs_pmi; cluster.mpi is honoured for it and only for it."""
    from helpers import sbatch_of
    from vdkit.render.prepare import job_spec

    plan = make_plan(compose(["cluster.mpi=pmi2"]))
    assert job_spec(plan, tmp_path).pmi is False and "--mpi" not in sbatch_of(plan, tmp_path)[0]
    import dataclasses

    nemo = engines.get("nemo").module
    monkeypatch.setattr(nemo, "SPEC", dataclasses.replace(nemo.SPEC, needs_pmi=True))
    assert job_spec(plan, tmp_path).pmi is True and "--mpi=pmi2" in sbatch_of(plan, tmp_path)[0]
    assert "--mpi" not in sbatch_of(make_plan(compose(["cluster.mpi=none"])), tmp_path)[0]


def test_run_lock_names_its_launcher(tmp_path):
    from vdkit.run.runlock import acquire_local, holder_note

    fd = acquire_local(tmp_path, "local")
    try:
        assert (tmp_path / LOCK_FILE).read_text() == f"local {os.getpid()}\n"
        assert holder_note(tmp_path) == f"held by local job {os.getpid()}"
    finally:
        os.close(fd)
    assert holder_note(tmp_path) is None  # released: the lock file's text outlives it, the note does not



@pytest.mark.parametrize("names", ["xe9680,,debug", ",xe9680", "xe9680,"])
def test_a_slurm_name_list_with_an_empty_item_is_what_slurm_accepts(names):
    """slurmctld splits --partition / --reservation with strtok_r(",") (src/slurmctld/partition_mgr.c get_part_list),
    which skips empty items: `sbatch --test-only --partition=xe9680,,xe9680` runs (Slurm 22.05.8), so the door takes it;
    a list with no name (",") is refused by Slurm and by the door (tests/bad_inputs: slurm-partition-no-name)."""
    recipe = compose([f"cluster.partition='{names}'", f"cluster.reservation='{names}'"])
    launchers.get("slurm").check_recipe(recipe)


def test_slurm_dependencies_that_sbatch_takes_pass_the_door():
    """What `sbatch --test-only --dependency=...` takes on Slurm 22.05.8 (jobs 13, 14 alive) passes; the refused forms
    are rows of tests/bad_inputs (slurm-dependency-*)."""
    from dataclasses import replace

    slurm, base = launchers.get("slurm"), compose([])
    for dep in ("singleton", "afterok:13:14", "afterok:13?afterany:14", "13,14", "after:13+5", "afterany:13_*",
                "singleton,afterok:13", "afternotok:13(failed)", "afterok:13?14", "AFTEROK:13"):
        slurm.check_recipe(replace(base, cluster=replace(base.cluster, dependency=dep)))
    with pytest.raises(UserError, match="cluster.dependency='aftr:13'"):  # the same path refuses (rows: bad_inputs)
        slurm.check_recipe(replace(base, cluster=replace(base.cluster, dependency="aftr:13")))
