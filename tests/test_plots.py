"""The report plots: legends off the data, only what is drawn in a legend, log2 GPUs, nothing hidden.

Each plot's figure is built (``*_figure``) and its artists inspected: where the legend's box lies against
every axes' box (in display pixels, after a draw), which legend labels exist, the axis scales, and the
drawn positions of points that would otherwise coincide. The PNG functions are the same figures saved.
"""
from __future__ import annotations

import random

import pytest

pytest.importorskip("matplotlib")

from vdkit.validation import plots  # noqa: E402
from vdkit.validation.tables import Cell, Table  # noqa: E402

LABELS = {"llama2_7b": "Llama 2 7B", "lora": "LoRA", "ptuning": "P-tuning", "sft": "SFT"}


def table(published=True, status="extrapolated") -> Table:
    """7B LoRA / P-tuning / SFT on 4, 8, 16 GPUs; LoRA measured exactly at the published figure."""
    pub = {("lora", 4): 102, ("lora", 8): 79, ("lora", 16): 39, ("ptuning", 4): 100, ("ptuning", 8): 78,
           ("ptuning", 16): 39, ("sft", 4): 380}
    cells = []
    for method in ("lora", "ptuning", "sft"):
        for gpus in (4, 8, 16):
            p = pub.get((method, gpus)) if published else None
            minutes = p if method == "lora" and p else 300.0 / gpus * (1.5 if method == "sft" else 1.0)
            cells.append(Cell("llama2_7b", gpus, method, status=status, ours=minutes,
                              interval=(minutes * 0.9, minutes * 1.1), published=p))
    return Table("table9", "Table 9. Time for model customization, 1000 steps (minutes)", "src", "grid", "minutes",
                 1000, cells, ["lora", "ptuning", "sft"], LABELS)


def boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return renderer, legends


def assert_legends_off_the_axes(fig):
    renderer, legends = boxes(fig)
    assert legends, "no legend"
    for legend in legends:
        lb = legend.get_window_extent(renderer)
        for ax in fig.axes:
            ab = ax.get_window_extent(renderer)
            assert not lb.overlaps(ab), f"legend {lb} lies on axes {ab}"


def legend_labels(fig):
    _, legends = boxes(fig)
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_scaling_legend_is_off_the_data_and_names_what_is_drawn():
    fig = plots.scaling_figure(table())
    assert_legends_off_the_axes(fig)
    labels = legend_labels(fig)
    assert {"LoRA", "P-tuning", "SFT", "published", "this kit, extrapolated", "this kit, 95 % interval"} <= set(labels)
    assert "this kit, measured" not in labels  # no measured cell: no such entry
    assert "published" not in " ".join(t.get_text() for t in fig.texts)  # the title promises nothing


def test_without_published_figures_nothing_says_published():
    fig = plots.scaling_figure(table(published=False, status="measured"))
    labels = legend_labels(fig)
    assert "published" not in labels and "this kit, measured" in labels
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_marker() == "x"]


def test_gpus_are_on_a_log2_axis_with_ticks_at_the_counts():
    fig = plots.scaling_figure(table())
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [4, 8, 16]
    assert ax.get_yscale() == "log"


def _points(ax, marker):
    """(x, y) of every drawn point with this marker."""
    return [(x, y) for line in ax.get_lines() if line.get_marker() == marker
            for x, y in zip(line.get_xdata(), line.get_ydata())]


def test_a_measured_point_equal_to_the_published_one_stays_visible():
    fig = plots.scaling_figure(table())
    (ax,) = fig.axes
    ours = [line for line in ax.get_lines() if line.get_marker() == "o"]
    published = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert ours and published
    assert min(line.get_zorder() for line in ours) > max(line.get_zorder() for line in published)
    # LoRA's 102 at 4 GPUs is both; the circle is on top, the published cross is a larger marker
    assert any(y == 102 for _, y in _points(ax, "o")) and any(y == 102 for _, y in _points(ax, "x"))
    assert max(line.get_markersize() for line in published) > max(line.get_markersize() for line in ours)


def test_equal_published_figures_of_two_methods_do_not_coincide():
    fig = plots.scaling_figure(table())
    (ax,) = fig.axes
    at_39 = [x for x, y in _points(ax, "x") if y == 39]  # LoRA and P-tuning both published 39 at 16 GPUs
    assert len(at_39) == 2 and abs(at_39[0] - at_39[1]) > 0.5  # nudged apart, around 16 on the log2 axis
    assert all(12 < x < 20 for x in at_39)


