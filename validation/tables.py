"""Published tables as data, and the one builder that rebuilds any of them from run directories.

A published table is one YAML, ``validation/published/<name>.yaml``: its source, its figures as cells,
and how it is arranged (``layout``) and planned (``sweep``: the cells' recipes, conf/sweep/<sweep>.yaml).
The file is the registration: :func:`table_names` lists them, :func:`spec` reads one (an unknown name
is one line, exit 2); :func:`vdkit.validation.report.build` arranges run directories into any of them
and :func:`vdkit.validation.report.markdown` renders it. Layouts (``LAYOUTS``):

- ``grid``: rows model x GPUs, one column per method (Table 9);
- ``nodes``: one row per model and node count, time and checkpoint size (Table 4);
- ``rows``: one row per sweep cell with its plan, memory and fit (the Alpaca OPT and MI300X Llama 3.1
  tables, :mod:`vdkit.validation.hf_tables`).

``collect_runs`` reads each run directory once (recipe, plan, logs, estimate). Run directories bring
their own plan (``plan.json``, the prediction included); only a table built without runs (the planned
table) plans its sweep's cells.
"""
from __future__ import annotations

import csv
import difflib
import io
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from vdkit.errors import UserError

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
NOT_PUBLISHED = "not published"  # a cell the guide has no figure for (not its "N/A")
NOT_PUBLISHED_MARK = "n/p"  # how the Markdown table shows it
LAYOUTS = ("grid", "nodes", "rows")
DEFAULT_TABLE = "table9"  # what `vdkit report` and `vdkit demo` rebuild unless told otherwise


def table_names(folder: Optional[Path] = None) -> Tuple[str, ...]:
    """Every published table: the stems of validation/published/*.yaml."""
    return tuple(sorted(p.stem for p in (folder or PUBLISHED_DIR).glob("*.yaml")))


def load_published(name: str, folder: Optional[Path] = None) -> dict:
    """The published table ``name`` (validation/published/NAME.yaml) as data; UserError for an unknown name."""
    import yaml

    folder = folder or PUBLISHED_DIR
    path = folder / f"{name}.yaml"
    # a name, never a path (`--table ../published/table9` would read whatever the path reaches)
    if name not in table_names(folder) or not path.is_file():
        close = difflib.get_close_matches(str(name).lower(), table_names(folder), n=1)
        raise UserError(f"--table {name!r}: no published table by that name"
                        + (f" (did you mean {close[0]}?)" if close else ""),
                        f"use one of: {', '.join(table_names(folder))} (`vdkit list tables`)")
    return yaml.safe_load(path.read_text())


def spec(name: str, folder: Optional[Path] = None) -> dict:
    """:func:`load_published`, checked as a table spec: a known ``layout`` and a ``sweep``."""
    data = load_published(name, folder)
    if data.get("layout") not in LAYOUTS or not data.get("sweep"):
        raise UserError(f"published table {name!r} has layout={data.get('layout')!r} sweep={data.get('sweep')!r}",
                        f"give it layout: one of {', '.join(LAYOUTS)}, and sweep: the conf/sweep/ file of its cells")
    return data


@dataclass
class RunResult:
    """What one run directory contributes to a table."""

    path: str
    model: str
    method: str
    gpus: int
    nodes: int
    feasible: bool
    reason: str = ""
    checkpoint_gb: Optional[float] = None
    log: object = None  # validation.logs.StepLog
    estimate: object = None  # validation.extrapolate.Estimate
    error: str = ""  # why there is no estimate (no timing yet, ...)
    predicted_minutes: Optional[float] = None  # the step-time model's minutes for the table's steps
    warnings: List[str] = field(default_factory=list)


