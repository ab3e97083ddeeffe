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
              latency: float, elem_bytes: float, step_fwd_s: float = 0.0, step_bwd_s: float = 0.0) -> float:
    """Context parallelism's K / V ring per micro batch and stage, as exposed (Transformer Engine's p2p attention,
    AttnFuncWithCPAndKVP2P: the same structure in TE 1.4 .. 2.12; docs/prediction.md "Attention's own rate, per
    stack, and the CP ring as exposed").

    Each layer's attention runs CP steps, one chunk's kernel each (``step_fwd_s`` forward, ``step_bwd_s`` backward).
    The send / receive of the next step's block is posted before a step's kernel and waited for after it, so a hop
    costs only what outlasts that kernel, plus its latency:
    - forward: CP - 1 hops of this GPU's K and V chunk (its s / CP tokens, its KV heads / TP), under steps 0 .. CP - 2;
      a recomputed forward (``share``) repeats them;
    - backward: K, V alone under step 0, K, V with dK, dV under the middle steps, dK, dV alone under the last.
    Rank order tp-cp-ep-dp-pp (megatron-core 0.16.1 parallel_state.py): a CP group's ranks sit TP apart, so its ring
    stays on NVLink while TP x CP fits a node; beyond, every ring step waits on a hop across the fabric (the steps are
    synchronous: the slowest pair sets each one). With no kernel time given the ring is counted whole."""
    if cp <= 1:
        return 0.0
    m = r.model
    kv_dim = m.num_query_groups * (m.hidden_size // m.num_attention_heads)
    chunk = 2 * n / cp * kv_dim / tp * elem_bytes  # K and V of this GPU's share
    link = nvlink if tp * cp <= r.cluster.gpus_per_node else ib_per_gpu
    hop = chunk / (link * 1e9)
    forward = (cp - 1) * (max(0.0, hop - step_fwd_s) + latency)
    backward = sum(max(0.0, blocks * hop - step_bwd_s) + latency
                   for blocks in [1] + [2] * (cp - 2) + [1])  # KV | KV + dKV ... | dKV
    return layers * ((1 + share) * forward + backward)
