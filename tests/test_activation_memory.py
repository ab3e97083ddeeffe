"""The planner's activation bytes per layer equal what megatron-core saves for backward, counted live.

A 3-layer tiny Llama (GQA, SwiGLU, RMSNorm) block of megatron-core's local spec on CPU, one forward under
torch's saved-tensor hooks (vdkit.recipes.megatron.activations), against
vdkit.planner.activations.layer_bytes(kernels="local", fp32) for every recompute mode the planner uses
(none, selective, full, partial = full on the first N layers), MBS 1 and 2, and ReLU / GeLU MLPs with
LayerNorm. Layer 0 also holds the block's shared RoPE table, so layers 1.. are compared. Tensor and
sequence parallelism run as two gloo ranks (slow: a second process imports megatron).
"""
from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from vdkit.planner.activations import layer_bytes  # noqa: E402

TOL = 0.05  # the bar; the counts agree to the byte today
SEQ, H, F, HEADS, GROUPS = 64, 64, 160, 8, 2


def _model(norm="rmsnorm", activation="swiglu"):
    return SimpleNamespace(hidden_size=H, ffn_hidden_size=F, num_attention_heads=HEADS, num_query_groups=GROUPS,
                           norm=norm, activation=activation)


def _config(tp, sp, mode, num_layers_recomputed=None, norm="rmsnorm", activation="swiglu", bf16=False):
    import torch
    import torch.nn.functional as fn
    from megatron.core.transformer.transformer_config import TransformerConfig

    from vdkit.planner import recompute

    keys = recompute.mcore(SimpleNamespace(recompute=mode, recompute_num_layers=num_layers_recomputed))
    return TransformerConfig(
        num_layers=3, hidden_size=H, ffn_hidden_size=F, num_attention_heads=HEADS, num_query_groups=GROUPS,
        normalization="RMSNorm" if norm == "rmsnorm" else "LayerNorm", gated_linear_unit=activation == "swiglu",
        activation_func={"swiglu": fn.silu, "relu": fn.relu, "gelu": fn.gelu}[activation], add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp, sequence_parallel=sp,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, bf16=bf16, use_cpu_initialization=True, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, **{k: v for k, v in keys.items() if v is not None})


def _measure(tp, sp, mode, mbs, frozen=False, **kw):
    from vdkit.recipes.megatron.activations import block_bytes

    return block_bytes(_config(tp, sp, mode, **kw), SEQ, mbs, frozen)


def _check(got, mode, mbs, tp=1, sp=False, model=None, recomputed=0, peft=""):
    """Layers 1.. (layer 0 also holds the shared RoPE table): the formula within TOL."""
    model = model or _model()
    for i, measured in enumerate(got[1:], start=1):
        want = layer_bytes(model, SEQ, mbs, tp, sp, "full" if i < recomputed else mode, "local", 4.0, peft)
        assert abs(measured - want) <= TOL * want, (mode, mbs, tp, sp, i, measured, want)



@pytest.mark.parametrize("mode,mbs", [("none", 1), ("none", 2), ("selective", 1), ("selective", 2), ("full", 2)])
def test_each_recompute_mode_per_layer(one_rank, mode, mbs):
    _check(_measure(1, False, mode, mbs), mode, mbs)