def collect_run(path, target_steps: int) -> RunResult:
    """Recipe, plan, step log and estimate of one run directory (for ``target_steps``)."""
    from vdkit.rundir import load_recipe
    from vdkit.rundir import RECIPE_FILE, load_plan
    from vdkit.validation.extrapolate import estimate_log
    from vdkit.validation.logs import read_source

    path = Path(path)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"{path} is not a run directory (no {RECIPE_FILE})",
                        "pass run directories written by `vdkit render` / `vdkit run`, e.g. runs/*")
    recipe = load_recipe(path)
    res = RunResult(str(path), recipe.model.name, recipe.method.name, recipe.world_size, recipe.cluster.nodes, True)
    try:
        plan = load_plan(path)  # the plan the run was rendered with, never re-planned
        res.feasible, res.reason, res.checkpoint_gb = plan.feasible, plan.reason or "", plan.checkpoint_gb
        if plan.prediction is not None:  # plan.json's own prediction, for the table's steps
            res.predicted_minutes = plan.prediction.step_seconds * target_steps / 60.0
    except UserError as exc:
        # An unreadable plan.json says nothing about fitting ("N/A" would claim it does not fit): the
        # run's measured steps still count; only the predicted column stays blank.
        res.warnings.append(f"{exc.what}: its predicted minutes are left blank (the measured steps still count)")
    if not res.feasible:
        return res
    try:
        res.log = read_source(path)
        res.warnings += list(res.log.warnings)
        res.estimate = estimate_log(res.log, target_steps)
        res.warnings += res.estimate.data_warnings
    except UserError as exc:
        res.error = str(exc)
        res.warnings.append(f"{path}: no steps to report yet ({exc.what})")
    return res


def collect_runs(paths, target_steps: int) -> List[RunResult]:
    """:func:`collect_run` for each run directory, each read once (a directory given twice, however spelled,
    would count its steps twice in a cell)."""
    seen: Dict[Path, str] = {}
    results, twice = [], []
    for p in paths:
        real = Path(p).resolve()
        if real in seen:
            twice.append(f"{p} (as {seen[real]})")
            continue
        seen[real] = str(p)
        results.append(collect_run(p, target_steps))
    if twice and results:
        results[0].warnings.insert(0, f"run directories given twice were read once: {', '.join(twice)}")
    return results


# ----------------------------------------------------------------------------- cells
@dataclass
class Cell:
    """One (model, GPUs, method) cell: ours next to the published figure."""

    model: str
    gpus: int
    method: str
    nodes: Optional[int] = None
    status: str = "not run"  # measured | extrapolated | infeasible | no timing | not run
    minutes: Optional[float] = None
    interval: Optional[Tuple[float, float]] = None
    fluctuating: bool = False
    published: Optional[float] = None
    published_footnote: str = ""
    published_na: bool = False  # the guide printed N/A
    reason: str = ""
    runs: List[str] = field(default_factory=list)
    checkpoint_gb: Optional[float] = None
    published_checkpoint_gb: Optional[float] = None
    predicted: Optional[float] = None  # minutes the step-time model predicts for the cell as run (guide recipe)
    predicted_fast: Optional[float] = None  # minutes for the same samples with the fast recipe (table9_fast)

    @property
    def published_status(self) -> str:
        """'figure', 'N/A' (the guide printed N/A) or 'not published' (the guide has no such cell)."""
        if self.published is not None:
            return "figure"
        return "N/A" if self.published_na else NOT_PUBLISHED

    @property
    def ratio(self) -> Optional[float]:
        if self.minutes is None or not self.published:
            return None
        return self.minutes / self.published

    def to_dict(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "nodes": self.nodes, "method": self.method,
                "status": self.status, "minutes": _r(self.minutes),
                "interval_minutes": [_r(x) for x in self.interval] if self.interval else None,
                "fluctuating": self.fluctuating, "published_minutes": self.published,
                "published_footnote": self.published_footnote or None, "published_na": self.published_na,
                "published_status": self.published_status,
                "ratio": _r(self.ratio, 3), "checkpoint_gb": _r(self.checkpoint_gb),
                "published_checkpoint_gb": self.published_checkpoint_gb, "reason": self.reason or None,
                "predicted_minutes": _r(self.predicted), "predicted_fast_minutes": _r(self.predicted_fast),
                "runs": self.runs}


def _r(x, nd=2):
    return None if x is None else round(float(x), nd)


