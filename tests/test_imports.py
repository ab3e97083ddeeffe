"""Imports go one way: no import circle anywhere in the package, engines and launchers kept apart.

Read from the source (AST), not by importing: module-level *and* function-level imports count, in
every folder pyproject.toml maps into ``vdkit`` (its setuptools ``package-dir``), so a new package
is covered the day it is mapped.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def package_dirs() -> Dict[str, Path]:
    """``{package: folder}`` from pyproject.toml's ``[tool.setuptools] package-dir``."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {pkg: ROOT / folder for pkg, folder in data["tool"]["setuptools"]["package-dir"].items()}


def modules() -> Dict[str, Path]:
    """Every module of the package: dotted name -> file (the most specific package-dir mapping wins)."""
    mapping = package_dirs()
    found: Dict[str, Path] = {}
    for pkg, folder in sorted(mapping.items(), key=lambda kv: len(kv[0])):  # deeper mappings override
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(not p.isidentifier() for p in parts):
                continue
            found[".".join([pkg, *parts])] = path
    return found


def _imported(tree: ast.AST, name: str, is_package: bool) -> Iterator[Tuple[str, int]]:
    """(imported module or name, line) for every import statement, at any depth."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno  # a submodule, else (resolved upward) ``base``


def graph() -> Dict[str, Dict[str, int]]:
    """``{module: {imported module: line}}`` over the package's own modules."""
    mods = modules()
    edges: Dict[str, Dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _imported(tree, name, path.name == "__init__.py"):
            while target and target not in mods:  # ``from pkg import name``: the module is pkg
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].setdefault(target, line)
    return edges


