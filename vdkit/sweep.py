"""Planning a verb's cells: one recipe, a ``-m`` product or a named sweep, every cell before any acts."""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

from vdkit.errors import UserError


def feasible_plans(overrides: Sequence[str], multirun: bool = False, sweep: Optional[str] = None,
                   verb: str = "render") -> list:
    """Compose and plan every override set (one recipe, ``-m`` or ``sweep``).

    A sweep skips the cells that do not fit or have no valid layout, with a note on stderr naming
    ``verb``; a single recipe raises the UserError. Raises when no cell is left.
    """
    from vdkit.config import compose, override_sets
    from vdkit.plan import make_plan, require_feasible

    many = bool(multirun or sweep)
    plans: List = []
    for cell in override_sets(list(overrides), multirun, sweep):
        recipe = compose(cell)
        try:
            plans.append(require_feasible(make_plan(recipe)))
        except UserError as exc:
            if not many:
                raise
            print(f"vdkit {verb}: skipped {' '.join(cell) or recipe.run_name}: {exc}", file=sys.stderr)
    if not plans:
        raise UserError(f"no cell of the sweep is feasible, nothing to {verb}", "see the notes above; change the sweep")
    return plans
