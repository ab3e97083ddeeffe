"""The transformers-engine documents' tables: ``alpaca_opt`` (the fine-tuning white paper's Figure 6)
and ``llama31_roce`` (the multi-node blog's train time per epoch), next to the published figures.

Rows come from the sweep of the same name (conf/sweep/NAME.yaml). With run directories, a row that
was run shows the plan it was rendered with (its ``plan.json``: memory, verdict, prediction, never
re-planned) and what was measured: the step times, extrapolated to the cell's ``train.target_steps``
(the whole 3-epoch run for Alpaca, one epoch for PubMedQA) by :mod:`vdkit.validation.extrapolate`;
rows not run show the published figure only. Without run directories the table is the planned one:
every cell is planned, so it shows the planner's verdict, memory and prediction (OPT-30B: out of
memory, by how much).

Units follow the documents: minutes for the whole run (white paper), seconds per epoch (blog).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from vdkit.errors import UserError

TABLES = ("alpaca_opt", "llama31_roce")
# Planning a published cell needs no weights: the sweeps name the cluster's staged copies
# (model.hf_path=/shared/models/...), which the door refuses on a machine without them.
PLAN_ONLY = ["model.hf_path=null"]


@dataclass
class Row:
    """One cell of the document's table: the plan, what was measured, what was published."""

    model: str
    nodes: int
    gpus: int
    transport: str
    params_b: float
    feasible: Optional[bool]  # None: not planned (a row not run in a report of run directories)
    memory_gb: Optional[float]
    gpu_memory_gb: float
    reason: str = ""
    target_steps: int = 0
    predicted: Optional[float] = None  # in the table's unit
    ours: Optional[float] = None  # measured / extrapolated, in the table's unit
    ours_status: str = "not run"  # measured | extrapolated | no timing | not run
    published: Optional[float] = None
    published_text: str = "N/A"
    runs: List[str] = field(default_factory=list)

    @property
    def ratio(self) -> Optional[float]:
        return self.ours / self.published if self.ours is not None and self.published else None

    @property
    def predicted_ratio(self) -> Optional[float]:
        return self.predicted / self.published if self.predicted is not None and self.published else None

    def to_dict(self) -> dict:
        r = lambda x, nd=2: None if x is None else round(float(x), nd)  # noqa: E731
        return {"model": self.model, "nodes": self.nodes, "gpus": self.gpus, "transport": self.transport,
                "params_b": r(self.params_b, 3), "feasible": self.feasible, "memory_per_gpu_gb": r(self.memory_gb, 1),
                "gpu_memory_gb": self.gpu_memory_gb, "reason": self.reason or None, "target_steps": self.target_steps,
                "predicted": r(self.predicted), "ours": r(self.ours), "ours_status": self.ours_status,
                "published": self.published, "published_text": self.published_text, "ratio": r(self.ratio, 3),
                "predicted_ratio": r(self.predicted_ratio, 3), "runs": self.runs}


@dataclass
class HFTable:
    name: str
    title: str
    source: str
    unit: str  # "minutes" | "seconds per epoch"
    rows: List[Row]
    labels: Dict[str, str]
    warnings: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"table": self.name, "title": self.title, "published_source": self.source, "unit": self.unit,
                "rows": [r.to_dict() for r in self.rows], "warnings": self.warnings}


def _published_cell(pub: dict, row: Row) -> Tuple[Optional[float], str]:
    for c in pub["cells"]:
        if c["model"] != row.model or int(c["nodes"]) != row.nodes:
            continue
        if "roce" in c and row.nodes > 1 and bool(c["roce"]) != (row.transport == "roce"):
            continue
        if c.get("oom"):
            return None, "out of memory"
        if "below" in c:
            return None, f"< {c['below']:g}"
        value = c.get("minutes", c.get("seconds"))
        return float(value), f"{value:g}"
    return None, "N/A"


