"""The step's collective and synchronisation terms (vdkit.planner.predict's communication): a ring all-reduce, context
parallelism's K / V ring, and the straggler that every synchronous step waits for."""
from __future__ import annotations


def ring_s(bytes_per_gpu: float, ranks: int, gb_s: float, latency_s: float) -> float:
    """A ring all-reduce of ``bytes_per_gpu`` over ``ranks`` GPUs at ``gb_s`` GB/s per GPU."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * bytes_per_gpu / (gb_s * 1e9) + 2 * (ranks - 1) * latency_s


def straggler(gpus: int, hw: dict) -> float:
    """How much slower the slowest of ``gpus`` identical GPUs runs than the average one: 1 + the spread of
    their speeds (``gpu_speed_cv``, step_time.yaml with its source) x the expected maximum of ``gpus`` standard
    normal draws (Blom's approximation of the order statistic, exact to ~1 % of it). A synchronous step
    ends when its slowest GPU does: 1.014 on 8 GPUs, 1.024 on 64, 1.032 on 1024 at a 1 % spread."""
    from statistics import NormalDist

    if gpus <= 1:
        return 1.0
    return 1.0 + float(hw["gpu_speed_cv"]) * NormalDist().inv_cdf((gpus - 0.375) / (gpus + 0.25))


def cp_ring_s(r, n: float, tp: int, cp: int, layers: int, share: float, nvlink: float, ib_per_gpu: float,
               latency: float, elem_bytes: float) -> float:
    """Context parallelism's ring per micro batch and stage (Transformer Engine's p2p attention): each layer
    passes its K and V chunk (this GPU's s / CP tokens, its KV heads / TP) round the CP ring, CP - 1 hops
    forward and again with their gradients backward (2x: K, V and dK, dV); a recomputed forward repeats
    its hops. Counted whole: the kit does not assume the hops hide behind the chunk's attention. CP groups
    sit next to TP in megatron-core's rank order: NVLink while TP x CP fits a node, else the fabric."""
    if cp <= 1:
        return 0.0
    m = r.model
    kv_dim = m.num_query_groups * (m.hidden_size // m.num_attention_heads)
    chunk = 2 * n / cp * kv_dim / tp * elem_bytes  # K and V of this GPU's share
    link = nvlink if tp * cp <= r.cluster.gpus_per_node else ib_per_gpu
    hop = chunk / (link * 1e9) + latency
    return layers * (cp - 1) * (1 + 2 + share) * hop
