"""The bytes each transformer layer of a megatron-core model saves for backward, counted live.

torch's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``) see every tensor autograd
keeps for the backward pass, including those a custom ``autograd.Function`` (megatron's tensor-parallel
linears, its recompute ``CheckpointFunction``) saves. Each is counted once by storage (a view of a
tensor already kept costs nothing more) and charged to the layer whose forward saved it; a tensor saved
between layers (full recompute's checkpoint keeps the layer's input after the layer ran) goes to the
layer last entered. Parameters are weights, not activations, and are not counted.

The planner's formula (:func:`vdkit.planner.activations.layer_bytes`) is checked against
these counts (tests/test_activation_memory.py), and the megatron engine's memory.json reports them
beside the plan.
"""
from __future__ import annotations

from typing import Callable, List, Sequence


def saved_bytes_per_layer(layers: Sequence, params: Sequence, forward: Callable[[], object],
                          not_layers: Sequence = ()) -> List[int]:
    """Run ``forward()`` and return the bytes each module of ``layers`` saves for backward, one count per
    layer in order. ``params``: the model's parameters (their storages are weights, excluded);
    ``not_layers``: modules after the layers whose saves are no layer's (the block's final norm)."""
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
    handles += [module.register_forward_pre_hook(enter(None)) for module in not_layers]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward()
    finally:
        for h in handles:
            h.remove()
    del out
    return totals


def block_bytes(config, seq: int, micro_batch: int, frozen: bool = False, vp_stage=None) -> List[int]:
    """Bytes each layer of a megatron-core ``TransformerBlock`` (local spec, no final norm) built from
    ``config`` saves in one forward of ``micro_batch`` sequences of ``seq`` tokens on this rank.

    ``frozen``: every weight frozen. ``vp_stage``: the model chunk to build when ``config`` is interleaved (its
    ``virtual_pipeline_model_parallel_size``): megatron-core then builds layers / (PP x VP) layers. Model parallel state must be initialised (TP = ``config.tensor_model_parallel_size``). The first
    layer also carries the block's shared RoPE table (``s x d`` elements), saved once for all layers."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from vdkit.recipes.common.mcore_cpu import local_block_spec

    block = TransformerBlock(config, local_block_spec(config), post_layer_norm=False, vp_stage=vp_stage)
    for p in block.parameters() if frozen else ():  # P-tuning's frozen base model
        p.requires_grad_(False)
    rope = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0)(seq)
    local = seq // config.tensor_model_parallel_size if config.sequence_parallel else seq
    x = torch.randn(local, micro_batch, config.hidden_size, dtype=config.params_dtype, requires_grad=True)
    return saved_bytes_per_layer(block.layers, list(block.parameters()),
                                 lambda: block(x, attention_mask=None, rotary_pos_emb=rope))


def chunk_report(chunks, plan, cuda: bool) -> dict:
    """This rank's activation bytes per layer, measured (one forward of one micro batch of random hidden
    states through each chunk's decoder, under the hooks) and planned
    (:func:`vdkit.planner.activations.layer_bytes`, local kernels): ``{"measured": [...], "planned": [...]}``,
    one entry per layer of every chunk in order (the final norm's saves are left out; under full recompute
    the first layer's checkpoint also keeps the chunk's RoPE table, ``s x d`` elements shared by all)."""
    import torch

    from vdkit.planner.activations import layer_bytes
    from vdkit.planner import lora_targets
    from vdkit.planner.memory import activation_bytes

    r = plan.recipe
    p, t, m = r.parallelism, r.train, r.model
    tp = p.tp
    sp = bool(p.sequence_parallel) and tp > 1
    seq = (t.seq_length + (r.method.ptuning_virtual_tokens if r.method.name == "ptuning" else 0)) // p.cp
    measured, planned = [], []
    for chunk in chunks:
        gpt = getattr(chunk, "module", chunk)
        block = gpt.decoder
        rope = gpt.rotary_pos_emb(seq) if getattr(gpt, "rotary_pos_emb", None) is not None else None
        x = torch.randn(seq // tp if sp else seq, t.micro_batch_size, m.hidden_size,
                        dtype=block.config.params_dtype, device="cuda" if cuda else "cpu", requires_grad=True)
        if not block.pre_process:  # later pipeline stages read their input from here, not the argument
            block.set_input_tensor(x)
        with torch.random.fork_rng(devices=[]):  # the training RNG stream is not touched
            final = [block.final_layernorm] if getattr(block, "final_layernorm", None) is not None else []
            measured += saved_bytes_per_layer(block.layers, list(block.parameters()),
                                              lambda: block(x, attention_mask=None, rotary_pos_emb=rope), final)
        recomputed = len(block.layers) if p.recompute == "full" and not p.recompute_num_layers else \
            (p.recompute_num_layers or 0) if p.recompute == "full" else 0
        peft = r.method.name if r.method.name in ("lora", "ptuning") else ""
        rest = "none" if p.recompute == "full" else (p.recompute or "none")  # partial: the others keep all
        planned += [layer_bytes(m, seq, t.micro_batch_size, tp, sp,
                                "full" if i < recomputed else rest, "local", activation_bytes("bf16" if cuda else "fp32"),
                                peft, r.method.lora_adapter_dim, lora_targets=lora_targets.of(r))
                    for i in range(len(block.layers))]
        if recomputed and rope is not None:  # the first checkpoint also saves the chunk's RoPE table
            planned[len(planned) - len(block.layers)] += rope.numel() * rope.element_size()
    return {"measured": measured, "planned": [int(round(b)) for b in planned]}
