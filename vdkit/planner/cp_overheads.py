"""Context parallelism's own memory traffic per layer and micro batch: the copies, output merges and gradient
accumulation of Transformer Engine 1.x's p2p ring (issue 35).

A CP run's attention is not one kernel per layer but TE's ``AttnFuncWithCPAndKVP2P``: CP steps per layer, each a
kernel on one block of K / V, around which the ring's Python packs, slices, merges and accumulates whole
activations. The kernels are priced by their FLOPs (vdkit.planner.attention_rate) and the hops by
vdkit.planner.collectives.cp_ring_s; what this module adds is the elementwise traffic between them, bytes at the
GPU's HBM rate (memory-bound copies and adds: nothing fitted). Counted from TE 1.10
``transformer_engine/pytorch/attention.py`` (the class at :1302; TE 1.4 and 1.6rc2 have the same code, v1.4 :537 ..
:1011, v1.6rc2 :556 .. :1030), the ``sbhd`` / ``bshd`` path megatron-core takes without packed-sequence cu_seqlens,
BF16 attention, the load-balanced causal split (each rank holds chunks r and 2 CP - 1 - r). Per layer on CP rank
``r``, ``Q`` the bytes of this GPU's queries (its s / CP tokens x heads / TP x head dim, bf16; the output, its
gradient and dQ are the same size) and ``KV`` those of its K and V together:

- forward (``torch.cuda.stream`` alternates two streams, so a step's own copies run under the other stream's
  kernel - the half of Q or of K / V made contiguous (:1630, :1744), the result's zero fill (:1949); only
  what runs in series on one stream is counted): K and V packed into the first send buffer
  (``torch.cat``, :1459: read and written, ``2 KV``); after the loop, on the current stream (:1976), each step's
  output merged into the result (``flash_attn_fwd_out_correction``, :1264, torch.compile'd: reads the step's output and
  the result, writes the result: ``3 Q``, half that for the steps whose query is the second chunk only, i > r);
- backward (one stream, all in series): K and V copied into the send buffer (:2198, ``2 KV``); per step, the
  inputs it slices made contiguous (the second half of Q, O and dO, ``3 Q``, or the first half of K and V, ``KV``;
  none on the diagonal step), the step's dQ copied or added into the layer's (whole or half: 2 or 3 bytes per byte,
  :2627-2655), its dK and dV packed (``torch.cat``, :2690) and copied or added into the dK / dV buffer that travels
  on (:2717-2753). The buffers stay bf16 in 1.x (no fp32 accumulation: that is the FP8 path's).

The ranks meet at every layer's ring, so the slowest rank's bytes count, each pass. Left out: the log-sum-exp
tensors (heads x tokens, 1 / head dim of Q's size), the per-step kernels' own reads and writes (inside their
published rate), the launches (the host's: vdkit.planner.host_time counts CP's per ring step), TE 1.4's sbhd -> bshd
transposes (no copies at one sequence a micro batch), Transformer Engine 2.x's ring (a different code: fp32 outputs
per step, docs/prediction.md) and the FP8 attention path.
"""
from __future__ import annotations

from typing import Tuple

from vdkit.planner.arch import BF16_BYTES as BF16  # TE 1.x's ring buffers, outputs and gradients (BF16 attention)


def rank_bytes(cp: int, rank: int, q: float, kv: float) -> Tuple[float, float]:
    """(forward, backward) HBM bytes one layer's ring moves on CP rank ``rank`` beyond its kernels (the module
    docstring), ``q`` the bytes of its queries and ``kv`` of its K and V together."""
    forward = 2 * kv + sum(3 * q if i <= rank else 1.5 * q for i in range(cp))  # pack K, V; merge each step's output
    backward = 2 * kv  # K, V into the send buffer
    for i in range(cp):
        diagonal = i == cp - 1
        half_kv = not diagonal and i >= cp - rank - 1  # all of Q against the first half of the block's K, V
        backward += 0.0 if diagonal else kv if half_kv else 3 * q  # the sliced inputs made contiguous
        if i > cp - rank - 1:
            backward += 3 * q  # dQ added whole
        elif i == cp - rank - 1:
            backward += 2 * q if rank == cp - 1 else 2.5 * q  # copied whole, or its first half copied, second added
        else:
            backward += 1.5 * q if i > 0 else q  # the second half added, or copied (step 0)
        backward += kv if half_kv else 2 * kv  # dK, dV packed
        if diagonal:
            backward += 2.5 * kv if rank == 0 else 3 * kv  # into the buffer: half added, half copied; or all added
        elif half_kv:
            backward += kv if i == 0 and rank == cp - 1 else 1.5 * kv  # its first half copied or added
        else:
            backward += 3 * kv if i > 0 else 2 * kv  # added whole, or copied (step 0)
    return forward, backward


def applies(recipe, cp: int) -> bool:
    """Whether ``recipe``'s job runs the ring counted here: CP > 1 on Transformer Engine 1.x layers, BF16 attention."""
    from vdkit.planner.activations import attention_precision
    from vdkit.planner.attention_rate import te_version
    from vdkit.planner.memory import layer_kernels

    if cp <= 1 or layer_kernels(recipe) != "fused" or attention_precision(recipe) != "bf16":
        return False
    version = te_version(recipe)
    return version is not None and version.split(".")[0] == "1"


def layer_bytes(recipe, tokens: float, tp: int, cp: int) -> Tuple[float, float]:
    """(forward, backward) bytes of one layer's ring on its slowest rank, each pass; (0, 0) where it does not run
    (:func:`applies`). ``tokens``: the micro batch's tokens (the whole sequence, before CP splits it)."""
    if not applies(recipe, cp):
        return 0.0, 0.0
    m = recipe.model
    head = m.hidden_size // m.num_attention_heads
    per_rank = tokens / cp
    q = BF16 * per_rank * m.num_attention_heads / tp * head
    kv = 2 * BF16 * per_rank * max(1.0, m.num_query_groups / tp) * head  # K and V (a KV head TP shares is replicated)
    ranks = [rank_bytes(cp, r, q, kv) for r in range(cp)]
    return max(f for f, _ in ranks), max(b for _, b in ranks)


def micro_s(recipe, tokens: float, tp: int, cp: int, layers: int, share: float, hbm_bytes_s: float) -> float:
    """Seconds per micro batch and stage of ``layers`` layers' ring traffic at ``hbm_bytes_s`` (a recomputed forward,
    ``share`` of the layers, runs its forward again)."""
    forward, backward = layer_bytes(recipe, tokens, tp, cp)
    return layers * ((1.0 + share) * forward + backward) / hbm_bytes_s
