"""The one checkpoint policy (vdkit.planner.checkpoint_policy) as the plan decides it and the engines render it.

Plans only (no training): Young's cadence bounded by the work a crash may lose, a timing run saving only
when stopped, bounded retention, the end's weights-only save, the plan's share and storage; Bridge's and
NeMo's checkpoint settings rendered from it.
"""
from __future__ import annotations

import json
import math

import pytest

from vdkit.planner import checkpoint_policy, timeplan as schedule
from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan

ISSUE_PLAN = ["engine=bridge", "model=llama2_7b", "method=sft", "train.max_steps=1000"]


def _times(*overrides):
    plan = make_plan(compose(list(overrides)))
    return plan, plan.time


def test_issue_plan_spends_at_most_a_tenth_of_its_wall_time_on_checkpoints():
    plan, tp = _times(*ISSUE_PLAN)
    assert tp.mode == "train" and tp.every_source == "plan"
    assert tp.checkpoint_share <= 0.10, tp.checkpoint_share
    # the run (minutes) is shorter than Young's interval: one save, at the end, of the weights only
    assert (tp.every_n_steps, tp.checkpoints, tp.final) == (0, 1, "weights")
    weights_gb = plan.params * checkpoint_policy.WEIGHT_BYTES / 1e9
    assert tp.held_gb == pytest.approx(weights_gb)
    assert tp.checkpoint_cost_s == pytest.approx(weights_gb / plan.recipe.cluster.storage_write_gbps_per_node)


