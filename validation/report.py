"""Rebuilding a design-guide table from run directories: the table, its files and plots.

The domain half of ``vdkit report``; ``vdkit demo`` calls :func:`write_report` directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

from vdkit.errors import UserError


def write_report(runs: Sequence, table_name: str = "table9", out="report", plots: bool = True) -> Tuple[object, List[Path]]:
    """Collect ``runs``, build ``table_name`` next to the published figures, write it (+ PNG plots) to ``out``.

    Returns (the table, the files written). Raises UserError for a path that is not a run directory.
    """
    from vdkit.rundir import safe_dir_name
    from vdkit.validation import tables

    for r in runs:
        if not Path(r).is_dir():
            raise UserError(f"{r} is not a run directory", "pass run directories, e.g. `vdkit report runs/*`")
    published = tables.load_published(table_name)
    results = tables.collect_runs(list(runs), int(published["steps"]))
    table = tables.table9(results) if table_name == "table9" else tables.training_table(results)
    extra = {}
    if plots:
        from vdkit.validation import plots as png

        extra[f"{table.name}_scaling.png"] = png.scaling_png(table)
        for res in results:
            if res.estimate is not None:
                name = f"trace_{safe_dir_name(Path(res.path).name)}.png"
                extra[name] = png.trace_png(res.log, res.estimate, title=Path(res.path).name)
    return table, tables.write_table(table, out, extra)
