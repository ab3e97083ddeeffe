"""PNG plots for reports: minutes vs GPUs (ours next to published), a run's step-time trace, grouped bars.

matplotlib is imported inside the functions (Agg backend, no display needed), so importing
this module costs nothing. Each function returns the PNG bytes; the caller decides where they go.

Rules every plot here keeps (issue 21: each was broken once):

- legends sit outside the axes, never on the data;
- a legend names only what is drawn (no "published" entry in a plot without published figures);
- GPU counts double (4, 8, 16): the GPU axis is log2 and minutes are log, so halving the time per
  doubling is a straight line and 4 -> 8 -> 16 are evenly spaced;
- methods are nudged apart along the GPU axis (a few per cent), so two published points with the same
  figures (LoRA and P-tuning) or a measured point equal to the published one stay visible: the
  published figure is a large cross, this kit's a smaller circle drawn on top;
- a line joins points of one method *and one engine* only (issue 36: the demo's line joined a Bridge
  point to a megatron point); each engine has its own line style, named in the legend when there are two;
- a published figure is a point (a cross, never a band or a line that reads as a range); a range is
  drawn as a bar only where there is one (this kit's 95 % interval, the plan's low .. high).
"""
from __future__ import annotations

import io
import math
from typing import Dict, List, Optional, Sequence, Tuple

