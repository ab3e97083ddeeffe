"""Published tables as data, and the one builder that rebuilds any of them from run directories.

A published table is one YAML, ``validation/published/<name>.yaml`` (the file is the registration:
:func:`table_names` lists them, :func:`spec` reads one; an unknown name is one line, exit 2). Every
spec has the same parts:

- ``key``: the recipe fields that name a cell (:data:`KEY_FIELDS`: model, gpus, nodes, method, inter_node);
- ``cells``: the published figures, each with its key fields and one of ``minutes`` / ``seconds`` (the
  spec's ``units``; ``null``: the source printed N/A), ``below`` (an upper bound), ``oom`` (out of memory),
  optionally ``footnote``, ``checkpoint_gb`` and ``recipe`` (settings of that cell alone, as below);
- ``sweep``: conf/sweep/<sweep>.yaml, the cells' recipes (planned for the table without runs);
  ``alternative_sweep``: the same cells with another recipe (its predictions beside them);
- ``steps``: the step count the figures are for (none: each cell's ``train.target_steps``);
- ``recipe``: which recipes are cells of the table (``vdkit plan`` prints their published figure,
  :mod:`vdkit.validation.citation`): the GPU (``cluster.gpu_type``, required), the engine and data, and
  every setting the published runs fixed (sequence length, batch sizes, ...), so a plan that departs from
  the published run is not cited as it; nor is a model that is not the published one dimension for
  dimension;
  ``cited_as`` and ``figure_unit``: how that line names it;
- ``layout``: how :mod:`vdkit.validation.table_output` arranges it (:data:`LAYOUTS`: ``grid`` model x GPUs
  rows with a column per ``methods`` entry, Table 9; ``nodes`` one row per cell with time and checkpoint
  size, Table 4; ``rows`` one row per cell with its plan, memory and fit, the Alpaca OPT and MI300X
  Llama 3.1 tables), ``report_rows`` (``models_run``: a report of runs shows the published cells of
  the models it ran; ``all``: every published cell).

:func:`build` is the builder: one :class:`Cell` per key, for every table. Run directories bring their
own plan (``plan.json``, the prediction included); only a table built without runs (the planned table)
plans its sweep's cells.
"""
from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from vdkit.errors import UserError

if TYPE_CHECKING:  # the run directories' side (vdkit.validation.run_dir) is imported where runs are read
    from vdkit.validation.run_dir import RunResult

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
NOT_PUBLISHED = "not published"  # a cell the source has no figure for (not its "N/A")
NOT_PUBLISHED_MARK = "n/p"  # how the Markdown table shows it
LAYOUTS = ("grid", "nodes", "rows")
REPORT_ROWS = ("models_run", "all")
ROW_LABELS = ("model", "size_nodes_transport")  # a rows spec's row_label: how a row is named in the bar plot
DEFAULT_TABLE = "table9"  # what `vdkit report` and `vdkit demo` rebuild unless told otherwise
# Planning a published cell needs no weights: the sweeps name the cluster's staged copies
# (model.hf_path=/shared/models/...), which the door refuses on a machine without them.
PLAN_ONLY = ["model.hf_path=null"]

# The condition a table citing its figures (``recipe``) must state: the GPU its runs were measured on.
GPU_CONDITION = "cluster.gpu_type"

# What a spec's ``key`` may name: a cell's identity, read off a recipe. inter_node is the fabric between
# nodes ("-" on one node, where there is none).
KEY_FIELDS: Dict[str, Callable] = {
    "model": lambda r: r.model.name,
    "gpus": lambda r: r.world_size,
    "nodes": lambda r: r.cluster.nodes,
    "method": lambda r: r.method.name,
    "inter_node": lambda r: r.cluster.transport if r.cluster.nodes > 1 else "-",
}


