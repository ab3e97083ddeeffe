"""The fused (Transformer Engine) set's activation bytes with frozen base weights (LoRA, P-tuning), by engine.

Derived from Transformer Engine's source (vdkit.planner.activations' module docstring), not measured: TE does not
run on the CPU. Each expectation is written tensor by tensor (what the trainable layer keeps that the frozen one
does not, less what the LoRA adapter keeps), so a changed term in either place fails here. Before, the fused set
counted every frozen linear as trainable: a PEFT layer cost what an SFT layer does.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vdkit.planner.activations import layer_bytes

S, B, TP, H, F, R = 512, 2, 2, 256, 688, 16


def _model(activation="swiglu"):
    return SimpleNamespace(hidden_size=H, ffn_hidden_size=F, num_attention_heads=8, num_query_groups=2,
                           norm="rmsnorm", activation=activation)


def _saved(peft, engine, sp, fp8, activation="swiglu"):
    """SFT's layer bytes less the PEFT layer's: what frozen weights drop, less what the adapter adds."""
    m = _model(activation)
    kw = dict(fp8=fp8, engine=engine)
    return (layer_bytes(m, S, B, TP, sp, "none", **kw)
            - layer_bytes(m, S, B, TP, sp, "none", peft=peft, lora_dim=R, **kw))


sbh, sbf_t, sbr = S * B * H, S * B * F / TP, S * B * R
CASES = [
    # Bridge (TE 2.12), LoRA on QKV: fc2's input and fc1's norm output go; QKV's norm output stays (the adapter
    # asks for it, the same bf16 tensor) and B keeps A's gathered output
    ("lora", "bridge", False, False, "swiglu", 2 * sbf_t + 2 * sbh - 2 * sbr),
    # ... under SP the adapter keeps the gathered bf16 norm output beside TE's local shard
    ("lora", "bridge", True, False, "swiglu", 2 * sbf_t + 2 * sbh / TP - 2 * sbh - 2 * sbr),
    # ... in FP8: fc2's FP8 input, the projection's FP8 copy and fc1's FP8 norm output go; the adapter's bf16
    # norm output is not TE's FP8 copy
    ("lora", "bridge", False, True, "swiglu", sbf_t + sbh / TP + sbh - 2 * sbh - 2 * sbr),
    # P-tuning: no adapter, both norm outputs go
    ("ptuning", "bridge", False, False, "swiglu", 2 * sbf_t + 2 * 2 * sbh),
    # ReLU's backward reads its own output, the tensor fc2 would have saved
    ("lora", "bridge", False, False, "relu", 2 * sbh - 2 * sbr),
    # NeMo (TE 1.2 / 1.3 save the norm output whatever the weight): fc2's input goes, B keeps A's TP split
    ("lora", "nemo", False, False, "swiglu", 2 * sbf_t - 2 * sbr / TP),
    ("lora", "nemo", True, True, "swiglu", sbf_t + sbh / TP - 2 * sbh / TP - 2 * sbr / TP),
    ("ptuning", "nemo", False, True, "swiglu", sbf_t + sbh / TP),
]


@pytest.mark.parametrize("peft,engine,sp,fp8,activation,want", CASES)
def test_fused_peft_layer_bytes_are_the_frozen_terms(peft, engine, sp, fp8, activation, want):
    assert _saved(peft, engine, sp, fp8, activation) == pytest.approx(want, rel=1e-12)


def test_full_recompute_keeps_the_input_whatever_trains():
    m = _model()
    assert layer_bytes(m, S, B, TP, True, "full", peft="lora", lora_dim=R, engine="bridge") == \
        layer_bytes(m, S, B, TP, True, "full")


def test_lora_plan_activations_are_below_sfts_by_the_frozen_inputs():
    """A LoRA plan (Bridge, TP 2, no SP, bf16, PP 1: every layer in flight once) holds less than SFT's by each
    layer's fc2 input and fc1 norm output, less the adapter's A output."""
    from vdkit.composition.config import compose
    from vdkit.composition.schema import GB
    from vdkit.planner.memory import estimate_memory

    common = ["model=llama2_7b", "engine=bridge", "data=synthetic", "train.seq_length=4096",
              "train.micro_batch_size=1", "train.precision=bf16"]
    lora, sft = compose(common + ["method=lora"]), compose(common + ["method=sft"])
    acts = [estimate_memory(r, 2, 1, 1, False, "none", True).activations_gb for r in (lora, sft)]
    m, s = lora.model, 4096
    per_layer = (2 * s * m.ffn_hidden_size / 2 + 2 * s * m.hidden_size - 2 * s * lora.method.lora_adapter_dim)
    assert (acts[1] - acts[0]) * GB == pytest.approx(m.num_layers * per_layer, rel=1e-9)
