"""Run directories (vdkit.rundir): plan.json carries the plan and its prediction; nothing downstream re-plans."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import make_run, series
from vdkit.config import compose
from vdkit.planner.plan import make_plan
from vdkit.rundir import PLAN_FILE, create_run_dir, load_plan

H100_LORA = ["model=llama2_7b", "method=lora"]  # a recipe the step-time model predicts


def test_plan_json_carries_the_prediction(tmp_path):
    plan = make_plan(compose(H100_LORA))
    assert plan.prediction is not None
    run_dir = create_run_dir(plan, {}, tmp_path)
    data = json.loads((run_dir / PLAN_FILE).read_text())
    pred = plan.prediction
    assert data["predicted_step_seconds"] == round(pred.step_seconds, 4)
    assert data["predicted_minutes"] == round(pred.minutes, 2)
    assert data["predicted_tokens_per_s_per_gpu"] == round(pred.tokens_per_s_per_gpu, 1)
    assert data["predicted_gpu_hours"] == round(pred.gpu_hours, 3)
    loaded = load_plan(run_dir)
    assert loaded.prediction == pred  # unrounded, term by term
    assert (loaded.params, loaded.trainable_params, loaded.runner_up) == (plan.params, plan.trainable_params,
                                                                         plan.runner_up)
    data["prediction"]["step"]["compute_s"] *= 2  # what the run dir says wins over what re-planning would say
    (run_dir / PLAN_FILE).write_text(json.dumps(data))
    assert load_plan(run_dir).prediction.step.compute_s == pytest.approx(2 * pred.step.compute_s)


def test_a_plan_without_prediction_reads_back_as_none(tmp_path):
    plan = make_plan(compose(["model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic"]))
    assert plan.prediction is None  # a CPU: the model describes no such GPU
    run_dir = create_run_dir(plan, {}, tmp_path)
    assert json.loads((run_dir / PLAN_FILE).read_text())["predicted_minutes"] is None
    assert load_plan(run_dir).prediction is None


BLOCK_THE_PLANNER = """
import sys
for name in ("vdkit.planner.plan", "vdkit.planner.sharded", "vdkit.planner.predict", "vdkit.planner.predict_hf"):
    sys.modules[name] = None  # any import of the planner now raises ImportError
"""


def test_the_report_builds_with_the_planner_unimportable(tmp_path):
    """validate and report read plan.json (the prediction included); they never import the planner."""
    runs = [make_run(tmp_path / "runs", H100_LORA + [f"cluster.nodes={n}"], series(5.0)) for n in (1, 2)]
    expected = {n: make_plan(compose(H100_LORA + [f"cluster.nodes={n}"])).prediction.step_seconds for n in (1, 2)}
    code = BLOCK_THE_PLANNER + textwrap.dedent(f"""
        import json
        from pathlib import Path
        from vdkit.cli import main
        assert main(["validate", {str(runs[0])!r}, "--json"]) == 0
        assert main(["report", *{[str(r) for r in runs]!r}, "--table", "table9", "--out", {str(tmp_path / "report")!r},
                     "--no-plots"]) == 0
        assert "vdkit.planner.plan" not in sys.modules or sys.modules["vdkit.planner.plan"] is None
        table = json.loads((Path({str(tmp_path / "report")!r}) / "table9.json").read_text())
        print(json.dumps(table["cells"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads(proc.stdout.strip().splitlines()[-1])
    ran = {c["gpus"]: c for c in cells if c["runs"] and c["method"] == "lora"}
    steps = 1000  # Table 9's steps
    for nodes, step_s in expected.items():
        assert ran[8 * nodes]["predicted_minutes"] == pytest.approx(step_s * steps / 60, rel=1e-3)
        assert ran[8 * nodes]["minutes"] is not None  # measured, extrapolated
