"""`vdkit plan`: compose, validate and print the plan (layout, memory, fit, checkpoint size)."""
from __future__ import annotations

import json

from vdkit.commands.args import add_override_args


def register(sub) -> None:
    """Add the `vdkit plan` verb to ``sub``."""
    p = sub.add_parser("plan", help="is it feasible? which TP/PP? memory per GPU? how long? checkpoint size?",
                       description="Compose the recipe from conf/ and OVERRIDES, validate it and print the plan: "
                                   "layout (TP, PP, DP, gradient accumulation; automatic layouts are the fastest predicted that "
                                   "fit with headroom), per-GPU memory by part, whether it fits the GPU and why not, the "
                                   "predicted step time, minutes, tokens/s per GPU and GPU-hours, and the checkpoint size. With -m or --sweep, one row "
                                   "per cell.")
    add_override_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per plan (one per line)")
    p.add_argument("--cfg", action="store_true",
                   help="print the composed recipe as YAML, every key with its meaning as a comment, and stop")
    p.add_argument("--explain", metavar="KEY", action="append",
                   help="what KEY means (e.g. cluster.nodes; a section such as cluster lists its keys): its type, "
                        "default, the value the overrides give it, and stop. Repeatable")
    p.add_argument("--check", action="store_true",
                   help=f"exit {EXIT_DOES_NOT_FIT} when a plan does not fit (or a sweep cell has no layout), for "
                        "scripts; without it a plan that says 'does not fit' is an answer and exits 0")
    p.set_defaults(func=run)


EXIT_DOES_NOT_FIT = 3  # `vdkit plan --check`: a valid question whose answer is "no" (2 is a bad input)


def run(args) -> int:
    """`vdkit plan`: each recipe composed, validated and planned, the plan printed (or ``--json``); the exit code."""
    from vdkit.composition.config import compose
    from vdkit.render.sweep import override_sets
    from vdkit.errors import UserError

    if args.explain and (args.multirun or args.sweep is not None or args.cfg):
        other = "--cfg" if args.cfg else ("-m" if args.multirun else "--sweep")
        raise UserError(f"--explain describes a key of one recipe; with {other} it would show only "
                        + ("--explain's answer" if args.cfg else "the first cell's value"),
                        f"drop {other} (or --explain): `vdkit plan --explain KEY [overrides]`")
    sets = override_sets(args.overrides, args.multirun, args.sweep)
    if args.explain:
        from vdkit.commands.keys import explain, lookup

        for key in args.explain:  # every key checked before any output
            lookup(key)
        recipe = compose(sets[0])
        print("\n".join(explain(key, recipe) for key in args.explain))
        return 0
    if args.cfg:
        from vdkit.commands.keys import annotated_yaml

        for i, overrides in enumerate(sets):
            print(("---\n" if i else "") + annotated_yaml(compose(overrides)), end="")
        return 0
    from vdkit.render.sweep import plan_cells

    many = bool(args.multirun or args.sweep is not None)
    plans = plan_cells(sets, many, "plan", require_fit=False)  # no-layout cells: a note, like render
    plans = runnable(plans, many)  # a plan render would refuse is no answer: the same engine and launcher checks
    if args.json:
        for plan in plans:
            figure = _published(plan)
            extra = {"published": None if figure is None else {
                "table": figure.table, "figure": figure.text,
                "minutes_for_target_steps": None if figure.minutes is None
                else round(figure.minutes_for(plan.recipe.train.target_steps), 2)}}
            if plan.feasible:
                extra["schedule"] = plan.time.to_dict()
            print(json.dumps({**plan.to_dict(), **extra}))
    elif len(plans) == 1:
        print(describe(plans[0]))
    else:
        print(table(plans))
    if args.check and (len(plans) < len(sets) or not all(p.feasible for p in plans)):
        return EXIT_DOES_NOT_FIT
    return 0


def runnable(plans, many: bool) -> list:
    """``plans`` that their engine and launcher can run (:func:`check_runnable`). A sweep's cell they cannot (P-tuning
    on Bridge) is skipped with a one-line note on stderr, as the README promises; a single recipe, or a sweep with
    no cell left, is refused (UserError)."""
    import sys

    from vdkit.errors import UserError

    kept, skipped = [], []
    for plan in plans:
        try:
            check_runnable(plan)
        except UserError as exc:
            if not many:
                raise
            skipped.append((plan, exc))
            continue
        kept.append(plan)
    if not kept and skipped:
        plan, exc = skipped[0]
        raise UserError(f"no cell of the sweep can run, nothing to plan: {plan.recipe.run_name}: {exc.what}"
                        + (f" (and {len(skipped) - 1} more cell(s))" if len(skipped) > 1 else ""), exc.fix)
    for plan, exc in skipped:
        print(f"vdkit plan: skipped {plan.recipe.run_name}: {exc}", file=sys.stderr)
    return kept


