"""The MLPerf 70B LoRA series as n x m + S (issue 35; benchmarks/per_micro.py, docs/prediction.md "1 -> 8 node")."""
from __future__ import annotations


import pytest

from helpers import bench_module


@pytest.fixture(scope="module")
def M():
    return bench_module("per_micro")


def test_solve_splits_a_step_into_its_micro_batches_and_a_per_step_part(M):
    """Hand-made series: 0.5 s a micro batch and 60 ms a step at 4, 2 and 1 micro batches."""
    m, s = M.solve([(4, 2.06), (2, 1.06), (1, 0.56)])
    assert m == pytest.approx(0.5) and s == pytest.approx(0.06)


def test_the_parts_add_up_to_the_predicted_step(M):
    """n x (the micro batch's parts) + the step's parts = the predicted step, for the one-node FP8-attention row and a
    CP 2 row (Dell's 2 nodes, 4 micro batches): nothing of predict_step's total is left out or counted twice."""
    data = {r["name"]: r for r in M.yaml.safe_load(M.I.DATA.read_text())["runs"]}
    for name in ("MLPerf LoRA 1 XE9680 TP4 (Dell v4.1)", "MLPerf LoRA 2 XE9680 TP4 CP2 (Dell)"):
        plan = M.make_plan(M.I._compose(data[name]))
        d = M.decompose(plan.prediction.step, plan.recipe)
        assert d["micro"] == 4
        total = d["micro"] * sum(d[p] for p in M.MICRO_PARTS) + sum(d[p] for p in M.STEP_PARTS)
        assert total == pytest.approx(plan.prediction.step.total_s, rel=1e-12)
        assert d["tail"] == pytest.approx(M.P.fitted()["per_step_host_s"])  # the fused path's fitted tail, once
        assert d["gemm"] > d["attention"] > 0.0


def test_dells_published_series_costs_a_flat_micro_batch(M):
    """Dell's v4.1 CP 2 series (2 / 4 / 8 XE9680s: 4 / 2 / 1 micro batches), published: 0.550 s a micro batch and
    about nothing a step (the samples per second in independent_runs.yaml, solved)."""
    pub = [(w["micro"], w["published_s"]) for w in M.rows() if w["series"].startswith("Dell") and "CP2" in w["name"]]
    assert [n for n, _ in pub] == [4, 2, 1]
    m, s = M.solve(pub)
    assert m == pytest.approx(0.550, abs=0.002) and abs(s) < 0.015