# ----------------------------------------------------------------------------- specs
def table_names(folder: Optional[Path] = None) -> Tuple[str, ...]:
    """Every published table: the stems of validation/published/*.yaml."""
    return tuple(sorted(p.stem for p in (folder or PUBLISHED_DIR).glob("*.yaml")))


def load_published(name: str, folder: Optional[Path] = None) -> dict:
    """The published table ``name`` (validation/published/NAME.yaml) as data; UserError for an unknown name."""
    folder = folder or PUBLISHED_DIR
    path = folder / f"{name}.yaml"
    # a name, never a path (`--table ../published/table9` would read whatever the path reaches)
    if name not in table_names(folder) or not path.is_file():
        close = difflib.get_close_matches(str(name).lower(), table_names(folder), n=1)
        raise UserError(f"--table {name!r}: no published table by that name"
                        + (f" (did you mean {close[0]}?)" if close else ""),
                        f"use one of: {', '.join(table_names(folder))} (`vdkit list tables`)")
    return copy.deepcopy(_parsed(str(path), path.stat().st_mtime_ns))


@lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int) -> dict:
    """One parse per file version: `vdkit plan --sweep` cites a table for every cell (callers get a copy)."""
    import yaml

    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def spec(name: str, folder: Optional[Path] = None) -> dict:
    """:func:`load_published`, checked as a table spec (layout, key, sweep, row options)."""
    data = load_published(name, folder)
    if data.get("layout") not in LAYOUTS or not data.get("sweep"):
        raise UserError(f"published table {name!r} has layout={data.get('layout')!r} sweep={data.get('sweep')!r}",
                        f"give it layout: one of {', '.join(LAYOUTS)}, and sweep: the conf/sweep/ file of its cells")
    bad = [k for k in data.get("key") or () if k not in KEY_FIELDS]
    if not data.get("key") or bad:
        raise UserError(f"published table {name!r} has key={data.get('key')!r}",
                        f"name its cells by some of: {', '.join(KEY_FIELDS)}")
    if data.get("report_rows", "models_run") not in REPORT_ROWS or data.get("row_label", "model") not in ROW_LABELS:
        raise UserError(f"published table {name!r} has report_rows={data.get('report_rows')!r} "
                        f"row_label={data.get('row_label')!r}",
                        f"use report_rows: {' or '.join(REPORT_ROWS)}; row_label: {' or '.join(ROW_LABELS)}")
    if data.get("recipe") and not (data.get("cited_as") and data.get("figure_unit")):
        raise UserError(f"published table {name!r} names its recipes but not how `vdkit plan` cites them",
                        "give it cited_as (e.g. Table 9) and figure_unit (e.g. min for 1000 steps)")
    if data.get("recipe") and not data["recipe"].get(GPU_CONDITION):  # an H200 plan is no H100 cell
        raise UserError(f"published table {name!r} names its recipes but not the GPU its figures were measured on",
                        f"add {GPU_CONDITION}: the GPU (e.g. H100-SXM5-80GB) to its recipe conditions")
    return data


def key_of(pub: dict, recipe) -> tuple:
    """The cell of ``pub`` that ``recipe`` would be (its key fields' values)."""
    return tuple(KEY_FIELDS[f](recipe) for f in pub["key"])


def published_cells(pub: dict) -> Dict[tuple, dict]:
    """key -> the published cell, in the source's order."""
    return {tuple(c[f] for f in pub["key"]): c for c in pub["cells"]}


def figure(pub: dict, cell: Optional[dict]) -> Tuple[Optional[float], str]:
    """(the published value in the table's unit or None, the figure as the source prints it) of ``cell``:
    "N/A" (printed N/A, or no such cell), "out of memory", "< 10", or the number."""
    if cell is None:
        return None, "N/A"
    if cell.get("oom"):
        return None, "out of memory"
    if "below" in cell:
        return None, f"< {cell['below']:g}"
    value = cell.get("seconds" if "second" in pub["units"] else "minutes")
    return (None, "N/A") if value is None else (value, f"{value:g}")  # the number as the YAML has it


