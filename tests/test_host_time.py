"""The eager host time in the step-time model (vdkit.planner.host_time, issue 35).

An eager stage costs max(GPU time, host time) per micro batch, the host time being the ops a layer launches x the eager
cost of one (hf_step_time.yaml stack.op_overhead_us). The local layer's op table equals a live count of the layer
megatron-core 0.16.1 runs here (vdkit.recipes.megatron.traffic layer_ops); a plan whose layers are small on the GPU is
host-bound by the hand-computed amount, and not with per-layer CUDA graphs; a large-layer plan hides its host time.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import local_layer_config

from vdkit.composition.config import compose
from vdkit.planner import host_time as H
from vdkit.planner import predict as P

# (seq, micro batch, hidden, heads, query groups, ffn): GQA with 2 groups, plain attention, one group (MQA)
SHAPES = {"gqa": (24, 2, 48, 6, 2, 112), "plain": (16, 1, 64, 4, 4, 96), "mqa": (16, 2, 64, 8, 1, 80)}


def _config(shape, mode):
    return local_layer_config(SHAPES[shape], mode)



@pytest.mark.parametrize("shape,mode,method", [("gqa", "none", "sft"), ("gqa", "selective", "lora"),
                                               ("plain", "full", "sft"), ("mqa", "none", "ptuning"),
                                               ("gqa", "full", "lora")])
def test_the_local_op_table_equals_the_live_count(one_rank, shape, mode, method):
    from vdkit.recipes.megatron.traffic import layer_ops as live

    s, b, h, a, g, _ = SHAPES[shape]
    measured = live(_config(shape, mode), s, b, frozen=method != "sft", lora_dim=8 if method == "lora" else 0)
    r = SimpleNamespace(model=SimpleNamespace(num_attention_heads=a, num_query_groups=g),
                        method=SimpleNamespace(name=method), train=SimpleNamespace(precision="bf16", cuda_graphs="none"))
    fwd, bwd = H.layer_ops(r, 1, 1, mode, 1.0 if mode == "full" else 0.0, P.calibration(), kind="local")
    assert (fwd, bwd) == (measured["forward"], measured["backward"])


# Bridge LoRA on Dolly's unpacked 115-token samples, TP 4: each layer's micro batch is microseconds on the GPU.
SMALL = ("model=llama2_7b", "engine=bridge", "method=lora", "data=dolly", "cluster.nodes=1", "parallelism.tp=4",
         "parallelism.pp=1", "train.precision=bf16")


def test_an_eager_small_layer_plan_is_host_bound_by_the_hand_count():
    calib = P.calibration()
    eager, graphed = (P.predict_step(compose([*SMALL, f"train.cuda_graphs={g}"]), 4, 1) for g in ("none", "layer"))
    # by hand (step_time.yaml host): a BF16 TE layer forward 4 linears x 3 + 8 others + LoRA 3 + TP collectives 2 = 25,
    # backward (frozen base: dgrad only) 4 x 3 + 8 + LoRA 5 + 2 = 27; 32 layers; 10 us an op (hf_step_time.yaml)
    assert calib["host"]["te_linear_forward"]["bf16"] == 3 and calib["host"]["te_other_forward"] == 8
    r = compose(list(SMALL))
    micro = r.train.global_batch_size // (r.train.micro_batch_size * 2)  # DP 2
    host_mb = 32 * (25 + 27) * 10e-6
    assert eager.parts["host_issue_s"] == pytest.approx(micro * host_mb)
    # graphed: 4 ops a layer, hidden behind the GPU's work: its step is the GPU's alone
    assert graphed.parts["host_bound_s"] == 0.0
    # micro x the GPU's stage time (the loop's drains, test_the_loops_host_syncs_..., and the per-step host tail are
    # on top of both)
    gpu = (graphed.total_s - graphed.parts["data_parallel_s"] - graphed.optimizer_s - graphed.parts["drain_s"]
           - graphed.parts["per_step_host_s"])
    assert eager.parts["host_bound_s"] == pytest.approx(micro * host_mb - gpu)
    assert eager.total_s == pytest.approx(graphed.total_s + micro * host_mb - gpu)
    assert eager.parts["drain_s"] == graphed.parts["drain_s"] > 0.0
    assert eager.parts["host_bound_s"] > 0.5 * eager.total_s  # the CPU, not the GPU, sets this step
    note = H.step_note(eager, r)
    assert note and note[0].startswith("host-bound eager: train.cuda_graphs=layer would")
    assert H.step_note(graphed, compose([*SMALL, "train.cuda_graphs=layer"])) == []


def test_a_large_layer_plan_hides_its_host_time():
    # MLPerf's 70B LoRA layout, one 8192-token micro batch over TP 4 x CP 2: ~7 ms of GPU work a layer
    r = compose(["model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=8",
                 "cluster.max_nodes=8", "train.seq_length=8192", "train.precision=fp8", "train.global_batch_size=8",
                 "train.micro_batch_size=1", "parallelism.tp=4", "parallelism.pp=1", "parallelism.cp=2",
                 "parallelism.distributed_optimizer=true"])
    step = P.predict_step(r, 4, 1, distributed_optimizer=True)
    assert 0.0 < step.parts["host_issue_s"] < 0.5 * step.total_s
    assert step.parts["host_bound_s"] == 0.0 and H.step_note(step, r) == []


def test_the_loops_host_syncs_put_the_ops_after_them_in_series():
    # Bridge's loss NaN / Inf checks every micro batch (10 ops after the first read-back) and the DDP's per gradient
    # bucket (3), 10 us an op, on top of max(GPU, host): by hand, LoRA (one bucket) and SFT (one per 40M parameters)
    calib = P.calibration()
    assert (calib["host"]["drain"]["loss"], calib["host"]["drain"]["grad_bucket"]) == (10, 3)
    lora = compose(list(SMALL))
    micro = lora.train.global_batch_size // (lora.train.micro_batch_size * 2)  # TP 4 x DP 2
    step = P.predict_step(lora, 4, 1, distributed_optimizer=True)
    assert step.parts["grad_buckets"] == 1
    assert step.parts["drain_s"] == pytest.approx((micro * 10 + 3) * 10e-6)
    sft = compose([*SMALL[:2], "method=sft", *SMALL[3:]])
    step = P.predict_step(sft, 4, 1, distributed_optimizer=True)
    held = step.parts["drain_s"] / 10e-6 - micro * 10  # 3 x buckets
    assert step.parts["grad_buckets"] > 10 and held == pytest.approx(3 * step.parts["grad_buckets"])
    assert P.predict_step(sft, 4, 1, distributed_optimizer=False).parts["grad_buckets"] == 1  # no overlap: one
    # in the step's total (the per-micro-batch overhead), and only for the engine whose loop has the syncs
    nemo = compose(["engine=nemo", *[o for o in SMALL if not o.startswith("engine=")]])
    assert "drain_s" not in P.predict_step(nemo, 4, 1).parts


def test_the_drains_are_the_engines_loop_not_its_regime(monkeypatch):
    # which read-backs drain a step is the engine's loop (its spec's loop_drains), not its step-time regime: the
    # unfused megatron engine given the loss checks pays them; Bridge (fused) without any pays none
    import dataclasses
    import importlib

    from vdkit.recipes import engines

    def with_drains(name, drains):
        module = importlib.import_module(engines.REGISTRY[name])
        monkeypatch.setattr(module, "SPEC", dataclasses.replace(module.SPEC, loop_drains=drains))

    from vdkit.composition.schema import LOOP_DRAINS

    assert set(LOOP_DRAINS) <= set(P.calibration()["host"]["drain"])  # each drain's ops: step_time.yaml host.drain
    assert engines.get("bridge").spec.loop_drains == ("loss", "grad_bucket")
    assert engines.get("megatron").spec.loop_drains == () == engines.get("nemo").spec.loop_drains
    megatron = compose(["engine=megatron", *[o for o in SMALL if not o.startswith("engine=")]])
    micro = megatron.train.global_batch_size // (megatron.train.micro_batch_size * 2)  # TP 4 x DP 2
    assert "drain_s" not in P.predict_step(megatron, 4, 1).parts
    with_drains("megatron", ("loss",))
    parts = P.predict_step(megatron, 4, 1).parts
    assert parts["drain_s"] == pytest.approx(micro * 10 * 10e-6) and "grad_buckets" not in parts
    with_drains("bridge", ())
    bridge = compose(list(SMALL))
    assert P.regime(bridge) == "fused" and "drain_s" not in P.predict_step(bridge, 4, 1).parts
    with pytest.raises(TypeError, match="loop_drains"):
        dataclasses.replace(engines.get("megatron").spec, loop_drains=("logits",))
