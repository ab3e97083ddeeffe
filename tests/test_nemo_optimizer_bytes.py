"""NeMo 1.23's Apex distributed Adam with fp32 state on a bf16 model keeps 16-bit master remainders (10 bytes per
trainable parameter, conf/calibration/memory.yaml ``fp32_distributed_optimizer_bytes``), and the step-time model's
data-parallel reduction moves the gradient buffer's bytes as the engine renders it (vdkit.planner.memory
grad_optimizer_bytes: one home for both models)."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner.layout import data_parallel
from vdkit.planner.memory import stage_params, stage_static_bytes
from vdkit.planner.predict import predict_step

SFT_7B = ["model=llama2_7b", "method=sft", "cluster.nodes=2", "parallelism.tp=2", "parallelism.pp=1"]


@pytest.mark.parametrize("engine, precision, distributed, optim_bytes", [
    ("nemo", "bf16", True, 10.0),  # store_param_remainders: int16 remainder + fp32 m + v
    ("nemo", "fp8", True, 10.0),   # model.fp8 without fp8_params: the model's dtype is still bf16
    ("nemo", "bf16", False, 12.0),  # fused_adam: MainParamsOptimizerWrapper's fp32 master
    ("megatron", "bf16", True, 12.0),  # megatron-core's fp32 master shard
    ("bridge", "bf16", True, 12.0),
])
def test_fp32_optimizer_state_bytes(engine, precision, distributed, optim_bytes):
    r = compose([*SFT_7B, f"engine={engine}", f"train.precision={precision}",
                 f"parallelism.distributed_optimizer={str(distributed).lower()}"])
    _, _, trainable = stage_params(r, 2, 1, 0)
    got = stage_static_bytes(r, 2, 1, 0, distributed)
    shards = data_parallel(r, 2, 1) if distributed else 1
    assert got["optimizer"] == pytest.approx(optim_bytes * trainable / shards)
    assert got["gradients"] == pytest.approx(4.0 * trainable)


def _dp_s(engine: str, optimizer_dtype: str) -> float:
    r = compose([*SFT_7B, f"engine={engine}", "parallelism.distributed_optimizer=true",
                 f"train.optimizer_dtype={optimizer_dtype}"])
    return predict_step(r, 2, 1, distributed_optimizer=True).parts["dp_s"]


def test_dp_reduction_moves_the_rendered_gradient_bytes():
    # NeMo with train.optimizer_dtype=bf16 renders grad_sync_dtype bf16: half the bytes of the fp32 reduction (the
    # ring's per-step latency, the same in both, aside); Bridge's presets keep grad_reduce_in_fp32: unchanged.
    fp32, bf16 = _dp_s("nemo", "fp32"), _dp_s("nemo", "bf16")
    assert 0 < bf16 < fp32
    latency = 2 * bf16 - fp32  # ring time = bytes x a + latency: 4a + l and 2a + l
    assert 0 <= latency < 0.1 * bf16
    assert _dp_s("bridge", "bf16") == pytest.approx(_dp_s("bridge", "fp32"))


@pytest.mark.parametrize("overrides", [
    ["method=sft"], ["method=sft", "train.precision=fp8"], ["recipe=fast", "method=lora"]])
def test_the_10_bytes_follow_what_nemo_yaml_gives_megatron_base_model(overrides, tmp_path):
    # NeMo 1.23 takes store_param_remainders when: distributed_fused_adam, megatron_amp_O2 with a bf16 autocast
    # dtype, optim.dtype fp32 (its default when unset) and no fp8_params (megatron_base_model.py:735-751)
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.nemo.config import build_config

    plan = make_plan(compose(["model=llama2_7b", *overrides]))
    model = build_config(plan, tmp_path)["model"]
    assert model["optim"]["name"] == "distributed_fused_adam" and "dtype" not in model["optim"]
    assert model["megatron_amp_O2"] is True and not model.get("fp8_params")
    p = plan.recipe.parallelism
    _, _, trainable = stage_params(plan.recipe, plan.tp, plan.pp, 0)
    got = stage_static_bytes(plan.recipe, plan.tp, plan.pp, 0, bool(p.distributed_optimizer))["optimizer"]
    assert got == pytest.approx(10.0 * trainable / (plan.dp * p.cp))


@pytest.mark.parametrize("engine, optimizer_dtype, pass_bytes", [
    ("megatron", "fp32", 34.0),  # fp32 master, m, v (12) and the fp32 gradient (4) read and written, bf16 weight written
    ("nemo", "fp32", 30.0),      # Apex's 16-bit remainders: 10 bytes of state
    ("nemo", "bf16", 14.0),      # Apex dtype / grad_sync_dtype bf16: m, v (4) and a bf16 gradient (2)
    ("bridge", "bf16", 26.0),    # the precision-aware optimizer: fp32 master, bf16 m and v (8), fp32 gradient (4)
])
def test_optimizer_pass_moves_the_bytes_the_memory_model_keeps(engine, optimizer_dtype, pass_bytes):
    # one home: the step-time model's optimizer pass reads the memory model's per-engine bytes (before: 34 for all);
    # the same model and layout hold the same trainable parameters, so the passes' times are in their bytes' ratio
    from vdkit.planner.memory import optimizer_pass_bytes

    def step(engine, optimizer_dtype):
        r = compose([*SFT_7B, f"engine={engine}", "parallelism.distributed_optimizer=true",
                     f"train.optimizer_dtype={optimizer_dtype}"])
        return r, predict_step(r, 2, 1, distributed_optimizer=True).optimizer_s

    r, got = step(engine, optimizer_dtype)
    assert optimizer_pass_bytes(r, True) == pass_bytes
    assert got / step("megatron", "fp32")[1] == pytest.approx(pass_bytes / 34.0, rel=1e-9)