def _fill(cell: Cell, runs: List[RunResult], warnings: List[str]) -> None:
    """Put the best run of a cell into it: the one with the most timed steps."""
    if not runs:
        return
    cell.runs = [r.path for r in runs]
    cell.nodes = runs[0].nodes
    if runs[0].predicted_minutes is not None:
        cell.predicted = runs[0].predicted_minutes
    cell.checkpoint_gb = runs[0].checkpoint_gb
    if not runs[0].feasible:
        cell.status, cell.reason = "infeasible", runs[0].reason
        return
    timed = [r for r in runs if r.estimate is not None]
    if not timed:
        cell.status, cell.reason = "no timing", runs[0].error
        return
    best = max(timed, key=lambda r: r.estimate.steps_measured)
    if len(timed) > 1:
        warnings.append(f"{len(timed)} runs for {cell.model} {cell.method} on {cell.gpus} GPUs; "
                        f"using {best.path} (most measured steps)")
    e = best.estimate
    cell.status = "extrapolated" if e.extrapolated else "measured"
    cell.minutes, cell.interval, cell.fluctuating = e.extrapolated_minutes, tuple(e.interval_minutes), e.fluctuating


@dataclass
class Table:
    """A rebuilt table: its cells in row order, the published source and footnotes."""

    name: str
    title: str
    source: str
    target_steps: int
    cells: List[Cell]
    columns: List[str]  # methods (table9) or ["time"] (training)
    labels: Dict[str, str]
    warnings: List[str] = field(default_factory=list)
    layout: str = "grid"  # how it is arranged and rendered (LAYOUTS)
    results: List[RunResult] = field(default_factory=list, repr=False)  # the run directories read (for plots)

    def to_dict(self) -> dict:
        return {"table": self.name, "title": self.title, "published_source": self.source,
                "target_steps": self.target_steps, "cells": [c.to_dict() for c in self.cells],
                "warnings": self.warnings}


def _model_order(published_models: Dict[str, str], names) -> List[str]:
    known = [m for m in published_models if m in names]
    return known + sorted(n for n in names if n not in published_models)


@lru_cache(maxsize=8)
def _world_sizes(sweep: str) -> Dict[tuple, int]:
    """(model, nodes) -> GPUs of every cell of ``sweep`` (composed only)."""
    from vdkit.config import compose, sweep_cells

    return {(r.model.name, r.cluster.nodes): r.world_size for r in (compose(c) for c in sweep_cells(sweep))}


def _planned(sweep: str) -> Dict[tuple, object]:
    """(model, GPUs, method, nodes) -> the plan's prediction of every cell of ``sweep`` (the planned table)."""
    from vdkit.config import compose, sweep_cells
    from vdkit.plan import make_plan  # only the planned table plans: run directories bring their plan.json

    out = {}
    for overrides in sweep_cells(sweep):
        plan = make_plan(compose(overrides))
        r = plan.recipe
        out[(r.model.name, r.world_size, r.method.name, r.cluster.nodes)] = plan.prediction
    return out


@lru_cache(maxsize=8)
def grid_predictions(sweep: str, alternative: Optional[str], steps: int) -> Dict[tuple, Tuple[Optional[float], Optional[float]]]:
    """(model, GPUs, method) -> (predicted minutes of ``sweep``'s recipe for ``steps`` steps, predicted
    minutes of the ``alternative`` sweep's recipe for the same samples)."""
    guide = {k[:3]: v for k, v in _planned(sweep).items()}
    other = {k[:3]: v for k, v in _planned(alternative).items()} if alternative else {}
    out = {}
    for key, g in guide.items():
        samples = g.step.samples_per_step * steps if g else None
        f = other.get(key)
        out[key] = (g.step.total_s * steps / 60.0 if g else None,
                    f.minutes_for_samples(samples) if (f and samples) else None)
    return out


