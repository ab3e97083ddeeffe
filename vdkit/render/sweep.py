"""A verb's cells: one recipe, a ``-m`` product or a named sweep, expanded and then planned, every cell
before any acts.

Expansion: ``-m a=x,y b=1,2`` is Hydra's own override parser and sweeper split (the cartesian
product, :func:`expand_multirun`); ``--sweep NAME`` reads ``conf/sweep/NAME.yaml`` (cells as data,
:func:`sweep_cells`) and appends the command line's overrides to every cell; :func:`override_sets`
is the one entry the verbs use, with the command line's rules (:mod:`vdkit.rules.overrides`).
Planning: :func:`plan_cells` / :func:`feasible_plans`, one rule for skipping a sweep's infeasible cells.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

from vdkit.composition.config import group_options, hydra_message
from vdkit.composition.conftree import conf_dir
from vdkit.errors import EngineCannot, UserError
from vdkit.rules.overrides import refuse_env_interpolation


# ----------------------------------------------------------------------------- expansion
def expand_multirun(overrides: List[str]) -> List[List[str]]:
    """Hydra-style ``-m`` expansion: ``model=a,b cluster.nodes=1,2`` -> the cartesian product."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    from vdkit.composition.confsource import parse_overrides

    refuse_env_interpolation(overrides)  # expansion would escape it into a literal: say so instead
    try:
        parsed = parse_overrides(overrides)  # each string parsed once per process (compose parses them again)
        batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    except HydraException as exc:
        raise UserError(f"invalid override: {hydra_message(exc)}", "write overrides as key=value or key=a,b") from None
    return [list(cell) for batch in batches for cell in batch]


def load_sweep(name: str) -> dict:
    """The named sweep file conf/sweep/NAME.yaml as a mapping (:func:`vdkit.composition.sweepfile.read`)."""
    from vdkit.composition import sweepfile

    path = conf_dir() / "sweep" / f"{name}.yaml"
    if not path.exists():
        raise UserError(f"no sweep named {name!r}", "use --sweep " + " | --sweep ".join(group_options("sweep")))
    return sweepfile.read(path)


def sweep_cells(name: str, extra: List[str] = ()) -> List[List[str]]:
    """The override sets of the named sweep conf/sweep/NAME.yaml, each followed by ``extra``.

    A sweep file holds ``cells: [[override, ...], ...]`` and optionally ``base: [override, ...]``
    put before every cell; ``extra`` (the command line's own overrides) is appended to every
    cell, so it wins. Checked and counted before any cell is expanded (:mod:`vdkit.composition.sweepfile`).
    """
    from vdkit.composition.sweepfile import checked_cells

    base, cells = checked_cells(name, conf_dir() / "sweep" / f"{name}.yaml", load_sweep(name), extra)
    expanded: List[List[str]] = []
    for cell in cells:
        expanded.extend(expand_multirun(base + cell + list(extra)))
    return expanded


def override_sets(overrides: List[str], multirun: bool = False, sweep: Optional[str] = None) -> List[List[str]]:
    """The override sets a verb runs on: one, a ``-m`` product, or a named sweep's cells."""
    from vdkit.rules.overrides import check_cell_count, check_overrides, check_sweep_size

    refuse_env_interpolation(overrides)  # before expansion, which escapes it into a literal
    if sweep is not None and not str(sweep).strip():
        raise UserError("--sweep was given an empty name", "use --sweep " + " | --sweep ".join(group_options("sweep")))
    if sweep and multirun:
        raise UserError(f"--sweep {sweep} and -m do not combine (every cell would be planned twice)",
                        "drop -m: comma lists after --sweep already sweep every cell of it")
    check_overrides(overrides, multirun=bool(multirun or sweep))
    if sweep or multirun:
        check_sweep_size(overrides)  # before expansion: range(0,10**9) would never finish
    if sweep:
        cells = sweep_cells(sweep, overrides)
        check_cell_count(len(cells), f"--sweep {sweep} with {' '.join(overrides) or 'no overrides'}")
        return cells
    if multirun:
        return expand_multirun(overrides)
    return [list(overrides)]


# ----------------------------------------------------------------------------- planning


def plan_cells(cells: Sequence[Sequence[str]], many: bool, verb: str, require_fit: bool = True) -> list:
    """Plan each cell (override list). One rule for every verb that takes sweeps (plan, render, submit, demo):

    a cell of a sweep (``many``) that has no valid layout - or, with ``require_fit``, does not fit - is
    skipped with a one-line note on stderr naming ``verb``; a single recipe raises the UserError.
    Composition errors (a bad key or option) are never skipped: they are the command line's; a cell its engine's
    spec cannot build (:class:`vdkit.errors.EngineCannot`) is skipped like one that does not fit. Raises
    when no cell is left.
    """
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan, require_feasible

    plans: List = []
    skipped: List[tuple] = []  # (cell, error): notes only when some cell is left, else one line
    for cell in cells:
        try:
            recipe = compose(list(cell))
        except EngineCannot as exc:  # the engine's spec lacks what the cell asks (P-tuning on Bridge): skipped
            if not many:
                raise
            skipped.append((cell, None, exc))
            continue
        try:
            plan = make_plan(recipe)
            if require_fit:
                require_feasible(plan)
        except UserError as exc:
            if not many:
                raise
            skipped.append((cell, recipe, exc))
            continue
        plans.append(plan)
    if not plans:
        cell, recipe, exc = skipped[0]
        more = f" (and {len(skipped) - 1} more cell(s))" if len(skipped) > 1 else ""
        raise UserError(f"no cell of the sweep is feasible, nothing to {verb}: {' '.join(cell) or getattr(recipe, 'run_name', '')}: "
                        f"{exc.what}{more}", exc.fix or "change the sweep")
    for cell, recipe, exc in skipped:
        print(f"vdkit {verb}: skipped {' '.join(cell) or getattr(recipe, 'run_name', '')}: {exc}", file=sys.stderr)
    return plans


def feasible_plans(overrides: Sequence[str], multirun: bool = False, sweep: Optional[str] = None,
                   verb: str = "render", require_fit: bool = True) -> list:
    """Compose and plan every override set (one recipe, ``-m`` or ``sweep``): :func:`plan_cells`."""
    cells = override_sets(list(overrides), multirun, sweep)
    return plan_cells(cells, bool(multirun or sweep is not None), verb, require_fit)
