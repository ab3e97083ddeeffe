"""`vdkit demo` on a reduced sweep: the table it writes matches the runs it made."""
import json
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.validation.run_dir import validate_one
from vdkit.run.rundir import load_recipe


@pytest.mark.slow
def test_demo_reduced_sweep_writes_the_table_of_its_runs(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "-m", "method=lora,sft", "cluster.nodes=1,2", "train.max_steps=8"])
    text = capsys.readouterr().out
    assert rc == 0, text
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 4
    report = out / "report"
    for name in ("table9.md", "table9.csv", "table9.json", "table9_scaling.png"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0
    table = json.loads((report / "table9.json").read_text())
    measured = {(c["method"], c["gpus"]): c for c in table["cells"] if c["runs"]}
    # the demo's emulated 2-rank nodes: 1 node = 2 GPUs, 2 nodes = 4
    assert set(measured) == {("lora", 2), ("lora", 4), ("sft", 2), ("sft", 4)}
    for run in runs:
        recipe = load_recipe(run)
        cell = measured[(recipe.method.name, recipe.world_size)]
        assert [str(run)] == [str(Path(p)) for p in cell["runs"]]
        # the cell is this run's own estimate, recomputed independently from its logs
        own = validate_one(run)
        assert own["steps_measured"] == recipe.train.max_steps
        assert cell["minutes"] == pytest.approx(own["extrapolated_minutes"], abs=0.006)
        assert own["target_steps"] == 1000
    # the printed table is the Markdown file's table
    md = (report / "table9.md").read_text()
    assert "| tiny_llama | 2 |" in md and "| tiny_llama | 4 |" in md
    assert "| tiny_llama | 2 |" in text
    # megatron-core ran the layouts the planner picked for the demo's 8.5 MB devices: SFT in tensor parallel
    layouts = {(load_recipe(r).method.name, load_recipe(r).world_size): load_recipe(r).parallelism for r in runs}
    assert layouts[("sft", 2)].tp == 2 and layouts[("sft", 4)].tp == 2 and layouts[("lora", 2)].tp == 1
    assert all((r / "memory.json").is_file() for r in runs)


@pytest.mark.slurm
def test_demo_on_the_local_slurm(tmp_path, capsys, monkeypatch, local_slurm):
    # the session's cluster is the one the demo finds running (and leaves running)
    monkeypatch.setenv("VDKIT_SLURM_DIR", str(local_slurm.root))
    out = tmp_path / "demo"
    rc = main(["demo", "--slurm", "--out", str(out), "-m", "method=lora", "cluster.nodes=2", "train.max_steps=6"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "on the local emulated Slurm" in text
    (run,) = (out / "runs").iterdir()
    assert list(run.glob("slurm-*.out")) and (run / "job_id.txt").is_file()
    table = json.loads((out / "report" / "table9.json").read_text())
    (cell,) = [c for c in table["cells"] if c["runs"]]
    assert (cell["method"], cell["gpus"], cell["nodes"]) == ("lora", 4, 2)  # the demo's 2 ranks per node
    assert local_slurm.is_up()


def test_the_demo_sweep_plans_the_layouts_its_comment_states():
    """conf/sweep/demo.yaml's header says which layout each cell gets; plan the cells (no training)."""
    from vdkit.composition.config import compose
    from vdkit.render.sweep import sweep_cells
    from vdkit.planner.plan import make_plan

    got = {}
    for cell in sweep_cells("demo"):
        plan = make_plan(compose(cell))
        r = plan.recipe
        got[(r.method.name, r.cluster.nodes)] = (plan.tp, plan.pp, r.parallelism.vp, plan.dp)
    assert got == {("lora", 1): (1, 2, 1, 1), ("ptuning", 1): (1, 2, 1, 1), ("sft", 1): (2, 1, 1, 1),
                   ("lora", 2): (1, 2, 2, 2), ("ptuning", 2): (1, 2, 2, 2), ("sft", 2): (2, 2, 2, 1)}
    header = (Path(__file__).resolve().parents[1] / "conf" / "sweep" / "demo.yaml").read_text()
    assert "LoRA and P-tuning run in two pipeline\n# stages (PP2, pinned" in header and "SFT into tensor parallel (TP2" in header


def test_demo_refuses_at_the_door_what_it_cannot_run_here(tmp_path, capsys, monkeypatch):
    """A sweep of NeMo cells (its container) or of Slurm cells without --slurm: one line, before any training."""
    from vdkit.cli import main

    assert main(["demo", "--sweep", "table9", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "engine=nemo" in err and "runs only in its container" in err and "Traceback" not in err
    assert not (tmp_path / "a" / "runs").exists() or not any((tmp_path / "a" / "runs").iterdir())
    cell = ["engine=megatron", "model=tiny_llama", "data=synthetic", "cluster=xe9680", "cluster.gpus_per_node=2",
            "cluster.socket_ifname=lo", "cluster.ib_hcas=[]", "cluster.transport=tcp", "+cluster.env.NCCL_IB_DISABLE=1"]
    assert main(["demo", "-m", *cell, "--out", str(tmp_path / "b")]) == 2
    assert "would submit to a scheduler" in capsys.readouterr().err


def test_demo_slurm_takes_the_cluster_slurm_conf_names(tmp_path, monkeypatch):
    """`vdkit cluster up --dir X` prints SLURM_CONF=X/slurm.conf: --slurm uses X; a site's slurm.conf is refused."""
    from vdkit.commands.demo import slurm_dir
    from vdkit.errors import UserError
    from vdkit.slurm import localcluster

    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert slurm_dir() == localcluster.default_dir()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "x" / "slurm.conf"))
    assert slurm_dir() == tmp_path / "x"  # not started yet: demo --slurm starts it there
    site = tmp_path / "etc"
    site.mkdir()
    (site / "slurm.conf").write_text("ClusterName=site\n")
    monkeypatch.setenv("SLURM_CONF", str(site / "slurm.conf"))
    with pytest.raises(UserError, match="not a local Slurm"):
        slurm_dir()