def grid_table(pub: dict, results: List[RunResult]) -> Table:
    """A ``grid`` table (Table 9: model x GPUs rows, one column per method of ``pub["methods"]``).

    Rows: every published row of a model that appears among the runs, plus every run's own row
    (models outside the source, such as tiny_llama, get rows with N/A published figures); with no runs,
    every published row (the planned table: predictions next to the published figures).
    """
    methods = tuple(pub["methods"])
    warnings: List[str] = []
    by_cell: Dict[tuple, List[RunResult]] = {}
    for r in results:
        if r.method not in methods:
            warnings.append(f"{r.path}: method {r.method} is not a column of {pub['table']} "
                            f"({', '.join(pub['methods'].values())}); skipped")
            continue
        by_cell.setdefault((r.model, r.gpus, r.method), []).append(r)
    published = {(c["model"], int(c["gpus"]), c["method"]): c for c in pub["cells"]}
    # No runs at all: the planned table (every published row, predicted next to published).
    models = {m for m, _, _ in by_cell} if results else set(pub["models"])
    rows = sorted({(m, g) for m, g, _ in published if m in models} | {(m, g) for m, g, _ in by_cell})
    order = _model_order(pub["models"], models)
    rows.sort(key=lambda mg: (order.index(mg[0]), mg[1]))
    # Predictions of cells that were run come from their plan.json (_fill); only the planned table (no
    # runs) plans the published cells themselves.
    predictions = (grid_predictions(pub["sweep"], pub.get("alternative_sweep"), int(pub["steps"]))
                   if not results else {})
    cells = []
    for model, gpus in rows:
        for method in methods:
            cell = Cell(model, gpus, method)
            cell.predicted, cell.predicted_fast = predictions.get((model, gpus, method), (None, None))
            p = published.get((model, gpus, method))
            if p is not None:
                cell.published = p.get("minutes")
                cell.published_na = p.get("minutes") is None
                cell.published_footnote = str(p.get("footnote") or "")
            _fill(cell, by_cell.get((model, gpus, method), []), warnings)
            cells.append(cell)
    for r in results:
        warnings.extend(r.warnings)
    return Table(pub["table"], pub["title"], pub["source"].strip(), int(pub["steps"]), cells, list(methods),
                 {**pub["methods"], **pub["models"],
                  **{f"footnote {k}": v for k, v in (pub.get("footnotes") or {}).items()}},
                 warnings, layout="grid", results=list(results))


def nodes_table(pub: dict, results: List[RunResult]) -> Table:
    """A ``nodes`` table (Table 4): time for the table's steps per model and node count, checkpoint size."""
    warnings: List[str] = []
    by_cell: Dict[tuple, List[RunResult]] = {}
    for r in results:
        by_cell.setdefault((r.model, r.nodes, r.method), []).append(r)
    published = {(c["model"], int(c["nodes"])): c for c in pub["cells"]}
    models = {m for m, _, _ in by_cell} if results else set(pub["models"])  # no runs: the planned table
    keys = {(m, n, "pretrain") for (m, n) in published if m in models} | set(by_cell)
    order = _model_order(pub["models"], {k[0] for k in keys})
    planned = {} if results else _planned(pub["sweep"])  # runs: their own plan.json
    steps = int(pub["steps"])
    gpus_of = _world_sizes(pub["sweep"])  # composed, not planned: a published row's GPUs
    cells = []
    for model, nodes, method in sorted(keys, key=lambda k: (order.index(k[0]), k[1], k[2])):
        runs = by_cell.get((model, nodes, method), [])
        gpus = runs[0].gpus if runs else gpus_of.get((model, nodes))
        cell = Cell(model, gpus, method, nodes=nodes)
        pred = next((v for k, v in planned.items() if (k[0], k[3], k[2]) == (model, nodes, method)), None)
        cell.predicted = pred.step_seconds * steps / 60 if pred else None
        p = published.get((model, nodes)) if method == "pretrain" else None
        if p is not None:
            cell.published, cell.published_checkpoint_gb = p["minutes"], p["checkpoint_gb"]
        _fill(cell, runs, warnings)
        cells.append(cell)
    for r in results:
        warnings.extend(r.warnings)
    return Table(pub["table"], pub["title"], pub["source"].strip(), int(pub["steps"]), cells, ["time"],
                 dict(pub["models"]), warnings, layout="nodes", results=list(results))