def test_trace_legend_is_off_the_data():
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.steps import StepLog, StepRecord

    rnd = random.Random(3)
    records = [StepRecord(step=i, timing_s=(2.0 if i < 3 else 1.0) + 0.3 * rnd.random()) for i in range(50)]
    log = StepLog(source="x.out", format="nemo1", steps=records)
    fig = plots.trace_figure(log, estimate_log(log, 1000), title="run")
    assert_legends_off_the_axes(fig)
    (ax,) = fig.axes
    assert ax.get_ylim()[1] >= max(r.timing_s for r in records)


def test_bars_leave_out_series_without_figures_and_keep_the_legend_off_the_bars():
    fig = plots.grouped_bars_figure("t", "minutes", ["a", "b", "c"],
                                    [("predicted", [1.0, 2.0, None]), ("this kit", [None, None, None]),
                                     ("published", [None, 2.5, 40.0])], notes={2: "does not fit"})
    assert_legends_off_the_axes(fig)
    assert legend_labels(fig) == ["predicted", "published"]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "40" in texts and "2.5" in texts and "does not fit" in texts and texts.count("–") == 2  # predicted c, published a
    # the note sits level inside its row's slot, even in the last row (the axes keep every row's slot)
    ax = fig.axes[0]
    note = next(t for t in ax.texts if t.get_text() == "does not fit")
    lo, hi = ax.get_xlim()
    assert note.get_rotation() == 0 and lo <= 1.5 < note.get_position()[0] < hi and hi >= 2.5


def test_markdown_links_every_plot():
    text = plots.markdown_links(["table9.md", "table9_scaling.png", "trace_a_1n8g.png", "trace_b_2n8g.png"])
    assert "![table9_scaling](table9_scaling.png)" in text
    assert "- [a_1n8g](trace_a_1n8g.png)" in text and "- [b_2n8g](trace_b_2n8g.png)" in text
    assert plots.markdown_links(["table9.md"]) == ""