def test_megatron_engine_plan_counts_the_local_spec_it_builds(one_rank):
    """engine=megatron builds megatron-core's local layer spec on GPUs too (recipes/megatron/model.py, its spec's
    layer_kernels): its bf16 plan's activations per layer are what that block saves in bf16, measured here with
    saved-tensor hooks (the same torch code paths as on a GPU: torch's composite RMSNorm, megatron-core's torch softmax).
    Before, the plan counted Transformer Engine's fused set (flash attention: no s^2 softmax)."""
    from vdkit.composition.config import compose
    from vdkit.composition.schema import GB
    from vdkit.planner.memory import estimate_memory

    r = compose(["engine=megatron", "model=tiny_llama", "method=sft", "data=synthetic", "model.num_layers=3",
                 f"model.hidden_size={H}", f"model.ffn_hidden_size={F}", f"model.num_attention_heads={HEADS}",
                 f"model.num_query_groups={GROUPS}", f"train.seq_length={SEQ}", "train.micro_batch_size=1"])
    acts = estimate_memory(r, 1, 1, 1, False, "none", False, "bf16").activations_gb * GB
    planned = (acts - 6.0 * SEQ * r.model.vocab_size) / 3  # PP 1: each layer once, plus the logits
    from vdkit.recipes.megatron.activations import block_bytes

    measured = block_bytes(_config(1, False, "none", bf16=True), SEQ, 1)
    for got in measured[1:]:  # layer 0 also holds the shared RoPE table
        assert got == pytest.approx(planned, rel=1e-9), (got, planned)
    # bf16's own terms: torch's RMSNorm keeps fp32 tensors, the softmax its fp32 output and the bf16 cast; frozen too
    frozen = block_bytes(_config(1, False, "none", bf16=True), SEQ, 1, frozen=True)
    for got in frozen[1:]:
        assert got == layer_bytes(_model(), SEQ, 1, 1, False, "none", "local", 2.0, "ptuning")


def test_cpu_plan_counts_the_fp32_the_cpu_runs(one_rank):
    """On a CPU cluster (cluster=local, gpu_type cpu) the megatron engine trains in fp32 (recipes/megatron/train.py:
    fp32 parameters, memory.json's "planned" in fp32): the plan's weights, gradients and optimizer states are fp32's
    and its activations per layer what the fp32 block saves, measured here. Before, the plan counted bf16 (2-byte
    activations, 2-byte weights) on the CPU."""
    from vdkit.composition.config import compose
    from vdkit.planner.memory import estimate_memory, stage_static_bytes

    r = compose(["engine=megatron", "model=tiny_llama", "method=sft", "data=synthetic", "cluster=local",
                 "model.num_layers=3", f"model.hidden_size={H}", f"model.ffn_hidden_size={F}",
                 f"model.num_attention_heads={HEADS}", f"model.num_query_groups={GROUPS}", f"train.seq_length={SEQ}",
                 "train.micro_batch_size=1"])
    mem = estimate_memory(r, 1, 1, 1, False, "none", False)
    fp32 = stage_static_bytes(r, 1, 1, 0, False, "fp32")
    assert mem.weights_gb * 1e9 == pytest.approx(fp32["weights"])
    assert mem.optimizer_gb * 1e9 == pytest.approx(fp32["optimizer"])
    planned = (mem.activations_gb * 1e9 - 4.0 * SEQ * r.model.vocab_size) / 3  # the fp32 logits: one buffer
    for got in _measure(1, False, "none", 1)[1:]:  # the fp32 block (layer 0 also holds the RoPE table)
        assert got == pytest.approx(planned, rel=1e-9), (got, planned)


def test_partial_recompute_counts_each_layer(one_rank):
    # recompute_num_layers=2 (block): layers 0 and 1 keep their input, layer 2 everything
    got = _measure(1, False, "full", 1, num_layers_recomputed=2)
    _check(got, "none", 1, recomputed=2)
    assert got[2] > 10 * got[1]


@pytest.mark.parametrize("mode", ["none", "selective"])
def test_frozen_weights_keep_no_linear_inputs(one_rank, mode):
    # P-tuning's base model: every weight frozen (LoRA's adapter case runs in tests/test_megatron_engine.py)
    _check(_measure(1, False, mode, 1, frozen=True), mode, 1, peft="ptuning")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_plain_mlp_layernorm(one_rank, activation):
    got = _measure(1, False, "none", 1, norm="layernorm", activation=activation)
    _check(got, "none", 1, model=_model("layernorm", activation))