def check_runnable(plan) -> None:
    """Refuse (UserError) a plan that fits but that its engine or launcher cannot run - the checks
    `render` makes before writing (vdkit.render.prepare), all pure: P-tuning on an engine without it, a LoRA
    placement the engine does not plan, a Kubernetes job with a secrets file, an image its launcher cannot
    read. A plan that does not fit is answered by its verdict instead."""
    if not plan.feasible:
        return
    from pathlib import Path

    from vdkit.render.prepare import engine_of, job_spec, launcher_of
    from vdkit.run.create import safe_dir_name

    r = plan.recipe
    notional = Path(r.run.out_dir or ".").expanduser().absolute() / safe_dir_name(r.run_name)  # never created
    launcher_of(plan).check(plan, job_spec(plan, notional))
    engine_of(plan).check(plan)


def describe(plan) -> str:
    """The plan of one recipe as a short text block."""
    r, p, m = plan.recipe, plan.recipe.parallelism, plan.memory
    on = {True: "on", False: "off"}
    verdict = "fits" if plan.feasible else "DOES NOT FIT"
    cp = f" x CP {p.cp}" if p.cp > 1 else ""
    if plan.borderline:
        verdict += " (borderline)"
    lines = [
        f"{r.model.name} {r.method.name} on {r.cluster.name}: {r.cluster.nodes} node(s) x {r.cluster.gpus_per_node} GPUs"
        f" = {r.world_size} GPUs, engine {r.engine.name}",
        f"  layout      TP {p.tp} x PP {p.pp}{cp} x DP {plan.dp} ({p.sharding if p.sharding != 'none' else plan.layout_source}), VP {p.vp}, sequence parallel "
        f"{on[p.sequence_parallel]}, recompute {p.recompute}"
        + ((f" (the first {p.recompute_num_layers} of {r.model.num_layers // p.pp} layers per stage)" if (p.vp or 1) == 1
            else f" (the first {p.recompute_num_layers} of {r.model.num_layers // p.pp // p.vp} layers in each of a "
                 f"stage's {p.vp} model chunks)")
           if p.recompute == "full" and p.recompute_num_layers else "")
        + f", distributed optimizer {on[p.distributed_optimizer]}",
        f"  batch       MBS {r.train.micro_batch_size}, GBS {r.train.global_batch_size}, gradient accumulation "
        f"{plan.grad_accum}, seq {r.train.seq_length}, {r.train.precision}, {r.train.max_steps} steps "
        f"(estimates for {r.train.target_steps})",
        f"  memory/GPU  weights {m.weights_gb:.1f} + gradients {m.gradients_gb:.1f} + optimizer {m.optimizer_gb:.1f}"
        f" + activations {m.activations_gb:.1f} + overhead {m.overhead_gb:.1f} = {m.total_gb:.1f} GB"
        f" of {r.cluster.gpu_memory_gb:g} GB (GB = 10^9 bytes, the GPU's reported total: cluster.gpu_memory_gb)",
        f"  verdict     {verdict}" + (f": {plan.reason}" if plan.reason else ""),
        f"  checkpoint  {plan.checkpoint_gb:,.1f} GB (weights + optimizer states)",
    ]
    if r.cluster.nodes > 1:  # what the time model assumes of the inter-node fabric (vdkit.planner.interconnect)
        from vdkit.planner.interconnect import interconnect

        lines.append(f"  fabric      {interconnect(r.cluster).line()}")
    pred = plan.prediction
    if pred is not None:
        terms = pred.step.terms()
        lines += [
            f"  predicted   {pred.step_seconds:.3g} s/step, {pred.minutes:,.1f} min for {r.train.target_steps} steps, "
            f"{pred.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {pred.gpu_hours:,.1f} GPU-hours",
            "  step terms  " + " + ".join(f"{name} {sec:.3g}" for name, sec in terms.items())
            + " s (dominant: " + ", ".join(name for name, _ in pred.step.dominant(2)) + ")"
            + (f"; host-bound {pred.step.parts['host_bound_s']:.3g} s of the overhead ({pred.step.parts['host_bound_s'] / pred.step.total_s:.0%} of the step: "
               "the CPU issuing eager kernels)" if pred.step.parts.get("host_bound_s", 0.0) > 0 else ""),
        ]
        lines += _tp_line(pred.step.parts, r.parallelism.tp_comm_overlap_cfg)
        if pred.interval_s:
            lo, hi = pred.interval_s
            lines.append(f"  range       {lo:.3g} .. {hi:.3g} s/step ({lo * r.train.target_steps / 60:,.0f} .. "
                         f"{hi * r.train.target_steps / 60:,.0f} min): {pred.interval_source}")
        if pred.basis:
            fitted = [f"{t} ({why[len('fitted: '):]})" for t, why in pred.basis if why.startswith("fitted")]
            assumed = [f"{t} ({why[len('assumed: '):]})" for t, why in pred.basis if why.startswith("assumed")]
            physics = [t for t, why in pred.basis if not why.startswith(("fitted", "assumed"))]
            lines.append("  basis       physics: " + ", ".join(physics) + ("; fitted: " + "; ".join(fitted) if fitted else "")
                         + ("; assumed: " + "; ".join(assumed) if assumed else ""))
    figure = _published(plan)
    if figure is not None:
        lines.append(f"  published   {figure.line(pred)}")
    if plan.runner_up:
        lines.append(f"  runner-up   {plan.runner_up}")
    if plan.feasible:
        from vdkit.planner.timeplan import describe as describe_time

        lines += describe_time(plan.time)
    lines += [f"  note        {n}" for n in plan.notes]
    return "\n".join(lines)