# ----------------------------------------------------------------------------- cells
@dataclass
class Cell:
    """One cell of a published table: its recipe's facts, its plan, what was measured, what was published.

    ``ours``, ``interval``, ``published`` and ``predicted`` are in the table's unit (``Table.unit``)."""

    model: str
    gpus: Optional[int] = None
    method: str = ""
    nodes: Optional[int] = None
    inter_node: str = "-"
    transport: str = ""
    params_b: Optional[float] = None
    target_steps: Optional[int] = None
    status: str = "not run"  # measured | extrapolated | infeasible | no timing | diverged | cancelled | not run
    ours: Optional[float] = None
    interval: Optional[Tuple[float, float]] = None
    fluctuating: bool = False
    published: Optional[float] = None
    published_text: str = "N/A"  # the figure as printed: "102", "< 10", "out of memory", "N/A"
    published_footnote: str = ""
    published_na: bool = False  # the source printed N/A
    feasible: Optional[bool] = None  # the plan's verdict (None: not planned, a cell not run in a report of runs)
    memory_gb: Optional[float] = None  # the plan's memory per GPU
    gpu_memory_gb: Optional[float] = None
    reason: str = ""
    runs: List[str] = field(default_factory=list)
    checkpoint_gb: Optional[float] = None
    published_checkpoint_gb: Optional[float] = None
    predicted: Optional[float] = None  # the step-time model for the cell as run (or planned)
    predicted_range: Optional[Tuple[float, float]] = None  # the plan's low .. high for it (None: the plan has none)
    predicted_fast: Optional[float] = None  # ... for the same samples with the alternative sweep's recipe
    engine: str = ""  # the engine of the run the cell shows (plots name it per point when they differ)
    hardware: str = ""  # cluster.gpu_type of that run ("cpu": a run on this machine's cores)

    @property
    def published_status(self) -> str:
        """'figure', 'N/A' (the source printed N/A) or 'not published' (the source has no such cell)."""
        if self.published is not None:
            return "figure"
        return "N/A" if self.published_na else NOT_PUBLISHED

    @property
    def ratio(self) -> Optional[float]:
        """This kit ÷ published."""
        return self.ours / self.published if self.ours is not None and self.published else None

    @property
    def predicted_ratio(self) -> Optional[float]:
        """Predicted ÷ published."""
        return self.predicted / self.published if self.predicted is not None and self.published else None


@dataclass
class Table:
    """A rebuilt table: its cells in row order, the published source, labels and footnotes."""

    name: str
    title: str
    source: str
    layout: str  # how it is arranged and rendered (LAYOUTS)
    unit: str  # "minutes" | "seconds per epoch"
    target_steps: Optional[int]  # the spec's steps (None: each cell's own)
    cells: List[Cell]
    columns: List[str]  # grid: the methods; else ["time"]
    labels: Dict[str, str]
    warnings: List[str] = field(default_factory=list)
    row_label: str = "model"
    results: List[RunResult] = field(default_factory=list, repr=False)  # the run directories read (for plots)


# ----------------------------------------------------------------------------- the builder
@lru_cache(maxsize=16)
def _sweep_recipes(sweep: str) -> Tuple[object, ...]:
    """The composed recipes of every cell of ``sweep`` (not planned)."""
    from vdkit.composition.config import compose
    from vdkit.render.sweep import sweep_cells

    return tuple(compose(c) for c in sweep_cells(sweep, PLAN_ONLY))


@lru_cache(maxsize=16)
def _sweep_plans(sweep: str) -> Tuple[object, ...]:
    """Every cell of ``sweep`` planned (only the planned table plans: run directories bring plan.json)."""
    from vdkit.planner.plan import make_plan

    return tuple(make_plan(r) for r in _sweep_recipes(sweep))


