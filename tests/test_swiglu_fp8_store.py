"""train.swiglu_input_dtype=fp8: megatron-core's FP8 store of the SwiGLU input, measured, counted and rendered.

The fused SwiGLU megatron-core runs with ``bias_activation_fusion`` (what the bridge engine renders) saves fc1's
output for backward; with ``activation_func_fp8_input_store`` it saves an unscaled float8_e4m3fn copy instead
(fusions/fused_bias_swiglu.py:163-166). Measured here on the CPU under saved-tensor hooks against
conf/calibration/memory.yaml ``swiglu_input_bytes``, which the memory model counts; then the MLPerf v5.1 H200
LoRA row (FP8_ACT=1), planned as published, keeps its activations and plans no recompute, as the run did.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from vdkit.composition.config import compose
from vdkit.planner.activations import layer_bytes
from vdkit.planner.calibration import memory
from vdkit.planner.plan import make_plan

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "independent_runs.yaml"
H200_ROW = "MLPerf LoRA 1 XE9680L H200 TP2 (Dell)"


def _saved_bytes_per_element(fp8_store: bool) -> float:
    """Bytes megatron-core's fused SwiGLU keeps for backward per element of its input (saved-tensor hooks)."""
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    x = torch.randn(32, 2, 128, dtype=torch.bfloat16, requires_grad=True)  # [s, b, 2f / TP] as fc1 hands it on
    saved = []
    # the TorchScript executor unoptimised: its optimising first call costs seconds on a CPU, and saves the same
    with torch.jit.optimized_execution(False):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = bias_swiglu_impl(x, None, fp8_store)
        y.float().sum().backward()  # backward casts the copy back (:186)
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    return sum(t.numel() * t.element_size() for t in saved) / x.numel()


@pytest.mark.parametrize("dtype,fp8_store", [("bf16", False), ("fp8", True)])
def test_saved_swiglu_input_bytes_are_measured(dtype, fp8_store):
    assert _saved_bytes_per_element(fp8_store) == memory()["swiglu_input_bytes"][dtype]


def test_layer_keeps_fc1_output_at_one_byte():
    """The fused set's layer keeps 2sbf/TP fewer bytes with the FP8 store (SwiGLU models only), any precision."""
    m = compose(["model=llama2_70b"]).model
    s, b, tp = 8192, 1, 2
    for fp8 in (False, True):
        for peft in ("", "lora"):
            kw = dict(fp8=fp8, peft=peft, lora_dim=32, engine="bridge")
            bf16 = layer_bytes(m, s, b, tp, False, "none", **kw)
            stored = layer_bytes(m, s, b, tp, False, "none", swiglu_input="fp8", **kw)
            assert bf16 - stored == 2 * s * b * m.ffn_hidden_size / tp * (2 - 1)
    # full recompute keeps only the layer's input
    assert layer_bytes(m, s, b, tp, False, "full", swiglu_input="fp8") == layer_bytes(m, s, b, tp, False, "full")


def test_bridge_renders_the_store_only_when_asked():
    from vdkit.recipes.bridge.config import SWIGLU_FP8_INPUT_STORE, _model

    cell = ["model=tiny_llama", "engine=bridge", "method=lora", "data=synthetic"]
    on = _model(make_plan(compose(cell + ["train.swiglu_input_dtype=fp8"])))
    off = _model(make_plan(compose(cell)))
    assert on[SWIGLU_FP8_INPUT_STORE] is True and SWIGLU_FP8_INPUT_STORE not in off


def test_mlperf_h200_lora_row_plans_no_recompute():
    """Dell's v5.1 H200 LoRA run (TP 2, no recompute, FP8_ACT=1) as published fits without recompute; the same
    layout storing the SwiGLU input in bf16 does not (full recompute, as the kit planned before)."""
    row = next(r for r in yaml.safe_load(ROWS.read_text())["runs"] if r["name"] == H200_ROW)
    assert "train.swiglu_input_dtype=fp8" in row["overrides"]
    plan = make_plan(compose(row["overrides"]))
    assert plan.recipe.parallelism.recompute == "none"
    assert plan.memory.total_gb <= plan.recipe.cluster.gpu_memory_gb
    bf16 = make_plan(compose([o for o in row["overrides"] if not o.startswith("train.swiglu_input_dtype")]))
    assert bf16.recipe.parallelism.recompute == "full"
    # the recomputing plan names the setting that would spare it; the plan with it has nothing to add
    hint = "with train.swiglu_input_dtype=fp8"
    assert any(n.startswith(hint) and f"{plan.memory.total_gb:.1f} GB" in n for n in bf16.notes), bf16.notes
    assert not any(n.startswith(hint) for n in plan.notes)
    layers, ffn, tp = bf16.recipe.model.num_layers, bf16.recipe.model.ffn_hidden_size, 2
    saved_gb = layers * 2 * 8192 * ffn / tp / 1e9  # the fc1 outputs' second byte, every layer in flight
    none = make_plan(compose([o for o in row["overrides"] if not o.startswith("train.swiglu_input_dtype")]
                             + ["parallelism.recompute=none"]))
    assert none.memory.total_gb - plan.memory.total_gb == pytest.approx(saved_gb)
