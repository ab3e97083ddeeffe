"""A built published table (:class:`vdkit.validation.tables.Table`) as files: Markdown, CSV, JSON, plots.

Each layout has its shape: ``grid`` (Table 9: model x GPUs rows, a column per method, each cell "this kit
/ published (ratio)"), ``nodes`` (Table 4: a row per cell with time and checkpoint size) and ``rows``
(the Alpaca OPT and MI300X tables: a row per cell with its plan, memory and fit, in the source's unit).
:func:`write` writes any of them, each file whole or not at all.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Dict, List, Optional

from vdkit.errors import UserError
from vdkit.validation.extrapolate import CPU_FLUCTUATION_CV
from vdkit.validation.tables import NOT_PUBLISHED_MARK, Cell, Table


def _r(x, nd=2):
    return None if x is None else round(float(x), nd)


def _minutes(x: Optional[float]) -> str:
    if x is None:
        return "N/A"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _ours(cell: Cell) -> str:
    if cell.status == "infeasible":
        return "N/A"
    if cell.status in ("diverged", "cancelled"):
        return cell.status
    if cell.ours is None:
        return "—" if cell.status == "not run" else "no timing"
    text = _minutes(cell.ours)
    if cell.status == "extrapolated":
        text += " [e]"
    if cell.fluctuating:
        text += " [f]"
    return text


def _pub(cell: Cell) -> str:
    if cell.published is None:
        return "N/A" if cell.published_na else NOT_PUBLISHED_MARK
    return cell.published_text + (f" [{cell.published_footnote}]" if cell.published_footnote else "")


def _cell_md(cell: Cell) -> str:
    ratio = f" ({cell.ratio:.2f}×)" if cell.ratio is not None else ""
    return f"{_ours(cell)} / {_pub(cell)}{ratio}"


def _predicted_md(cell: Cell) -> str:
    speedup = (f" ({cell.published / cell.predicted_fast:.0f}×)"
               if cell.published and cell.predicted_fast else "")
    return f"{_pub(cell)} / {_minutes(cell.predicted)} / {_minutes(cell.predicted_fast)}{speedup}"


def _grid(table: Table, cell_md) -> List[str]:
    """Model x GPUs rows, one column per method, each cell ``cell_md(cell)``."""
    out = ["| model | GPUs | " + " | ".join(table.labels.get(m, m) for m in table.columns) + " |",
           "| --- | ---: |" + " ---: |" * len(table.columns)]
    rows: Dict[tuple, Dict[str, Cell]] = {}
    for c in table.cells:
        rows.setdefault((c.model, c.gpus), {})[c.method] = c
    for (model, gpus), by_method in rows.items():
        out.append(f"| {table.labels.get(model, model)} | {gpus} | "
                   + " | ".join(cell_md(by_method[m]) for m in table.columns) + " |")
    return out


def _nodes(table: Table) -> List[str]:
    out = [f"| model | method | XE9680 nodes | GPUs | time for {table.target_steps} steps (min) "
           "| predicted (min) | checkpoint size (GB) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in table.cells:
        ck = "—" if c.checkpoint_gb is None else (f"{c.checkpoint_gb:,.0f}" if c.checkpoint_gb >= 10
                                                  else f"{c.checkpoint_gb:.3g}")
        pub_ck = NOT_PUBLISHED_MARK if c.published_checkpoint_gb is None else f"{c.published_checkpoint_gb:,g}"
        ck_ratio = (f" ({c.checkpoint_gb / c.published_checkpoint_gb:.2f}×)"
                    if c.checkpoint_gb is not None and c.published_checkpoint_gb else "")
        out.append(f"| {table.labels.get(c.model, c.model)} | {c.method} | {c.nodes} | {c.gpus} | {_cell_md(c)} "
                   f"| {_minutes(c.predicted)} | {ck} / {pub_ck}{ck_ratio} |")
    return out


def _grid_or_nodes_markdown(table: Table) -> str:
    """Table 9 / Table 4: each cell 'ours / published (ratio)', footnotes under it."""
    out = [f"## {table.title} — this kit next to the published figures", ""]
    out += _grid(table, _cell_md) if table.layout == "grid" else _nodes(table)
    out += ["", "Each cell: this kit / published (ratio this kit ÷ published). "
            f"Minutes for {table.target_steps} steps of `train_step_timing` only: model load, data load, "
            "validation and checkpoint saving excluded.", "",
            f"- [e] extrapolated by this kit from the measured steps to {table.target_steps} "
            "(warm-up once + steady mean; see `vdkit validate`).",
            "- [f] fluctuating step times (CV over 10 % or a significant drift; a run on CPU only over "
            f"{CPU_FLUCTUATION_CV:.0%}: its spread is the shared cores' scheduling, not the run).",
            "- diverged: every loss of the run is NaN or infinite; its step times are no figure.",
            "- cancelled: the run was cancelled (`vdkit cancel`, or `scancel`) before its last step; its steps are no figure "
            "(`vdkit validate` still extrapolates them, saying so).",
            "- N/A: the planner says the layout does not fit (this kit) or the guide printed N/A (published). "
            "—: not run.",
            f"- {NOT_PUBLISHED_MARK}: the guide publishes no figure for this cell (a model or layout outside it, "
            "such as the demo's tiny_llama)."]
    out += [f"- [{k.split(' ', 1)[1]}] {v} (published)." for k, v in table.labels.items()
            if k.startswith("footnote ")]
    if table.layout == "grid" and any(c.predicted_fast is not None for c in table.cells):
        out += ["", "### Published, predicted (the guide's recipe) and predicted (the fast recipe, same samples)", ""]
        out += _grid(table, _predicted_md)
        out += ["", "Each cell: published / predicted for the guide's recipe / predicted for the fast recipe "
                "(`recipe=fast`: packed sequences - P-tuning unpacked, NeMo cannot pack it -, fused kernels, the model's "
                "layout) on the same samples, minutes "
                "(`vdkit plan --sweep` of the table's sweeps; the model: `benchmarks/bench_prediction.py`)."]
    for c in table.cells:
        if c.status in ("infeasible", "no timing", "diverged", "cancelled") and c.reason:
            out.append(f"- {table.labels.get(c.model, c.model)}, {c.gpus} GPUs, {c.method}: {c.status}: {c.reason}")
    out += ["", f"Published source: {table.source}", ""]
    return "\n".join(out)


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def _transport(c: Cell) -> str:
    return "—" if c.nodes == 1 else {"roce": "RoCE", "tcp": "no RoCE (TCP)", "ib": "InfiniBand"}[c.transport]


def _rows_markdown(t: Table) -> str:
    """The document's shape: one row per model (white paper) or per model x nodes x RoCE (blog)."""
    unit = "min, 3 epochs" if t.unit == "minutes" else "s per epoch"
    out = [f"## {t.title} — this kit next to the published figures", ""]
    out.append(f"| model | params (B) | nodes | GPUs | inter-node | plan: memory per GPU (GB) | "
               f"predicted ({unit}) | this kit ({unit}) | published ({unit}) | ratio |")
    out.append("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for r in t.cells:
        fit = ("not run" if r.memory_gb is None else
               f"{r.memory_gb:.1f} of {r.gpu_memory_gb:g}" + ("" if r.feasible else " — DOES NOT FIT"))
        ours = _fmt(r.ours) + (" [e]" if r.status == "extrapolated" else "")
        if r.status == "cancelled":
            ours = "cancelled"
        if r.feasible is False:
            ours = "N/A"
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else (
            f"pred. {r.predicted_ratio:.2f}×" if r.predicted_ratio is not None else "—")
        out.append(f"| {t.labels.get(r.model, r.model)} | {r.params_b:.3g} | {r.nodes} | {r.gpus} | {_transport(r)} | "
                   f"{fit} | {_fmt(r.predicted)} | {ours} | {r.published_text} | {ratio} |")
    out += ["", f"Times: {unit} of training steps only (model load, checkpointing and evaluation excluded). "
            "[e]: extrapolated by this kit from the measured steps to the cell's steps (`vdkit validate`). "
            "Predicted: the kit's step-time model (— when it gives none). Ratio: this kit ÷ published.", ""]
    for r in t.cells:
        if r.feasible is False or r.status == "cancelled":
            out.append(f"- {t.labels.get(r.model, r.model)}, {r.nodes} node(s): {r.reason}")
    out += ["", f"Published source: {t.source}", ""]
    return "\n".join(out)


def to_markdown(table: Table) -> str:
    """Any built table as Markdown, in its layout's shape."""
    return _rows_markdown(table) if table.layout == "rows" else _grid_or_nodes_markdown(table)


# ----------------------------------------------------------------------------- CSV and JSON
def cell_dict(table: Table, c: Cell) -> dict:
    """One cell as the JSON and CSV name its fields (per layout)."""
    if table.layout == "rows":
        return {"model": c.model, "nodes": c.nodes, "gpus": c.gpus, "transport": c.transport,
                "params_b": _r(c.params_b, 3), "feasible": c.feasible, "memory_per_gpu_gb": _r(c.memory_gb, 1),
                "gpu_memory_gb": c.gpu_memory_gb, "reason": c.reason or None, "target_steps": c.target_steps,
                "predicted": _r(c.predicted), "ours": _r(c.ours), "ours_status": c.status,
                "published": _r(c.published, 6), "published_text": c.published_text, "ratio": _r(c.ratio, 3),
                "predicted_ratio": _r(c.predicted_ratio, 3), "runs": c.runs}
    return {"model": c.model, "gpus": c.gpus, "nodes": c.nodes, "method": c.method,
            "status": c.status, "minutes": _r(c.ours),
            "interval_minutes": [_r(x) for x in c.interval] if c.interval else None,
            "fluctuating": c.fluctuating, "published_minutes": c.published,
            "published_footnote": c.published_footnote or None, "published_na": c.published_na,
            "published_status": c.published_status,
            "ratio": _r(c.ratio, 3), "checkpoint_gb": _r(c.checkpoint_gb),
            "published_checkpoint_gb": c.published_checkpoint_gb, "reason": c.reason or None,
            "predicted_minutes": _r(c.predicted), "predicted_fast_minutes": _r(c.predicted_fast),
            "runs": c.runs}


def to_dict(table: Table) -> dict:
    """The table as its JSON file holds it."""
    head = {"table": table.name, "title": table.title, "published_source": table.source}
    if table.layout == "rows":
        return {**head, "unit": table.unit, "rows": [cell_dict(table, c) for c in table.cells],
                "warnings": table.warnings}
    return {**head, "target_steps": table.target_steps, "cells": [cell_dict(table, c) for c in table.cells],
            "warnings": table.warnings}


CSV_FIELDS = ("model", "gpus", "nodes", "method", "status", "minutes", "interval_lo", "interval_hi", "fluctuating",
              "published_minutes", "published_status", "published_footnote", "ratio", "checkpoint_gb",
              "published_checkpoint_gb", "predicted_minutes", "predicted_fast_minutes", "reason", "runs")
ROWS_CSV_FIELDS = ("model", "params_b", "nodes", "gpus", "transport", "feasible", "memory_per_gpu_gb",
                   "gpu_memory_gb", "target_steps", "predicted", "ours", "ours_status", "published", "published_text",
                   "ratio", "predicted_ratio", "reason", "runs")


def to_csv(table: Table) -> str:
    """One line per cell (the layout's fields)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=ROWS_CSV_FIELDS if table.layout == "rows" else CSV_FIELDS,
                       lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for c in table.cells:
        d = cell_dict(table, c)
        lo, hi = d.pop("interval_minutes", None) or (None, None)
        d.update(interval_lo=lo, interval_hi=hi, runs=";".join(d["runs"]))
        w.writerow(d)
    return buf.getvalue()


# ----------------------------------------------------------------------------- files
def plot_files(table: Table) -> Dict[str, bytes]:
    """The table's PNG plots: a rows table's grouped bars; else the scaling plot and each timed run's trace."""
    from vdkit.run.create import safe_dir_name
    from vdkit.validation import plots

    if table.layout == "rows":
        return {f"{table.name}.png": plots.bars_png(table)}
    files = {f"{table.name}_scaling.png": plots.scaling_png(table)}
    for res in table.results:
        if res.estimate is not None:
            r = res.plan.recipe if res.plan is not None else None
            what = f" - engine {r.engine.name}, {'CPU (local processes)' if r.cluster.gpu_type == 'cpu' else r.cluster.gpu_type}" if r else ""
            files[f"trace_{safe_dir_name(Path(res.path).name)}.png"] = plots.trace_png(
                res.log, res.estimate, title=Path(res.path).name + what)
    return files


def write(table: Table, out_dir, plots: bool = True) -> List[Path]:
    """NAME.md, NAME.csv, NAME.json (and with ``plots`` the PNGs, linked from the Markdown) in ``out_dir``."""
    from vdkit.validation.plots import markdown_links

    extra = plot_files(table) if plots else {}
    files = {f"{table.name}.md": (to_markdown(table) + markdown_links(list(extra))).encode(),
             f"{table.name}.csv": to_csv(table).encode(),
             f"{table.name}.json": (json.dumps(to_dict(table), indent=2) + "\n").encode(), **extra}
    return write_files(out_dir, files, report=table.name)


def write_files(out_dir, files: Dict[str, bytes], report: str = "report") -> List[Path]:
    """Write ``files`` (name -> bytes) into ``out_dir``; returns the paths.

    Each file is written to a temporary name and renamed, so a failure leaves no half-written file.
    The files an earlier report of the same table wrote there and this one does not (trace plots of
    runs no longer in it, e.g. a re-run `vdkit demo`) are removed: the directory shows one report.
    The list lives in a hidden manifest per ``report`` (the table's name: ``.<report>.files``), so two
    tables' reports can share a directory; files the kit did not write are never touched.
    """
    from vdkit.composition.files import replace_all
    from vdkit.run.create import missing_parents, remove_empty

    out = Path(out_dir)
    created = missing_parents(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create report directory {out}: {exc.strerror}",
                        "pass --out DIR pointing at a writable directory") from None
    manifest = out / f".{report}.files"
    try:
        before = set(json.loads(manifest.read_text()))
    except (OSError, ValueError):
        before = set()
    # All or nothing: every file and the manifest are complete before any is renamed into place, so a
    # full disk leaves the previous report (or nothing) behind.
    contents = {**files, manifest.name: (json.dumps(sorted(files)) + "\n").encode()}
    try:
        replace_all(out, contents)
    except BaseException:
        if created:
            remove_empty(created)
        raise
    written = [out / name for name in files]
    for stale in sorted(before - set(files)):
        if "/" not in stale and not stale.startswith("."):  # a name we wrote, inside out_dir
            (out / stale).unlink(missing_ok=True)
    return written
