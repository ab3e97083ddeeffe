"""The data-parallel gradient reduction's share of a step (vdkit.planner.predict's DP terms, issue 35).

The trainable parameters' gradients are reduced once per step, after the backward, in the gradient buffer's dtype as
the engine renders it (the memory model's gradient bytes, one home: fp32 main gradients, 4; NeMo's Apex
grad_sync_dtype bf16 with train.optimizer_dtype=bf16, 2), over the data-parallel x context-parallel group (as
megatron-core does). Across nodes NCCL runs one ring per channel, each crossing between nodes on its own adapter, so
all the node's adapters carry the reduction at once: its bus bandwidth is the node's fabric bandwidth, capped by
NVLink (nccl-tests across nodes report busbw ~ adapters x the per-adapter rate, e.g. ~95 GB/s on 4 NICs,
NVIDIA/nccl-tests#252) - not one adapter's share per GPU.

NVIDIA's fused path with the distributed optimizer overlaps that reduction with compute (NeMo 1.23's
reduce_overlap_gradients: "the grad sync is overlapped with the final backward pass", conf/nvidia/llama2_pretrain.yaml;
Bridge's ddp overlap_grad_reduce / overlap_param_gather, recipes/bridge/config.py): each gradient bucket is
reduce-scattered as the last micro batch's backward fills it: only what outlasts that compute is exposed (the window:
its FLOPs at the efficiencies the compute runs at) ... but the last bucket (the embedding's) reduces after the
backward: exposed (vdkit.planner.dp_tail).
"""
from __future__ import annotations

from typing import NamedTuple

from vdkit.planner import dp_tail
from vdkit.planner.collectives import ring_s
from vdkit.planner.memory import grad_optimizer_bytes


class Reduction(NamedTuple):
    """One step's DP reduction, in seconds: the whole ring (``ring_s``), the compute window it may hide behind
    (``window_flops_s`` / ``window_attn_s``: FLOPs at 100 % of peak, 0 when not overlapped), what outlasts that
    window (``exposed_s``) and the last bucket's exposed tail (``tail_s``)."""
    ring_s: float
    window_flops_s: float
    window_attn_s: float
    exposed_s: float
    tail_s: float


def reduction(recipe, dp: int, cp: int, trainable_held: float, embedding_trainable: float,
              distributed_optimizer: bool, overlapped: bool, nvlink: float, latency: float, fab,
              window: tuple, calib: dict) -> Reduction:
    """The DP reduction of ``trainable_held`` parameters on this GPU over DP x CP ranks: NVLink (``nvlink`` GB/s,
    ``latency`` s) inside a node, the fabric ``fab`` (vdkit.planner.interconnect) across nodes; ``overlapped``: the
    fused path with the distributed optimizer, hiding the ring behind ``window`` = (flops_s, attn_flops_s, eff,
    attn_eff) of the last micro batch's compute and exposing the last bucket (``embedding_trainable``: the input
    embedding's trainable parameters on this GPU)."""
    link, lat = ((nvlink, latency) if recipe.world_size <= recipe.cluster.gpus_per_node
                 else (min(nvlink, fab.node_gb_s), fab.latency_us * 1e-6))
    grad_bytes = grad_optimizer_bytes(recipe, distributed_optimizer)[0]
    whole = ring_s(grad_bytes * trainable_held, dp * cp, link, lat)
    flops_mb, attn_mb, eff, attn_eff = window
    window_flops, window_attn = (flops_mb, attn_mb) if overlapped else (0.0, 0.0)
    exposed = max(0.0, whole - window_flops / eff - window_attn / attn_eff)
    last = dp_tail.last_bucket_params(embedding_trainable, trainable_held, dp_tail.bucket_params(calib, dp))
    tail = dp_tail.exposed_tail_s(grad_bytes, last, dp * cp, link, lat) * overlapped
    return Reduction(whole, window_flops, window_attn, exposed, tail)
