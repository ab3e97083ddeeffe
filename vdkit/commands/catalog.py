"""What exists: every model, method, cluster, data set, engine, launcher, sweep and table, one line each.

Nothing here is a list of names: each kind is read from where it is defined - a config group from
the files under ``conf/<group>/``, engines from their registry (:mod:`vdkit.recipes.engines`),
launchers from theirs, tables from ``validation/published/*.yaml`` - and each line from that
thing's own words: the first sentence of the YAML file's header comment (a sweep's or table's
``description`` / ``title``), or the first line of the module's docstring. ``vdkit list`` prints it.
Standard library + PyYAML + vdkit's light modules: no engine is imported beyond its interface.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

SUMMARY_CHARS = 80  # a line's description is cut (at a word) beyond this: one line per thing


@dataclass(frozen=True)
class Entry:
    """One thing that exists: its name, what it is, and any figures derived from its file."""

    name: str
    summary: str
    facts: str = ""


@dataclass(frozen=True)
class Kind:
    """A kind of thing (``models``), how a user picks one (``model=NAME``) and how to list them."""

    name: str
    usage: str
    entries: Callable[[], List[Entry]]


# ----------------------------------------------------------------------------- one line from a file
def first_sentence(text: str, limit: int = SUMMARY_CHARS) -> str:
    """The first sentence of ``text`` (whitespace collapsed), cut at a word past ``limit`` characters."""
    text = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!vs)\.(\s+(?=[A-Z(`\"])|$)", text)
    if m:
        text = text[:m.start()]
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return text


def header_comment(path: Path) -> str:
    """The YAML file's leading comment block (``@package`` directives skipped); when the file opens with
    keys (e.g. a ``defaults:`` list), its first comment block instead."""
    block: List[str] = []
    started = False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if body.startswith("@package"):
                continue
            block.append(body)
            started = True
        elif started:
            break
    return " ".join(block)


def docstring_line(module: str) -> str:
    """The first line of a module's docstring (the module is imported: keep engine modules light)."""
    try:
        doc = importlib.import_module(module).__doc__ or ""
    except ImportError as exc:  # e.g. an install that predates the module: say so, list the rest
        return f"(cannot import {module} here: {exc}; reinstall vdkit)"
    return first_sentence(doc.strip().splitlines()[0] if doc.strip() else "")


def _load(path: Path) -> dict:
    import yaml

    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


# ----------------------------------------------------------------------------- config groups
def _group_files(group: str) -> List[Path]:
    from vdkit.composition.conftree import conf_dir

    return sorted((conf_dir() / group).glob("*.yaml"))


def _model_facts(path: Path) -> str:
    """'6.74B params, 32 layers, hidden 4096' from the model file's own sizes."""
    from vdkit.planner.arch import param_counts
    from vdkit.composition.schema import ModelCfg

    data = _load(path)
    known = {k: v for k, v in data.items() if k in ModelCfg.__dataclass_fields__}
    try:
        total = param_counts(ModelCfg(**known)).total
    except (TypeError, ValueError, ZeroDivisionError):
        return ""
    scale, unit = next((s, u) for s, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if total >= s)
    size = f"{total / scale:#.3g}".rstrip(".") + unit
    return f"{size} params, {data.get('num_layers')} layers"


def _with_defaults(path: Path) -> dict:
    """The file's values over those of the same-group files its ``defaults:`` list names (``_self_`` last, as
    Hydra merges them: conf/cluster/k8s_mi300x.yaml is xe9680_mi300x.yaml with another launcher)."""
    data = _load(path)
    merged: dict = {}
    for entry in data.get("defaults") or []:
        parent = path.parent / f"{entry}.yaml" if isinstance(entry, str) and entry != "_self_" else None
        if parent is not None and parent.is_file() and parent != path:
            merged.update(_with_defaults(parent))
    merged.update({k: v for k, v in data.items() if k != "defaults"})
    return merged


def _cluster_facts(path: Path) -> str:
    """'1-6 nodes x 8 H100-SXM5-80GB, ib' from the cluster file."""
    import dataclasses

    from vdkit.composition.schema import ClusterCfg

    d = {**dataclasses.asdict(ClusterCfg()), **_with_defaults(path)}  # the schema's defaults under the file's values
    nodes = f"{d['min_nodes']}-{d['max_nodes']}" if d["min_nodes"] != d["max_nodes"] else f"{d['min_nodes']}"
    return f"{nodes} nodes x {d['gpus_per_node']} {d['gpu_type']}, {d['launcher']}, {d['transport']}"


def _sweep_facts(path: Path) -> str:
    cells = _load(path).get("cells")
    return f"{len(cells)} cells" if isinstance(cells, list) else ""


def group_entries(group: str, facts: Optional[Callable[[Path], str]] = None) -> Callable[[], List[Entry]]:
    """Entries of ``conf/<group>/``: name = file stem, summary = ``description`` or the header comment."""

    def entries() -> List[Entry]:
        out = []
        for path in _group_files(group):
            described = _load(path).get("description")
            summary = first_sentence(str(described)) if described else first_sentence(header_comment(path))
            out.append(Entry(path.stem, summary, facts(path) if facts else ""))
        return out

    return entries


# ----------------------------------------------------------------------------- registries
def engine_entries() -> List[Entry]:
    """The engines ``engine.name`` may name: each spec's one-line summary (`vdkit list engines` prints the table)."""
    from vdkit.recipes import engines

    return [Entry(s.name, s.summary) for s in engines.specs()]


