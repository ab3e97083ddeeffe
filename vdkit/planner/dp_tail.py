"""The data-parallel reduction's exposed tail: the last gradient bucket, reduced after the backward (issue 35).

On NVIDIA's fused path with the distributed optimizer, megatron-core's DDP (``overlap_grad_reduce``) reduce-scatters
each gradient bucket as soon as the backward has filled it, beside the rest of the backward; vdkit.planner.predict
hides that reduction behind a micro batch's compute. The buckets are cut in reverse parameter order, "to roughly
follow backprop order" (megatron-core 0.16.1 distributed/param_and_grad_buffer.py:712), at ``bucket_size`` parameters
(max(40M, 1M x the DP group's size), distributed_data_parallel.py:64-65; step_time.yaml ``host.drain``). So the last
bucket holds the input embedding and whatever of the first layer's weights the previous cut left - half a bucket on
average - and its grads are ready only when the backward ends: its reduce-scatter (``start_grad_sync`` from
``register_grad_ready``, :539-560) has nothing left to hide behind, and ``finish_grad_sync`` (:507-537) waits for it
before the optimizer step. With ``overlap_param_gather`` the same bucket's updated weights are all-gathered first
in the next forward (``start_param_sync``, :250), before its first layer can run. Priced here: that bucket's
reduce-scatter and all-gather, a ring all-reduce of its gradient bytes at the DP ring's bandwidth and latency (the
same ring the hidden part uses). A PEFT job's trainable weights (adapters) are one bucket when smaller than one:
all of it is the tail. NeMo 1.23's fused path (Apex's DistributedFusedAdam with overlap_grad_sync, NVIDIA's fitted
rows) buckets its gradients in backward order too; its bucket size (Apex's bucket_cap_mb) is taken as megatron-core's
here - an assumption, not read from a run. Nothing is fitted.
"""
from __future__ import annotations

from vdkit.planner.collectives import ring_s


def bucket_params(calib: dict, dp: int) -> float:
    """megatron-core's default gradient bucket, in parameters: max(40M, 1M x DP) (step_time.yaml ``host.drain``)."""
    d = calib["host"]["drain"]
    return max(float(d["bucket_params"]), float(d["bucket_params_per_dp_rank"]) * dp)


def last_bucket_params(embedding_trainable: float, trainable_held: float, bucket_params: float) -> float:
    """Parameters in the DDP's last gradient bucket on this GPU: every trainable one when they fit one bucket, else
    the (trainable) input embedding's share plus half a bucket of the first layer's weights, at most all of them."""
    if trainable_held <= bucket_params:
        return trainable_held
    return min(trainable_held, embedding_trainable + bucket_params / 2.0)


def exposed_tail_s(grad_bytes: float, last_params: float, ranks: int, gb_s: float, latency_s: float) -> float:
    """Seconds a step waits for the last bucket: its reduce-scatter after the backward and its all-gather before the
    next forward (a ring all-reduce of its gradient bytes over the DP x CP group)."""
    return ring_s(grad_bytes * last_params, ranks, gb_s, latency_s)