def test_a_written_report_links_the_plots_it_wrote(tmp_path):
    from vdkit.validation import table_output

    written = table_output.write(table(), tmp_path)
    md = (tmp_path / "table9.md").read_text()
    pngs = [p.name for p in written if p.suffix == ".png"]
    assert pngs and all(f"({name})" in md for name in pngs)
    assert (tmp_path / "table9_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_hf_report_links_its_bar_plot(tmp_path):
    from vdkit.validation import table_output, tables

    t = tables.build("alpaca_opt", [])
    table_output.write(t, tmp_path)
    assert "(alpaca_opt.png)" in (tmp_path / "alpaca_opt.md").read_text()


def test_a_cpu_demo_plot_says_what_its_points_are():
    """Points measured on this machine's CPU say so, and which engine drew each when engines differ."""
    t = table(published=False)
    for c in t.cells:
        c.model, c.hardware = "tiny_llama", "cpu"
        c.engine = "bridge" if (c.method, c.gpus) == ("lora", 4) else "megatron"
    fig = plots.scaling_figure(t)
    title = fig._suptitle.get_text()
    assert "CPU cores" in title and "tiny tiny_llama" in title and "not H100 minutes" in title
    assert "bridge (lora 4)" in title and "megatron (" in title
    assert {a.get_text() for ax in fig.axes for a in ax.texts} == {"bridge", "megatron"}
    t.cells = [c for c in t.cells if c.engine == "megatron"]
    assert "engine: megatron" in plots.scaling_figure(t)._suptitle.get_text()  # one engine: no per-point labels


def test_a_cpu_runs_spread_is_not_flagged_below_the_cpu_threshold():
    from vdkit.validation.extrapolate import CPU_FLUCTUATION_CV, estimate_log
    from vdkit.validation.steps import StepLog, StepRecord

    rnd = random.Random(5)
    records = [StepRecord(step=i, timing_s=0.1 + 0.05 * rnd.random()) for i in range(50)]  # CV ~ 12 %
    log = StepLog(source="x.out", format="nemo1", steps=records)
    est, cpu_est = estimate_log(log, 1000), estimate_log(log, 1000, on_cpu=True)
    assert est.fluctuating and 0.10 < est.step_time_cv < CPU_FLUCTUATION_CV and not cpu_est.fluctuating
    on_gpu = plots.trace_figure(log, est, title="run").axes[0].get_title()
    on_cpu = plots.trace_figure(log, cpu_est, title="run").axes[0].get_title()
    assert "FLUCTUATING" in on_gpu and "FLUCTUATING" not in on_cpu and "spread of a CPU run" in on_cpu


def _demo_table():
    """The demo's mix: LoRA at 4 GPUs on Bridge, at 8 and 16 on megatron (each figure distinct), published too."""
    t = table()
    for c in t.cells:
        c.engine = "bridge" if (c.method, c.gpus) == ("lora", 4) else "megatron"
        c.ours *= 1.01  # LoRA's were equal to the published figures: distinct here, to tell the lines apart
        c.predicted = c.ours * 1.3 + c.gpus  # distinct from every other figure drawn
    return t


def _joined(ax):
    """The y values of every drawn line through two or more points (a line style, not markers alone)."""
    return [set(line.get_ydata()) for line in ax.get_lines()
            if len(line.get_xdata()) > 1 and line.get_linestyle() not in ("None", "none", "")]


def test_a_line_never_joins_two_engines():
    """Issue 36: the demo's scaling line joined a Bridge point to a megatron point. Each line holds one
    engine's figures (this kit's or the plan's), and the legend names each engine's line style."""
    t = _demo_table()
    fig = plots.scaling_figure(t)
    (ax,) = fig.axes
    by_engine = {e: {v for c in t.cells if c.engine == e for v in (c.ours, c.predicted)} for e in ("bridge", "megatron")}
    lines = _joined(ax)
    assert lines and all(any(ys <= values for values in by_engine.values()) for ys in lines), lines
    labels = legend_labels(fig)
    assert {"engine=bridge", "engine=megatron"} <= set(labels)
    styles = {h.get_label(): h.get_linestyle() for legend in fig.legends for h in legend.legend_handles}
    assert styles["engine=bridge"] != styles["engine=megatron"]


def test_published_figures_are_points_not_bands():
    """Issue 36: published figures were a wide pale band through the crosses, read as a range. Each is a
    cross, joined to nothing, and the legend's "published" entry is a cross without a line."""
    t = _demo_table()
    fig = plots.scaling_figure(t)
    (ax,) = fig.axes
    published = {c.published for c in t.cells if c.published is not None}
    assert not [ys for ys in _joined(ax) if ys & published]
    assert [line for line in ax.get_lines() if line.get_marker() == "x" and set(line.get_ydata()) <= published]
    (handle,) = [h for legend in fig.legends for h in legend.legend_handles if h.get_label() == "published"]
    assert handle.get_marker() == "x" and handle.get_linestyle() in ("None", "none", "")


def test_the_plans_range_is_a_bar_only_where_it_is_a_range():
    """The plan's low .. high is drawn as a vertical bar for a cell whose plan has a range, nothing for a
    point range (low = high) or none, and the legend names it only when one is drawn."""
    t = table(published=False, status="measured")
    for c in t.cells:
        c.interval, c.predicted = None, c.ours * 1.2
    lora = [c for c in t.cells if c.method == "lora"]
    lora[0].predicted_range = (lora[0].predicted * 0.8, lora[0].predicted * 1.5)
    lora[1].predicted_range = (lora[1].predicted, lora[1].predicted)  # a point, not a range
    fig = plots.scaling_figure(t)
    (ax,) = fig.axes
    segments = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert len(segments) == 1
    (x0, y0), (x1, y1) = segments[0]
    assert x0 == x1 and sorted((y0, y1)) == sorted(lora[0].predicted_range)
    assert "predicted range (vdkit plan)" in legend_labels(fig)
    lora[0].predicted_range = None
    assert "predicted range (vdkit plan)" not in legend_labels(plots.scaling_figure(t))


def test_a_planned_table_carries_the_plans_range():
    """tables.build fills each planned cell's range from its plan's interval (minutes, like its prediction)."""
    from vdkit.validation import tables

    t = tables.build("alpaca_opt")  # built by the test above too (its plans are cached)
    ranged = [c for c in t.cells if c.predicted_range]
    assert ranged and all(0 < lo < hi for c in ranged for lo, hi in [c.predicted_range])
