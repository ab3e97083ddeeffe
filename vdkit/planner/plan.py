"""The layout search and the plan: ``make_plan(recipe)``.

``make_plan(recipe)`` checks a pinned layout against the rules (and names the rule it breaks), or
picks one when ``parallelism.tp`` / ``parallelism.pp`` are unset: among every valid TP x PP (x VP,
x recomputation) that fits memory with the headroom (:data:`vdkit.planner.calibration.HEADROOM`), the one
with the lowest predicted step time (:mod:`vdkit.planner.predict`; near-ties go to the simpler layout), and
it names the runner-up and why it lost. It never raises for a layout that merely does not fit
memory: the plan says ``feasible: false`` and why, with the arithmetic. Sharded data parallelism
(FSDP / ZeRO-3) has its own memory model (:mod:`vdkit.planner.sharded`); the result is a
:class:`vdkit.composition.plan_types.Plan` either way.

The parallelism rules live in :mod:`vdkit.planner.layout`, the memory model (bytes per GPU, worst pipeline
stage) in :mod:`vdkit.planner.memory`; here: the search among the valid layouts, and the plan.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from vdkit.planner.context import data_notes, seq_notes
from vdkit.errors import UserError
from vdkit.planner.arch import param_counts, trainable_params
from vdkit.planner.calibration import HEADROOM, is_borderline
from vdkit.planner.cuda_graphs import plan_note
from vdkit.planner import lora_targets
from vdkit.planner.layout import effective_sp  # noqa: F401 (this module's API too; its home: layout)
from vdkit.planner.interval import attach
from vdkit.planner.layout import data_parallel, divisors, layout_violations, valid_layouts
from vdkit.planner.memory import checkpoint_gb, estimate_memory, fp8_weight_bytes, layers_in_flight
from vdkit.planner.host_time import step_note as host_note
from vdkit.planner.local_traffic import step_note
from vdkit.planner.presets import preset_notes
from vdkit.planner.predict import predict_step, predicts_for, regime, why_no_prediction
from vdkit.composition.plan_types import Candidate, Plan, Prediction
from vdkit.composition.schema import Recipe


def engine_notes(recipe) -> List[str]:
    """The engine's own notes on the run (its spec's ``notes``, read through the registry), e.g. seeded weights."""
    from vdkit.recipes import engines

    return engines.get(recipe.engine.name).notes(recipe)


def schedule_notes(recipe) -> List[str]:
    """A real fine-tune (run.mode=train) whose learning-rate warm-up lasts the whole run: it starts, but never
    trains at method.lr (NeMo's CosineAnnealing reaches it at the last step; Bridge caps the warm-up one step short
    of the end, recipes/bridge/config.py)."""
    m, t = recipe.method, recipe.train
    if recipe.run.mode != "train" or m.warmup_steps < t.max_steps:
        return []
    return [f"method.warmup_steps={m.warmup_steps} >= train.max_steps={t.max_steps}: the whole run is learning-rate "
            f"warm-up and never trains at method.lr={m.lr:g}; set method.warmup_steps lower (e.g. "
            f"{max(1, t.max_steps // 20)}, 5 % of the steps) or train longer"]


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
    return [1] + [v for v in divisors(r.model.num_layers // pp) if v > 1]


def candidate_layouts(r: Recipe, tp: Optional[int], pp: Optional[int], vp: Optional[int],
                      recompute: Optional[str], sequence_parallel: Optional[bool],
                      distributed_optimizer: bool) -> List[Candidate]:
    """Every valid layout within the pins (tp, pp, vp, recompute), with its memory and fit."""
    cap = r.cluster.gpu_memory_gb
    # per-layer CUDA graphs: megatron-core refuses full recompute beside them (vdkit.rules.cuda_graphs)
    graphed, out = r.train.cuda_graphs == "layer", []
    for ltp, lpp in valid_layouts(r, tp, pp, vp or 1):
        dp = data_parallel(r, ltp, lpp)
        sp = effective_sp(ltp, sequence_parallel)
        for lvp in _vp_options(r, lpp, vp, dp):
            if layout_violations(r, ltp, lpp, lvp):
                continue
            for rc in ([recompute] if recompute else ["none", "selective", "full"][:2 if graphed else 3]):
                mem = estimate_memory(r, ltp, lpp, lvp, sp, rc, distributed_optimizer)
                out.append(Candidate(ltp, lpp, lvp, rc, mem, mem.total_gb <= cap,
                                     mem.total_gb <= cap * (1 - HEADROOM)))
            if recompute is None and r.parallelism.recompute_num_layers is None and not graphed:
                partial = _partial_recompute(r, ltp, lpp, lvp, sp, distributed_optimizer)
                out += [partial] if partial else []
    return out


def _partial_recompute(r: Recipe, tp: int, pp: int, vp: int, sp: bool, distributed_optimizer: bool
                       ) -> Optional[Candidate]:
    """Full recompute of only as many layers per model chunk as memory needs (megatron's block method: the
    first N layers of each of a stage's VP chunks, vdkit.planner.recompute), or None when no recompute or every
    layer is what it takes."""
    cap, layers = r.cluster.gpu_memory_gb, r.model.num_layers // pp // vp
    if layers < 2:
        return None

    def memory(n):
        return estimate_memory(r.with_parallelism(recompute_num_layers=n), tp, pp, vp, sp, "full",
                               distributed_optimizer)

    if estimate_memory(r, tp, pp, vp, sp, "none", distributed_optimizer).total_gb <= cap * (1 - HEADROOM):
        return None
    lo, hi = 1, layers  # the fewest layers per chunk whose recompute leaves the headroom (memory falls with n)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if memory(mid).total_gb <= cap * (1 - HEADROOM) else (mid + 1, hi)
    if lo >= layers:
        return None
    mem = memory(lo)
    return Candidate(tp, pp, vp, "full", mem, True, True, recompute_num_layers=lo)


def rank_candidates(r: Recipe, candidates: List[Candidate], distributed_optimizer: bool,
                    constants: Optional[dict] = None) -> List[Candidate]:
    """The candidates that fit, fastest first (predicted step time; ties: less memory)."""
    ranked = [dataclasses.replace(c, step=predict_step(
                  r.with_parallelism(recompute_num_layers=c.recompute_num_layers) if c.recompute_num_layers else r,
                  c.tp, c.pp, c.vp, c.recompute, distributed_optimizer, constants))
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
    # Near-ties (within TIE) go to the simpler layout: no or less interleaving, fewer model-parallel GPUs,
    # less recomputation.
    near = [c for c in pool if c.step.total_s <= pool[0].step.total_s * (1 + TIE)]
    chosen = min(near, key=lambda c: (c.vp, c.tp * c.pp, _recompute_rank(c), c.step.total_s))
    runner = next((c for c in pool if (c.tp, c.pp) != (chosen.tp, chosen.pp)), None)
    faster = next((c for c in ranked if not c.roomy and c.step.total_s < chosen.step.total_s), None)
    return chosen, runner, faster


def _recompute_rank(c: Candidate) -> int:
    """Less recomputation is simpler (and what published layouts run): none, selective, partial, full."""
    return {"none": 0, "selective": 1}.get(c.recompute, 3 if c.recompute_num_layers is None else 2)


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

    from vdkit.recipes import engines

    p, m = recipe.parallelism, recipe.model
    source = "pinned" if (p.tp or p.pp) else "auto"
    tp, pp = p.tp, p.pp
    engine = engines.get(recipe.engine.name)
    ddp_only = engine.data_parallel_only  # torch DDP: TP 1 x PP 1, no sharded optimizer
    if source == "auto" and ddp_only:
        tp, pp = 1, 1
    elif source == "auto" and recipe.method.name == "pretrain" and m.pretrain_tp and m.pretrain_pp:
        tp, pp, source = m.pretrain_tp, m.pretrain_pp, "design guide"
    vp = p.vp or 1
    if tp and pp:
        broken = layout_violations(recipe, tp, pp, vp)
        if broken and source == "auto" and ddp_only:  # nothing to pick: torch DDP puts the whole model on every GPU
            raise UserError(f"engine={recipe.engine.name} runs data parallel only: its layout, TP 1 x PP 1 on each of "
                            f"{recipe.world_size} GPUs, breaks a rule: {broken[0]}",
                            "change train.global_batch_size / train.micro_batch_size or the GPU count "
                            "(cluster.nodes, cluster.gpus_per_node)")
        if broken:
            raise UserError(f"layout tp={tp} pp={pp} on {recipe.world_size} GPUs breaks a rule: {broken[0]}",
                            "change parallelism.tp / parallelism.pp, or leave them unset to let the planner pick")
    full_method = recipe.method.name in ("sft", "pretrain")
    if ddp_only and p.distributed_optimizer:
        raise UserError(f"parallelism.distributed_optimizer=true: engine={recipe.engine.name} with parallelism.sharding="
                        f"{p.sharding} runs torch DDP, whose every rank holds all of Adam's state",
                        "leave parallelism.distributed_optimizer unset, or shard the state: parallelism.sharding=fsdp "
                        "or zero3")
    # unset: on for full-parameter methods, and where the engine's FP8 gathers FP8 parameters through it
    fp8_gather = recipe.train.precision == "fp8" and engine.spec.fp8_needs_distributed_optimizer
    dist_opt = p.distributed_optimizer
    if dist_opt is None:
        dist_opt = (full_method or fp8_gather) and not ddp_only
    if recipe.train.optimizer_dtype != "fp32" and not dist_opt:  # (the engine's spec holds the value: recipes/spec.py)
        raise UserError(f"train.optimizer_dtype={recipe.train.optimizer_dtype} sets the distributed optimizer's state "
                        "dtype, and without parallelism.distributed_optimizer the engine renders a plain fused Adam "
                        "(fp32 states)", "set parallelism.distributed_optimizer=true or train.optimizer_dtype=fp32")

    if not list(valid_layouts(recipe, tp, pp, vp)):
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
    sp = effective_sp(ltp, p.sequence_parallel)
    resolved = recipe.with_parallelism(tp=ltp, pp=lpp, vp=lvp, sequence_parallel=sp, recompute=rc,
                                       distributed_optimizer=dist_opt,
                                       recompute_num_layers=chosen.recompute_num_layers or p.recompute_num_layers)
    dp = data_parallel(recipe, ltp, lpp)
    grad_accum = recipe.train.global_batch_size // (recipe.train.micro_batch_size * dp)
    feasible = chosen.fits
    total = mem.total_gb
    borderline = is_borderline(total, cap)
    reason, notes = None, seq_notes(recipe) + data_notes(recipe) + engine_notes(recipe) + schedule_notes(recipe)
    # train.cuda_graphs=layer: what the memory counts for the graphs (the first stage's layers in flight)
    notes += lora_targets.a2a_note(recipe, ltp, sp)  # method.lora_a2a on a layout where it does nothing
    notes += plan_note(recipe, ltp, sp, layers_in_flight(recipe.model.num_layers // lpp, lpp, lvp, grad_accum, 0))
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
    if feasible and rc == "full":
        notes += _swiglu_store_note(recipe, chosen, sp, dist_opt, pinned=bool(tp and pp))
    if feasible and regime(recipe) == "fused":  # NVIDIA's presets are fused-stack layouts
        notes += preset_notes(recipe, chosen, dist_opt)
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
        notes += step_note(chosen.step, resolved) + host_note(chosen.step, resolved)
        if regime(recipe) == "fused":
            notes.append(f"step time predicted for NVIDIA's fused stack (engine={recipe.engine.name}: Transformer Engine, "
                         "fused kernels, gradient-accumulation fusion), not NeMo 1.x defaults")
    elif feasible:
        notes.append(f"no time prediction: {why_no_prediction(recipe)} (the layout is still the one it predicts "
                     "fastest)")
    prediction = attach(prediction, resolved)
    return Plan(recipe=resolved, dp=dp, grad_accum=grad_accum, memory=mem, feasible=feasible,
                borderline=borderline, reason=reason, checkpoint_gb=checkpoint_gb(recipe, dist_opt),
                layout_source=source, notes=tuple(notes), prediction=prediction, runner_up=runner_up,
                params=param_counts(recipe.model).total, trainable_params=trainable_params(recipe))


def _no_layout(recipe: Recipe, tp: Optional[int], pp: Optional[int], vp: int) -> None:
    """Raise the 'no valid layout' line with the rule that leaves none (never without a reason)."""
    m, p = recipe.model, recipe.parallelism
    where = (f"no valid layout for {m.name} on {recipe.world_size} GPUs" + (" with" if tp or pp else "")
             + (f" parallelism.tp={tp}" if tp else "") + (f" parallelism.pp={pp}" if pp else ""))
    if vp > 1 and list(valid_layouts(recipe, tp, pp, 1)):
        raise UserError(f"{where}: parallelism.vp={vp} needs parallelism.pp > 1 with PP x VP dividing the "
                        f"{m.num_layers} layers, and no PP that fits {recipe.world_size} GPUs does",
                        "leave parallelism.vp unset (the planner weighs interleaving), or pin a parallelism.pp with "
                        f"{m.num_layers} divisible by pp x vp")
    broken = layout_violations(recipe, tp or 1, pp or 1, vp)
    if not broken:  # the simplest layout is fine except for the world size: name the first rule any breaks
        for ltp in ([tp] if tp else divisors(recipe.cluster.gpus_per_node)):
            for lpp in ([pp] if pp else divisors(recipe.world_size)):
                broken = layout_violations(recipe, ltp, lpp, vp)
                if broken:
                    break
            if broken:
                break
    reason = broken[0] if broken else f"TP x PP must divide the world size ({recipe.world_size} GPUs)"
    raise UserError(f"{where}: {reason}",
                    "change parallelism.tp / pp, train.global_batch_size (a multiple of micro batch x DP) or "
                    "cluster.nodes")


def _swiglu_store_note(r: Recipe, c: Candidate, sp: bool, dist_opt: bool, pinned: bool) -> List[str]:
    """A plan that recomputes where the FP8 store of the SwiGLU input (``train.swiglu_input_dtype=fp8``, an engine
    that renders it) would keep every layer's activations within the budget the choice used: say so."""
    from vdkit.recipes import engines

    if (r.train.swiglu_input_dtype != "bf16" or getattr(r.model, "activation", "swiglu") != "swiglu"
            or not engines.get(r.engine.name).spec.holds("train.swiglu_input_dtype", "fp8")):
        return []
    stored = dataclasses.replace(r, train=dataclasses.replace(r.train, swiglu_input_dtype="fp8"))
    mem = estimate_memory(stored, c.tp, c.pp, c.vp, sp, "none", dist_opt)
    budget = r.cluster.gpu_memory_gb * (1 if pinned else 1 - HEADROOM)
    if mem.total_gb > budget:
        return []
    return [f"with train.swiglu_input_dtype=fp8 (megatron-core's FP8 store of the SwiGLU input, as MLPerf's LoRA "
            f"runs set it) this layout needs no recompute: {mem.total_gb:.1f} GB"]


def _what_would_fit(r: Recipe, tp, pp, vp, sp, rc, dist_opt) -> str:
    """The options that decide an infeasible plan: FP8 where the engine renders it, or more nodes."""
    hints = []
    cap = r.cluster.gpu_memory_gb
    if r.train.precision != "fp8" and fp8_weight_bytes(r.engine.name) is not None:
        fp8 = estimate_memory(r, tp, pp, vp, sp, "full", dist_opt, precision="fp8")
        verdict = "fits" if fp8.total_gb <= cap else "still does not fit"
        hints.append(f"with FP8 and full recompute (train.precision=fp8 parallelism.recompute=full) "
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