# ----------------------------------------------------------------------------- rendering
def _ours(cell: Cell) -> str:
    if cell.status == "infeasible":
        return "N/A"
    if cell.minutes is None:
        return "—" if cell.status == "not run" else "no timing"
    text = f"{cell.minutes:.3g}" if cell.minutes < 100 else f"{cell.minutes:.0f}"
    if cell.status == "extrapolated":
        text += " [e]"
    if cell.fluctuating:
        text += " [f]"
    return text


def _pub(cell: Cell) -> str:
    if cell.published is None:
        return "N/A" if cell.published_na else NOT_PUBLISHED_MARK
    text = f"{cell.published:g}"
    return text + (f" [{cell.published_footnote}]" if cell.published_footnote else "")


def _minutes(x: Optional[float]) -> str:
    if x is None:
        return "N/A"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _predicted_md(cell: Cell) -> str:
    speedup = (f" ({cell.published / cell.predicted_fast:.0f}×)"
               if cell.published and cell.predicted_fast else "")
    return f"{_pub(cell)} / {_minutes(cell.predicted)} / {_minutes(cell.predicted_fast)}{speedup}"


def _cell_md(cell: Cell) -> str:
    ratio = f" ({cell.ratio:.2f}×)" if cell.ratio is not None else ""
    return f"{_ours(cell)} / {_pub(cell)}{ratio}"


def to_markdown(table: Table) -> str:
    """The table as Markdown: each cell 'ours / published (ratio)', footnotes under it."""
    out = [f"## {table.title} — this kit next to the published figures", ""]
    if table.layout == "grid":
        out.append("| model | GPUs | " + " | ".join(table.labels.get(m, m) for m in table.columns) + " |")
        out.append("| --- | ---: |" + " ---: |" * len(table.columns))
        rows: Dict[tuple, Dict[str, Cell]] = {}
        for c in table.cells:
            rows.setdefault((c.model, c.gpus), {})[c.method] = c
        for (model, gpus), by_method in rows.items():
            out.append(f"| {table.labels.get(model, model)} | {gpus} | "
                       + " | ".join(_cell_md(by_method[m]) for m in table.columns) + " |")
    else:
        out.append(f"| model | method | XE9680 nodes | GPUs | time for {table.target_steps} steps (min) "
                   "| predicted (min) | checkpoint size (GB) |")
        out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for c in table.cells:
            ck = "—" if c.checkpoint_gb is None else (f"{c.checkpoint_gb:,.0f}" if c.checkpoint_gb >= 10
                                                      else f"{c.checkpoint_gb:.3g}")
            pub_ck = NOT_PUBLISHED_MARK if c.published_checkpoint_gb is None else f"{c.published_checkpoint_gb:,g}"
            ck_ratio = (f" ({c.checkpoint_gb / c.published_checkpoint_gb:.2f}×)"
                        if c.checkpoint_gb is not None and c.published_checkpoint_gb else "")
            out.append(f"| {table.labels.get(c.model, c.model)} | {c.method} | {c.nodes} | {c.gpus} | {_cell_md(c)} "
                       f"| {_minutes(c.predicted)} | {ck} / {pub_ck}{ck_ratio} |")
    out += ["", "Each cell: this kit / published (ratio this kit ÷ published). "
            f"Minutes for {table.target_steps} steps of `train_step_timing` only: model load, data load, "
            "validation and checkpoint saving excluded.", "",
            f"- [e] extrapolated by this kit from the measured steps to {table.target_steps} "
            "(warm-up once + steady mean; see `vdkit validate`).",
            "- [f] fluctuating step times (CV over 10 % or a significant drift).",
            "- N/A: the planner says the layout does not fit (this kit) or the guide printed N/A (published). "
            "—: not run.",
            f"- {NOT_PUBLISHED_MARK}: the guide publishes no figure for this cell (a model or layout outside it, "
            "such as the demo's tiny_llama)."]
    out += [f"- [{k.split(' ', 1)[1]}] {v} (published)." for k, v in table.labels.items()
            if k.startswith("footnote ")]
    if table.layout == "grid" and any(c.predicted_fast is not None for c in table.cells):
        out += ["", "### Published, predicted (the guide's recipe) and predicted (the fast recipe, same samples)", "",
                "| model | GPUs | " + " | ".join(table.labels.get(m, m) for m in table.columns) + " |",
                "| --- | ---: |" + " ---: |" * len(table.columns)]
        rows9: Dict[tuple, Dict[str, Cell]] = {}
        for c in table.cells:
            rows9.setdefault((c.model, c.gpus), {})[c.method] = c
        for (model, gpus), by_method in rows9.items():
            out.append(f"| {table.labels.get(model, model)} | {gpus} | "
                       + " | ".join(_predicted_md(by_method[m]) for m in table.columns) + " |")
        out += ["", "Each cell: published / predicted for the guide's recipe / predicted for the fast recipe "
                "(`recipe=fast`: packed sequences - P-tuning unpacked, NeMo cannot pack it -, fused kernels, the model's layout) on the same samples, minutes "
                "(`vdkit plan --sweep` of the table's sweeps; the model: `benchmarks/bench_prediction.py`)."]
    reasons = [c for c in table.cells if c.status in ("infeasible", "no timing") and c.reason]
    for c in reasons:
        out.append(f"- {table.labels.get(c.model, c.model)}, {c.gpus} GPUs, {c.method}: {c.status}: {c.reason}")
    out += ["", f"Published source: {table.source}", ""]
    return "\n".join(out)