def _tp_line(parts, ub_cfg=None) -> list:
    """The communication term's tensor-parallel share, honestly split (vdkit.planner.tp_overlap): what is exposed
    (in the term), what of it is the GEMMs' time lost to the overlap kernels' SMs and what the GEMMs hide (not in the
    term), with whose userbuffers settings (``ub_cfg``: parallelism.tp_comm_overlap_cfg); nothing without TP
    collectives."""
    exposed, hidden = parts.get("tensor_parallel_s", 0.0), parts.get("tensor_parallel_overlapped_s", 0.0)
    if exposed + hidden <= 0:
        return []
    if "tp_pairs" in parts and not parts["tp_pairs"]:
        return [f"  TP comm     {exposed:.3g} s/step in the communication term, counted whole (the rendered job "
                "does not overlap it with the GEMMs)"]
    margin = parts.get("tensor_parallel_sm_margin_s", 0.0)
    return [f"  TP comm     {exposed:.3g} s/step exposed in the communication term ({exposed - margin:.3g} collectives "
            f"outlasting their GEMMs + {margin:.3g} GEMM time lost to the overlap kernels' SMs); {hidden:.3g} s/step "
            f"hidden behind the GEMMs (Transformer Engine userbuffers, {'conf/tp_overlap/' + ub_cfg if ub_cfg else 'its defaults'}, "
            "as the rendered job overlaps them)"]


def _published(plan):
    """The published figure of the plan's cell (vdkit.validation.citation.published_for), or None."""
    from vdkit.validation.citation import published_for

    return published_for(plan.recipe)


def table(plans) -> str:
    """One row per plan: the kit's own parallelism table (e.g. for Table 9)."""
    head = ("model", "method", "GPUs", "nodes", "TP", "PP", "VP", "DP", "GA", "recompute", "mem/GPU GB", "fits",
            "ckpt GB", "s/step", "minutes", "tok/s/GPU", "published min", "--time", "allocs", "ckpt every",
            "ckpt cost min", "ckpt share", "ckpt held GB")
    rows, held = [], 0.0
    for plan in plans:
        r, p = plan.recipe, plan.recipe.parallelism
        fits = "yes" if plan.feasible else "NO"
        if plan.borderline:
            fits += " (borderline)"
        pred = plan.prediction
        timing = ((f"{pred.step_seconds:.3g}", f"{pred.minutes:,.1f}", f"{pred.tokens_per_s_per_gpu:,.0f}")
                  if pred else ("-", "-", "-"))
        figure = _published(plan)  # the published figure in the same minutes as the prediction, or its words
        mins = figure.minutes_for(r.train.target_steps) if figure is not None else None
        shown = "-" if figure is None else (f"{mins:,.1f}" if mins else figure.short or "-")
        times = plan.time if plan.feasible else None
        share = times.checkpoint_share if times is not None else None
        when = (f"{times.time_limit_min}", str(times.allocations or "?"),
                str(times.every_n_steps) if times.every_n_steps else ("stop" if times.final == "none" else "end"),
                f"{times.checkpoint_cost_s / 60:,.1f}", "-" if share is None else f"{share:.1%}",
                f"{times.held_gb:,.1f}") if times is not None else ("-",) * 6
        held += times.held_gb if times is not None else 0.0
        rows.append((r.model.name, r.method.name, str(r.world_size), str(r.cluster.nodes), str(p.tp), str(p.pp),
                     str(p.vp), str(plan.dp), str(plan.grad_accum), p.recompute, f"{plan.memory.total_gb:.1f}", fits,
                     f"{plan.checkpoint_gb:,.1f}", *timing, shown, *when))
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in rows]
    out.append(f"checkpoint storage the sweep holds at its end: {held:,.1f} GB (every cell's kept checkpoints; "
               "'stop': a timing run saves only when stopped)")
    infeasible = [p for p in plans if not p.feasible]
    for plan in infeasible:
        r = plan.recipe
        out.append(f"* {r.model.name} {r.method.name} on {r.world_size} GPUs: {plan.reason}")
    return "\n".join(out)