def _order(pub: dict, keys) -> List[tuple]:
    """Keys in the source's order: models as the spec lists them (others after, by name), numbers
    ascending, other values as the published cells (or the ``methods`` columns) first name them."""
    fields = pub["key"]
    seen: Dict[str, List] = {f: [] for f in fields}
    for k in published_cells(pub):
        for f, v in zip(fields, k):
            if v not in seen[f]:
                seen[f].append(v)
    seen["model"] = list(pub["models"]) + [m for m in seen.get("model", []) if m not in pub["models"]]
    if "methods" in pub:
        seen["method"] = list(pub["methods"])

    def rank(f, v):
        if isinstance(v, (int, float)) and f != "model":
            return (0, v, "")
        return (0, seen[f].index(v), "") if v in seen.get(f, []) else (1, 0, str(v))

    return sorted(keys, key=lambda k: tuple(rank(f, v) for f, v in zip(fields, k)))


def build(name: str, runs: Sequence = (), folder: Optional[Path] = None) -> Table:
    """The published table ``name`` rebuilt from the run directories ``runs`` (their plans, never
    re-planned), or with no runs the planned table: every cell of its sweep planned and predicted.

    Cells: with no runs, every published (and sweep) cell; with runs, the published cells of the models
    that ran (``report_rows: all``: every one) and every run's own cell. A grid table's rows are completed
    across its ``methods`` columns; a run of another method is skipped with a warning. UserError for an
    unknown name or a path that is not a run directory."""
    pub = spec(name, folder)
    fields = pub["key"]
    steps = int(pub["steps"]) if pub.get("steps") else None
    per_s = 1.0 if "second" in pub["units"] else 1 / 60.0  # seconds -> the table's unit
    published = published_cells(pub)
    methods = list(pub.get("methods") or ())
    from vdkit.validation.run_dir import collect_runs

    results = collect_runs(list(runs), steps)
    warnings: List[str] = []
    by_key: Dict[tuple, List[RunResult]] = {}
    for r in results:
        if methods and r.recipe.method.name not in methods:
            warnings.append(f"{r.path}: method {r.recipe.method.name} is not a column of {name} "
                            f"({', '.join(pub['methods'].values())}); skipped")
            continue
        by_key.setdefault(key_of(pub, r.recipe), []).append(r)
    recipes = {key_of(pub, r): r for r in _sweep_recipes(pub["sweep"])}
    if results:
        plans: Dict[tuple, object] = {}
        ran = {k[fields.index("model")] for k in by_key}
        keys = {k for k in published if pub.get("report_rows") == "all" or k[fields.index("model")] in ran}
        keys |= set(by_key)
    else:
        plans = {key_of(pub, p.recipe): p for p in _sweep_plans(pub["sweep"])}
        keys = set(published) | set(recipes)
    if methods:  # a grid row has every column
        at = fields.index("method")
        keys = {k[:at] + (m,) + k[at + 1:] for k in keys for m in methods}
    fast = _fast_predictions(pub) if not results and pub.get("alternative_sweep") else {}
    cells = []
    for key in _order(pub, keys):
        cell = Cell(**dict(zip(fields, key)))
        ran = by_key.get(key, [])
        recipe = ran[0].recipe if ran else recipes.get(key)
        plan = ran[0].plan if ran else plans.get(key)
        if recipe is not None:
            cell.gpus, cell.nodes, cell.method = recipe.world_size, recipe.cluster.nodes, recipe.method.name
            cell.inter_node, cell.transport = KEY_FIELDS["inter_node"](recipe), recipe.cluster.transport
            from vdkit.planner.arch import param_counts

            cell.params_b = param_counts(recipe.model).total / 1e9
            cell.gpu_memory_gb, cell.target_steps = recipe.cluster.gpu_memory_gb, steps or recipe.train.target_steps
        if plan is not None:
            cell.feasible, cell.memory_gb = plan.feasible, plan.memory.total_gb
            cell.reason = plan.reason or "" if not plan.feasible else ""
            if plan.prediction is not None and cell.target_steps:
                cell.predicted = plan.prediction.step_seconds * cell.target_steps * per_s
                if plan.prediction.interval_s:
                    cell.predicted_range = tuple(s * cell.target_steps * per_s for s in plan.prediction.interval_s)
        if key in fast:
            cell.predicted_fast = fast[key]
        p = published.get(key)
        cell.published, cell.published_text = figure(pub, p)
        if p is not None:
            cell.published_na = cell.published is None and not p.get("oom") and "below" not in p
            cell.published_footnote = str(p.get("footnote") or "")
            cell.published_checkpoint_gb = p.get("checkpoint_gb")
        _fill(cell, ran, per_s * 60.0, warnings)
        cells.append(cell)
    for r in results:
        warnings.extend(r.warnings)
    labels = {**pub.get("methods", {}), **pub["models"],
              **{f"footnote {k}": v for k, v in (pub.get("footnotes") or {}).items()}}
    return Table(pub["table"], pub["title"], pub["source"].strip(), pub["layout"], pub["units"], steps, cells,
                 methods or ["time"], labels, warnings, pub.get("row_label", "model"), list(results))