def cycles(edges: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _describe(comp: List[str], edges) -> str:
    inside = set(comp)
    return "; ".join(f"{a} -> {b} (line {edges[a][b]})" for a in comp for b in sorted(edges[a]) if b in inside)


def test_the_mapping_covers_every_package_folder():
    mods = modules()
    for pkg, folder in package_dirs().items():
        assert folder.is_dir(), f"{pkg} -> {folder} is not a folder"
    assert {"vdkit.planner.plan", "vdkit.recipes.engines", "vdkit.slurm.render", "vdkit.validation.report",
            "vdkit.recipes.megatron.train", "vdkit.launch.launchers"} <= set(mods)


def test_no_import_circle():
    edges = graph()
    found = cycles(edges)
    assert not found, "import circles:\n" + "\n".join(_describe(c, edges) for c in found)


def test_the_circle_finder_finds_a_circle():
    """The finder itself: a circle through a function-level import is reported."""
    tree = ast.parse("import os\ndef f():\n    from pkg.b import x\n")
    assert ("pkg.b.x", 3) in list(_imported(tree, "pkg.a", False))
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def _engine_packages() -> Dict[str, str]:
    from vdkit.recipes import engines

    return dict(engines.REGISTRY)


def _owner(module: str, owners: Dict[str, str]):
    for name, root in owners.items():
        if module == root or module.startswith(root + "."):
            return name
    return None


def test_no_engine_imports_another_engine():
    edges, owners = graph(), _engine_packages()
    bad = [f"{a} -> {b} (line {line})" for a, targets in edges.items() for b, line in targets.items()
           if _owner(a, owners) and _owner(b, owners) and _owner(a, owners) != _owner(b, owners)]
    assert not bad, "engines importing each other (share through vdkit.recipes.common):\n" + "\n".join(bad)


def test_launchers_import_no_engine():
    """slurm/ (and every launcher module) gets the engine's request as data: nothing from recipes/."""
    from vdkit.launch import launchers

    edges = graph()
    roots = {"vdkit.slurm"} | set(launchers.REGISTRY.values())
    bad = [f"{a} -> {b} (line {line})" for a, targets in edges.items() for b, line in targets.items()
           if any(a == r or a.startswith(r + ".") for r in roots) and b.startswith("vdkit.recipes")]
    assert not bad, "launchers importing engine code:\n" + "\n".join(bad)


def test_no_test_module_imports_another():
    """Shared test code lives in tests/helpers.py (or conftest.py fixtures), never in a test module another
    one imports: a test file can be renamed, split or deleted without breaking the others."""
    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.rglob("test_*.py")} | {"conftest"}
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[-1] in test_modules or name.startswith("tests."):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not found, "test modules importing test modules:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- the layers of docs/architecture.md
def diagram_layers() -> List[Tuple[str, Set[str]]]:
    """The layers of docs/architecture.md's diagram, top (front door) first: (label, repository paths named).

    ``folder/{a, b}.py`` names several modules of one folder (it may wrap onto the next line)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layers: imports go one way", 1)[1].split("```", 2)[1]
    layers: List[Tuple[str, str]] = []
    for line in block.splitlines():
        if not line.strip() or line.strip().startswith("▲"):  # an arrow line carries a description at most
            continue
        if not line[0].isspace():
            layers.append((line[:14].strip(), line[14:]))
        elif layers:
            layers[-1] = (layers[-1][0], layers[-1][1] + " " + line)
    out = []
    for label, body in layers:
        paths: Set[str] = set()
        for folder, names in re.findall(r"([\w/]+/)\{([^}]*)\}\.py", body):
            paths |= {f"{folder}{n.strip()}.py" for n in names.split(",")}
        paths |= set(re.findall(r"(?<![{\w/])((?:vdkit|recipes|slurm|k8s|validation)/[\w/]*\w\.py)", body))
        out.append((label, paths))
    return out


def test_the_architecture_diagram_names_every_module():
    named: Dict[str, str] = {}
    for label, paths in diagram_layers():
        for path in paths:
            assert path not in named, f"{path} is named twice in docs/architecture.md ({named[path]}, {label})"
            named[path] = label
    files = {str(p.relative_to(ROOT)) for p in modules().values()}
    assert not files - set(named), "docs/architecture.md's layer diagram does not name: " + ", ".join(
        sorted(files - set(named)))
    assert not set(named) - files, "docs/architecture.md names modules that do not exist: " + ", ".join(
        sorted(set(named) - files))


def test_the_diagram_parser_reads_groups_and_wrapped_lines():
    """The parser itself: a brace group wrapping onto the next line, a plain path, a layer per label."""
    layers = diagram_layers()
    labels = [label for label, _ in layers]
    assert labels[0] == "front door" and labels[-1] == "types" and "run directory" in labels
    by_label = dict(layers)
    assert {"validation/merge.py", "validation/steps.py", "validation/plots.py"} <= by_label["validation"]
    assert "vdkit/render/prepare.py" in by_label["prepare"] and "recipes/bridge/cpu_shim.py" in by_label["engines"]


DOWNWARD_FOLDERS = ("vdkit.recipes", "vdkit.slurm", "vdkit.k8s", "vdkit.validation")


def _folder(module: str) -> str:
    return next((f for f in DOWNWARD_FOLDERS if module == f or module.startswith(f + ".")), "")


def benchmark_graph() -> Dict[str, Dict[str, int]]:
    """``{benchmark: {benchmark it imports: line}}``: benchmarks/ scripts import each other by file name (the folder is
    on sys.path when one runs)."""
    mods = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    edges: Dict[str, Dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        for target, line in _imported(ast.parse(path.read_text(), str(path)), name, False):
            head = target.split(".")[0]
            if head in mods and head != name:
                edges[name].setdefault(head, line)
    return edges


def test_benchmarks_sit_above_the_package_and_import_no_circle():
    """benchmarks/ is the top layer: it imports the package, the package never imports a benchmark (it is not
    shipped), and the benchmarks import one another one way (no circle: bench_prediction and hf_efficiency once
    imported each other)."""
    edges = benchmark_graph()
    found = cycles(edges)
    assert not found, "benchmark import circles:\n" + "\n".join(_describe(c, edges) for c in found)
    upward = [f"{a} -> benchmarks/{b}.py (line {line})" for a, path in modules().items()
              for b, line in ((t.split(".")[0], n) for t, n in _imported(ast.parse(path.read_text()), a, False))
              if b in edges]
    assert not upward, "the package imports a benchmark:\n" + "\n".join(upward)


def test_engines_launchers_and_validation_import_only_downward():
    """recipes/, slurm/, k8s/ and validation/ import only from their own layer of the diagram or below, and none
    of the four imports another of them at its own layer (the Slurm and Kubernetes launchers know nothing of
    each other)."""
    mods = modules()
    layer_of_path = {path: i for i, (_, paths) in enumerate(diagram_layers()) for path in paths}  # 0: the top
    layer = {name: layer_of_path[str(path.relative_to(ROOT))] for name, path in mods.items()
             if str(path.relative_to(ROOT)) in layer_of_path}
    bad = []
    for a, targets in graph().items():
        if not _folder(a) or a not in layer:
            continue
        for b, line in targets.items():
            if b not in layer:
                continue
            if layer[b] < layer[a] or (layer[b] == layer[a] and _folder(b) and _folder(b) != _folder(a)):
                bad.append(f"{a} -> {b} (line {line})")
    assert not bad, "imports upward (docs/architecture.md's layers):\n" + "\n".join(bad)


# The planner's search and prediction: what an engine must never import (it reads the plan from the run
# directory; the arithmetic it compares against - vdkit.planner.arch, layout, memory, the time plan's
# helpers - it may).
SEARCH = ("vdkit.planner.plan", "vdkit.planner.sharded", "vdkit.planner.predict", "vdkit.planner.predict_hf")


def _engine_side_imports_of_the_search(edges) -> List[str]:
    return [f"{a} -> {b} (line {line})" for a, targets in edges.items() for b, line in targets.items()
            if a.startswith("vdkit.recipes") and b in SEARCH]


def test_engines_import_memory_arithmetic_never_the_layout_search():
    edges = graph()
    assert set(SEARCH) <= set(modules())  # the names are real modules (a rename must update this list)
    bad = _engine_side_imports_of_the_search(edges)
    assert not bad, "engine code importing the planner's search or prediction:\n" + "\n".join(bad)
    # the check finds one: an engine's function-level import of the search
    planted = {"vdkit.recipes.toy": {"vdkit.planner.plan": 7}}
    assert _engine_side_imports_of_the_search(planted) == ["vdkit.recipes.toy -> vdkit.planner.plan (line 7)"]


def _engine_names_in(tree: ast.AST, engines) -> List[Tuple[str, int]]:
    """String constants naming an engine (docstrings aside): an engine's name keyed or compared in code."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.value, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in engines
            and id(n) not in docstrings]


def test_no_engine_name_is_keyed_in_the_prediction_code():
    """Which step-time regime describes an engine is the engine spec's step_time_regime, read through
    the registry, never a table of engine names in the planner."""
    engines = set(_engine_packages())
    found = [f"{name}:{line} {value!r}" for name, path in modules().items() if name.startswith("vdkit.planner")
             for value, line in _engine_names_in(ast.parse(path.read_text(), str(path)), engines)]
    assert not found, "engine names in the planner:\n" + "\n".join(found)
    planted = ast.parse('"""nemo"""\nREGIMES = {"nemo": "unfused", "reference": "hf"}\n')
    assert _engine_names_in(planted, engines) == [("nemo", 2), ("reference", 2)]


MAX_MODULE_LINES = 450  # the house rule (docs/architecture.md, Layers): a module past it is split by what it holds


def test_no_module_is_over_the_house_limit():
    """Every module of the package (vdkit/, recipes/, slurm/, k8s/, validation/) and of benchmarks/ (the scripts whose
    figures docs/ cite: read and changed like the package) is at most MAX_MODULE_LINES long."""
    over = {str(p.relative_to(ROOT)): n for folder in ("vdkit", "recipes", "slurm", "k8s", "validation", "benchmarks")
            for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
