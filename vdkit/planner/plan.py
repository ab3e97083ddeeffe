"""The planner: parallelism rules, the per-GPU memory model and the layout search.

``make_plan(recipe)`` checks a pinned layout against the rules (and names the rule it breaks), or
picks one when ``parallelism.tp`` / ``parallelism.pp`` are unset: among every valid TP x PP (x VP,
x recomputation) that fits memory with the headroom (:data:`vdkit.planner.calibration.HEADROOM`), the one
with the lowest predicted step time (:mod:`vdkit.planner.predict`; near-ties go to the simpler layout), and
it names the runner-up and why it lost. It never raises for a layout that merely does not fit
memory: the plan says ``feasible: false`` and why, with the arithmetic. Sharded data parallelism
(FSDP / ZeRO-3) has its own memory model (:mod:`vdkit.planner.sharded`); the result is a
:class:`vdkit.schema.Plan` either way.

The memory model (bytes per GPU, worst pipeline stage), Megatron / NeMo mixed precision with
``megatron_amp_O2``:

- weights: 2 bytes per parameter held by the GPU (bf16); with ``train.precision=fp8`` the
  transformer-layer weights are FP8 parameters (1 byte), embeddings stay bf16.
- gradients: 4 bytes per *trainable* parameter (fp32 main gradients).
- optimizer states: 12 bytes per trainable parameter (fp32 master copy + Adam m and v), divided by
  DP when the distributed optimizer shards them.
- per stage (``stage_static_bytes``): stage 0 holds the input embedding (and P-tuning's prompt
  encoder), the last stage the final norm and output layer; the vocabulary is padded to a multiple
  of 128 x TP; norm weights are replicated over TP. The megatron engine measures each rank's
  weights / gradients / optimizer bytes against this (memory.json); in fp32 (CPU) the bytes are
  4 / 4 / 8 per parameter.
- activations, per layer and micro batch, bf16, flash attention (no s^2 term; so selective
  recomputation of core attention saves nothing more): s*b*(12h + 4kv + 6f) bytes, where the
  attention half stores the norm input, the QKV input, Q/K after RoPE, V and the projection input,
  and the SwiGLU MLP half the norm input, fc1 input, gate and up outputs and the down-projection
  input. Tensor parallelism divides it (the norm inputs, 4sbh, only with sequence parallelism).
  Full recomputation keeps only each layer's input (2sbh, / TP with SP) plus one layer's working
  set. The first pipeline stage holds min(PP, micro batches) micro batches in flight (1F1B),
  times (1 + (PP-1)/(PP*VP)) when interleaved. The last stage adds the logits (bf16 + fp32 for
  the loss: 6*s*b*V / TP).
- overhead: CUDA context, NCCL and cuBLAS workspaces, allocator fragmentation (``overhead_gb`` in
  conf/calibration/memory.yaml, or the cluster's ``memory_overhead_gb``: 0 for CPU processes).

Every byte count here is a number in conf/calibration/memory.yaml; "borderline" (within its
``borderline_fraction`` of the GPU's memory) is one rule, vdkit.planner.calibration.is_borderline, for every plan.

Checkpoint size (as NeMo writes it): bf16 weights + fp32 master weights + Adam m and v = 14 bytes
per trainable parameter (a PEFT checkpoint holds only the adapter's).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, List, Optional, Tuple

from vdkit.planner.arch import checkpoint_gb, lora_params_per_layer, param_counts, ptuning_params, trainable_params
from vdkit.context import data_notes, seq_notes
from vdkit.planner.calibration import HEADROOM, is_borderline, overhead_gb
from vdkit.planner.interval import attach
from vdkit.errors import UserError
from vdkit.planner.predict import predict_step, predicts_for, recompute_share, regime, why_no_prediction
from vdkit.schema import GB, Candidate, Memory, Plan, Prediction, Recipe

# The memory model's numbers (bytes per parameter, the per-GPU overhead, the borderline band) live in
# conf/calibration/memory.yaml, read through vdkit.planner.calibration.


# ----------------------------------------------------------------------------- rules
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


def _divisors(n: int) -> List[int]:
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


def _candidate_layouts(r: Recipe, pinned_tp: Optional[int], pinned_pp: Optional[int], vp: int
                       ) -> Iterator[Tuple[int, int]]:
    """Valid (tp, pp), smallest TP x PP first, larger TP first within a size (TP stays in-node)."""
    tps = [pinned_tp] if pinned_tp else [d for d in _divisors(r.cluster.gpus_per_node)]
    # PP divides both the layers and the world size: search the (few) divisors of the world size
    pps = [pinned_pp] if pinned_pp else [d for d in _divisors(r.world_size) if r.model.num_layers % d == 0]
    layouts = [(tp, pp) for tp in tps for pp in pps if not layout_violations(r, tp, pp, vp)]
    layouts.sort(key=lambda l: (l[0] * l[1], -l[0]))
    return iter(layouts)


# ----------------------------------------------------------------------------- memory model
def static_bytes(precision: str) -> Tuple[float, float, float]:
    """Bytes per parameter a GPU holds for (weights, gradients, optimizer states) in ``precision``:
    weights per parameter held, gradients and optimizer states per *trainable* parameter held
    (conf/calibration/memory.yaml ``megatron_bytes``)."""
    from vdkit.planner.calibration import memory

    return tuple(float(x) for x in memory()["megatron_bytes"][precision])


VOCAB_DIVISOR = 128  # NeMo / Megatron pad the vocabulary to a multiple of 128 x TP


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary as NeMo and Megatron allocate it: up to a multiple of 128 x TP."""
    multiple = VOCAB_DIVISOR * tp
    return -(-vocab // multiple) * multiple


def stage_params(r: Recipe, tp: int, pp: int, stage: int) -> Tuple[float, float, float]:
    """(held, held in transformer layers, trainable) parameters of one GPU of pipeline stage ``stage``.

    Stage 0 holds the input embedding (and learned positions), the last stage the final norm and the
    output layer (with PP > 1 a tied output layer is a copy there, as Megatron keeps it); TP shards
    the linear layers and the embeddings, norms and the row-parallel layers' biases are replicated.
    LoRA adapters sit on each layer's fused QKV (A and B both sharded over TP, NeMo's split);
    P-tuning's prompt encoder sits on stage 0 (its linear layers sharded over TP, the virtual-token
    embedding and the second layer's bias replicated)."""
    m, meth = r.model, r.method
    counts = param_counts(m)
    replicated = 2 * counts.final_norm + (2 * m.hidden_size if m.bias else 0)  # norms; o and fc2 biases
    layers = m.num_layers // pp
    layer_params = layers * ((counts.per_layer - replicated) / tp + replicated)
    vocab = padded_vocab(m.vocab_size, tp) * m.hidden_size / tp
    output = vocab if (not counts.tied or pp > 1) else 0.0
    held = (layer_params + ((vocab + counts.positions) if stage == 0 else 0)
            + ((output + counts.final_norm) if stage == pp - 1 else 0))
    if meth.name == "lora":
        trainable = layers * lora_params_per_layer(m, meth.lora_adapter_dim, r.engine.lora_qkv) / tp
        held += trainable
    elif meth.name == "ptuning":
        trainable = ptuning_params(meth, m, tp) if stage == 0 else 0.0
        held += trainable
    else:
        trainable = held
    return held, layer_params, trainable


def stage_static_bytes(r: Recipe, tp: int, pp: int, stage: int, distributed_optimizer: bool,
                       precision: Optional[str] = None) -> dict:
    """Bytes one GPU of pipeline stage ``stage`` holds for weights, gradients and optimizer states.

    ``precision``: bf16 / fp8 (mixed precision, see static_bytes; fp8 stores transformer-layer
    weights in 1 byte) or fp32; default ``train.precision``. The distributed optimizer shards the
    optimizer states over DP."""
    precision = precision or r.train.precision
    w, g, o = static_bytes(precision)
    held, layer_params, trainable = stage_params(r, tp, pp, stage)
    weights = w * held - (1.0 if precision == "fp8" else 0.0) * layer_params
    shards = data_parallel(r, tp, pp) * r.parallelism.cp  # megatron-core's distributed optimizer: the DP x CP group
    return {"weights": weights, "gradients": g * trainable,
            "optimizer": o * trainable / (shards if distributed_optimizer else 1)}


def estimate_memory(r: Recipe, tp: int, pp: int, vp: int, sequence_parallel: bool, recompute: str,
                    distributed_optimizer: bool, precision: Optional[str] = None) -> Memory:
    """Per-GPU memory (GB) of the worst pipeline stage for one layout (see the module docstring)."""
    m, t = r.model, r.train
    precision = precision or t.precision
    dp = data_parallel(r, tp, pp)
    layers = m.num_layers // pp
    static = max((stage_static_bytes(r, tp, pp, st, distributed_optimizer, precision) for st in {0, pp - 1}),
                 key=lambda d: sum(d.values()))
    weight_bytes, grads, optim = static["weights"], static["gradients"], static["optimizer"]

    # context parallelism: each GPU holds 1 / CP of every sequence's activations (and logits)
    s = (t.seq_length + (r.method.ptuning_virtual_tokens if r.method.name == "ptuning" else 0)) / r.parallelism.cp
    b, h, f = t.micro_batch_size, m.hidden_size, m.ffn_hidden_size
    kv = m.num_query_groups * (h // m.num_attention_heads)
    sharded = s * b * (8 * h + 4 * kv + 6 * f) / tp
    norms = s * b * 4 * h / (tp if sequence_parallel else 1)
    per_layer = sharded + norms
    if recompute == "full":  # partial (recompute_num_layers): those layers keep only their input
        share = recompute_share(r, recompute, layers)
        stored_per_layer = share * 2 * s * b * h / (tp if sequence_parallel else 1) + (1 - share) * per_layer
        working = per_layer  # one layer recomputed at a time
    else:
        stored_per_layer, working = per_layer, 0.0
    microbatches = t.global_batch_size // (t.micro_batch_size * dp)
    in_flight = min(pp, microbatches)
    interleave = 1 + (pp - 1) / (pp * vp) if vp > 1 else 1.0
    acts_first = layers * stored_per_layer * in_flight * interleave + working
    logits = 6.0 * s * b * m.vocab_size / tp
    acts_last = layers * stored_per_layer + working + logits  # last stage: 1 micro batch in flight
    acts = acts_first + logits if pp == 1 else max(acts_first, acts_last)
    return Memory(weights_gb=weight_bytes / GB, gradients_gb=grads / GB, optimizer_gb=optim / GB,
                  activations_gb=acts / GB,
                  overhead_gb=overhead_gb(r.cluster))


# ----------------------------------------------------------------------------- layout search
# HEADROOM (vdkit.planner.calibration): the share of the GPU an automatic layout leaves unused; pinned layouts
# are only checked against the whole GPU.
TIE = 0.01  # predicted step times within 1 % are a tie (the model is not that precise)


def _vp_options(r: Recipe, pp: int, pinned_vp: Optional[int], dp: int) -> List[int]:
    """Interleaving depths to weigh: the pinned one, else 1 and every VP NeMo accepts for this PP."""
    if pinned_vp:
        return [pinned_vp]
    micro = r.train.global_batch_size // (r.train.micro_batch_size * dp)
    if pp < 2 or micro % pp:  # NeMo's interleaved schedule needs micro batches per step % PP == 0
        return [1]
    return [1] + [v for v in _divisors(r.model.num_layers // pp) if v > 1]


def candidate_layouts(r: Recipe, tp: Optional[int], pp: Optional[int], vp: Optional[int],
                      recompute: Optional[str], sequence_parallel: Optional[bool],
                      distributed_optimizer: bool) -> List[Candidate]:
    """Every valid layout within the pins (tp, pp, vp, recompute), with its memory and fit."""
    cap = r.cluster.gpu_memory_gb
    out = []
    for ltp, lpp in _candidate_layouts(r, tp, pp, vp or 1):
        dp = data_parallel(r, ltp, lpp)
        sp = (ltp > 1) if sequence_parallel is None else sequence_parallel
        for lvp in _vp_options(r, lpp, vp, dp):
            if layout_violations(r, ltp, lpp, lvp):
                continue
            for rc in ([recompute] if recompute else ["none", "selective", "full"]):
                mem = estimate_memory(r, ltp, lpp, lvp, sp, rc, distributed_optimizer)
                out.append(Candidate(ltp, lpp, lvp, rc, mem, mem.total_gb <= cap,
                                     mem.total_gb <= cap * (1 - HEADROOM)))
    return out


def rank_candidates(r: Recipe, candidates: List[Candidate], distributed_optimizer: bool,
                    constants: Optional[dict] = None) -> List[Candidate]:
    """The candidates that fit, fastest first (predicted step time; ties: less memory)."""
    ranked = [dataclasses.replace(c, step=predict_step(r, c.tp, c.pp, c.vp, c.recompute, distributed_optimizer,
                                                       constants))
              for c in candidates if c.fits]
    ranked.sort(key=lambda c: (round(c.step.total_s, 9), c.memory.total_gb))
    return ranked


def choose(ranked: List[Candidate], pinned: bool = False
           ) -> Tuple[Optional[Candidate], Optional[Candidate], Optional[Candidate]]:
    """(chosen, runner-up, faster-without-headroom) from ranked candidates.

    The chosen layout is the fastest that leaves the headroom (else, or when TP x PP are pinned, the
    fastest that fits at all);
    the runner-up the fastest layout with another TP x PP that leaves it; the third a layout faster than
    the chosen one that fits only without the headroom (None when there is none).
    """
    roomy = [c for c in ranked if c.roomy]
    pool = roomy if roomy and not pinned else ranked  # a pinned TP x PP only has to fit
    if not pool:
        return None, None, None
    # Near-ties (within TIE) go to the simpler layout: no or less interleaving, fewer model-parallel GPUs.
    near = [c for c in pool if c.step.total_s <= pool[0].step.total_s * (1 + TIE)]
    chosen = min(near, key=lambda c: (c.vp, c.tp * c.pp, c.step.total_s))
    runner = next((c for c in pool if (c.tp, c.pp) != (chosen.tp, chosen.pp)), None)
    faster = next((c for c in ranked if not c.roomy and c.step.total_s < chosen.step.total_s), None)
    return chosen, runner, faster


def _why_lost(chosen: Candidate, other: Candidate) -> str:
    """One line: how much slower ``other`` is and which term makes the difference."""
    a, b = chosen.step.terms(), other.step.terms()
    term = max(b, key=lambda k: b[k] - a[k])
    slower = other.step.total_s / chosen.step.total_s - 1
    if slower <= TIE:
        why = (f"a tie within {TIE:.0%}: the simpler layout wins (fewer model-parallel GPUs, less interleaving)"
               if (other.vp, other.tp * other.pp) >= (chosen.vp, chosen.tp * chosen.pp) else
               f"a tie within {TIE:.0%}")
    else:
        why = f"{slower:.0%} slower: {term} {b[term]:.3g} s vs {a[term]:.3g} s"
    return f"{other.label}: {other.step.total_s:.3g} s/step, {other.memory.total_gb:.1f} GB; {why}"


# ----------------------------------------------------------------------------- planning
def make_plan(recipe: Recipe) -> Plan:
    """Decide (or check) the layout of ``recipe``, estimate its memory, predict its step time and decide
    its time plan (``Plan.time``: --time, allocations, checkpoint cadence; computed here, once).

    Automatic layouts: among the valid layouts that fit with HEADROOM, the one with the lowest
    predicted step time (the plan names the runner-up and why it lost). Pinned layouts are checked,
    never changed. Raises UserError when a pinned layout breaks a rule; returns a plan with
    ``feasible=False`` and the arithmetic in ``reason`` when nothing fits the GPU's memory.
    """
    from vdkit.planner.timeplan import time_plan

    plan = layout_plan(recipe)
    return dataclasses.replace(plan, time=time_plan(plan))


def layout_plan(recipe: Recipe) -> Plan:
    """:func:`make_plan` without the time plan (``Plan.time`` None): the layout, memory and prediction."""
    if recipe.parallelism.sharding != "none":  # FSDP / ZeRO-3: its own memory model (vdkit.planner.sharded)
        from vdkit.planner.sharded import make_sharded_plan

        return make_sharded_plan(recipe)

    p, m = recipe.parallelism, recipe.model
    source = "pinned" if (p.tp or p.pp) else "auto"
    tp, pp = p.tp, p.pp
    if source == "auto" and recipe.method.name == "pretrain" and m.pretrain_tp and m.pretrain_pp:
        tp, pp, source = m.pretrain_tp, m.pretrain_pp, "design guide"
    vp = p.vp or 1
    if tp and pp:
        broken = layout_violations(recipe, tp, pp, vp)
        if broken:
            raise UserError(f"layout tp={tp} pp={pp} on {recipe.world_size} GPUs breaks a rule: {broken[0]}",
                            "change parallelism.tp / parallelism.pp, or leave them unset to let the planner pick")
    full_method = recipe.method.name in ("sft", "pretrain")
    dist_opt = full_method if p.distributed_optimizer is None else p.distributed_optimizer

    if not list(_candidate_layouts(recipe, tp, pp, vp)):
        _no_layout(recipe, tp, pp, vp)
    # A layout the user pinned keeps its VP (1 unless given); automatic and design-guide layouts weigh VP too.
    pinned_vp = p.vp or (1 if source == "pinned" else None)
    cands = candidate_layouts(recipe, tp, pp, pinned_vp, p.recompute, p.sequence_parallel, dist_opt)
    ranked = rank_candidates(recipe, cands, dist_opt)
    chosen, runner, faster = choose(ranked, pinned=bool(tp and pp))
    cap = recipe.cluster.gpu_memory_gb
    if chosen is None:  # nothing fits: report the layout that comes closest
        chosen = min(cands, key=lambda c: c.memory.total_gb)
    ltp, lpp, lvp, rc, mem = chosen.tp, chosen.pp, chosen.vp, chosen.recompute, chosen.memory
    sp = (ltp > 1) if p.sequence_parallel is None else p.sequence_parallel
    resolved = recipe.with_parallelism(tp=ltp, pp=lpp, vp=lvp, sequence_parallel=sp, recompute=rc,
                                       distributed_optimizer=dist_opt)
    dp = data_parallel(recipe, ltp, lpp)
    grad_accum = recipe.train.global_batch_size // (recipe.train.micro_batch_size * dp)
    feasible = chosen.fits
    total = mem.total_gb
    borderline = is_borderline(total, cap)
    reason, notes = None, seq_notes(recipe) + data_notes(recipe)
    if not feasible:
        reason = (f"needs {total:.1f} GB per GPU at best (tp={ltp} pp={lpp} dp={dp}, recompute {rc}: "
                  f"weights {mem.weights_gb:.1f} + gradients {mem.gradients_gb:.1f} + optimizer "
                  f"{mem.optimizer_gb:.1f} + activations {mem.activations_gb:.1f} + overhead {mem.overhead_gb:.1f}) "
                  f"> {cap:g} GB on {recipe.world_size} GPUs" + ("; borderline" if borderline else ""))
        reason += _what_would_fit(recipe, ltp, lpp, lvp, sp, rc, dist_opt)
    elif borderline:
        notes.append(f"borderline: {total:.1f} of {cap:g} GB per GPU")
    if feasible and not chosen.roomy:
        notes.append((f"this layout leaves less than the {HEADROOM:.0%} headroom" if tp and pp else
                      f"no layout leaves the {HEADROOM:.0%} headroom")
                     + f" ({cap * (1 - HEADROOM):.0f} of {cap:g} GB usable): it needs {total:.1f} GB")
    runner_up = None
    if feasible and runner is not None and regime(recipe) != "hf":  # (layouts ranked by NeMo's regime)
        runner_up = _why_lost(chosen, runner)
    if feasible and faster is not None:
        notes.append(f"{faster.label} would take {faster.step.total_s:.3g} s/step but needs "
                     f"{faster.memory.total_gb:.1f} GB: more than {cap * (1 - HEADROOM):.0f} GB leaves no headroom")
    prediction = None
    if feasible and regime(recipe) == "hf":  # the transformers engine's DDP: its own regime (vdkit.planner.predict_hf)
        from vdkit.planner.predict_hf import predict_hf_step

        step = predict_hf_step(resolved, rc) if (ltp, lpp) == (1, 1) else None
        if step is not None:
            prediction = Prediction(step, recipe.train.target_steps, recipe.world_size)
        else:
            notes.append(f"no time prediction: {why_no_prediction(resolved, ltp, lpp)}")
    elif feasible and predicts_for(recipe):
        prediction = Prediction(chosen.step, recipe.train.target_steps, recipe.world_size)
        if regime(recipe) == "fused":
            notes.append(f"step time predicted for NVIDIA's fused stack (engine={recipe.engine.name}: Transformer Engine, "
                         "fused kernels, gradient-accumulation fusion), not NeMo 1.x defaults")
    elif feasible:
        notes.append(f"no time prediction: {why_no_prediction(recipe)} (the layout is still the one it predicts "
                     "fastest)")
    prediction = attach(prediction, resolved)
    return Plan(recipe=resolved, dp=dp, grad_accum=grad_accum, memory=mem, feasible=feasible,
                borderline=borderline, reason=reason, checkpoint_gb=checkpoint_gb(recipe),
                layout_source=source, notes=tuple(notes), prediction=prediction, runner_up=runner_up,
                params=param_counts(recipe.model).total, trainable_params=trainable_params(recipe))


def _no_layout(recipe: Recipe, tp: Optional[int], pp: Optional[int], vp: int) -> None:
    """Raise the 'no valid layout' line with the rule that leaves none (never without a reason)."""
    m, p = recipe.model, recipe.parallelism
    where = (f"no valid layout for {m.name} on {recipe.world_size} GPUs" + (" with" if tp or pp else "")
             + (f" parallelism.tp={tp}" if tp else "") + (f" parallelism.pp={pp}" if pp else ""))
    if vp > 1 and list(_candidate_layouts(recipe, tp, pp, 1)):
        raise UserError(f"{where}: parallelism.vp={vp} needs parallelism.pp > 1 with PP x VP dividing the "
                        f"{m.num_layers} layers, and no PP that fits {recipe.world_size} GPUs does",
                        "leave parallelism.vp unset (the planner weighs interleaving), or pin a parallelism.pp with "
                        f"{m.num_layers} divisible by pp x vp")
    broken = layout_violations(recipe, tp or 1, pp or 1, vp)
    if not broken:  # the simplest layout is fine except for the world size: name the first rule any breaks
        for ltp in ([tp] if tp else _divisors(recipe.cluster.gpus_per_node)):
            for lpp in ([pp] if pp else _divisors(recipe.world_size)):
                broken = layout_violations(recipe, ltp, lpp, vp)
                if broken:
                    break
            if broken:
                break
    reason = broken[0] if broken else f"TP x PP must divide the world size ({recipe.world_size} GPUs)"
    raise UserError(f"{where}: {reason}",
                    "change parallelism.tp / pp, train.global_batch_size (a multiple of micro batch x DP) or "
                    "cluster.nodes")


def _what_would_fit(r: Recipe, tp, pp, vp, sp, rc, dist_opt) -> str:
    """The options that decide an infeasible plan: FP8 parameters, or more nodes."""
    hints = []
    cap = r.cluster.gpu_memory_gb
    if r.train.precision != "fp8":
        fp8 = estimate_memory(r, tp, pp, vp, sp, "full", dist_opt, precision="fp8")
        verdict = "fits" if fp8.total_gb <= cap else "still does not fit"
        hints.append(f"with FP8 parameters and full recompute (train.precision=fp8 parallelism.recompute=full) "
                     f"it needs {fp8.total_gb:.1f} GB: {verdict}")
    c = r.cluster
    for nodes in range(c.nodes + 1, c.max_nodes + 1):
        bigger = dataclasses.replace(r, cluster=dataclasses.replace(c, nodes=nodes),
                                     parallelism=dataclasses.replace(r.parallelism, tp=None, pp=None))
        try:
            if layout_plan(bigger).feasible:
                hints.append(f"in {r.train.precision} it fits on {nodes} nodes "
                             f"({nodes * c.gpus_per_node} GPUs): cluster.nodes={nodes}")
                break
        except UserError:
            continue
    return "; " + "; ".join(hints) if hints else ""


def require_feasible(plan: Plan) -> Plan:
    """The plan itself, or a UserError saying why it does not fit."""
    if not plan.feasible:
        r = plan.recipe
        raise UserError(f"{r.model.name} {r.method.name} on {r.world_size} GPUs does not fit: {plan.reason}",
                        "see `vdkit plan` with the same overrides")
    return plan
