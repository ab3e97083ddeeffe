"""The command line's override syntax and the sweep's size, before anything composes.

Syntax Hydra accepts but vdkit would silently mis-read (``~key``, ``hydra.*``, a key given twice,
sweep syntax without ``-m``, ``glob()`` / ``interval()``): :func:`check_overrides`; an environment
interpolation (``${oc.env:VAR}``) in any override: :func:`refuse_env_interpolation`. A ``-m``
product over :data:`MAX_CELLS` cells: :func:`check_sweep_size` (before expansion) and
:func:`check_cell_count` (after a named sweep is expanded).
"""
from __future__ import annotations

import math
import re
from typing import Sequence

from vdkit.errors import UserError

MAX_CELLS = 256  # a sweep larger than this is a typo (range(0,10000)), not a plan: say so before composing
# ${oc.env:VAR} (and the old ${env:VAR}, ${oc.decode:...}): refused on the command line and in a site's files
ENV_INTERPOLATION = re.compile(r"\$\{\s*(oc\.env|env|oc\.decode)\s*:")


def refuse_env_interpolation(overrides) -> None:
    """Refuse ``${oc.env:VAR}`` (and the old ``${env:VAR}``) in any override.

    Composition resolves it, so the variable's value - often a token - would land in the run
    directory's name, the Slurm job name and recipe.yaml. The shell can expand a non-secret
    variable itself; secrets belong in run.secrets_file, which only the job reads.
    """
    for o in overrides:
        if ENV_INTERPOLATION.search(str(o)):
            key = str(o).split("=", 1)[0]
            raise UserError(f"{key}: environment interpolation ${{oc.env:...}} is refused: its value (maybe a "
                            "token) would be written into the run dir name, the job name and recipe.yaml",
                            f"let your shell expand a non-secret variable ({key}=\"$VAR\"); pass secrets "
                            "through run.secrets_file")


def _parse(overrides: Sequence[str]):
    from hydra.errors import HydraException

    from vdkit.composition.confsource import parse_overrides

    try:
        return parse_overrides(overrides)
    except HydraException:
        return None  # compose reports Hydra's own message


def _refuse_unquoted(overrides: Sequence[str]) -> None:
    """A ``key=value`` whose value Hydra's grammar cannot read unquoted (pyxis' ``nvcr.io#nvidia/nemo:24.01``, a path
    with a space or parentheses): Hydra's own message ('LexerNoViableAltException', "mismatched input '='") names
    neither the override nor the cure. Other unparsable overrides (no ``=``) keep Hydra's message."""
    for raw in overrides:
        key, eq, value = str(raw).partition("=")
        if eq and re.fullmatch(r"[+~]{0,2}[\w.@/-]+", key) and _parse([raw]) is None and _parse([f"{key}='{value}'"]):
            raise UserError(f"{raw}: the value holds characters Hydra's override grammar reserves (#, ;, =, spaces, "
                            "brackets, parentheses, quotes) and cannot be read unquoted",
                            f"quote the value: {key}='{value}' (in a shell: \"{key}='{value}'\")")


def check_overrides(overrides: Sequence[str], multirun: bool = False, duplicates: bool = True) -> None:
    """Override syntax that Hydra accepts but vdkit would silently mis-read.

    ``~key`` (deleting falls back to the schema's defaults, e.g. ``~model`` became llama2_7b),
    ``hydra.*`` (vdkit composes, it does not run as a Hydra app: hydra.run.dir / hydra.job.chdir do
    nothing), a key given twice (one is dropped), sweep syntax without ``-m``, ``glob()`` /
    ``interval()`` (no finite list of cells here).
    """
    parsed = _parse(overrides)
    if parsed is None:
        _refuse_unquoted(overrides)
        return
    seen = {}
    for raw, o in zip(overrides, parsed):
        key = o.get_key_element().lstrip("+~")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise UserError(f"{key}: vdkit composes its config with Hydra but does not run as a Hydra app, so "
                            "hydra.* settings have no effect",
                            "drop it; --out DIR chooses where run directories go")
        if o.is_delete():
            raise UserError(f"{raw}: deleting a config group or key is refused (vdkit would silently fall back to "
                            "the schema's default, e.g. ~model became llama2_7b)",
                            "choose an option instead, e.g. model=tiny_llama, or set the key to null")
        name = key.split("@", 1)[0]
        if name == "recipe_method":  # conf/config.yaml picks it from recipe and method
            raise UserError(f"{raw}: recipe_method is chosen by recipe= and method= (conf/recipe_method/"
                            "<recipe>_<method>.yaml), not on the command line",
                            "choose recipe=NAME and method=NAME, and override single keys, e.g. data.packed=false")
        if duplicates and name in seen:
            raise UserError(f"{name} is given twice ({seen[name]} and {raw}); one would be silently dropped",
                            f"give {name} once" + (" (a comma list with -m sweeps it)" if multirun else ""))
        seen[name] = raw
        if o.is_sweep_override():
            text = str(raw).split("=", 1)[1] if "=" in str(raw) else str(raw)
            for fn in ("glob(", "interval("):
                if text.lstrip().startswith(fn):
                    raise UserError(f"{raw}: {fn[:-1]}() sweeps are not supported by vdkit's sweeps "
                                    "(no finite list of cells)",
                                    f"list the values with commas and -m, e.g. -m {key}=a,b"
                                    + (f" (options: vdkit plan --cfg lists keys; conf/{key}/ holds the {key} options)"
                                       if "." not in key else ""))
            if not multirun:
                raise UserError(f"{raw} is a sweep (several values for {name}), but -m was not given",
                                f"add -m to plan every value, or quote a literal comma: {name}='a,b'")


def _sweep_product(overrides: Sequence[str], limit: int):
    """(cells, the override that passed ``limit`` or None) of a ``-m`` product, counted without expanding it."""
    parsed = _parse(overrides)
    if parsed is None:
        return 1, None
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    cells = 1
    for o in parsed:
        if not o.is_sweep_override():
            continue
        v = o.value()
        if isinstance(v, RangeSweep):
            start, stop, step = v.start, v.stop, v.step or 1
            n = max(0, math.ceil((stop - start) / step)) if step else 0
        elif isinstance(v, ChoiceSweep):
            n = len(v.list)
        else:
            continue
        cells *= max(n, 1)
        if cells > limit:
            return cells, o
    return cells, None


def sweep_size(overrides: Sequence[str], limit: int = MAX_CELLS) -> int:
    """The cells a ``-m`` product of ``overrides`` has (a number above ``limit`` once it passes it), unexpanded."""
    return _sweep_product(overrides, limit)[0]


def check_sweep_size(overrides: Sequence[str], limit: int = MAX_CELLS) -> None:
    """Refuse a ``-m`` product of more than ``limit`` cells before it is expanded (range(0,10**9) included)."""
    cells, o = _sweep_product(overrides, limit)
    if o is not None:
        raise UserError(f"the sweep has {cells:,}+ cells, more than the {limit} vdkit plans in one command "
                        f"(from {o.input_line})",
                        "narrow the lists (e.g. range(0,8)), or run several smaller sweeps")


def check_cell_count(n: int, what: str, limit: int = MAX_CELLS) -> None:
    """Refuse ``n`` expanded cells above ``limit`` (a named sweep times the command line's lists)."""
    if n > limit:
        raise UserError(f"{what} has {n:,} cells, more than the {limit} vdkit plans in one command",
                        "narrow the comma lists / range() you added, or run several smaller sweeps")
