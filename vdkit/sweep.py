"""Planning a verb's cells: one recipe, a ``-m`` product or a named sweep, every cell before any acts."""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

from vdkit.errors import UserError


def plan_cells(cells: Sequence[Sequence[str]], many: bool, verb: str, require_fit: bool = True) -> list:
    """Plan each cell (override list). One rule for every verb that takes sweeps (plan, render, submit, demo):

    a cell of a sweep (``many``) that has no valid layout - or, with ``require_fit``, does not fit - is
    skipped with a one-line note on stderr naming ``verb``; a single recipe raises the UserError.
    Composition errors (a bad key or option) are never skipped: they are the command line's. Raises
    when no cell is left.
    """
    from vdkit.config import compose
    from vdkit.planner.plan import make_plan, require_feasible

    plans: List = []
    skipped: List[tuple] = []  # (cell, error): notes only when some cell is left, else one line
    for cell in cells:
        recipe = compose(list(cell))
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
        raise UserError(f"no cell of the sweep is feasible, nothing to {verb}: {' '.join(cell) or recipe.run_name}: "
                        f"{exc.what}{more}", exc.fix or "change the sweep")
    for cell, recipe, exc in skipped:
        print(f"vdkit {verb}: skipped {' '.join(cell) or recipe.run_name}: {exc}", file=sys.stderr)
    return plans


def feasible_plans(overrides: Sequence[str], multirun: bool = False, sweep: Optional[str] = None,
                   verb: str = "render", require_fit: bool = True) -> list:
    """Compose and plan every override set (one recipe, ``-m`` or ``sweep``): :func:`plan_cells`."""
    from vdkit.config import override_sets

    cells = override_sets(list(overrides), multirun, sweep)
    return plan_cells(cells, bool(multirun or sweep is not None), verb, require_fit)