def _prediction(plan, seconds: bool) -> Optional[float]:
    """The step-time model's figure for the cell's target steps, in the table's unit (None without one)."""
    pred = getattr(plan, "prediction", None)
    step_s = getattr(pred, "step_seconds", None) if pred is not None else None
    if step_s is None:
        return None
    total_s = float(step_s) * plan.recipe.train.target_steps
    return total_s if seconds else total_s / 60.0


def _key(model: str, nodes: int, transport: str) -> tuple:
    return (model, nodes, transport if nodes > 1 else "-")  # one node: no inter-node transport


def build(name: str, runs: Sequence = ()) -> HFTable:
    """The table ``name`` from the run directories ``runs`` (their plans, never re-planned), or, with no
    runs, the planned table of its sweep."""
    from vdkit.arch import param_counts
    from vdkit.config import compose, sweep_cells
    from vdkit.rundir import RECIPE_FILE, load_plan, load_recipe
    from vdkit.validation.tables import collect_run, load_published

    if name not in TABLES:
        raise UserError(f"no table named {name!r} here", "use " + " or ".join(TABLES))
    pub = load_published(name)
    seconds = "second" in pub["units"]
    warnings: List[str] = []
    by_key: Dict[tuple, List[Path]] = {}
    recipes = {}
    for path in runs:
        path = Path(path)
        if not (path / RECIPE_FILE).is_file():
            raise UserError(f"{path} is not a run directory (no {RECIPE_FILE})",
                            "pass run directories written by `vdkit render` / `vdkit run`, e.g. runs/*")
        recipe = recipes[path] = load_recipe(path)
        by_key.setdefault(_key(recipe.model.name, recipe.cluster.nodes, recipe.cluster.transport), []).append(path)
    rows: List[Row] = []
    for cell in sweep_cells(name, PLAN_ONLY):
        r = compose(cell)
        key = _key(r.model.name, r.cluster.nodes, r.cluster.transport)
        ran = by_key.pop(key, [])
        if ran:
            plan = load_plan(ran[0])
        elif not runs:
            from vdkit.plan import make_plan  # the planned table: no run directory to read a plan from

            plan = make_plan(r)
        else:
            plan = None
        row = Row(model=r.model.name, nodes=r.cluster.nodes, gpus=r.world_size, transport=r.cluster.transport,
                  params_b=param_counts(r.model).total / 1e9, feasible=plan.feasible if plan else None,
                  memory_gb=plan.memory.total_gb if plan else None, gpu_memory_gb=r.cluster.gpu_memory_gb,
                  reason=(plan.reason or "") if plan else "", target_steps=r.train.target_steps,
                  predicted=_prediction(plan, seconds) if plan else None)
        row.published, row.published_text = _published_cell(pub, row)
        rows.append(row)
        for path in ran:
            _add_run(row, path, recipes[path], seconds, warnings, collect_run)
    for key, paths in by_key.items():
        for path in paths:
            recipe = recipes[path]
            warnings.append(f"{path}: {recipe.model.name} on {recipe.cluster.nodes} node(s) "
                            f"({recipe.cluster.transport}) is not a cell of {name}; skipped")
    return HFTable(name, pub["title"], pub["source"].strip(), pub["units"], rows, dict(pub["models"]), warnings)


def _add_run(row: Row, path: Path, recipe, seconds: bool, warnings: List[str], collect_run) -> None:
    """A run directory's measured (or extrapolated) figure into its row."""
    res = collect_run(path, recipe.train.target_steps)
    warnings.extend(res.warnings)
    row.runs.append(str(path))
    if res.estimate is None:
        row.ours_status = "no timing" if row.ours is None else row.ours_status
        return
    e = res.estimate
    value = e.extrapolated_minutes * (60.0 if seconds else 1.0)
    if row.ours is None or e.steps_measured > 0:
        row.ours, row.ours_status = value, ("extrapolated" if e.extrapolated else "measured")


# ----------------------------------------------------------------------------- rendering
def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def _transport(row: Row) -> str:
    return "—" if row.nodes == 1 else {"roce": "RoCE", "tcp": "no RoCE (TCP)", "ib": "InfiniBand"}[row.transport]