CSV_FIELDS = ("model", "gpus", "nodes", "method", "status", "minutes", "interval_lo", "interval_hi", "fluctuating",
              "published_minutes", "published_status", "published_footnote", "ratio", "checkpoint_gb",
              "published_checkpoint_gb", "predicted_minutes", "predicted_fast_minutes", "reason", "runs")


def to_csv(table: Table) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for c in table.cells:
        d = c.to_dict()
        lo, hi = d.pop("interval_minutes") or (None, None)
        d.pop("published_na")
        d.update(interval_lo=lo, interval_hi=hi, runs=";".join(d["runs"]))
        w.writerow(d)
    return buf.getvalue()


def write_table(table: Table, out_dir, extra_files: Optional[Dict[str, bytes]] = None) -> List[Path]:
    """Write NAME.md, NAME.csv, NAME.json (and ``extra_files``) into ``out_dir``; returns the paths."""
    from vdkit.validation.plots import markdown_links

    markdown = to_markdown(table) + markdown_links(list(extra_files or {}))  # the plots, linked from the table
    files = {f"{table.name}.md": markdown.encode(), f"{table.name}.csv": to_csv(table).encode(),
             f"{table.name}.json": (json.dumps(table.to_dict(), indent=2) + "\n").encode(), **(extra_files or {})}
    return write_files(out_dir, files, report=table.name)


def write_files(out_dir, files: Dict[str, bytes], report: str = "report") -> List[Path]:
    """Write ``files`` (name -> bytes) into ``out_dir``; returns the paths.

    Each file is written to a temporary name and renamed, so a failure leaves no half-written file.
    The files an earlier report of the same table wrote there and this one does not (trace plots of
    runs no longer in it, e.g. a re-run `vdkit demo`) are removed: the directory shows one report.
    The list lives in a hidden manifest per ``report`` (the table's name: ``.<report>.files``), so two
    tables' reports can share a directory; files the kit did not write are never touched.
    """
    from vdkit.files import file_mode
    from vdkit.rundir import missing_parents, remove_empty

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
    # All or nothing: every file (and the manifest) goes to a temporary name first; the renames happen
    # only when all are complete, so a full disk leaves the previous report (or nothing) behind.
    import tempfile

    contents = {**files, manifest.name: (json.dumps(sorted(files)) + "\n").encode()}
    temps: Dict[str, str] = {}
    try:
        for name, data in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
            temps[name] = tmp
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, file_mode())
        for name, tmp in temps.items():
            os.replace(tmp, out / name)
    except BaseException:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        if created:
            remove_empty(created)
        raise
    written = [out / name for name in files]
    for stale in sorted(before - set(files)):
        if "/" not in stale and not stale.startswith("."):  # a name we wrote, inside out_dir
            (out / stale).unlink(missing_ok=True)
    return written
