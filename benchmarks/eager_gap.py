"""The eager-vs-graphed gap of the published MLPerf 70B LoRA TP4 CP2 runs, against the kit's host-time model (issue 35).

Two pairs of published runs differ in per-layer CUDA graphs (the scripts' ``LAYER_CUDA_GRAPH``): NVIDIA's v4.0
eager 8- and 128-node runs and its v4.1 graphed ones (a new image too), and Oracle's v5.0 eager 64-node H200 run
and Azure's v4.1 graphed one (the same NeMo 24.09 implementation; benchmarks/independent_runs.yaml reads both
scripts line by line). For each row it prints the published and predicted seconds per step, the host's issue time
the model counts (vdkit.planner.host_time: ops x the eager cost of one op) and the GPU seconds it hides behind, then
the cost of one op at which the model's stage, ``max(GPU, host)``, would reach the published step: how far the
counted host time is from explaining the gap. Nothing is fitted and nothing is written; the rows are predicted as
``independent_runs.py`` predicts them. Usage (~1 min):

    python benchmarks/eager_gap.py
"""
from __future__ import annotations

from unittest import mock

import yaml

import independent_runs as I
from vdkit.planner import host_time
from vdkit.planner.plan import make_plan

# (eager row, its graphed counterpart), by name in independent_runs.yaml
PAIRS = (("MLPerf LoRA 8 nodes TP4 CP2 (NVIDIA)", "MLPerf LoRA 8 nodes TP4 CP2 (NVIDIA v4.1)"),
         ("MLPerf LoRA 128 nodes TP4 CP2 (NVIDIA)", "MLPerf LoRA 128 nodes TP4 CP2 (NVIDIA v4.1)"),
         ("MLPerf LoRA 64 H200 nodes TP4 CP2 (Oracle)", "MLPerf LoRA 64 H200 nodes TP4 CP2 (Azure)"))


def _step(recipe, op_s: float):
    """The predicted step of ``recipe`` with one op costing ``op_s`` host seconds."""
    with mock.patch.object(host_time, "op_cost_s", lambda: op_s):
        return make_plan(recipe).prediction.step


def binding_op_cost_s(recipe, published_s: float, hi: float = 1e-3, tol: float = 1e-7) -> float:
    """The cost of one op (seconds) at which the predicted step reaches ``published_s`` (bisection; the step only
    grows with the op's cost). ``hi`` if even that falls short."""
    lo = 0.0
    if _step(recipe, hi).total_s < published_s:
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _step(recipe, mid).total_s < published_s else (lo, mid)
    return hi


def rows():
    """Per row of PAIRS: name, published and predicted seconds, host issue and GPU seconds, and for an eager row the
    op cost that binds it (None for a graphed one)."""
    data = {run["name"]: run for run in yaml.safe_load(I.DATA.read_text())["runs"]}
    op_s = host_time.op_cost_s()
    out = []
    eager = {e for e, _ in PAIRS}
    for name in (n for pair in PAIRS for n in pair):
        run = data[name]
        r = I._compose(run)
        published = r.train.global_batch_size / run["samples_per_s"]  # GBS samples / the job's samples per second
        step = _step(r, op_s)
        q = step.parts
        gpu = step.total_s - q.get("host_bound_s", 0.0) - q.get("per_step_host_s", 0.0) - q.get("drain_s", 0.0)
        out.append({"name": name, "published_s": published, "predicted_s": step.total_s,
                    "host_issue_s": q.get("host_issue_s", 0.0), "gpu_s": gpu,
                    # a graphed row issues 2 + 2 ops a layer: no op cost binds it in the model's range
                    "binding_op_us": binding_op_cost_s(r, published) * 1e6 if name in eager else None,
                    "op_us": op_s * 1e6,
                    "layers": r.model.num_layers})
    return out


def main() -> None:
    table = rows()
    print(f"  {'row':<46} {'published':>9} {'predicted':>9} {'host issue':>10} {'GPU':>7} {'op cost to bind':>16}")
    for w in table:
        bind = (f"{w['binding_op_us']:>8.0f} us ({w['binding_op_us'] / w['op_us']:.1f}x)"
                if w["binding_op_us"] is not None else f"{'(graphed)':>16}")
        print(f"  {w['name']:<46} {w['published_s']:>9.3f} {w['predicted_s']:>9.3f} {w['host_issue_s']:>10.3f} "
              f"{w['gpu_s']:>7.3f} {bind}")
    by = {w["name"]: w for w in table}
    for eager, graphed in PAIRS:
        gap = by[eager]["published_s"] - by[graphed]["published_s"]
        print(f"  {eager} - {graphed}: {gap:.3f} s a step, {gap / by[eager]['layers'] * 1e3:.2f} ms a layer "
              f"and micro batch")


if __name__ == "__main__":
    main()
