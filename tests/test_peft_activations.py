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


_ADAPTER_PROBE = r"""
import json, sys
from vdkit.recipes.bridge import cpu_shim
cpu_shim.apply()
import torch
from megatron.core import ModelParallelConfig
from megatron.bridge.peft.utils import ParallelLinearAdapter
from vdkit.recipes.common.mcore_cpu import single_rank_model_parallel

single_rank_model_parallel()
s, b, h, r, out = (int(v) for v in sys.argv[1:])
# as megatron/bridge/peft/lora.py builds it for linear_qkv (identity activation, no norm, column-parallel B)
adapter = ParallelLinearAdapter(h, out, r, base_linear_name="decoder.layers.0.self_attention.linear_qkv",
                                activation="identity", norm_type=None, gather_output=False, input_is_parallel=False,
                                dropout=0.0, alpha=r, disable_sequence_parallel_comm=True,
                                model_parallel_config=ModelParallelConfig(use_cpu_initialization=True))
norm_out = torch.randn(s, b, h, requires_grad=True)  # what TE's LayerNormLinear returns with return_layernorm_output
params = {p.untyped_storage().data_ptr() for p in adapter.parameters()}
saved = {}
def pack(t):
    if t.untyped_storage().data_ptr() not in params:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    adapter(norm_out)
mine = norm_out.untyped_storage().data_ptr()
print(json.dumps({"input": saved.pop(mine, 0), "other": sum(saved.values())}))
"""


def test_bridges_lora_adapter_keeps_what_the_plan_counts():
    """Measured, not derived: Megatron-Bridge 0.3.1's ParallelLinearAdapter (megatron-core linears, so it runs on
    the CPU; TE's own layers do not), one forward under torch's saved-tensor hooks, fp32, TP 1. It keeps the norm
    output it is handed (the very tensor TE keeps for a LoRA-wrapped QKV: no new bytes) and A's output; the
    plan's LoRA layer holds exactly that beyond a P-tuning layer (QKV's norm output and A's output, rank r)."""
    import json
    import subprocess
    import sys

    s, b, h, r = 64, 2, 32, 4
    out = subprocess.run([sys.executable, "-c", _ADAPTER_PROBE, str(s), str(b), str(h), str(r), str(3 * h)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"input": s * b * h * 4, "other": s * b * r * 4}
    m = SimpleNamespace(hidden_size=h, ffn_hidden_size=88, num_attention_heads=4, num_query_groups=4,
                        norm="rmsnorm", activation="swiglu")
    planned = [layer_bytes(m, s, b, 1, False, "none", element=4.0, peft=p, lora_dim=r, engine="bridge")
               for p in ("lora", "ptuning")]
    assert planned[0] - planned[1] == got["input"] + got["other"]