def test_a_long_run_saves_every_young_interval_and_keeps_two():
    plan, tp = _times(*ISSUE_PLAN, "train.max_steps=100000")
    c = plan.recipe.cluster
    write_s = plan.checkpoint_gb / c.storage_write_gbps_per_node
    interval = min(math.sqrt(2 * write_s * c.mtbf_h * 3600), c.max_lost_work_min * 60)
    assert tp.every_n_steps == int(interval // tp.step_s) > 0
    assert tp.max_lost_work_s <= c.max_lost_work_min * 60
    assert tp.async_save and tp.final == "full" and tp.keep == checkpoint_policy.KEEP
    assert tp.held_gb == pytest.approx(checkpoint_policy.KEEP * plan.checkpoint_gb)
    periodic = 100000 // tp.every_n_steps
    assert tp.checkpoints == periodic + (tp.allocations - 1) + 1


def test_the_table9_sweep_timing_runs_hold_no_checkpoint(capsys):
    from vdkit.cli import main

    assert main(["plan", "--sweep", "table9", "--json"]) == 0
    cells = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    feasible = [c for c in cells if c["feasible"]]
    assert len(feasible) >= 20
    for cell in feasible:
        s = cell["schedule"]
        assert (s["mode"], s["every_n_steps"], s["final"]) == ("timing", 0, "none"), cell
        assert s["checkpoints"] == s["allocations"] - 1 == 0 and s["held_gb"] == 0


def test_the_sweep_table_states_the_storage_it_holds(capsys):
    from vdkit.cli import main

    assert main(["plan", "-m", "model=llama2_7b", "method=sft", "engine=bridge", "train.max_steps=1000,100000"]) == 0
    out = capsys.readouterr().out
    assert "ckpt share" in out and "ckpt held GB" in out
    held = [schedule.time_plan(make_plan(compose(ISSUE_PLAN[:-1] + [f"train.max_steps={n}"]))).held_gb
            for n in (1000, 100000)]
    assert f"holds at its end: {sum(held):,.1f} GB" in out


def test_a_timing_run_of_the_issue_plan_saves_only_when_stopped():
    _, tp = _times(*ISSUE_PLAN, "run.mode=timing")
    assert (tp.every_n_steps, tp.final, tp.checkpoints, tp.held_gb, tp.checkpoint_cost_s) == (0, "none", 0, 0.0, 0.0)


def _bridge_checkpoint(*overrides):
    from vdkit.recipes.bridge.config import bridge_config

    plan = make_plan(compose(["engine=bridge", "model.megatron_path=/m/b", *overrides]))
    return bridge_config(plan, "/runs/x", "/runs/x/checkpoints", in_container=True)["checkpoint"]


def test_bridge_timing_run_saves_only_when_stopped():
    ck = _bridge_checkpoint("model=llama2_70b", "method=lora", "cluster.nodes=2", "run.mode=timing")
    # save_interval 0: no periodic save and none after the last step (Bridge's pretrain.py), a stop still saves
    assert ck["save_interval"] == 0 and ck["most_recent_k"] == checkpoint_policy.KEEP
    assert "async_save" not in ck


def test_bridge_train_run_keeps_two_and_writes_in_the_background():
    ck = _bridge_checkpoint("method=sft", "train.max_steps=100000")
    assert ck["save_interval"] > 0 and ck["most_recent_k"] == 2 and ck["async_save"] is True
    assert "save_optim" not in ck  # resume checkpoints carry the optimizer


def test_bridge_short_train_run_saves_the_weights_at_its_end():
    ck = _bridge_checkpoint("method=sft", "train.max_steps=1000")
    assert ck["save_interval"] is None  # no periodic save; Bridge saves after the last step
    assert (ck["save_optim"], ck["load_optim"], ck["save_rng"]) == (False, False, False)


def test_nemo_timing_run_writes_no_top_k_and_no_nemo_file():
    from vdkit.recipes.nemo.config import build_config

    plan = make_plan(compose(["model.nemo_path=/m/a.nemo", "data.data_dir=/data/dolly", "run.mode=timing"]))
    params = build_config(plan, "/runs/x")["exp_manager"]["checkpoint_callback_params"]
    assert params["every_n_epochs"] == 0 and "every_n_train_steps" not in params
    assert params["save_nemo_on_train_end"] is False and params["save_best_model"] is False
    assert params["save_last"] is True  # the stop's checkpoint (NeMo's StatelessTimer)


def test_nemo_train_run_keeps_the_best_and_the_last():
    from vdkit.recipes.nemo.config import build_config

    plan = make_plan(compose(["model.nemo_path=/m/a.nemo", "data.data_dir=/data/dolly", "method=sft",
                              "train.max_steps=100000"]))
    params = build_config(plan, "/runs/x")["exp_manager"]["checkpoint_callback_params"]
    assert params["save_top_k"] + 1 == checkpoint_policy.KEEP and params["save_last"] is True
    assert params["every_n_train_steps"] > 0 and params["save_nemo_on_train_end"] is True


def test_the_door_asks_the_room_the_plan_holds_not_three_checkpoints_per_cell(tmp_path, monkeypatch):
    """Issue 34 item 5: a timing cell of table9 keeps only its stop's save, so render asks room for one checkpoint
    (held + the one being written), the figure `vdkit plan --json` prints; a train run keeping two asks three."""
    import os

    from vdkit.errors import UserError
    from vdkit.run.rundir import check_results_room
    from vdkit.render.sweep import sweep_cells

    cell = next(c for c in sweep_cells("table9") if "model=llama2_7b" in c and "method=sft" in c)
    plan = make_plan(compose(list(cell) + [f"run.results_dir={tmp_path}/res"]))
    assert plan.time.room_gb == pytest.approx(plan.checkpoint_gb)  # the stop's save, being written
    long_run = make_plan(compose(ISSUE_PLAN + ["train.max_steps=100000"]))
    assert long_run.time.room_gb == pytest.approx((checkpoint_policy.KEEP + 1) * long_run.checkpoint_gb)

    real = os.statvfs

    def free(gb):
        class St:
            f_frsize, f_bavail = 1, int(gb * 1e9)
        monkeypatch.setattr(os, "statvfs", lambda p: St if str(p).startswith(str(tmp_path)) else real(p))

    free(1.2 * plan.checkpoint_gb)  # room for one 7B SFT checkpoint: enough for a timing cell
    check_results_room(plan, tmp_path / "run", check_mounts=True)
    free(0.8 * plan.checkpoint_gb)
    with pytest.raises(UserError, match="the plan's storage"):
        check_results_room(plan, tmp_path / "run", check_mounts=True)


def test_plan_json_carries_the_room_figure_for_every_table9_cell(capsys):
    from vdkit.cli import main

    assert main(["plan", "--sweep", "table9", "--json"]) == 0
    cells = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for cell in (c for c in cells if c["feasible"]):
        s = cell["schedule"]
        assert s["room_gb"] == pytest.approx(s["checkpoint_gb"], abs=0.01), cell


def test_the_checkpoints_kept_have_one_home_the_plans():
    """The rank prunes to the plan's retention: KEEP is written once (the policy) and every other module imports it
    (recipes/common/checkpoint.py had its own ``KEEP = 2``: a change to one would have left the other behind)."""
    import ast
    from pathlib import Path

    from vdkit.recipes.common import checkpoint as rank_side

    root = Path(__file__).resolve().parents[1]
    homes = []
    for folder in ("vdkit", "recipes", "slurm", "k8s", "validation"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:  # module-level figures named KEEP
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                value = getattr(node, "value", None)
                if any(isinstance(t, ast.Name) and t.id == "KEEP" for t in targets) and \
                        isinstance(value, ast.Constant) and isinstance(value.value, int):
                    homes.append(str(path.relative_to(root)))
    assert homes == ["vdkit/planner/checkpoint_policy.py"], homes
    assert rank_side.KEEP is checkpoint_policy.KEEP and rank_side.superseded.__defaults__ == (checkpoint_policy.KEEP,)
