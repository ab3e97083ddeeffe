"""The LoRA adapter's own HBM traffic per layer and micro batch (vdkit.planner.lora_traffic), and its place in the
step (vdkit.planner.predict)."""
from types import SimpleNamespace

import pytest

from vdkit.composition.config import compose
from vdkit.planner import lora_traffic as L
from vdkit.planner import predict as P


def _lora(method="lora", dropout=0.0, qkv="fused", sp=True):
    # Llama 2 70B's attention: hidden 8192, 64 heads of 128, 8 KV groups (K / V 1024 columns each)
    model = SimpleNamespace(hidden_size=8192, num_attention_heads=64, num_query_groups=8)
    return SimpleNamespace(model=model, method=SimpleNamespace(name=method, lora_dropout=dropout),
                           engine=SimpleNamespace(lora_qkv=qkv), parallelism=SimpleNamespace(sequence_parallel=sp))


# 70B at TP 4, CP 2 (4096 tokens a GPU), SP: t 4096, x 1024, h 8192, QKV's columns o = (8192 + 2 x 1024) / 4 = 2560
FWD = 2 * (4096 * 8192 + 6 * 4096 * 2560)  # linear_in reads the input; linear_out, the scale and the add: 12 t o
BWD = 2 * (4 * 4096 * 2560 + 2 * 4096 * 8192 + 3 * 1024 * 8192)  # 8 t o + 4 t h + 6 x h (the input gradients summed)


def test_a_layers_adapter_bytes_hand_counted():
    assert FWD == 192_937_984 and BWD == 268_435_456
    assert L.layer_bytes(_lora(), 4096, 4) == FWD + BWD
    # a fully recomputed layer runs the adapter's forward again
    assert L.layer_bytes(_lora(), 4096, 4, recompute_share=1.0) == 2 * FWD + BWD


def test_dropout_reads_and_writes_the_input_and_its_mask_both_ways():
    # torch.nn.Dropout on the 1024 x 8192 input before the gather: (2 + 2 + 1) B forward and backward
    assert L.layer_bytes(_lora(dropout=0.1), 4096, 4) - L.layer_bytes(_lora(), 4096, 4) == 10 * 1024 * 8192


def test_without_sequence_parallelism_the_input_gradients_sum_over_the_whole_sequence():
    # x = t: the gradients' sum reads two and writes one over 4096 tokens, not 1024
    assert L.layer_bytes(_lora(sp=False), 4096, 4) - L.layer_bytes(_lora(), 4096, 4) == 2 * 3 * (4096 - 1024) * 8192
    # unset (the plan's auto): on at TP > 1, as the plan resolves it; never at TP 1
    assert L.layer_bytes(_lora(sp=None), 4096, 4) == L.layer_bytes(_lora(), 4096, 4)
    assert L.layer_bytes(_lora(sp=None), 4096, 1) == L.layer_bytes(_lora(sp=False), 4096, 1)


def test_separate_q_k_v_adapters_each_read_the_input():
    # a = 3: linear_in reads the input 3 times forward, its gradients 3 x (2 t h) backward, 3 gradients added
    a3 = 2 * (3 * 4096 * 8192 + 6 * 4096 * 2560) + 2 * (4 * 4096 * 2560 + 6 * 4096 * 8192 + 9 * 1024 * 8192)
    assert L.layer_bytes(_lora(qkv="separate"), 4096, 4) == a3


def test_only_lora_has_an_adapter():
    assert L.layer_bytes(_lora(method="sft"), 4096, 4) == 0.0
    assert L.layer_bytes(_lora(method="ptuning"), 4096, 4) == 0.0


def test_the_step_pays_each_layers_adapter_bytes_at_hbm_bandwidth(monkeypatch):
    """Dell's 2-node MLPerf row (70B LoRA, TP 4 CP 2, 4 micro batches): the step with the adapters' traffic less the
    step without it is micro x layers x the bytes / HBM's 3.35 TB/s, on the slowest GPU (straggler)."""
    r = compose(["engine.transformer_engine=1.10.0", "model=llama2_70b", "engine=bridge", "method=lora",
                 "data=synthetic", "cluster.nodes=2", "train.seq_length=8192", "train.precision=fp8",
                 "train.global_batch_size=8", "train.micro_batch_size=1", "parallelism.tp=4", "parallelism.pp=1",
                 "parallelism.cp=2"])  # sequence parallelism unset: the plan's auto, on at TP 4
    step = P.predict_step(r, 4, 1, 1, "none", True)
    expected = 4 * step.parts["straggler"] * 80 * (FWD + BWD) / 3.35e12  # ~0.054 s a step
    assert step.parts["lora_traffic_s"] == pytest.approx(expected, rel=1e-9)
    monkeypatch.setattr(L, "layer_bytes", lambda *a, **k: 0.0)
    without = P.predict_step(r, 4, 1, 1, "none", True)
    assert step.total_s - without.total_s == pytest.approx(expected, rel=1e-6)
