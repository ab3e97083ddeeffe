"""How far to trust a prediction: its range and which of its terms are physics and which are fitted.

The range is measured, not assumed: the leave-one-out errors (predicted / published - 1, each figure
predicted with the constants refitted without it) of the published figures of the same regime, as
``python benchmarks/bench_prediction.py`` prints them, written in the calibration files' ``intervals``.
A prediction ``p`` is printed with ``p / (1 + worst over-prediction)`` to ``p / (1 + worst
under-prediction)``: where the published runs of that regime fell relative to their predictions.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

#: the regime's terms -> physics, or the constants they rest on (fitted)
PHYSICS = "physics (datasheet / measured hardware figures, the model's FLOPs and bytes)"


def group(recipe) -> str:
    """Which published figures describe the recipe's stack: guide (NeMo 1.x defaults, unfused), fused_pretrain /
    fused_finetune (NVIDIA's performance settings - Bridge, pretraining, the fast recipe - by what the plan runs:
    NVIDIA's pretraining rows or its fine-tuning rows), zero3 / fsdp (full rows) / fsdp_unpacked (transformers:
    benchmarks/hf_efficiency.py)."""
    from vdkit.planner.predict import _fused_path, regime
    from vdkit.planner.tokens import full_rows

    if regime(recipe) == "hf":
        if recipe.parallelism.sharding == "zero3":
            return "zero3"
        return "fsdp" if full_rows(recipe) else "fsdp_unpacked"
    if not _fused_path(recipe):
        return "guide"
    return "fused_pretrain" if recipe.method.name == "pretrain" else "fused_finetune"


HF_GROUPS = ("zero3", "fsdp", "fsdp_unpacked")


def _table(recipe) -> dict:
    from vdkit.planner.calibration import load

    return load("hf_step_time" if group(recipe) in HF_GROUPS else "step_time")["intervals"]


def interval(recipe, step_s: float) -> Tuple[float, float, str]:
    """(low, high) seconds per step and the figures the range comes from."""
    row = _table(recipe)[group(recipe)]
    lo, hi = step_s / (1 + float(row["max"])), step_s / (1 + float(row["min"]))
    note = row["figures"]
    if group(recipe) == "fused_finetune" and not recipe.data.packed:
        note += "; those rows packed 4096-token sequences, this plan's samples are unpacked: no such run was checked"
    ref = _reference_gpu(recipe)
    if ref and recipe.cluster.gpu_type != ref:
        note += f"; measured on {ref}, no {recipe.cluster.gpu_type} run of this stack checked"
    return lo, hi, note


def _reference_gpu(recipe) -> Optional[str]:
    if group(recipe) in HF_GROUPS:
        return None
    from vdkit.planner.predict import calibration

    return calibration()["hardware"].get("reference_gpu")


def basis(recipe) -> Dict[str, str]:
    """Each printed term -> what it rests on (physics, or the fitted constant and its value)."""
    g = group(recipe)
    if g in HF_GROUPS:
        from vdkit.planner.predict_hf import gpu_profile

        out = dict.fromkeys(("per-micro-batch overhead", "communication", "pipeline bubble", "optimizer"), PHYSICS)
        eff = float(gpu_profile(recipe)["hf_gemm_efficiency"])
        out["compute"] = (f"fitted: hf_gemm_efficiency={eff:.3g} of the {recipe.cluster.gpu_type}'s MAMF "
                          "(public torch FSDP runs, benchmarks/hf_efficiency.py)" if eff != 1.0 else
                          f"{PHYSICS}; no public run of this stack on the {recipe.cluster.gpu_type} fitted")
        return _fabric_basis(recipe, out)
    from vdkit.planner.predict import _fused_path, attention_precision, efficiency_key, fitted

    k = fitted()
    eff, attn = efficiency_key(recipe.train.precision), efficiency_key(attention_precision(recipe))
    compute = f"fitted: {eff}={k[eff]:.3g} of peak (NVIDIA's Llama 2 rows, Table 4)"
    stack = _attention(recipe)
    if stack:  # the attention at its stack's published kernel rate (vdkit.planner.attention_rate)
        compute += f"; the s^2 attention {stack}"
    elif attn != eff:  # FP8 GEMMs, BF16 attention (vdkit.planner.activations.attention_precision)
        compute += f"; the s^2 attention at the BF16 peak x {attn}={k[attn]:.3g}"
    out = {"compute": compute,
           "per-micro-batch overhead": (f"fitted: guide_stack_gb_s={k['guide_stack_gb_s']:.3g} GB/s of weight bytes "
                                        "touched per micro batch (Table 9)") if g == "guide" else
           "physics: the roofline's excess (weights streamed from HBM once per GEMM pass)",
           "communication": PHYSICS, "pipeline bubble": "physics: the layout x the stage time", "optimizer": PHYSICS}
    if _fused_path(recipe):  # the host's tail after the step's syncs, once per step (predict_step)
        out["per-step host tail"] = (f"fitted: per_step_host_s={k['per_step_host_s'] * 1e3:.3g} ms once per step "
                                     "(NVIDIA's Llama 2 rows, Table 4)")
    return _fabric_basis(recipe, out)


def _attention(recipe) -> str:
    """The attention term's basis when its stack's published kernel rate prices it ("" when the GEMM rule does)."""
    from vdkit.planner.attention_rate import rate
    from vdkit.planner.predict import attention_span, calibration, gpu_hardware

    calib = calibration()
    peak = float(gpu_hardware(calib, recipe.cluster.gpu_type)["peak_tflops_bf16"])
    a = rate(recipe, calib, peak, attention_span(recipe, calib) / recipe.parallelism.cp)
    return a.basis(calib["attention"]["source"]) if a else ""


def _fabric_basis(recipe, out: Dict[str, str]) -> Dict[str, str]:
    """On more than one node the communication term rests on the fabric's figures: the site's measured
    one, the adapters' datasheet rate, or a stated default (vdkit.planner.interconnect)."""
    if recipe.cluster.nodes > 1:
        from vdkit.planner.interconnect import interconnect

        f = interconnect(recipe.cluster)
        out["communication"] = {"cluster": "the cluster file's inter-node bandwidth (cluster.inter_node_gb_s)",
                                "adapters": PHYSICS}.get(f.source, f"assumed: the {f.transport} fabric's stated default")
    return out


def attach(prediction, recipe):
    """``prediction`` with its range and basis filled in (None stays None)."""
    import dataclasses

    if prediction is None:
        return None
    lo, hi, source = interval(recipe, prediction.step_seconds)
    return dataclasses.replace(prediction, interval_s=(lo, hi), interval_source=source,
                               basis=tuple(basis(recipe).items()))
