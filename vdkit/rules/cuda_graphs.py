"""train.cuda_graphs=layer beside what megatron-core 0.16.1 refuses with per-layer CUDA graphs, refused at the door.

An engine that renders the setting (its spec's ``cuda_graphs``, the door in :func:`vdkit.recipes.spec.refusal`)
renders megatron-core's ``cuda_graph_impl=transformer_engine`` over whole layers
(:mod:`vdkit.recipes.bridge.cuda_graphs` says why). Each rule here is one megatron-core refuses on every rank at start-up or at the first replay
(paths under site-packages/megatron/core):

- full recompute (``parallelism.recompute=full``, or ``recompute_num_layers``): transformer/transformer_config.py
  :1780-1784 allows it only with a full-iteration graph, which the transformer_engine path refuses (:1738-1742);
  the planner never picks full recompute for such a recipe (vdkit.planner.plan);
- packed fine-tuning sequences (``data.packed``): a layer's graph takes tensors only, and its replay asserts
  ``packed_seq_params is None`` (transformer/transformer_layer.py:1020-1026);
- a cluster without GPUs (``cluster.gpu_type=cpu``): there is no CUDA graph to capture.

Selective recompute is allowed: :1786-1826 refuses it only with nonzero attention / hidden dropout, and the Llama
providers the kit renders set both to 0 (megatron/bridge/models/llama/llama_provider.py:41-42).
"""
from __future__ import annotations

from vdkit.errors import UserError

EAGER = "train.cuda_graphs=none (eager)"


def check_cuda_graphs(recipe) -> None:
    """Refuse train.cuda_graphs=layer with full recompute, packed sequences or no GPU (the module docstring)."""
    if recipe.train.cuda_graphs != "layer":
        return
    p = recipe.parallelism
    if p.recompute == "full" or p.recompute_num_layers is not None:
        raise UserError("train.cuda_graphs=layer with full recompute: megatron-core 0.16.1 runs full recompute only "
                        "inside a full-iteration graph, which per-layer graphs are not (transformer_config.py:1780-1784)",
                        f"use parallelism.recompute=selective or none (or leave it unset), or {EAGER}")
    if recipe.data.packed:
        raise UserError("train.cuda_graphs=layer with data.packed=true: a layer's CUDA graph takes tensors only and "
                        "megatron-core refuses packed sequences' packed_seq_params at replay (transformer_layer.py:1020-1026)",
                        f"use data.packed=false (rows padded to train.seq_length), or {EAGER}")
    from vdkit.composition.schema import CPU_GPU_TYPE

    if recipe.cluster.gpu_type == CPU_GPU_TYPE:
        raise UserError(f"train.cuda_graphs=layer on cluster {recipe.cluster.name} (no GPUs): CUDA graphs are "
                        "captured on a GPU", f"use {EAGER} here, or a GPU cluster")
