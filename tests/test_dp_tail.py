"""The data-parallel reduction's exposed tail: the last gradient bucket, reduced after the backward (issue 35;
vdkit/planner/dp_tail.py, docs/prediction.md "GEMM shape is not what the 8B TP 2 row misses")."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner import dp_tail, predict as P
from vdkit.planner.arch import param_counts
from vdkit.planner.collectives import ring_s
from vdkit.planner.memory import grad_optimizer_bytes

CISCO_TP2 = ["model=llama3_1_8b", "engine=bridge", "method=pretrain", "data=synthetic", "cluster.nodes=16",
             "cluster.max_nodes=16", "train.seq_length=8192", "train.precision=fp8", "train.global_batch_size=64",
             "train.micro_batch_size=1", "parallelism.tp=2", "parallelism.pp=1"]


def test_the_last_bucket_is_the_embedding_and_half_a_bucket_or_every_trainable_weight_that_fits_one():
    assert dp_tail.last_bucket_params(0.0, 30e6, 40e6) == 30e6  # LoRA's adapters: one bucket, all of it the tail
    assert dp_tail.last_bucket_params(262e6, 4e9, 64e6) == 262e6 + 32e6
    assert dp_tail.last_bucket_params(262e6, 280e6, 64e6) == 280e6  # never more than the GPU holds
    calib = P.calibration()
    assert dp_tail.bucket_params(calib, 8) == 40e6 and dp_tail.bucket_params(calib, 64) == 64e6  # max(40M, 1M x DP)


def test_the_fused_step_waits_for_the_embeddings_bucket_after_the_backward():
    """Cisco's Llama 3.1 8B at TP 2 on 16 nodes: DP 64, the vocabulary-parallel embedding's half (128256 x 4096 / 2)
    plus half a 64M-parameter bucket, its fp32 gradients reduce-scattered and all-gathered over the DP ring after the
    backward - in the communication term, on top of the reduction the backward hides."""
    r = compose(CISCO_TP2)
    s = P.predict_step(r, 2, 1, 1, "none", True)
    calib = P.calibration()
    from vdkit.planner.interconnect import interconnect

    fab = interconnect(r.cluster)
    nvlink = float(P.gpu_hardware(calib, r.cluster.gpu_type)["nvlink_gb_s"])
    last = param_counts(r.model).embedding / 2 + 64e6 / 2
    want = ring_s(grad_optimizer_bytes(r, True)[0] * last, 64, min(nvlink, fab.node_gb_s), fab.latency_us * 1e-6)
    assert s.parts["data_parallel_tail_s"] == pytest.approx(want, rel=1e-9) and want > 0.005
    assert s.communication_s == pytest.approx(s.parts["tensor_parallel_s"] + s.parts["data_parallel_s"] + want,
                                              rel=1e-9)


def test_no_tail_where_the_reduction_is_not_overlapped():
    """Without the distributed optimizer (no overlap_grad_reduce in the render) the whole reduction is already counted
    after the backward; the design guide's unfused NeMo path overlaps nothing either."""
    r = compose(CISCO_TP2)
    assert P.predict_step(r, 2, 1, 1, "none", False).parts["data_parallel_tail_s"] == 0.0
    guide = compose(["model=llama2_7b", "method=sft", "cluster.nodes=2"])
    assert P.predict_step(guide, 1, 1, 1, "none", True).parts["data_parallel_tail_s"] == 0.0
