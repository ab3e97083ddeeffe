"""The megatron and bridge engines move to new stack versions apart, but for one named coupling: the
megatron-core CPU shim ``recipes/common/mcore_cpu.py`` and its pin (megatron-core 0.16.1), which both use.

Why it is shared rather than split: nearly all of it patches megatron-core's private names (the CUDA RNG
state, the default causal mask, the local layer spec), which depend on the megatron-core release, not on
the engine; two copies would be the same lines twice while both engines run 0.16.1. What the tests hold:
both engines declare the shim's megatron-core series, both extras pin the shim's release, and the shim is
the only module either engine imports from the other's reach that touches megatron-core. An engine that
moves to another megatron-core (e.g. Bridge 0.4.0 in nemo:26.04 is on 0.17) fails here with the one line that
says what to do: give that engine its own shim for its pin (recipes/<engine>/), keep this one for the other.
"""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIM = "vdkit.recipes.common.mcore_cpu"


def series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def coupling_problems(megatron_series: str, bridge_series: str, shim_version: str, extras: dict) -> list:
    """What breaks the one coupling: an engine declaring another megatron-core series than the shared shim's, or
    an extra pinning another release; each problem a line naming the shim and the fix."""
    fix = (f"the megatron and bridge engines share {SHIM} (megatron-core {shim_version}): give the engine that "
           "moves its own shim for its pin under recipes/<engine>/ and keep this one for the other")
    out = [f"the {name} engine declares megatron-core {have}, the shared shim is for {shim_version}: {fix}"
           for name, have in (("megatron", megatron_series), ("bridge", bridge_series)) if have != series(shim_version)]
    for extra in ("megatron", "bridge"):
        pins = [d for d in extras[extra] if re.match(r"megatron-core\b", d)]
        if pins != [f"megatron-core=={shim_version}"]:
            out.append(f"the {extra} extra pins {pins}, the shared shim is for {shim_version}: {fix}")
    return out


def _pins():
    from vdkit.recipes import megatron
    from vdkit.recipes.bridge import versions
    from vdkit.recipes.common.mcore_cpu import TESTED_VERSION

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return megatron.MCORE_SERIES, versions.MCORE_VERSION, TESTED_VERSION, extras


def test_both_engines_declare_the_shared_shims_megatron_core_pin():
    assert coupling_problems(*_pins()) == []


@pytest.mark.parametrize("engine", ["megatron", "bridge"])
def test_an_engine_moving_alone_names_the_shim_as_the_coupling(engine):
    megatron_series, bridge_series, shim, extras = _pins()
    moved = (("0.17", bridge_series) if engine == "megatron" else (megatron_series, "0.17"))
    problems = coupling_problems(*moved, shim, extras)
    assert len(problems) == 1 and problems[0].startswith(f"the {engine} engine declares megatron-core 0.17")
    assert SHIM in problems[0] and "recipes/<engine>/" in problems[0]


def _imports(package: str) -> set:
    """Every vdkit.recipes module the engine package's modules import (at any depth of their code)."""
    out = set()
    for path in (ROOT / "recipes" / package).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vdkit.recipes"):
                out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.startswith("vdkit.recipes")}
    return out


def _touches_megatron(module: str) -> bool:
    path = ROOT / "recipes" / (module.removeprefix("vdkit.recipes.").replace(".", "/") + ".py")
    return path.is_file() and re.search(r"^\s*(from|import) megatron\b", path.read_text(), re.M) is not None


def test_the_shim_is_the_only_megatron_core_code_the_engines_share():
    shared = {m for m in _imports("megatron") & _imports("bridge")
              if not m.startswith(("vdkit.recipes.megatron", "vdkit.recipes.bridge"))}
    assert {m for m in shared if _touches_megatron(m)} == {SHIM}