def engine_records() -> List[dict]:
    """What each registered engine can do, from its spec (`vdkit list engines --json`); ``images`` with the values
    conf/engine/<name>.yaml gives the keys."""
    from vdkit.composition.conftree import conf_dir
    from vdkit.recipes import engines

    out = []
    for spec in engines.specs():
        row = spec.table_row()
        path = conf_dir() / "engine" / f"{spec.name}.yaml"
        values = _load(path) if path.is_file() else {}
        row["images"] = {k: values.get(k.split(".", 1)[1]) for k in spec.images if k.startswith("engine.")}
        row["images"].update({k: "the cluster's" for k in spec.images if not k.startswith("engine.")})
        out.append(row)
    return out


# the table's rows: (label, record key, how a value reads)
_ENGINE_ROWS = (("families", "families", None), ("methods", "methods", None), ("shardings", "shardings", None),
                ("sharding none is", "data_parallel_only",
                 lambda v: "DDP (TP 1 x PP 1, every rank all Adam state)" if v else "TP x PP, distributed optimizer"),
                ("precisions", "precisions", None), ("optimizer dtypes", "optimizer_dtypes", None),
                ("SwiGLU input saved in", "swiglu_input_dtypes", None),
                ("FP8 attention (train.fp8_attention)", "fp8_attention", None),
                ("CUDA graphs (train.cuda_graphs)", "cuda_graphs", None),
                ("LoRA targets (method.lora_targets)", "lora_targets", None),
                ("LoRA all-to-all (method.lora_a2a)", "lora_a2a", None),
                ("context parallel", "context_parallel", None),
                ("RoPE scaling", "rope_scaling", None), ("step-time regime", "step_time_regime", None),
                ("refuses model fields", "refuses", None), ("GPU vendors", "gpu_vendors", None),
                ("stack", "stack", lambda v: ", ".join(f"{k} {x}" for k, x in v.items()) or "unpinned"),
                ("runs here (vdkit run)", "runs_locally", None),
                ("hang watchdog", "writes_heartbeat", lambda v: "yes (ranks beat)" if v else "no (ranks write no heartbeat)"),
                ("run-dir files", "run_dir_files", None))


def engine_table() -> str:
    """`vdkit list engines`: one column per engine, one row per capability (what `vdkit plan` accepts)."""
    records = engine_records()

    def cell(value, how):
        if how:
            return how(value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, (list, dict)):
            return ", ".join(value) or "-"
        return str(value)

    rows = [("engine=NAME", [r["name"] for r in records])]
    rows += [(label, [cell(r[key], how) for r in records]) for label, key, how in _ENGINE_ROWS]
    first = max(len(label) for label, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(records))]
    lines = ["engines (engine=NAME; what each spec holds: vdkit/recipes/spec.py)"]
    lines += ["  " + label.ljust(first) + "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
              for label, cells in rows]
    return "\n".join(lines)


def launcher_entries() -> List[Entry]:
    """The launchers ``cluster.launcher`` may name, from the launcher registry."""
    from vdkit.launch import launchers

    return [Entry(name, docstring_line(module)) for name, module in launchers.REGISTRY.items()]


def table_entries() -> List[Entry]:
    """The published tables ``vdkit report --table NAME`` rebuilds (validation/published/*.yaml)."""
    import importlib.resources as resources

    folder = Path(str(resources.files("vdkit.validation"))) / "published"
    out = []
    for path in sorted(folder.glob("*.yaml")):
        data = _load(path)
        cells = data.get("cells")
        title = " ".join(str(data.get("title", "")).split())  # a title is one line already (no sentence cut)
        out.append(Entry(str(data.get("table", path.stem)), title,
                         f"{len(cells)} published cells" if isinstance(cells, (list, dict)) else ""))
    return out


KINDS: Tuple[Kind, ...] = (
    Kind("models", "model=NAME", group_entries("model", _model_facts)),
    Kind("methods", "method=NAME", group_entries("method")),
    Kind("clusters", "cluster=NAME", group_entries("cluster", _cluster_facts)),
    Kind("data", "data=NAME", group_entries("data")),
    Kind("recipes", "recipe=NAME", group_entries("recipe")),
    Kind("deepspeed", "parallelism.deepspeed_config=NAME", group_entries("deepspeed")),
    Kind("tp_overlap", "parallelism.tp_comm_overlap_cfg=NAME", group_entries("tp_overlap")),
    Kind("engines", "engine=NAME", engine_entries),
    Kind("launchers", "cluster.launcher=NAME", launcher_entries),
    Kind("sweeps", "--sweep NAME", group_entries("sweep", _sweep_facts)),
    Kind("tables", "vdkit report --table NAME", table_entries),
)


def kinds() -> Dict[str, Kind]:
    """Kind name -> Kind, in the order ``vdkit list`` prints them."""
    return {k.name: k for k in KINDS}


def render(selected: List[str]) -> str:
    """The listing of the ``selected`` kinds (all when empty): a heading per kind, one line per entry."""
    chosen = [kinds()[name] for name in selected] if selected else list(KINDS)
    blocks = []
    for kind in chosen:
        entries = kind.entries()
        width = max((len(e.name) for e in entries), default=0)
        lines = [f"{kind.name} ({kind.usage})"]
        for e in entries:
            text = f"{e.facts}; {e.summary}" if e.facts and e.summary else (e.facts or e.summary)
            lines.append(f"  {e.name.ljust(width)}  {text}".rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
