"""The LoRA adapter's own HBM traffic per layer and micro batch (vdkit.planner.lora_traffic), and its place in the
step (vdkit.planner.predict)."""
from types import SimpleNamespace

import pytest

from vdkit.composition.config import compose
from vdkit.planner import lora_traffic as L
from vdkit.planner import predict as P


def _lora(method="lora", dropout=0.0, qkv="fused", sp=True, targets=("linear_qkv",), a2a=False):
    # Llama 2 70B's attention: hidden 8192, 64 heads of 128, 8 KV groups (K / V 1024 columns each)
    model = SimpleNamespace(hidden_size=8192, num_attention_heads=64, num_query_groups=8, ffn_hidden_size=28672)
    return SimpleNamespace(model=model, method=SimpleNamespace(name=method, lora_dropout=dropout, lora_targets=targets,
                                                               lora_adapter_dim=16, lora_a2a=a2a),
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
    monkeypatch.setattr(L, "layer_s", lambda *a, **k: 0.0)
    without = P.predict_step(r, 4, 1, 1, "none", True)
    assert step.total_s - without.total_s == pytest.approx(expected, rel=1e-6)


# The output projection's adapter (method.lora_targets): row-parallel, its input this GPU's [t, h / TP] (2048 of 8192
# columns), B's output gathered whole [t, h] and split back to x = t / TP under SP (Bridge's ParallelLinearAdapter)
PROJ_FWD = 2 * (4096 * 2048 + 4096 * 8192 + 5 * 1024 * 8192)  # input read, gathered output, scale + add on [x, h]
PROJ_BWD = 2 * (2 * 1024 * 8192 + 4096 * 8192 + 2 * 4096 * 8192 / 4 + 5 * 4096 * 2048)


def test_the_projections_adapter_bytes_hand_counted():
    both = _lora(targets=("linear_qkv", "linear_proj"))
    assert L.layer_bytes(both, 4096, 4) == FWD + BWD + PROJ_FWD + PROJ_BWD
    assert L.layer_bytes(_lora(targets=("linear_proj",)), 4096, 4) == PROJ_FWD + PROJ_BWD
    # all-to-all (method.lora_a2a): B's output stays split, the all-to-all writes [x, h], not the gathered [t, h]
    a2a = L.layer_bytes(_lora(targets=("linear_proj",), a2a=True), 4096, 4)
    assert a2a == PROJ_FWD + PROJ_BWD - 2 * 2 * (4096 - 1024) * 8192


def test_a_row_parallel_adapters_tp_collectives():
    # 4096 tokens at TP 4 over 400 GB/s with 10 us each: A's rank-16 output all-reduced forward and its input gradient
    # backward; B's [t, h] output gathered forward and (SP) its gradient gathered backward
    ring = 3 / 4 / 400e9
    reduce, gather = 2 * ring * 2 * 4096 * 16 + 1e-5, ring * 2 * 4096 * 8192 + 1e-5
    proj = _lora(targets=("linear_qkv", "linear_proj"))
    assert L.row_collective_s(proj, 4096, 4, 400, 1e-5) == pytest.approx(2 * reduce + 2 * gather, rel=1e-12)
    assert L.row_collective_s(proj, 4096, 4, 400, 1e-5, 1.0) == pytest.approx(3 * reduce + 3 * gather, rel=1e-12)
    a2a = ring * 2 * 4096 * 8192 / 4 + 1e-5  # each GPU's [t, h / TP] by all-to-all: 1 / TP of the gather
    assert L.row_collective_s(_lora(targets=("linear_proj",), a2a=True), 4096, 4, 400, 1e-5) == pytest.approx(
        2 * reduce + 2 * a2a, rel=1e-12)
    assert L.row_collective_s(_lora(), 4096, 4, 400, 1e-5) == 0.0  # QKV's adapter: TE's collectives (tp_overlap)
    assert L.row_collective_s(proj, 4096, 1, 400, 1e-5) == 0.0


def test_the_adapters_time_is_their_bytes_or_their_flops_whichever_is_longer():
    r = _lora(targets=("linear_qkv", "linear_proj"))
    flops = 4096 / 4 * 6 * 16 * (8192 + 10240 + 8192 + 8192)  # forward, input and weight gradients, 1 / TP
    assert L.layer_s(r, 4096, 4, 0.0, 3.35e12, 1e15) == L.layer_bytes(r, 4096, 4) / 3.35e12  # rank 16: bytes
    assert L.layer_s(r, 4096, 4, 0.0, 3.35e12, 1e6) == pytest.approx(flops / 1e6, rel=1e-12)


def test_an_fp8_jobs_adapters_run_at_the_bf16_peak():
    """Bridge's ParallelLinearAdapter builds megatron-core's own Column/RowParallelLinear (peft/utils.py 26, 482-520):
    torch GEMMs that Transformer Engine's FP8 autocast leaves in bf16, so an FP8 job's adapter FLOPs run at the BF16
    peak. At rank 4096 (above either ridge) the FLOPs set the adapters' time: the same in FP8 as in BF16."""
    base = ["model=llama2_70b", "engine=bridge", "method=lora", "method.lora_adapter_dim=4096", "cluster.nodes=1",
            "train.seq_length=4096", "train.global_batch_size=8", "parallelism.tp=4", "parallelism.pp=1"]
    bf16, fp8 = (P.predict_step(compose([*base, f"train.precision={p}"]), 4, 1, 1, "none", True) for p in ("bf16", "fp8"))
    r = compose([*base, "train.precision=fp8"])
    hw = P.gpu_hardware(P.calibration(), r.cluster.gpu_type)
    flops_bound = L.layer_s(r, 4096, 4, 0.0, 1e30, float(hw["peak_tflops_bf16"]) * 1e12)  # HBM free: FLOPs alone
    assert flops_bound > L.layer_bytes(r, 4096, 4) / 3.35e12  # the FLOPs are what sets it at this rank
    assert fp8.parts["lora_traffic_s"] == pytest.approx(bf16.parts["lora_traffic_s"], rel=1e-9)
