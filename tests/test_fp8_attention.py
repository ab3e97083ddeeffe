"""train.fp8_attention: what an FP8 job's dot-product attention runs in, priced and rendered.

Transformer Engine's FP8 recipes cover the linears; attention runs FP8 only with megatron-core's
``fp8_dot_product_attention`` (TE's fp8_dpa). So an FP8 plan prices its s^2 attention FLOPs at the BF16 peak x
the BF16 efficiency unless the recipe asks for FP8 attention, which the bridge engine renders as Bridge's
MixedPrecisionConfig field (a model-level value would be reset by the preset: vdkit.recipes.bridge.config).
"""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner import predict as P
from vdkit.planner.plan import make_plan

FP8 = ["model=llama2_7b", "engine=bridge", "method=pretrain", "data=synthetic", "cluster.nodes=1",
       "train.seq_length=8192", "train.precision=fp8", "train.global_batch_size=32", "parallelism.tp=1",
       "parallelism.pp=2"]


def _compute_s(overrides) -> P.StepTime:
    return P.predict_step(compose(overrides), 1, 2)


def test_fp8_plan_prices_attention_at_the_bf16_peak():
    """An FP8 plan's compute is its GEMM FLOPs at the FP8 peak x FP8 efficiency plus its attention kernels' FLOPs at
    the BF16 peak x its stack's published kernel rate (vdkit.planner.attention_rate); with FP8 attention, the
    attention at FP8 too (the GEMM rule: no FP8 backward rate is published)."""
    r = compose(FP8)
    hw, k = P.gpu_hardware(P.calibration(), r.cluster.gpu_type), P.fitted()
    step = _compute_s(FP8)
    micro = step.parts["multiplier"] - 1  # PP 2: one bubble stage on top of the micro batches
    per_gpu = step.parts["straggler"] * P.tokens_per_sample(r) / 2  # MBS 1, PP 2
    gemm = P.flops_per_token(r) - P.attention_flops_per_token(r)
    attn = P.attention_kernel_flops_per_token(r)
    assert 0 < attn < gemm
    fp8 = float(hw["peak_tflops_fp8"]) * 1e12 * k["gemm_efficiency_fp8"]
    assert 0 < step.parts["attn_eff"] != k["gemm_efficiency_bf16"]
    bf16 = float(hw["peak_tflops_bf16"]) * 1e12 * step.parts["attn_eff"]
    assert step.compute_s == pytest.approx(micro * per_gpu * (gemm / fp8 + attn / bf16))
    on = _compute_s(FP8 + ["train.fp8_attention=true"])
    assert on.parts["attn_eff"] == 0.0  # the GEMM rule
    assert on.compute_s == pytest.approx(micro * per_gpu * (gemm + attn) / fp8)
    assert on.compute_s < step.compute_s


def test_bf16_plan_is_priced_as_before():
    """At BF16 the GEMMs run at the BF16 peak x efficiency and the attention at its stack's kernel rate."""
    bf16 = [o for o in FP8 if o != "train.precision=fp8"]
    r = compose(bf16)
    step = P.predict_step(r, 1, 2)
    assert P.attention_precision(r) == "bf16"
    hw, k = P.gpu_hardware(P.calibration(), r.cluster.gpu_type), P.fitted()
    micro = step.parts["multiplier"] - 1
    assert step.compute_s == pytest.approx(micro * (step.parts["flops_s"] / (k["gemm_efficiency_bf16"] * float(
        hw["gemm_scale"])) + step.parts["attn_flops_s"] / step.parts["attn_eff"]))


def test_bridge_renders_fp8_attention_in_mixed_precision_only_when_asked():
    from vdkit.recipes.bridge import env
    from vdkit.recipes.bridge.config import FP8_ATTENTION, FP8_ATTENTION_ENV, PRECISION, bridge_config

    cell = FP8 + ["parallelism.distributed_optimizer=true"]
    on, off = (make_plan(compose(cell + [f"train.fp8_attention={v}"])) for v in ("true", "false"))
    mp_on = bridge_config(on, "/runs/r", "/runs/r/checkpoints")["mixed_precision"]
    assert mp_on[FP8_ATTENTION] is True and FP8_ATTENTION not in bridge_config(on, "/r", "/c")["model"]
    assert bridge_config(off, "/runs/r", "/runs/r/checkpoints")["mixed_precision"] == PRECISION["fp8"]
    assert FP8_ATTENTION_ENV.items() <= env(on).items()
    assert not set(FP8_ATTENTION_ENV) & set(env(off))


def test_rendered_mixed_precision_is_bridges_fp8_preset_plus_fp8_attention():
    """The mapping the render writes, instantiated by Bridge's own loader, is Bridge's FP8 preset (the one the kit
    names for train.precision=fp8) with fp8_dot_product_attention on - and its setup puts it on the model."""
    import dataclasses

    from omegaconf import OmegaConf

    from vdkit.recipes.bridge.config import FP8_ATTENTION, PRECISION, _mixed_precision
    from vdkit.recipes.bridge.runcheck import _import_bridge

    _import_bridge()
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from megatron.bridge.utils.instantiate_utils import instantiate

    rendered = instantiate(OmegaConf.create(_mixed_precision(compose(FP8 + ["train.fp8_attention=true"]).train)))
    preset = get_mixed_precision_config(PRECISION["fp8"])
    assert dataclasses.replace(preset, **{FP8_ATTENTION: True}) == rendered

    class Model:  # the fields setup() copies (update_config_with_precision_overrides: those the target has)
        fp8 = None
        fp8_dot_product_attention = False

    model = Model()
    rendered.finalize()
    rendered.setup(model)
    assert model.fp8 == "hybrid" and model.fp8_dot_product_attention is True


def test_fp8_attention_saves_qkv_and_output_in_fp8():
    """The fused set's layer with FP8 attention keeps Q, K, V and the output at 1 byte (Transformer Engine 2.12's
    FusedAttnFunc saves their FP8 copies) and two fp32 softmax statistics instead of one log-sum-exp; selective
    recompute keeps the checkpoint's bf16 inputs either way; a plan counts it only where FP8 attention is asked."""
    from vdkit.planner.activations import FP8_ATTENTION_BYTES, layer_bytes

    m = compose(["model=llama2_70b"]).model
    s, b, tp = 8192, 1, 4
    kv = m.num_query_groups * m.hidden_size // m.num_attention_heads
    for peft in ("", "lora"):
        kw = dict(fp8=True, peft=peft, lora_dim=16, engine="bridge")
        bf16, fp8 = (layer_bytes(m, s, b, tp, True, "none", fp8_attention=on, **kw) for on in (False, True))
        qkvo = (2 * s * b * m.hidden_size + 2 * s * b * kv) / tp
        assert bf16 - fp8 == pytest.approx(qkvo * (2 - FP8_ATTENTION_BYTES) - 4 * b * m.num_attention_heads / tp * s)
        assert layer_bytes(m, s, b, tp, True, "selective", fp8_attention=True, **kw) == \
            layer_bytes(m, s, b, tp, True, "selective", **kw)
    row = FP8 + ["parallelism.recompute=none", "parallelism.distributed_optimizer=true"]
    off, on = (make_plan(compose(row + [f"train.fp8_attention={v}"])) for v in ("false", "true"))
    assert on.memory.activations_gb < off.memory.activations_gb
