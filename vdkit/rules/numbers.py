"""Numbers at the door: every float field finite, every numeric field in its domain (:data:`DOMAINS`).

One table, so a new field gets its rule in one line; the few rules between two fields (min_lr <= lr,
max_nodes >= min_nodes, the per-GPU overhead below the GPU's memory) follow it in :func:`check_numbers`.
"""
from __future__ import annotations

import math

from vdkit.errors import UserError

INF = math.inf
# key: (low, low inclusive, high, high inclusive, example fix). None values pass (optional fields).
DOMAINS = {
    # 0: a control run that must not learn; above 1 no optimizer the engines run (Adam) trains: a typo (1e30)
    "method.lr": (0, True, 1, True, "method.lr=1e-4"),
    "method.min_lr": (0, True, 1, True, "method.min_lr=0"),
    "method.warmup_steps": (0, True, INF, False, "method.warmup_steps=50"),
    "method.weight_decay": (0, True, INF, False, "method.weight_decay=0.01"),
    "method.lora_adapter_dim": (1, True, INF, False, "method.lora_adapter_dim=32"),
    "method.lora_dropout": (0, True, 1, False, "method.lora_dropout=0.05"),
    "method.ptuning_virtual_tokens": (1, True, INF, False, "method.ptuning_virtual_tokens=10"),
    "method.ptuning_bottleneck_dim": (1, True, INF, False, "method.ptuning_bottleneck_dim=1024"),
    "method.ptuning_embedding_dim": (1, True, INF, False, "method.ptuning_embedding_dim=1024"),
    "model.num_layers": (1, True, INF, False, "model.num_layers=32"),
    "model.hidden_size": (1, True, INF, False, "model.hidden_size=4096"),
    "model.ffn_hidden_size": (1, True, INF, False, "model.ffn_hidden_size=11008"),
    "model.num_attention_heads": (1, True, INF, False, "model.num_attention_heads=32"),
    "model.num_query_groups": (1, True, INF, False, "model.num_query_groups=32"),
    "model.vocab_size": (1, True, INF, False, "model.vocab_size=32000"),
    "model.max_position_embeddings": (1, True, INF, False, "model.max_position_embeddings=4096"),
    "model.norm_eps": (0, False, 1, False, "model.norm_eps=1e-5"),
    "model.rope_base": (0, False, INF, False, "model.rope_base=10000"),
    "model.embedding_dim": (1, True, INF, False, "model.embedding_dim=null"),
    "model.pretrain_tp": (1, True, INF, False, "model.pretrain_tp=null"),
    "model.pretrain_pp": (1, True, INF, False, "model.pretrain_pp=null"),
    "cluster.gpu_memory_gb": (0, False, INF, False, "cluster.gpu_memory_gb=80"),
    "cluster.inter_node_gb_s": (0, False, INF, False, "cluster.inter_node_gb_s=null (from the adapters)"),
    "cluster.memory_overhead_gb": (0, True, INF, False, "cluster.memory_overhead_gb=null (the planner's default)"),
    "cluster.min_nodes": (1, True, INF, False, "cluster.min_nodes=1"),
    "cluster.max_nodes": (1, True, INF, False, "cluster.max_nodes=6"),
    "cluster.nodes": (1, True, INF, False, "cluster.nodes=1"),
    "cluster.time_limit_min": (1, True, INF, False, "cluster.time_limit_min=240"),
    "cluster.max_restarts": (0, True, 1000, True, "cluster.max_restarts=3"),  # restarts without end: a run that never stops
    "engine.log_every_n_steps": (1, True, INF, False, "engine.log_every_n_steps=1"),
    "engine.checkpoint_every_n_steps": (0, True, INF, False, "engine.checkpoint_every_n_steps=0 (no periodic checkpoint)"),
    "train.seed": (0, True, 2 ** 32, False, "train.seed=1234"),  # numpy / torch seeds: [0, 2**32)
}


def _value(recipe, key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(recipe, section), name)


def _fmt_range(lo, lo_in, hi, hi_in) -> str:
    if hi == INF:
        return (f">= {lo:g}" if lo_in else f"> {lo:g}") if lo else ("not negative" if lo_in else "positive")
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def check_numbers(recipe) -> None:
    """Every float finite and every field of :data:`DOMAINS` in its range (one line naming the key)."""
    import dataclasses

    for sec in ("model", "method", "cluster", "data", "engine", "parallelism", "train", "run"):
        section = getattr(recipe, sec)
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                fix = DOMAINS.get(f"{sec}.{f.name}", (None,) * 4 + (f"a finite {sec}.{f.name}",))[4]
                raise UserError(f"{sec}.{f.name}={v} is not a finite number", f"use e.g. {fix}")
    for key, (lo, lo_in, hi, hi_in, fix) in DOMAINS.items():
        v = _value(recipe, key)
        if v is None or isinstance(v, bool):
            continue
        ok = (v >= lo if lo_in else v > lo) and (v <= hi if hi_in else v < hi)
        if not ok:
            raise UserError(f"{key}={v} must be {_fmt_range(lo, lo_in, hi, hi_in)}", f"use e.g. {fix}")
    m, c = recipe.method, recipe.cluster
    if m.min_lr > m.lr:
        raise UserError(f"method.min_lr={m.min_lr:g} is above method.lr={m.lr:g} (the schedule decays from lr "
                        "to min_lr)", "use method.min_lr <= method.lr, e.g. method.min_lr=0")
    if c.max_nodes < c.min_nodes:
        raise UserError(f"cluster.max_nodes={c.max_nodes} is below cluster.min_nodes={c.min_nodes}",
                        "use cluster.max_nodes >= cluster.min_nodes")
    if c.memory_overhead_gb is not None and c.memory_overhead_gb >= c.gpu_memory_gb:
        raise UserError(f"cluster.memory_overhead_gb={c.memory_overhead_gb:g} leaves nothing of the "
                        f"{c.gpu_memory_gb:g} GB GPU (cluster.gpu_memory_gb)",
                        "use a per-device overhead well below the GPU's memory, e.g. cluster.memory_overhead_gb=4")