METHOD_COLORS = {"lora": "tab:blue", "ptuning": "tab:orange", "sft": "tab:green", "pretrain": "tab:purple"}
DODGE_OCTAVES = 0.1  # how far (in doublings of GPUs) neighbouring methods are nudged apart
# How each kind of figure is drawn; the legend's key entries come from here too.
STYLE = {
    "measured": dict(marker="o", markersize=6, linestyle="-", linewidth=1.5, zorder=5),
    "extrapolated": dict(marker="o", markersize=6, markerfacecolor="white", linestyle="-", linewidth=1.5, zorder=5),
    "published": dict(marker="x", markersize=9, markeredgewidth=2.0, linestyle="none", zorder=3),  # a point
    "interval": dict(linewidth=1.2, zorder=4),
    "predicted": dict(marker="+", markersize=8, linestyle=":", linewidth=1.2, zorder=4),  # the step-time model
    "predicted range": dict(linewidth=4, alpha=0.35, zorder=3),  # the plan's low .. high, where it has one
}
ENGINE_LINESTYLES = ("-", "--", "-.", (0, (1, 1)))  # one per engine on a panel, in name order
SERIES_COLORS = {"predicted": "tab:gray", "this kit": "tab:blue", "published": "tab:orange"}  # same in every bar plot
KEY_LABELS = {"measured": "this kit, measured", "extrapolated": "this kit, extrapolated",
              "published": "published", "interval": "this kit, 95 % interval",
              "predicted": "predicted (vdkit plan)", "predicted range": "predicted range (vdkit plan)"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _key_handles(kinds: Sequence[str]) -> list:
    """Legend entries (in black) for the kinds of figure drawn: measured, extrapolated, published, interval."""
    from matplotlib.lines import Line2D

    handles = []
    for kind in kinds:
        style = {k: v for k, v in STYLE[kind].items() if k != "zorder"}
        if kind == "interval":
            handles.append(Line2D([], [], color="black", marker="|", markersize=12, linestyle="none",
                                  label=KEY_LABELS[kind]))
        elif kind == "predicted range":
            handles.append(Line2D([], [], color="black", marker="|", markersize=14, markeredgewidth=style["linewidth"],
                                  alpha=style["alpha"], linestyle="none", label=KEY_LABELS[kind]))
        else:
            handles.append(Line2D([], [], color="black", label=KEY_LABELS[kind], **style))
    return handles


def _log2_gpu_axis(ax, gpus: Sequence[int]) -> None:
    """GPUs on a log2 axis, ticks exactly at the counts drawn, half a doubling of margin each side."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(gpus)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(g) for g in gpus])
    ax.set_xlim(min(gpus) / 2 ** 0.5, max(gpus) * 2 ** 0.5)
    ax.set_xlabel("GPUs (log2 scale)")


def _log_minutes_axis(ax, values: Sequence[float]) -> None:
    """A log axis with plain-number labels and room above and below the values."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [v for v in values if v and v > 0]
    ax.set_yscale("log")
    if values:
        lo, hi = min(values), max(values)
        ax.set_ylim(lo / 1.6, hi * 1.6)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    # a narrow range may hold fewer than two labelled (1-2-5) ticks: then label the minor ones too
    lo, hi = ax.get_ylim()
    majors = [k * 10 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
              for k in (1, 2, 5) if lo <= k * 10 ** e <= hi]
    ax.yaxis.set_minor_formatter(plain if len(majors) < 2 else NullFormatter())


def scaling_png(table) -> bytes:
    """:func:`scaling_figure` as PNG bytes."""
    return _png(scaling_figure(table))


def scaling_figure(table):
    """Minutes vs GPUs, one panel per model, one colour per method, one line style per engine (log2 GPUs, log minutes).

    This kit: line per method and engine, filled circle = measured, hollow = extrapolated, bar = 95 % interval.
    Published: a cross per figure (never joined). Predicted (the step-time model, vdkit plan): dotted line per
    method and engine with plus signs, the plan's range as a pale bar where it has one. One legend under the
    panels names only what is drawn.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D

    models: List[str] = list(dict.fromkeys(c.model for c in table.cells))
    engines = sorted({c.engine for c in table.cells
                      if (c.ours is not None or c.predicted is not None) and c.engine})
    dash = {e: ENGINE_LINESTYLES[i % len(ENGINE_LINESTYLES)] for i, e in enumerate(engines)}
    methods: List[str] = list(dict.fromkeys(c.method for c in table.cells))
    n = max(1, len(models))
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n, 3.9), squeeze=False)
    drawn_kinds, drawn_methods = set(), []
    for ax, model in zip(axes[0], models):
        cells = [c for c in table.cells if c.model == model]
        values = []
        for i, method in enumerate(methods):
            mc = sorted((c for c in cells if c.method == method), key=lambda c: c.gpus)
            if not mc:
                continue
            color = METHOD_COLORS.get(method, "tab:gray")
            nudge = 2 ** ((i - (len(methods) - 1) / 2) * DODGE_OCTAVES)
            pub = [c for c in mc if c.published is not None]
            if pub:  # points: a published figure is one number, not a range, and two cells' figures are not a line
                ax.plot([c.gpus * nudge for c in pub], [c.published for c in pub], color=color, **STYLE["published"])
                drawn_kinds.add("published")
                values += [c.published for c in pub]
            drawn = bool(pub)
            for engine in dict.fromkeys(c.engine for c in mc):  # never a line from one engine's point to another's
                drawn |= _engine_series(ax, [c for c in mc if c.engine == engine], color, nudge,
                                        dash.get(engine, "-"), len(engines) > 1, drawn_kinds, values)
            if drawn and method not in drawn_methods:
                drawn_methods.append(method)
        _log2_gpu_axis(ax, sorted({c.gpus for c in cells}))
        _log_minutes_axis(ax, values)
        ax.set_ylabel(f"minutes for {table.target_steps} steps (log scale)")
        ax.set_title(table.labels.get(model, model))
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], color=METHOD_COLORS.get(m, "tab:gray"), linewidth=2.5, label=table.labels.get(m, m))
               for m in drawn_methods]
    if len(engines) > 1:
        handles += [Line2D([], [], color="black", linestyle=dash[e], linewidth=1.5, label=f"engine={e}")
                    for e in engines]
    handles += _key_handles([k for k in ("measured", "extrapolated", "interval", "published", "predicted",
                                         "predicted range") if k in drawn_kinds])
    if handles:
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 3 if n == 1 else 7),
                   fontsize=8, frameon=False)
    fig.suptitle(table.title + caption(table), fontsize=10)
    fig.tight_layout()
    return fig


def _engine_series(ax, cells, color, nudge, dash, name_points, drawn_kinds, values) -> bool:
    """One method's cells of one engine: the plan's prediction (and its range) and this kit's points and line."""
    pred = [c for c in cells if c.predicted is not None]
    if pred:  # the step-time model's minutes for the cell as planned
        ax.plot([c.gpus * nudge for c in pred], [c.predicted for c in pred], color=color, **STYLE["predicted"])
        drawn_kinds.add("predicted")
        values += [c.predicted for c in pred]
    for c in pred:
        lo, hi = c.predicted_range or (None, None)
        if lo is not None and hi > lo:  # a range only where the plan gives one (low < high)
            ax.vlines(c.gpus * nudge, lo, hi, color=color, **STYLE["predicted range"])
            drawn_kinds.add("predicted range")
            values += [lo, hi]
    ours = [c for c in cells if c.ours is not None]
    if ours:
        ax.plot([c.gpus * nudge for c in ours], [c.ours for c in ours], color=color, linestyle=dash,
                linewidth=STYLE["measured"]["linewidth"], zorder=STYLE["measured"]["zorder"])
    for c in ours:
        kind = "extrapolated" if c.status == "extrapolated" else "measured"
        style = {k: v for k, v in STYLE[kind].items() if k not in ("linestyle", "linewidth")}
        ax.plot([c.gpus * nudge], [c.ours], color=color, linestyle="none", **style)
        if name_points:  # points from different engines: say which is which
            ax.annotate(c.engine, (c.gpus * nudge, c.ours), textcoords="offset points", xytext=(4, 3),
                        fontsize=6, color=color)
        drawn_kinds.add(kind)
        values.append(c.ours)
        if c.interval and c.interval[1] > c.interval[0]:
            ax.vlines(c.gpus * nudge, c.interval[0], c.interval[1], color=color, **STYLE["interval"])
            drawn_kinds.add("interval")
            values += list(c.interval)
    return bool(pred or ours)


def caption(table) -> str:
    """What the measured points are when they are not GPU runs: CPU, which model, which engine per point."""
    run = [c for c in table.cells if c.ours is not None]
    if not run:
        return ""
    engines = sorted({c.engine for c in run if c.engine})
    lines = []
    if any(c.hardware == "cpu" for c in run):
        lines.append(f"measured on this machine's CPU cores: a tiny {', '.join(sorted({c.model for c in run}))}; "
                     "'GPUs' are local processes sharing the cores (not H100 minutes)")
    if len(engines) > 1:
        lines.append("engine per point: " + ", ".join(
            f"{e} ({', '.join(sorted({f'{c.method} {c.gpus}' for c in run if c.engine == e}))})" for e in engines))
    elif engines:
        lines.append(f"engine: {engines[0]}")
    return "".join("\n" + ln for ln in lines)


def trace_png(log, est, title: Optional[str] = None) -> bytes:
    """:func:`trace_figure` as PNG bytes."""
    return _png(trace_figure(log, est, title))


def trace_figure(log, est, title: Optional[str] = None):
    """Step time per step with the excluded warm-up shaded and the steady mean and p5-p95 band."""
    plt = _pyplot()
    timed = log.timed
    steps = [s.step for s in timed]
    times = [s.timing_s for s in timed]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    w = est.warmup_steps
    if w:
        ax.axvspan(steps[0] - 0.5, steps[w - 1] + 0.5, color="tab:red", alpha=0.12,
                   label=f"warm-up excluded ({w} steps)")
    ax.axhspan(est.step_time_p5_s, est.step_time_p95_s, color="tab:green", alpha=0.15,
               label=f"steady p5-p95 ({est.step_time_p5_s:.3g}-{est.step_time_p95_s:.3g} s)")
    ax.axhline(est.step_time_mean_s, color="tab:green", linewidth=1.5,
               label=f"steady mean {est.step_time_mean_s:.3g} s")
    ax.plot(steps, times, ".-", color="tab:blue", linewidth=0.8, markersize=3, label="train_step_timing")
    ax.set_xlabel("global step")
    ax.set_ylabel("step time (s)")
    flag = "FLUCTUATING: " + est.fluctuation_reason if est.fluctuating else est.fluctuation_reason
    ax.set_title((title or log.source) + f"\n{len(times)} steps, CV {est.step_time_cv:.1%}, {flag}", fontsize=9)
    top = max(times + [est.step_time_p95_s]) if times else est.step_time_p95_s
    ax.set_ylim(0, top * 1.08)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
    return fig


def bars_png(t) -> bytes:
    """A ``rows`` table as grouped bars per row: predicted, this kit, published (the document's figure, side by side)."""
    short = {"roce": "RoCE", "tcp": "TCP", "ib": "IB"}
    size = {r.model: t.labels.get(r.model, r.model).split()[-2] if len(t.labels.get(r.model, r.model).split()) > 1
            else r.model for r in t.cells}  # "Llama 3.1 70B Instruct" -> "70B"
    labels = [f"{size[r.model]}, {r.nodes} node" + (f"s\n{short[r.transport]}" if r.nodes > 1 else "")
              if t.row_label == "size_nodes_transport" else t.labels.get(r.model, r.model) for r in t.cells]
    series = [("predicted", [r.predicted for r in t.cells]), ("this kit", [r.ours for r in t.cells]),
              ("published", [r.published for r in t.cells])]
    notes = {j: "does not fit" for j, r in enumerate(t.cells) if r.feasible is False}
    return grouped_bars_png(t.title, "minutes (3 epochs)" if t.unit == "minutes" else "seconds per epoch", labels,
                            series, notes)


def grouped_bars_png(title: str, ylabel: str, labels: Sequence[str],
                     series: Sequence[Tuple[str, Sequence[Optional[float]]]],
                     notes: Optional[Dict[int, str]] = None) -> bytes:
    """:func:`grouped_bars_figure` as PNG bytes."""
    return _png(grouped_bars_figure(title, ylabel, labels, series, notes))


def grouped_bars_figure(title: str, ylabel: str, labels: Sequence[str],
                        series: Sequence[Tuple[str, Sequence[Optional[float]]]],
                        notes: Optional[Dict[int, str]] = None):
    """Bars per row label, one bar per series (e.g. predicted / this kit / published), value printed on each.

    Series without any value are left out (and out of the legend); a missing value in a drawn series
    is a grey dash; ``notes`` (row index -> text, e.g. "does not fit") is written across that row.
    """
    plt = _pyplot()
    drawn = [(name, list(values)) for name, values in series if any(v is not None for v in values)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(labels)), 4.0))
    width = 0.8 / max(1, len(drawn))
    top = max([v for _, values in drawn for v in values if v is not None] or [1.0])
    for i, (name, values) in enumerate(drawn):
        xs = [j + (i - (len(drawn) - 1) / 2) * width for j in range(len(values))]
        ax.bar([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None], width,
               color=SERIES_COLORS.get(name, f"C{i}"), label=name)
        for x, v in zip(xs, values):
            if v is None:
                ax.text(x, 0, "–", ha="center", va="bottom", color="0.55", fontsize=9)
            else:
                ax.text(x, v + top * 0.01, f"{v:,.0f}" if v >= 100 else f"{v:.3g}", ha="center", va="bottom",
                        fontsize=7)
    for j, text in (notes or {}).items():  # across the row's own slot, level, above its dashes
        ax.text(j, top * 0.1, text, ha="center", va="bottom", fontsize=8, color="0.3")
    ax.set_xlim(-0.5, len(labels) - 0.5)  # every row's slot, also a last row without bars
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title="– : no figure", title_fontsize=7)
    return fig


def markdown_links(names: Sequence[str]) -> str:
    """A report's "Plots" section: the scaling / bar plots shown inline, each step-time trace linked."""
    pngs = [n for n in names if n.endswith(".png")]
    if not pngs:
        return ""
    main = [n for n in pngs if not n.startswith("trace_")]
    traces = [n for n in pngs if n.startswith("trace_")]
    out = ["", "## Plots", ""]
    out += [f"![{n[:-4]}]({n})" for n in main]
    if traces:
        out += ["", "Step-time traces (warm-up excluded, steady mean and p5-p95):", ""]
        out += [f"- [{n[len('trace_'):-4]}]({n})" for n in traces]
    return "\n".join(out) + "\n"

