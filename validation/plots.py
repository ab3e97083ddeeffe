"""PNG plots for reports: minutes vs GPUs (ours next to published) and a run's step-time trace.

matplotlib is imported inside the functions (Agg backend, no display needed), so importing
this module costs nothing. Each function returns the PNG bytes; the caller decides where they go.
"""
from __future__ import annotations

import io
from typing import List, Optional

METHOD_COLORS = {"lora": "tab:blue", "ptuning": "tab:orange", "sft": "tab:green", "pretrain": "tab:purple"}


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


def scaling_png(table) -> bytes:
    """Minutes vs GPUs, one panel per model, one colour per method.

    Solid lines with filled markers: measured by this kit; hollow markers: extrapolated by this
    kit; dashed lines with crosses: published; dotted lines with plus signs: predicted by the
    step-time model (vdkit plan). Vertical bars: the 95 % interval.
    """
    plt = _pyplot()
    models: List[str] = []
    for c in table.cells:
        if c.model not in models:
            models.append(c.model)
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.6 * max(1, len(models)), 4.0), squeeze=False)
    for ax, model in zip(axes[0], models):
        cells = [c for c in table.cells if c.model == model]
        for method in dict.fromkeys(c.method for c in cells):
            color = METHOD_COLORS.get(method, "tab:gray")
            label = table.labels.get(method, method)
            mc = sorted((c for c in cells if c.method == method), key=lambda c: c.gpus)
            ours = [c for c in mc if c.minutes is not None]
            if ours:
                ax.plot([c.gpus for c in ours], [c.minutes for c in ours], "-", color=color,
                        label=f"{label} (this kit)")
                for c in ours:
                    hollow = c.status == "extrapolated"
                    ax.plot([c.gpus], [c.minutes], "o", color=color, markerfacecolor="white" if hollow else color)
                    if c.interval and c.interval[1] > c.interval[0]:
                        ax.vlines(c.gpus, c.interval[0], c.interval[1], color=color, linewidth=1)
            pub = [c for c in mc if c.published is not None]
            if pub:
                ax.plot([c.gpus for c in pub], [c.published for c in pub], "--x", color=color, alpha=0.7,
                        label=f"{label} (published)")
            pred = [c for c in mc if getattr(c, "predicted", None) is not None]
            if pred:  # the step-time model's minutes for the cell as planned (vdkit plan)
                ax.plot([c.gpus for c in pred], [c.predicted for c in pred], ":+", color=color, alpha=0.7,
                        label=f"{label} (predicted)")
        gpus = sorted({c.gpus for c in cells})
        ax.set_xticks(gpus)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(f"minutes for {table.target_steps} steps")
        ax.set_title(table.labels.get(model, model))
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{table.title}\nsolid, filled: measured by this kit; hollow: extrapolated by this kit; "
                 "dashed x: published; dotted +: predicted; bars: 95 % interval", fontsize=9, y=1.04)
    return _png(fig)


def trace_png(log, est, title: Optional[str] = None) -> bytes:
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
    flag = "FLUCTUATING: " + est.fluctuation_reason if est.fluctuating else "steady"
    ax.set_title((title or log.source) + f"\n{len(times)} steps, CV {est.step_time_cv:.1%}, {flag}", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return _png(fig)
