"""Activation recompute as each stack is told it, and what share of layers it recomputes.

``parallelism.recompute``: ``none``; ``selective`` (megatron-core / NeMo recompute the attention core:
softmax and its dropout, the activations that grow with seq^2); ``full`` (each layer keeps only its input
and reruns its forward in backward). ``parallelism.recompute_num_layers=N`` with ``full`` is partial
recompute: megatron-core's ``recompute_method=block`` (NeMo's ``activations_checkpoint_method=block``)
recomputes the first N layers of each (virtual) pipeline stage and keeps the others' activations
(megatron/core/transformer/transformer_block.py ``_checkpointed_forward``). Without N every layer
recomputes (``uniform``, one layer per checkpoint).
"""
from __future__ import annotations


def full_share(p, layers_per_stage: int) -> float:
    """The share of a stage's layers that full recompute reruns (1.0 without recompute_num_layers)."""
    if (p.recompute or "none") != "full":
        return 0.0
    n = p.recompute_num_layers
    return 1.0 if not n or layers_per_stage <= 0 else min(n, layers_per_stage) / layers_per_stage


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