def _fast_predictions(pub: dict) -> Dict[tuple, float]:
    """key -> the alternative sweep's predicted time (table unit) for the samples of the sweep's cell."""
    per_s = 1.0 if "second" in pub["units"] else 1 / 60.0
    other = {key_of(pub, p.recipe): p.prediction for p in _sweep_plans(pub["alternative_sweep"])}
    out = {}
    for p in _sweep_plans(pub["sweep"]):
        key, g = key_of(pub, p.recipe), p.prediction
        f = other.get(key)
        steps = int(pub["steps"]) if pub.get("steps") else p.recipe.train.target_steps
        if g is not None and f is not None:
            out[key] = f.minutes_for_samples(g.step.samples_per_step * steps) * 60.0 * per_s
    return out


def _fill(cell: Cell, runs: List[RunResult], per_minute: float, warnings: List[str]) -> None:
    """Put the best run of a cell into it (the one with the most timed steps); ``per_minute``: the table's
    unit per minute."""
    if not runs:
        return
    cell.runs = [r.path for r in runs]
    first = runs[0]
    cell.checkpoint_gb = first.plan.checkpoint_gb if first.plan is not None else None
    if not first.feasible:
        cell.status, cell.reason = "infeasible", first.plan.reason or ""
        return
    timed = [r for r in runs if r.estimate is not None and not r.cancelled]
    if not timed:
        stopped = next((r for r in runs if r.cancelled), None)
        if stopped is not None:  # its steps stop short of the run asked for: no figure presented as complete
            cell.status, cell.reason = "cancelled", f"{stopped.path}: {stopped.cancelled}"
        else:
            cell.status, cell.reason = "no timing", first.error
        return
    best = max(timed, key=lambda r: r.estimate.steps_measured)
    if len(timed) > 1:
        warnings.append(f"{len(timed)} runs for {cell.model} {cell.method} on {cell.gpus} GPUs; "
                        f"using {best.path} (most measured steps)")
    if best.log is not None and best.log.diverged:  # its minutes time a run that trained nothing: not a figure
        cell.status, cell.reason = "diverged", f"{best.path}: every loss is NaN or infinite"
        return
    e = best.estimate
    cell.status = "extrapolated" if e.extrapolated else "measured"
    recipe = best.plan.recipe if best.plan is not None else None
    cell.engine, cell.hardware = (recipe.engine.name, recipe.cluster.gpu_type) if recipe else ("", "")
    cell.ours = e.extrapolated_minutes * per_minute
    cell.fluctuating = e.fluctuating  # the estimate applied the CPU threshold where the run was on CPU
    cell.interval = tuple(x * per_minute for x in e.interval_minutes)
