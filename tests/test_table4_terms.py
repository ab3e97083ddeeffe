"""Table 4's two rows part by part and the terms that differ between them (benchmarks/table4_terms.py;
docs/prediction.md "Table 4's stack, and why its two rows part")."""
from __future__ import annotations


import numpy as np
import pytest

from helpers import bench_module


@pytest.fixture(scope="module")
def T():
    return bench_module("table4_terms")


@pytest.fixture(scope="module")
def figs(T):
    out = T.B.load_figures()
    for f in out:
        T.B._basis(f)
    return out


def test_each_rows_parts_add_up_to_the_step_the_benchmark_predicts(T, figs):
    """The decomposition is the benchmark's own prediction, split: its parts sum to bench_prediction's step for the
    layout the planner picks (nothing left over on these two rows), and both rows take flash-attn 2's rate."""
    from vdkit.planner import attention_rate as AR

    k = T.P.fitted()
    for f in (f for f in figs if f.group == "table4"):
        q = T.parts(f, k)
        assert q["step_s"] == pytest.approx(T.B._step(f, k)[0], rel=1e-9)
        assert q["other_s"] == pytest.approx(0.0, abs=1e-9)
        calib = T.P.calibration()
        peak = float(T.P.gpu_hardware(calib, f.recipe.cluster.gpu_type)["peak_tflops_bf16"])
        flash2 = AR.blended_tflops(calib["attention"], "flash2", f.recipe.train.seq_length) / peak
        assert q["attn_eff"] == pytest.approx(flash2)  # what NeMo Framework 23.11's TE 0.13 / 1.1 ran


def test_no_sourced_term_closes_the_rows_spread_and_the_attention_rate_widens_it(T, figs):
    """(1 + 7B's error) / (1 + 70B's error) is what no shared constant changes. Every term with a source leaves it
    wide (the rows contradict each other); the attention at its real rate widens it against the GEMM rule, because the
    7B's attention is about twice the 70B's share of its compute (attention FLOPs per GEMM FLOP go as s / hidden)."""
    rows = {name: (sourced, errs) for name, sourced, errs in T.terms(figs)}
    base = rows["as planned"][1]
    for name, (sourced, errs) in rows.items():
        if sourced:
            assert T.spread({**base, **errs}) > 1.5, name
    assert T.spread({**base, **rows["attention at the GEMM rule (before this stop; not what ran)"][1]}) < T.spread(base)
    k = T.P.fitted()
    share = {f.recipe.model.name: (lambda q: q["attention_s"] / (q["attention_s"] + q["gemm_s"]))(T.parts(f, k))
             for f in figs if f.group == "table4"}
    assert 1.6 < share["llama2_7b"] / share["llama2_70b"] < 2.4


def test_the_overlap_term_leaves_the_fitted_figures_as_they_were(T, figs):
    """The NVIDIA-overlap term plans on copies: the figures the other terms refit on keep their basis."""
    before = [f.basis.copy() for f in figs]
    changed = T._overlapped(figs)
    assert all(np.array_equal(b, f.basis) for b, f in zip(before, figs))
    assert any(not np.array_equal(b, g.basis) for b, g in zip(before, changed))
