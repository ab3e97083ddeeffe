"""NeMo 1.23 without megatron_amp_O2 (LoRA / P-tuning in the design guide's recipe) builds fp32 parameters
(megatron_base_model.py:128-132): the memory model counts 4-byte weights, fp32 gradients and Adam's m and v with no
master copy (conf/calibration/memory.yaml ``fp32_params_bytes``), exactly where the rendered nemo.yaml has O2 off."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner.memory import estimate_memory, stage_params, stage_static_bytes

LORA_7B = ["model=llama2_7b", "parallelism.tp=1", "parallelism.pp=1"]


@pytest.mark.parametrize("overrides, o2", [
    (["method=lora"], False), (["method=ptuning"], False), (["method=sft"], True),
    (["method=lora", "recipe=fast"], True), (["method=pretrain"], True)])
def test_rendered_o2_is_what_the_memory_model_counts(overrides, o2, tmp_path):
    from vdkit.planner.plan import make_plan
    from vdkit.recipes import engines
    from vdkit.recipes.nemo.config import build_config

    plan = make_plan(compose(["model=llama2_7b", *overrides]))
    assert build_config(plan, tmp_path)["model"]["megatron_amp_O2"] is o2
    assert engines.get("nemo").fp32_params(plan.recipe) is (not o2)


@pytest.mark.parametrize("extra, w, g, o", [
    ([], 4.0, 4.0, 8.0),  # fp32 parameters: fp32 gradients, Adam m + v, no master copy (fused_adam unwrapped)
    (["parallelism.distributed_optimizer=true"], 4.0, 4.0, 8.0),  # Apex store_params=False: dtype is the model's
    (["parallelism.distributed_optimizer=true", "train.optimizer_dtype=bf16"], 4.0, 2.0, 6.0),  # store_params=True
])
def test_guide_lora_holds_fp32_weights(extra, w, g, o):
    r = compose(["method=lora", *LORA_7B, *extra])
    held, _, trainable = stage_params(r, 1, 1, 0)
    got = stage_static_bytes(r, 1, 1, 0, r.parallelism.distributed_optimizer)
    dp = r.cluster.nodes * r.cluster.gpus_per_node if r.parallelism.distributed_optimizer else 1
    assert got["weights"] == pytest.approx(w * held)
    assert got["gradients"] == pytest.approx(g * trainable)
    assert got["optimizer"] == pytest.approx(o * trainable / dp)
    # with O2 (recipe=fast: NVIDIA's settings) bf16 weights; other engines' LoRA bf16 weights
    fast = compose(["method=lora", *LORA_7B, *extra, "recipe=fast"])
    assert stage_static_bytes(fast, 1, 1, 0, True)["weights"] == pytest.approx(2.0 * held)
    bridge = stage_static_bytes(compose(["method=lora", "engine=bridge", *LORA_7B]), 1, 1, 0, False)
    assert bridge["weights"] == pytest.approx(2.0 * held)


def test_fp8_adds_te_copies_to_the_fp32_parameter():
    # train.precision=fp8 without O2: the fp32 parameter plus Transformer Engine's FP8 copy and transpose (1 + 1)
    r = compose(["method=lora", "train.precision=fp8", *LORA_7B])
    held, linear, _ = stage_params(r, 1, 1, 0)
    assert stage_static_bytes(r, 1, 1, 0, False)["weights"] == pytest.approx(4.0 * held + 2.0 * linear)


def _activations(overrides, recompute="none"):
    r = compose(["model=llama2_13b", "cluster.gpus_per_node=4", "parallelism.tp=2", "parallelism.pp=1", *overrides])
    return estimate_memory(r, 2, 1, 1, True, recompute, False).activations_gb * 1e9, r


@pytest.mark.parametrize("recompute, layers_holding", [("none", None), ("full", 1)])
def test_each_layer_in_flight_holds_te_s_bf16_cast_of_its_fp32_weights(recompute, layers_holding, monkeypatch):
    # Under torch.autocast TE casts the fp32 weight to bf16 and saves the cast for backward ("Cast for native AMP"),
    # a 2-byte copy of every linear weight per layer in flight (PP 1, one micro batch: every layer); with O2 the
    # cast is a no-op. Full recompute: only the layer being recomputed holds one.
    from vdkit.planner import memory

    o1, r = _activations(["method=lora"], recompute)
    _, linear, _ = stage_params(r, 2, 1, 0)
    monkeypatch.setattr(memory, "saved_cast_bytes", lambda *a: 0.0)
    without, _ = _activations(["method=lora"], recompute)
    layers = r.model.num_layers if layers_holding is None else layers_holding
    assert o1 - without == pytest.approx(2.0 * linear / r.model.num_layers * layers)


def test_fp8_saves_no_cast_and_o2_none():
    # FP8 GEMMs read TE's cached FP8 copies and save the parameter itself; O2's bf16 weight needs no cast
    from vdkit.planner.memory import saved_cast_bytes

    assert saved_cast_bytes(compose(["method=lora", "train.precision=fp8", *LORA_7B]), "fp8") == 0.0
    assert saved_cast_bytes(compose(["method=lora", "recipe=fast", *LORA_7B]), "bf16") == 0.0
    assert saved_cast_bytes(compose(["method=lora", *LORA_7B]), "bf16") == 2.0


def test_autocast_saves_a_new_bf16_copy_of_a_frozen_fp32_weight():
    # Measured, on CPU: under torch.autocast(bf16) a linear layer with a frozen fp32 weight saves for backward a bf16
    # cast of it (fp32_params_cast_bytes per weight, a new tensor each forward), not the parameter; with O2's bf16
    # weight it saves the parameter itself. TE's modules make the same cast by hand (memory.yaml cites them).
    import torch

    from vdkit.planner.calibration import memory

    def saved(weight_dtype, autocast):
        lin = torch.nn.Linear(64, 128, bias=False).to(weight_dtype).requires_grad_(False)
        x = torch.randn(4, 64, dtype=weight_dtype, requires_grad=True)
        got = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: got.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                lin(x)
        return [(t.numel() * t.element_size(), t.data_ptr() == lin.weight.data_ptr()) for t in got]

    cast = memory()["fp32_params_cast_bytes"]["nemo"]["bf16"]
    assert saved(torch.float32, True) == [(cast * 64 * 128, False)]  # a copy: bytes beyond the weight
    assert saved(torch.bfloat16, False) == [(2 * 64 * 128, True)]  # the parameter: nothing beyond it
