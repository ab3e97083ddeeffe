"""`vdkit check`, before anything of a run directory executes: its files are the kit's render of its own recipe.

A run directory's code (``launch.sbatch``, ``bridge_job.py``, NeMo's callbacks, the conversion jobs) is what the
cluster runs; the check runs some of it too (``bridge_job.py``'s loader). So each file the render writes, but the
engine's config (held to value rules instead: :mod:`vdkit.recipes.common.edits`), is rendered again in memory
from the run's own ``recipe.yaml`` and ``plan.json`` (the render's own functions: :func:`vdkit.render.prepare.files_for`)
and compared byte for byte with the file there. A file that differs, is missing, is a link (a ``nemo.yaml``
pointing at ``/etc/passwd``), a FIFO or unreadable is refused, never run nor read further - and never echoed: the
line names the file and the first line that differs, not its text. The engine config is held to YAML's one rule
the kit's reader does not apply: a key given twice in a mapping (OmegaConf, which NeMo and Bridge load through,
refuses it; PyYAML keeps the last in silence).

Standard library + the kit (the engine's and launcher's renderers through their registries).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple

FIX = "re-render the run with `vdkit render` (or put the rendered file back)"


def _kind(path: Path) -> str:
    """'' for a regular file (not a link), else what it is, in words."""
    from vdkit.composition.files import not_a_regular_file

    try:
        if os.path.islink(path):
            return "a symbolic link (the render writes files)"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return not_a_regular_file(path)


def _first_difference(got: bytes, want: bytes) -> str:
    a, b = got.split(b"\n"), want.split(b"\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}"
    return f"line {min(len(a), len(b)) + 1} ({'more' if len(a) > len(b) else 'fewer'} lines than the render)"


def duplicate_key(path: Path) -> str:
    """'' when no mapping of the YAML file holds a key twice, else 'key K twice (line N)'."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    found = []

    def mapping(loader, node, deep=False):
        seen = set()
        for k, _v in node.value:
            key = loader.construct_object(k, deep=True)
            if not isinstance(key, (dict, list)) and key in seen and not found:
                found.append(f"key {key!r} twice (line {k.start_mark.line + 1})")
            if not isinstance(key, (dict, list)):
                seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        yaml.load(path.read_text(encoding="utf-8", errors="replace"), Loader=Loader)
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return ""  # the engine's reader names a syntax error in its own line
    return found[0] if found else ""


def compare(run_dir: Path, engine, files) -> List[Tuple[str, str, str]]:
    """The defects (what, setting, fix) of ``run_dir``'s files against ``files`` (its render, name -> content):
    every rendered file but ``engine.config_files`` byte for byte; those only for kind and duplicate keys."""
    out, differ = [], []
    for name, content in files.items():
        path = run_dir / name
        kind = _kind(path)
        if kind:
            out.append((f"{name} is {kind}, not the file the kit renders for this run: refused, never run or read",
                        name, FIX))
            continue
        if name in engine.config_files:
            twice = duplicate_key(path)
            if twice:
                out.append((f"{name} holds {twice}: OmegaConf, which the job loads it with, refuses it (PyYAML keeps "
                            "the last in silence)", name, f"keep one, {FIX}"))
            continue
        want = content if isinstance(content, bytes) else content.encode()
        try:
            got = path.read_bytes()
        except OSError as exc:
            out.append((f"{name} is unreadable ({exc.strerror})", name, FIX))
            continue
        if got != want:
            differ.append(f"{name} (from {_first_difference(got, want)})")
    if differ:  # one line for the run dir (a copied one differs in every file that names its path)
        out.append((f"{', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'} from the kit's render of this "
                    "run's recipe.yaml and plan.json: code or a script that differs is refused, never run",
                    differ[0].split(" ")[0], FIX))
    return out


def check(run_dir: Path) -> List[Tuple[str, str, str]]:
    """:func:`compare` for one run directory, its render made here; a recipe the kit cannot render is one defect."""
    from vdkit.errors import UserError
    from vdkit.render.prepare import engine_of, files_for
    from vdkit.run.rundir import RECIPE_FILE, load_plan

    try:
        plan = load_plan(run_dir)
        files = files_for(plan, run_dir)
    except UserError as exc:
        return [(f"the kit cannot render this run again to compare with: {exc.what}", RECIPE_FILE, exc.fix or FIX)]
    return compare(run_dir, engine_of(plan), files)
