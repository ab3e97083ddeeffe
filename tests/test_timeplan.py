"""The time plan (vdkit.planner.timeplan): the site's facts as cluster fields, and the NeMo job's contract for
every Table 9 cell at 1000 steps (issue 17).

A site sets the partition maximum, its storage's write bandwidth, an allocation's start-up, the mean
time between failures and the work a failure may lose (conf/cluster/*.yaml or the command line); the
plan uses them and `vdkit plan` prints them. NeMo stops by its own clock below the allocation less the
stop's lead, resumes from its last checkpoint and checkpoints at the plan's cadence.
"""
from __future__ import annotations

import re

import pytest

from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.render.sweep import sweep_cells
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.planner.timeplan import SITE_FIELDS, time_plan, young_interval_s

CELL = ["model=llama2_70b", "method=lora", "train.max_steps=1000"]  # issue 17's example: 4 allocations of 240 min


def _times(*extra):
    return time_plan(make_plan(compose([*CELL, *extra])))


def test_the_site_facts_are_cluster_fields_with_their_defaults():
    from vdkit.composition.schema import ClusterCfg

    c = ClusterCfg()
    assert {k: getattr(c, k) for k in SITE_FIELDS} == {
        "max_time_min": 240, "storage_write_gbps_per_node": 0.67, "startup_s": 120.0, "mtbf_h": 24.0,
        "max_lost_work_min": 60.0}
    assert _times().site == {k: getattr(c, k) for k in SITE_FIELDS}


def test_start_up_follows_cluster_startup_s():
    base, slow = _times(), _times("cluster.startup_s=420")
    assert slow.startup_s - base.startup_s == pytest.approx(300)
    assert slow.wall_s - base.wall_s == pytest.approx(300 * base.allocations, rel=0.05)


