"""Activation recompute as each stack is told it, and what share of layers it recomputes.

``parallelism.recompute``: ``none``; ``selective`` (megatron-core / NeMo recompute the attention core:
softmax and its dropout, the activations that grow with seq^2); ``full`` (each layer keeps only its input
and reruns its forward in backward). ``parallelism.recompute_num_layers=N`` with ``full`` is partial
recompute: megatron-core's ``recompute_method=block`` (NeMo's ``activations_checkpoint_method=block``)
recomputes the first N layers of each (virtual) pipeline stage and keeps the others' activations
(megatron/core/transformer/transformer_block.py ``_checkpointed_forward``: its loop runs over the block's own
layers, and with VP > 1 each model chunk is its own ``TransformerBlock`` of layers / (PP x VP) layers, so a GPU
recomputes VP x N of its layers). Without N every layer recomputes (``uniform``, one layer per checkpoint).
"""
from __future__ import annotations


def full_share(p, layers_per_stage: int, vp: int = 1) -> float:
    """The share of a stage's layers that full recompute reruns (1.0 without recompute_num_layers): the first N
    of each of its ``vp`` model chunks (module docstring)."""
    if (p.recompute or "none") != "full":
        return 0.0
    n = p.recompute_num_layers
    chunk = layers_per_stage // max(1, vp)
    return 1.0 if not n or chunk <= 0 else min(n, chunk) / chunk


def mcore(p) -> dict:
    """megatron-core TransformerConfig keys (engine=megatron; Bridge's provider takes the same)."""
    mode = p.recompute or "none"
    if mode == "none":
        return {"recompute_granularity": None}
    if mode == "selective":
        return {"recompute_granularity": "selective"}
    if p.recompute_num_layers:
        return {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": p.recompute_num_layers}
    return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def nemo(p) -> dict:
    """NeMo 1.x model keys (activations_checkpoint_*)."""
    keys = mcore(p)
    return {"activations_checkpoint_granularity": keys["recompute_granularity"],
            "activations_checkpoint_method": keys.get("recompute_method"),
            "activations_checkpoint_num_layers": keys.get("recompute_num_layers")}