def to_markdown(t: HFTable) -> str:
    """The document's shape: one row per model (white paper) or per model x nodes x RoCE (blog)."""
    unit = "min, 3 epochs" if t.unit == "minutes" else "s per epoch"
    out = [f"## {t.title} — this kit next to the published figures", ""]
    out.append(f"| model | params (B) | nodes | GPUs | inter-node | plan: memory per GPU (GB) | "
               f"predicted ({unit}) | this kit ({unit}) | published ({unit}) | ratio |")
    out.append("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for r in t.rows:
        fit = ("not run" if r.memory_gb is None else
               f"{r.memory_gb:.1f} of {r.gpu_memory_gb:g}" + ("" if r.feasible else " — DOES NOT FIT"))
        ours = _fmt(r.ours) + (" [e]" if r.ours_status == "extrapolated" else "")
        if r.feasible is False:
            ours = "N/A"
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else (
            f"pred. {r.predicted_ratio:.2f}×" if r.predicted_ratio is not None else "—")
        out.append(f"| {t.labels.get(r.model, r.model)} | {r.params_b:.3g} | {r.nodes} | {r.gpus} | {_transport(r)} | "
                   f"{fit} | {_fmt(r.predicted)} | {ours} | {r.published_text} | {ratio} |")
    out += ["", f"Times: {unit} of training steps only (model load, checkpointing and evaluation excluded). "
            "[e]: extrapolated by this kit from the measured steps to the cell's steps (`vdkit validate`). "
            "Predicted: the kit's step-time model (— when it gives none). Ratio: this kit ÷ published.", ""]
    for r in t.rows:
        if r.feasible is False:
            out.append(f"- {t.labels.get(r.model, r.model)}, {r.nodes} node(s): {r.reason}")
    out += ["", f"Published source: {t.source}", ""]
    return "\n".join(out)


CSV_FIELDS = ("model", "params_b", "nodes", "gpus", "transport", "feasible", "memory_per_gpu_gb", "gpu_memory_gb",
              "target_steps", "predicted", "ours", "ours_status", "published", "published_text", "ratio",
              "predicted_ratio", "reason", "runs")


def to_csv(t: HFTable) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in t.rows:
        d = r.to_dict()
        d["runs"] = ";".join(d["runs"])
        w.writerow(d)
    return buf.getvalue()


def bars_png(t: HFTable) -> bytes:
    """Grouped bars per row: predicted, this kit, published (the document's figure, side by side)."""
    from vdkit.validation.plots import grouped_bars_png

    short = {"roce": "RoCE", "tcp": "TCP", "ib": "IB"}
    size = {r.model: t.labels.get(r.model, r.model).split()[-2] if len(t.labels.get(r.model, r.model).split()) > 1
            else r.model for r in t.rows}  # "Llama 3.1 70B Instruct" -> "70B"
    labels = [f"{size[r.model]}, {r.nodes} node" + (f"s\n{short[r.transport]}" if r.nodes > 1 else "")
              if t.name == "llama31_roce" else t.labels.get(r.model, r.model) for r in t.rows]
    series = [("predicted", [r.predicted for r in t.rows]), ("this kit", [r.ours for r in t.rows]),
              ("published", [r.published for r in t.rows])]
    notes = {j: "does not fit" for j, r in enumerate(t.rows) if r.feasible is False}
    return grouped_bars_png(t.title, "minutes (3 epochs)" if t.unit == "minutes" else "seconds per epoch", labels,
                            series, notes)


def write(t: HFTable, out_dir, plots: bool = True) -> List[Path]:
    """NAME.md, NAME.csv, NAME.json (+ NAME.png) in ``out_dir``, each written whole then renamed."""
    from vdkit.validation.tables import write_files

    from vdkit.validation.plots import markdown_links

    png = {f"{t.name}.png": bars_png(t)} if plots else {}
    files = {f"{t.name}.md": (to_markdown(t) + markdown_links(list(png))).encode(), f"{t.name}.csv": to_csv(t).encode(),
             f"{t.name}.json": (json.dumps(t.to_dict(), indent=2) + "\n").encode(), **png}
    return write_files(out_dir, files, report=t.name)