def test_checkpoint_interval_is_youngs_with_the_sites_mtbf_and_bound():
    base = _times()
    # Young's sqrt(2 C M) with M from the cluster; the default's interval is under the 60-min bound.
    assert young_interval_s(base.checkpoint_write_s, 24 * 3600) < 60 * 60
    assert base.every_n_steps == int(young_interval_s(base.checkpoint_write_s, 24 * 3600) // base.step_s)
    longer = _times("cluster.mtbf_h=96")  # four times the MTBF: twice the interval
    assert longer.every_n_steps == int(young_interval_s(base.checkpoint_write_s, 96 * 3600) // base.step_s)
    assert longer.every_n_steps == pytest.approx(2 * base.every_n_steps, abs=1)
    # A rare failure: the interval is the work a failure may lose, the site's bound.
    bounded = _times("cluster.mtbf_h=100000", "cluster.max_lost_work_min=10")
    assert bounded.every_n_steps == int(10 * 60 // base.step_s)
    assert bounded.max_lost_work_s <= 10 * 60


def test_plan_prints_the_site_facts_it_used(capsys):
    assert main(["plan", *CELL, "cluster.mtbf_h=48", "cluster.startup_s=300", "cluster.max_time_min=2880"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("site "))
    for part in ("cluster.max_time_min=2880", "cluster.storage_write_gbps_per_node=0.67", "cluster.startup_s=300",
                 "cluster.mtbf_h=48", "cluster.max_lost_work_min=60"):
        assert part in line, line


@pytest.mark.parametrize("override,words", [
    ("cluster.mtbf_h=0", "cluster.mtbf_h=0.0 must be positive"),
    ("cluster.max_lost_work_min=-5", "cluster.max_lost_work_min=-5.0 must be positive"),
    ("cluster.startup_s=-1", "cluster.startup_s=-1.0 must be >= 0"),
])
def test_bad_site_facts_are_one_line(override, words, capsys):
    with pytest.raises(UserError) as err:
        compose([override])
    assert words in str(err.value) and "\n" not in str(err.value) and "fix:" in str(err.value)
    assert main(["plan", override]) == 2
    err_text = capsys.readouterr().err
    assert words in err_text and "Traceback" not in err_text and len(err_text.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- NeMo, every Table 9 cell
# Table 9's cells as real 1000-step fine-tunes (run.mode=train): the cadence is the plan's.
TABLE9 = sweep_cells("table9", ["train.max_steps=1000", "engine.container_image='nvcr.io#nvidia/nemo:24.01'",
                                "run.mode=train"])


def test_the_timing_sweeps_checkpoint_only_at_the_stop():
    """run.mode=timing (every published-table sweep): no periodic checkpoint, the plan says so."""
    for name in ("table9", "table9_fast", "training", "alpaca_opt", "llama31_roce", "demo"):
        for cell in sweep_cells(name, ["train.max_steps=1000"])[:2]:
            recipe = compose(cell)
            assert recipe.run.mode == "timing" and recipe.val_every == 0, (name, cell)
            plan = make_plan(recipe)
            if plan.feasible:
                times = time_plan(plan)
                assert (times.every_n_steps, times.every_source, times.validation_s) == (0, "timing", 0.0)
    times = time_plan(make_plan(compose(sweep_cells("table9", ["train.max_steps=1000", "run.mode=train"])[0])))
    assert times.every_source == "plan" and times.val_every == 200 and times.validation_s > 0


@pytest.mark.parametrize("cell", TABLE9, ids=lambda c: "-".join(o.split("=")[1] for o in c[:4]))
def test_table9_nemo_job_stops_before_its_limit_resumes_and_checkpoints(cell, tmp_path):
    """The NeMo contract, per cell at 1000 steps: exp_manager.max_time_per_run ends fit below the
    allocation less the stop's lead (and the predicted start-up); resume on; the plan's cadence set;
    the sbatch time, signal and allocations agree with the plan."""
    import yaml

    from vdkit.render.prepare import prepare

    plan = make_plan(compose(cell))
    if not plan.feasible:
        pytest.skip(f"{' '.join(cell[:4])}: does not fit (the planner says why; Table 9 marks it N/A)")
    times = time_plan(plan)
    files = prepare(plan, tmp_path, check_mounts=False).files
    sbatch, cfg = files["launch.sbatch"], yaml.safe_load(files["nemo.yaml"])
    limit = int(re.search(r"^#SBATCH --time=(\d+)$", sbatch, re.M).group(1))
    assert limit == times.time_limit_min <= times.max_time_min
    assert re.search(r"^#SBATCH --signal=(\S+)$", sbatch, re.M).group(1) == f"B:USR1@{times.lead_s}"
    d, h, m, s = (int(x) for x in cfg["exp_manager"]["max_time_per_run"].split(":"))
    per_run = ((d * 24 + h) * 60 + m) * 60 + s
    assert 0 < per_run <= limit * 60 - times.lead_s - times.startup_s, (per_run, limit, times)
    em = cfg["exp_manager"]
    assert em["resume_if_exists"] is True and em["resume_ignore_no_checkpoint"] is True
    params = em["checkpoint_callback_params"]
    assert params["save_last"] is True  # the checkpoint NeMo writes when max_time_per_run ends fit
    if times.every_n_steps:  # the plan's cadence
        assert params["every_n_train_steps"] == times.every_n_steps < 1000
    else:  # Young's interval is longer than the run: checkpoints at the end (and at a stop) only
        assert "every_n_train_steps" not in params and times.allocations == 1
        assert young_interval_s(times.checkpoint_write_s, plan.recipe.cluster.mtbf_h * 3600) >= 1000 * times.step_s
    assert cfg["trainer"]["max_steps"] == 1000
    # The allocations the plan counts hold every step: each trains for NeMo's max_time_per_run.
    assert times.allocations >= 1 and times.allocations * per_run >= 1000 * times.step_s
    assert (times.allocations - 1) * per_run < (1000 + times.allocations) * times.step_s + times.checkpoint_cost_s
    print(f"\n{' '.join(o.split('=')[1] for o in cell[:4])}: {times.wall_s / 60:.0f} min predicted, --time={limit}, "
          f"{times.allocations} allocation(s), max_time_per_run {em['max_time_per_run']} (lead {times.lead_s} s), "
          f"checkpoint every {times.every_n_steps or 'end'} steps, {times.checkpoints} x {times.checkpoint_write_s:.0f} s")


# ----------------------------------------------------------------------------- why there is no step time
UNDESCRIBED = "cluster.gpu_type=NO-SUCH-GPU-80GB"  # in no calibration file, whatever GPUs they add


def _notes(*overrides):
    """The plan's printed note lines (`vdkit plan`'s text), the time plan's first."""
    from vdkit.commands.plan import describe

    text = describe(make_plan(compose(list(overrides))))
    return [line.split("note", 1)[1].strip() for line in text.splitlines() if line.startswith("  note ")]


def test_a_layout_the_transformers_regime_does_not_model_is_named_not_the_gpu():
    """engine=reference llama2_70b lora at TP 4 on H100 (a GPU hf_step_time.yaml describes): the
    time plan's note said 'no step-time prediction for this cluster's GPUs'; the layout is the reason.
    (`vdkit plan` refuses this plan for the reference engine, and its automatic layout is TP 1 x PP 1 since;
    the planner still makes a pinned one.)"""
    pinned = ["engine=reference", "model=llama2_70b", "method=lora", "parallelism.tp=4", "parallelism.pp=1"]
    plan = make_plan(compose(pinned))
    assert (plan.tp, plan.pp) == (4, 1) and plan.feasible and plan.prediction is None
    first, *rest = _notes(*pinned)
    assert first.startswith("no step-time prediction: the transformers-engine regime (vdkit.planner.predict_hf) models "
                            "data-parallel layouts only, not TP 4 x PP 1; --time is the partition maximum")
    assert "GPU" not in first and "H100" not in first
    assert "no time prediction: the transformers-engine regime (vdkit.planner.predict_hf) models data-parallel layouts " \
           "only, not TP 4 x PP 1" in rest


def test_a_tcp_cluster_without_a_measured_bandwidth_is_planned_on_the_stated_default():
    """Data parallel on MI300X across two TCP nodes that state no inter_node_gb_s: the sockets default, said."""
    from vdkit.commands.plan import describe

    cell = ["engine=reference", "model=llama2_7b", "method=lora", "cluster=xe9680_mi300x_noroce", "cluster.nodes=2",
            "cluster.inter_node_gb_s=null"]
    for layout in (["parallelism.tp=1", "parallelism.pp=1"], ["parallelism.sharding=fsdp"]):
        plan = make_plan(compose([*cell, *layout]))
        assert plan.prediction is not None and plan.time.predicted, layout
        text = describe(plan)
        assert "  fabric      TCP: 12.5 GB/s per node, 40 us per inter-node ring step (assumed: " in text, layout
        assert "assumed: communication" in text, layout


@pytest.mark.parametrize("engine, described", [("reference", "conf/calibration/hf_step_time.yaml describes "),
                                               ("megatron", "the step-time model describes ")])
def test_the_gpu_is_named_where_the_gpu_is_the_reason(engine, described):
    cell = [f"engine={engine}", "model=llama2_7b", "method=lora", UNDESCRIBED, "cluster.gpu_memory_gb=85.5",
            "cluster.time_limit_min=120"]  # a GPU the kit does not describe: its memory is the user's to state
    if engine == "reference":
        cell += ["parallelism.tp=1", "parallelism.pp=1"]
    first, *rest = _notes(*cell)
    assert first.startswith(f"no step-time prediction: {described}") and ", not NO-SUCH-GPU-80GB; --time is the " \
        "pinned limit and the allocations needed are unknown" in first
    assert any(n.startswith(f"no time prediction: {described}") and "not NO-SUCH-GPU-80GB" in n for n in rest)


# ----------------------------------------------------------------------------- decided once, read everywhere
def test_render_decides_the_time_plan_once_per_cell(tmp_path, capsys, monkeypatch):
    """`vdkit render` of a two-cell sweep: time_plan runs twice (once per cell, in make_plan); the launcher,
    the engine's nemo.yaml, the printed lines and plan.json read Plan.time."""
    import json

    from vdkit.planner import timeplan

    calls = []
    real = timeplan.time_plan

    def counted(plan, *args, **kwargs):
        calls.append(plan.recipe.model.name)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(timeplan, "time_plan", counted)
    code = main(["render", "-m", "model=llama2_7b,llama2_13b", "method=lora", "--out", str(tmp_path),
                 "--no-check-mounts"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(calls) == ["llama2_13b", "llama2_7b"]
    for run_dir in out.split():
        schedule = json.loads((tmp_path / run_dir / "plan.json").read_text())["schedule"]
        sbatch = (tmp_path / run_dir / "launch.sbatch").read_text()
        assert re.search(r"^#SBATCH --time=(\d+)$", sbatch, re.M).group(1) == str(schedule["time_limit_min"])


@pytest.mark.parametrize("pinned", [(), ("cluster.time_limit_min=200", "engine.checkpoint_every_n_steps=25")])
def test_recipe_yaml_holds_what_the_user_set_and_the_defaults(tmp_path, capsys, pinned):
    """Nothing derived goes back into the recipe: recipe.yaml's cluster and engine sections are the composed
    recipe's (unset --time and cadence stay unset, pinned ones are the user's); the derived values live in
    plan.json's time plan, which load_plan reads back as Plan.time and the engines' cadence comes from."""
    import yaml

    from vdkit.planner.timeplan import every_n_steps
    from vdkit.run.rundir import load_plan

    overrides = [*CELL, *pinned]
    assert main(["render", *overrides, "--out", str(tmp_path), "--no-check-mounts"]) == 0
    run_dir = tmp_path / capsys.readouterr().out.split()[0]
    written = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    composed = compose(overrides).to_dict()
    for section in ("cluster", "engine", "train", "run"):
        assert written[section] == composed[section], section
    plan = make_plan(compose(overrides))
    loaded = load_plan(run_dir)
    assert loaded.time == plan.time and every_n_steps(loaded) == plan.time.every_n_steps
    if pinned:
        assert (plan.time.time_limit_min, plan.time.every_n_steps) == (200, 25)
        assert (plan.time.time_source, plan.time.every_source) == ("pinned", "pinned")
    else:
        assert written["cluster"]["time_limit_min"] is None and written["engine"]["checkpoint_every_n_steps"] is None
        assert plan.time.time_source != "pinned" and plan.time.every_source == "plan"
