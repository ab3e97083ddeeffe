"""The bytes each transformer layer of a megatron-core model saves for backward, counted live.

torch's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``) see every tensor autograd
keeps for the backward pass, including those a custom ``autograd.Function`` (megatron's tensor-parallel
linears, its recompute ``CheckpointFunction``) saves. Each is counted once by storage (a view of a
tensor already kept costs nothing more) and charged to the layer whose forward saved it; a tensor saved
between layers (full recompute's checkpoint keeps the layer's input after the layer ran) goes to the
layer last entered. Parameters are weights, not activations, and are not counted.

The planner's formula (:func:`vdkit.planner.memory.activation_bytes_per_layer`) is checked against
these counts (tests/test_activation_memory.py), and the megatron engine's memory.json reports them
beside the plan.
"""
from __future__ import annotations

from typing import Callable, List, Sequence


def saved_bytes_per_layer(layers: Sequence, params: Sequence, forward: Callable[[], object]) -> List[int]:
    """Run ``forward()`` and return the bytes each module of ``layers`` saves for backward, one count per
    layer in order. ``params``: the model's parameters (their storages are weights, excluded)."""
    import torch

    excluded = {p.untyped_storage().data_ptr() for p in params}
    seen: set = set()
    totals = [0] * len(layers)
    current = {"layer": None}

    def enter(index):
        def hook(_module, _args):
            current["layer"] = index
        return hook

    def pack(t):
        idx = current["layer"]
        if idx is not None and isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            key = st.data_ptr()
            if key not in excluded and key not in seen and st.nbytes():
                seen.add(key)
                totals[idx] += st.nbytes()
        return t

    handles = [layer.register_forward_pre_hook(enter(i)) for i, layer in enumerate(layers)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward()
    finally:
        for h in handles:
            h.remove()
    del out
    return totals


def block_bytes(config, seq: int, micro_batch: int) -> List[int]:
    """Bytes each layer of a megatron-core ``TransformerBlock`` (local spec, no final norm) built from
    ``config`` saves in one forward of ``micro_batch`` sequences of ``seq`` tokens on this rank.

    Model parallel state must be initialised (TP = ``config.tensor_model_parallel_size``). The first
    layer also carries the block's shared RoPE table (``s x d`` elements), saved once for all layers."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from vdkit.recipes.mcore_cpu import local_block_spec

    block = TransformerBlock(config, local_block_spec(config), post_layer_norm=False)
    rope = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0)(seq)
    local = seq // config.tensor_model_parallel_size if config.sequence_parallel else seq
    x = torch.randn(local, micro_batch, config.hidden_size, dtype=config.params_dtype, requires_grad=True)
    return saved_bytes_per_layer(block.layers, list(block.parameters()),
                                 lambda: block(x, attention_mask=None, rotary_pos_emb=rope))
