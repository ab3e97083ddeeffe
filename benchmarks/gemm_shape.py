"""GEMM shape and Cisco's Llama 3.1 8B TP 2 row (issue 35): is the one calibrated GEMM efficiency the cause?

The step-time model prices every GEMM at one fitted efficiency (step_time.yaml ``gemm_efficiency_bf16`` / ``_fp8``).
Shape costs a GEMM through tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide"): its
M x N output is computed in CTA tiles, one tile per SM at a time, so the edge tiles' padding and the last wave's idle
SMs are paid for. This script prices that for every decoder-layer GEMM of a row - forward (tokens x out), activation
gradient (tokens x in) and weight gradient (in x out; none for a frozen PEFT weight), each column-parallel output and
row-parallel input split by TP, the tokens by CP - with the transformers regime's own rule and figures (one home:
vdkit.planner.predict_hf's quantization, hf_step_time.yaml ``gemm_tile`` 128 x 256 - CUTLASS's Hopper default
CTA tile - and the GPU's ``compute_units``, 132 SMs). The FLOP-weighted useful fraction ``q`` of a row, divided by the
mean over the fitted rows (so the calibrated constant keeps its meaning), is the factor a shape-aware efficiency
would put on the row's GEMM seconds.

It then decomposes Cisco's two predictions term by term: TP 1 as planned (the kit plans full recompute there: its
fp32 gradient buffer does not fit, benchmarks/independent_runs.yaml) and as run (no recompute), TP 2 as run (its TP
collectives unoverlapped: Cisco's pretrain.py never adds NeMo's overlap callback) and with the overlap the kit's
Bridge renders by default. Nothing is fitted or written. Usage (~10 s):

    python benchmarks/gemm_shape.py
"""
from __future__ import annotations

from dataclasses import replace
from statistics import mean
from typing import Dict, List

import yaml

import independent_runs as I
from vdkit.composition.config import compose
from vdkit.planner import predict as P
from vdkit.planner.calibration import load
from vdkit.planner.plan import make_plan
from vdkit.planner.predict_hf import _quantization

PREFIX = "MLPerf Llama 3.1 8B pretrain "
TP1, TP2 = (f"{PREFIX}{n} (Cisco)" for n in ("8 nodes TP1", "16 nodes TP2"))


def layer_quantization(recipe, tp: int, cp: int = 1) -> float:
    """FLOP-weighted useful fraction of a decoder layer's GEMMs on ``recipe``'s GPU at TP ``tp``, CP ``cp``."""
    hf = load("hf_step_time")
    gpus = hf["gpus"]
    units = int((gpus.get(recipe.cluster.gpu_type) or gpus[load("step_time")["hardware"]["reference_gpu"]])
                ["compute_units"])
    m, t = recipe.model, recipe.train
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    up = 2 * f if m.activation == "swiglu" else f
    tokens = t.micro_batch_size * P.tokens_per_sample(recipe) / cp
    wgrad = recipe.method.name in ("sft", "pretrain")  # PEFT: the frozen weights run no weight gradient
    flops = useful = 0.0
    for k, out, column in ((h, h + 2 * kv, True), (h, h, False), (h, up, True), (f, h, False)):
        k, out = (k, out / tp) if column else (k / tp, out)
        shapes = [(tokens, out, k), (tokens, k, out)] + ([(k, out, tokens)] if wgrad else [])
        for rows, cols, inner in shapes:  # output rows x cols, summed over inner
            fl = rows * cols * inner
            flops += fl
            useful += fl / _quantization(rows, cols, hf["gemm_tile"], units)
    return flops / useful


def fitted_rows() -> List[dict]:
    """The fitted NVIDIA rows (step_time.yaml anchors) as planned: name, TP, q."""
    out = []
    for run in load("step_time")["anchors"]["runs"]:
        plan = make_plan(compose(run["overrides"]))
        p = plan.recipe.parallelism
        out.append({"name": run["name"], "tp": p.tp, "q": layer_quantization(plan.recipe, p.tp, p.cp)})
    return out


def _terms(recipe, recompute: str, overlap: bool) -> Dict[str, float]:
    """The step's terms (seconds) of ``recipe`` at its own layout with ``parallelism.tp_comm_overlap`` set to
    ``overlap``, the distributed optimizer on."""
    recipe = replace(recipe, parallelism=replace(recipe.parallelism, tp_comm_overlap=overlap))
    p = recipe.parallelism
    s = P.predict_step(recipe, p.tp, p.pp, p.vp or 1, recompute, True)
    return {"step": s.compute_s + s.overhead_s + s.communication_s + s.bubble_s + s.optimizer_s,
            "gemm": s.parts["flops_s"] / P.fitted()[P.efficiency_key(recipe.train.precision)],
            "attention": s.compute_s - s.parts["flops_s"] / P.fitted()[P.efficiency_key(recipe.train.precision)],
            "tensor_parallel": s.parts["tensor_parallel_s"], "host_tail": s.parts["per_step_host_s"],
            "other": s.overhead_s - s.parts["per_step_host_s"] + s.optimizer_s + s.communication_s
            - s.parts["tensor_parallel_s"]}


def cisco() -> List[dict]:
    """Cisco's two rows: published step, each variant's terms and error, and the row's shape factor."""
    runs = {r["name"]: r for r in yaml.safe_load(I.DATA.read_text())["runs"]}
    norm = mean(w["q"] for w in fitted_rows())
    out = []
    for name, variants in ((TP1, (("as planned", None, True), ("as run: no recompute", "none", True))),
                           (TP2, (("as run: overlap off", None, False), ("with the kit's overlap", None, True)))):
        recipe = I._compose(runs[name])
        published = recipe.train.global_batch_size / runs[name]["samples_per_s"]  # s a step (independent_runs.py's)
        planned = make_plan(recipe).recipe
        q = layer_quantization(recipe, recipe.parallelism.tp)
        for label, recompute, overlap in variants:
            terms = _terms(planned, recompute or planned.parallelism.recompute, overlap)
            out.append({"name": name, "variant": label, "published_s": published, "q": q, "factor": q / norm,
                        **terms, "error": terms["step"] / published - 1})
    return out


def main() -> None:
    """Print the fitted rows' quantization, then Cisco's decomposition."""
    fit = fitted_rows()
    norm = mean(w["q"] for w in fit)
    print("tile x wave quantization of the decoder layers' GEMMs (useful fraction, FLOP-weighted; 128 x 256 tiles)")
    for w in fit:
        print(f"  fitted  {w['name']:<28} TP{w['tp']}  q {w['q']:.3f}  factor {w['q'] / norm:.3f}")
    print(f"  fitted rows' mean q {norm:.3f} (range {min(w['q'] for w in fit):.3f} .. {max(w['q'] for w in fit):.3f})")
    print("Cisco's Llama 3.1 8B rows, seconds per step by term (gemm at the fitted efficiency; other: drains, "
          "optimizer, exposed DP)")
    for w in cisco():
        print(f"  {w['name'][len(PREFIX):]:<21} {w['variant']:<22} q {w['q']:.3f} factor {w['factor']:.3f}  "
              f"published {w['published_s']:.3f}  predicted {w['step']:.3f} ({w['error']:+.1%})  gemm {w['gemm']:.3f}  "
              f"attention {w['attention']:.3f}  TP {w['tensor_parallel']:.4f}  tail {w['host_tail']:.3f}  "
              f"other {w['other']:.4f}  miss {w['published_s'] - w['step']:.3f} s")


if __name__ == "__main__":
    main()