def _two_ranks(rank, port, out):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from vdkit.recipes.common import mcore_cpu

    mcore_cpu.apply()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ps.initialize_model_parallel(2, 1)
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1)
    for mode, sp, mbs in [("none", True, 1), ("none", False, 2), ("selective", True, 2), ("full", True, 1)]:
        got = _measure(2, sp, mode, mbs)
        if rank == 0:
            out.put((mode, sp, mbs, got))
    # the same ranks count a bf16 layer's HBM traffic (vdkit.planner.local_traffic's TP / SP shapes; its TP 1 check:
    # tests/test_local_traffic.py), so that no second pair of processes has to import megatron-core
    import dataclasses

    from vdkit.recipes.megatron.traffic import layer_traffic

    for mode, sp in TRAFFIC_CASES:
        cfg = dataclasses.replace(_config(2, sp, mode, bf16=True), num_layers=1)
        got = sum(layer_traffic(cfg, SEQ, 2).values())
        if rank == 0:
            out.put((mode, sp, got))
    dist.destroy_process_group()


TRAFFIC_CASES = [("none", False), ("selective", True)]


@pytest.mark.slow  # two processes importing megatron-core: ~60 s on 2 cores
def test_tensor_and_sequence_parallel():
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_two_ranks, args=(port, out), nprocs=2, start_method="spawn")
    for _ in range(4):
        mode, sp, mbs, got = out.get(timeout=5)
        _check(got, mode, mbs, tp=2, sp=sp)
    from vdkit.planner.local_traffic import layer_traffic

    for _ in TRAFFIC_CASES:  # megatron-core's collectives are the communication term's, not counted
        mode, sp, got = out.get(timeout=5)
        want = layer_traffic(_model(), SEQ, 2, 2, sp, mode)  # selective: autograd's gradient copies may be skipped
        assert want.total - want.autograd_copies <= got <= want.total, (mode, sp, got, want)


def test_partial_recompute_with_interleaving_counts_n_layers_per_model_chunk(one_rank):
    """megatron-core's block method with VP > 1: each model chunk is its own TransformerBlock and recomputes its
    first N layers (measured: 8 layers, PP 2 x VP 2 -> 2-layer chunks, N = 1: layer 0 of every chunk keeps its
    input, layer 1 everything), so a stage recomputes VP x N of its layers; the planner counted N of the stage's
    (a quarter here, not half) and never offered partial recompute with VP > 1."""
    import dataclasses

    import torch

    from vdkit.planner.memory import recompute_share

    cfg = dataclasses.replace(_config(1, False, "full", num_layers_recomputed=1), num_layers=8,
                              pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                              pipeline_dtype=torch.float32)
    from vdkit.recipes.megatron.activations import block_bytes

    for chunk in (0, 1):
        got = block_bytes(cfg, SEQ, 1, vp_stage=chunk)
        rope = SEQ * (H // HEADS) * 4  # the chunk's RoPE table rides on its first checkpoint
        assert len(got) == 2
        assert got[0] - rope == layer_bytes(_model(), SEQ, 1, 1, False, "full", "local", 4.0)
        assert got[1] == layer_bytes(_model(), SEQ, 1, 1, False, "none", "local", 4.0)
    recipe = SimpleNamespace(parallelism=SimpleNamespace(recompute_num_layers=1))
    assert recompute_share(recipe, "full", layers_per_stage=4, vp=2) == 0.5  # 1 of each 2-layer chunk


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_fp8_linears_keep_fp8_copies_of_their_inputs(activation):
    """Transformer Engine's FP8 linears save the FP8 (1-byte) copy of their input, not the bf16 one (derived from
    TE's module/linear.py and layernorm_linear.py, not measured: the CPU has no TE): per layer the two norm outputs
    and fc2's input cost half, and the output projection adds an FP8 copy beside flash attention's bf16 output.
    Before, an FP8 plan counted every saved linear input at 2 bytes."""
    from vdkit.planner.memory import estimate_memory
    from vdkit.composition.config import compose

    s, b, tp, h, f = 4096, 1, 2, 4096, 11008
    m = SimpleNamespace(hidden_size=h, ffn_hidden_size=f, num_attention_heads=32, num_query_groups=8,
                        norm="rmsnorm", activation=activation)
    for sp, n in ((False, 1.0), (True, 1 / tp)):
        bf16 = layer_bytes(m, s, b, tp, sp, "none")
        fp8 = layer_bytes(m, s, b, tp, sp, "none", fp8=True)
        assert bf16 - fp8 == 2 * s * b * h * n + s * b * f / tp - s * b * h / tp
        assert layer_bytes(m, s, b, tp, sp, "full", fp8=True) == layer_bytes(m, s, b, tp, sp, "full")  # bf16 input
    r = compose(["model=llama2_7b", "engine=bridge", "method=pretrain", "data=synthetic", "train.seq_length=4096"])
    acts = {p: estimate_memory(r, 2, 1, 1, True, "none", True, p).activations_gb for p in ("bf16", "fp8")}
    assert acts["fp8"] < acts["bf16"]


def test_layers_in_flight_are_megatron_cores_1f1b_warmup():
    """The memory model's in-flight micro batches per stage against megatron-core 0.16.1's own schedule
    (get_pp_rank_microbatches: warm-up forwards, then one more before the first backward; at most all)."""
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    from vdkit.planner.memory import layers_in_flight

    for pp, vp, microbatches in [(4, 1, 2), (4, 1, 32), (2, 2, 2), (4, 2, 4), (4, 5, 8), (4, 20, 32), (8, 4, 8)]:
        layers = 80 // pp
        for rank in (0, pp - 1):
            comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
                                   virtual_pipeline_model_parallel_size=vp if vp > 1 else None)
            total, all_warmup, warmup, _ = get_pp_rank_microbatches(microbatches, vp, pp, p2p_communicator=comm)
            chunks = total if all_warmup else warmup + 1
            assert layers_in_flight(layers, pp, vp, microbatches, rank) == chunks * layers / vp, (pp, vp, rank)


