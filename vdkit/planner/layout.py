"""The parallelism rules of Megatron / NeMo layouts: which TP x PP (x CP, x VP) a recipe allows, each rule named.

Rules only (no memory, no search): the planner (:mod:`vdkit.planner.plan`) searches among
:func:`valid_layouts`, and an engine that runs data parallel only names the rule that kept a plan
from plain data parallelism (:func:`layout_violations`).
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

from vdkit.composition.schema import Recipe


def layout_violations(r: Recipe, tp: int, pp: int, vp: int) -> List[str]:
    """Every parallelism rule the layout breaks, each named (empty: the layout is valid)."""
    m, c, t = r.model, r.cluster, r.train
    out = []
    if m.num_attention_heads % tp or m.num_query_groups % tp:
        out.append(f"TP must divide the attention heads ({m.num_attention_heads}) and KV heads "
                   f"({m.num_query_groups}); tp={tp} does not")
    if m.ffn_hidden_size % tp:
        out.append(f"TP must divide the MLP width (model.ffn_hidden_size={m.ffn_hidden_size}); tp={tp} does not")
    if tp > c.gpus_per_node:
        out.append(f"TP must stay within one node (at most {c.gpus_per_node} GPUs); tp={tp}")
    if m.num_layers % pp:
        out.append(f"PP must divide the layers ({m.num_layers}); pp={pp} does not")
    if vp > 1 and (pp < 2 or m.num_layers % (pp * vp)):
        out.append(f"VP needs PP > 1 and PP x VP dividing the layers ({m.num_layers}); pp={pp} vp={vp}")
    if vp > 1 and r.is_peft:
        from vdkit.recipes import engines

        why = engines.get(r.engine.name).no_peft_interleaving
        if why:
            out.append(f"engine={r.engine.name} cannot interleave the pipeline (VP) with PEFT: {why}; vp={vp}")
    cp = r.parallelism.cp
    if r.world_size % (tp * pp * cp):
        out.append(f"TP x PP{' x CP' * (cp > 1)} must divide the world size ({r.world_size} GPUs); {tp} x {pp}"
                   f"{f' x {cp}' * (cp > 1)} = {tp * pp * cp} does not")
    else:
        dp = data_parallel(r, tp, pp)
        if t.global_batch_size % (t.micro_batch_size * dp):
            out.append(f"GBS must be a multiple of MBS x DP; {t.global_batch_size} is not a multiple of "
                       f"{t.micro_batch_size} x {dp}")
    return out


def data_parallel(r: Recipe, tp: int, pp: int) -> int:
    """Data-parallel ranks: the world less TP x PP x CP (context-parallel ranks share a batch's samples)."""
    return r.world_size // (tp * pp * r.parallelism.cp)


def divisors(n: int) -> List[int]:
    """The divisors of ``n`` in order, in O(sqrt n) (a billion layers must not take a billion steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def valid_layouts(r: Recipe, pinned_tp: Optional[int], pinned_pp: Optional[int], vp: int
                       ) -> Iterator[Tuple[int, int]]:
    """Valid (tp, pp), smallest TP x PP first, larger TP first within a size (TP stays in-node)."""
    tps = [pinned_tp] if pinned_tp else [d for d in divisors(r.cluster.gpus_per_node)]
    # PP divides both the layers and the world size: search the (few) divisors of the world size
    pps = [pinned_pp] if pinned_pp else [d for d in divisors(r.world_size) if r.model.num_layers % d == 0]
    layouts = [(tp, pp) for tp in tps for pp in pps if not layout_violations(r, tp, pp, vp)]
    layouts.sort(key=lambda l: (l[0] * l[1], -l[0]))
    return iter(layouts)


def effective_sp(tp: int, asked: Optional[bool]) -> bool:
    """Sequence parallelism at TP ``tp``: on when TP > 1 unless ``parallelism.sequence_parallel`` says otherwise, and
    never at TP 1, where there is no tensor-parallel group to split the sequence over: NeMo 1.23 turns it off there
    (megatron_base_model.py, 'sequence_parallel ... tensor_model_parallel_size == 1'), megatron-core refuses it
    ('Cannot use sequence parallelism without tensor parallelism', model_parallel_config.py), so the plan - and every
    engine's config built from it - says off."""
    return tp > 1 and (asked is None or bool(asked))
