"""The MLPerf 70B LoRA series per micro batch: the published and predicted step as n x m + S (issue 35).

A fixed job (Llama 2 70B LoRA, GBS 8, MBS 1, 8192-token samples) laid out TP 4 on one node (4 micro batches a step
and data-parallel rank) and TP 4 CP 2 on 2, 4 and 8 nodes (4, 2, 1): each step is n micro batches of a cost m
each plus a per-step cost S. Solving step = n x m + S over a series (least squares) tells a cost that scales with
the micro batches from one that comes once a step. This prints, for each row, the published and predicted step,
the predicted micro batch split into the model's parts (vdkit.planner.predict.predict_step's own terms: the GEMMs
at the fitted efficiency, the attention at its stack's rate or the GEMM rule, the exposed TP collectives and the
overlap's SM price, the CP ring (its exposed hops and its own copies and merges), the host's excess, the roofline /
other overhead) and its per-step part (the fitted host tail, the loop's drains, the exposed DP reduction, the
optimizer, the bubble), then each series' n x m + S solve, published and predicted. Nothing is fitted and nothing
is written; the rows are planned as ``independent_runs.py`` plans them. Usage (~20 s):

    python benchmarks/per_micro.py
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import yaml

import independent_runs as I
from vdkit.planner import predict as P
from vdkit.planner.activations import attention_precision
from vdkit.planner.plan import make_plan

# series of one submitter and image, by name in independent_runs.yaml (the 1-node row first: FP8 attention, no CP)
SERIES = {
    "Dell v4.1 (NeMo 24.09)": ("MLPerf LoRA 1 XE9680 TP4 (Dell v4.1)", "MLPerf LoRA 2 XE9680 TP4 CP2 (Dell)",
                               "MLPerf LoRA 4 XE9680 TP4 CP2 (Dell)", "MLPerf LoRA 8 XE9680 TP4 CP2 (Dell)"),
    "NVIDIA v4.1 (NeMo 24.09)": ("MLPerf LoRA 1 node TP4 (NVIDIA v4.1)", "MLPerf LoRA 8 nodes TP4 CP2 (NVIDIA v4.1)",
                                 "MLPerf LoRA 128 nodes TP4 CP2 (NVIDIA v4.1)"),
    "NVIDIA v4.0 (NeMo 24.04)": ("MLPerf LoRA 1 node TP4 (NVIDIA)", "MLPerf LoRA 8 nodes TP4 CP2 (NVIDIA)",
                                 "MLPerf LoRA 128 nodes TP4 CP2 (NVIDIA)"),
}
MICRO_PARTS = ("gemm", "attention", "tp", "cp", "pp", "host", "other")
STEP_PARTS = ("tail", "drain", "dp", "optimizer", "bubble")


def decompose(step, recipe) -> Dict[str, float]:
    """``step`` (a StepTime of ``recipe``) as one micro batch's parts (MICRO_PARTS, seconds) and the step's own
    (STEP_PARTS), with ``micro`` (n) and ``total_s``: n x sum(MICRO_PARTS) + sum(STEP_PARTS) = total_s."""
    q, k = step.parts, P.fitted()
    par, t = recipe.parallelism, recipe.train
    n = float(t.global_batch_size // (t.micro_batch_size * (recipe.world_size // (par.tp * par.pp * par.cp))))
    eff = k[P.efficiency_key(recipe.train.precision)]
    attn_eff = q["attn_eff"] or k[P.efficiency_key(attention_precision(recipe))]
    gemm, attention = q["flops_s"] / eff, q["attn_flops_s"] / attn_eff
    per_step = {"tail": q["per_step_host_s"], "drain": q.get("drain_s", 0.0), "dp": q["data_parallel_s"] + q.get("data_parallel_tail_s", 0.0),
                "optimizer": step.optimizer_s, "bubble": step.bubble_s}
    host = q.get("host_bound_s", 0.0) / n  # the host issue time beyond the GPU work it hides behind
    # the CP column: the ring's exposed hops and its own copies and merges (vdkit.planner.cp_overheads, an overhead)
    copies = q.get("cp_copies_s", 0.0) / n
    comm = {"tp": q["tensor_parallel_s"] / n, "cp": q["context_parallel_s"] / n + copies, "pp": q["pipeline_p2p_s"] / n}
    # what the compute term holds beyond the GEMMs and the attention at their rates (local layers' extra FLOPs)
    compute_rest = step.compute_s / n - gemm - attention
    other = (step.overhead_s - per_step["tail"] - per_step["drain"]) / n - host + compute_rest - copies
    return {"micro": n, "total_s": step.total_s, "gemm": gemm, "attention": attention, **comm, "host": host,
            "other": other, **per_step}


def solve(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """(m, S) of step = n x m + S by least squares over (n, step) points (two or more distinct n)."""
    a = np.array([[n, 1.0] for n, _ in points])
    m, s = np.linalg.lstsq(a, np.array([t for _, t in points]), rcond=None)[0]
    return float(m), float(s)


def rows() -> List[dict]:
    """Each SERIES row: name, series, published seconds a step, and :func:`decompose` of its prediction."""
    data = {run["name"]: run for run in yaml.safe_load(I.DATA.read_text())["runs"]}
    out = []
    for series, names in SERIES.items():
        for name in names:
            run = data[name]
            r = I._compose(run)
            plan = make_plan(r)
            published = r.train.global_batch_size / run["samples_per_s"]  # GBS samples / the job's samples a second
            out.append({"name": name, "series": series, "published_s": published,
                        **decompose(plan.prediction.step, plan.recipe)})
    return out


def main() -> None:
    table = rows()
    head = " ".join(f"{p:>8}" for p in MICRO_PARTS)
    print(f"  {'row':<44} {'n':>2} {'pub s':>7} {'pred s':>7} {'pub/n':>7} | per micro batch (s): {head} | "
          f"per step (s): {' '.join(f'{p:>6}' for p in STEP_PARTS)}")
    for w in table:
        print(f"  {w['name']:<44} {w['micro']:>2.0f} {w['published_s']:>7.3f} {w['total_s']:>7.3f} "
              f"{w['published_s'] / w['micro']:>7.3f} | {'':>20} {' '.join(f'{w[p]:>8.4f}' for p in MICRO_PARTS)} | "
              f"{'':>14}{' '.join(f'{w[p]:>6.4f}' for p in STEP_PARTS)}")
    for series in SERIES:
        cp = [w for w in table if w["series"] == series and "CP2" in w["name"]]
        if len({w["micro"] for w in cp}) < 2:  # one micro-batch count: n x m + S has no unique solution
            continue
        pub, pred = (solve([(w["micro"], w[key]) for w in cp]) for key in ("published_s", "total_s"))
        print(f"  {series}, CP 2 rows, step = n x m + S: published m {pub[0]:.3f} s, S {pub[1] * 1e3:+.0f} ms; "
              f"predicted m {pred[0]:.3f} s, S {pred[1] * 1e3:+.0f} ms")


if __name__ == "__main__":
    main()