def _lora_block_bytes(targets, mode, rank=8):
    """The frozen block with megatron engine's LoRA adapters (recipes/megatron/model.py LoraLinear) on ``targets``."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from vdkit.recipes.common.mcore_cpu import local_block_spec
    from vdkit.recipes.megatron.activations import saved_bytes_per_layer
    from vdkit.recipes.megatron.model import BASE_SPLIT, _adapter_classes

    config = _config(1, False, mode)
    block = TransformerBlock(config, local_block_spec(config), post_layer_norm=False)
    for p in block.parameters():
        p.requires_grad_(False)
    lora = _adapter_classes()[0]
    for layer in block.layers:
        for parent in (layer.self_attention, layer.mlp):
            for name in targets:
                if getattr(parent, name, None) is not None:
                    setattr(parent, name, lora(getattr(parent, name), BASE_SPLIT[name], rank, config, 0.0))
    rope = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0)(SEQ)
    x = torch.randn(SEQ, 1, H, dtype=config.params_dtype, requires_grad=True)
    return saved_bytes_per_layer(block.layers, list(block.parameters()),
                                 lambda: block(x, attention_mask=None, rotary_pos_emb=rope))


@pytest.mark.parametrize("targets,mode", [
    (("linear_qkv", "linear_proj"), "none"), (("linear_qkv", "linear_proj"), "selective"),
    (("linear_fc1",), "none"), (("linear_fc2",), "none"),
    (("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"), "none")])
def test_lora_targets_adapters_keep_what_the_plan_counts(one_rank, targets, mode):
    # method.lora_targets: each adapter beyond QKV's keeps its input where the frozen base does not, and A's output
    got = _lora_block_bytes(targets, mode)
    for measured in got[1:]:
        want = layer_bytes(_model(), SEQ, 1, 1, False, mode, "local", 4.0, "lora", 8, lora_targets=targets)
        assert abs(measured - want) <= TOL * want, (targets, mode, measured, want)
