"""Rebuilding a published table from run directories: the table, its files and plots.

The domain half of ``vdkit report``; ``vdkit demo`` calls :func:`write_report` directly. Every
published table goes through the one builder (:func:`vdkit.validation.tables.build`).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from vdkit.errors import UserError


def write_report(runs: Sequence, table_name: str, out="report", plots: bool = True) -> Tuple[object, List[Path]]:
    """Collect ``runs``, build ``table_name`` next to the published figures, write it (+ PNG plots) to ``out``.

    Returns (the table, the files written). Raises UserError for an unknown table or a path that is not
    a run directory.
    """
    from vdkit.rundir import safe_dir_name
    from vdkit.validation import tables

    for r in runs:
        if not Path(r).is_dir():
            raise UserError(f"{r} is not a run directory", "pass run directories, e.g. `vdkit report runs/*`")
    table = build(table_name, list(runs))
    if table.layout == "rows":
        from vdkit.validation import hf_tables

        return table, hf_tables.write(table, out, plots=plots)
    extra = {}
    if plots:
        from vdkit.validation import plots as png

        extra[f"{table.name}_scaling.png"] = png.scaling_png(table)
        for res in table.results:
            if res.estimate is not None:
                name = f"trace_{safe_dir_name(Path(res.path).name)}.png"
                extra[name] = png.trace_png(res.log, res.estimate, title=Path(res.path).name)
    return table, tables.write_table(table, out, extra)


def build(name: str, runs: Sequence = (), folder: Optional[Path] = None):
    """The published table ``name`` rebuilt from the run directories ``runs`` (none: the planned table).

    Returns a :class:`Table` (``grid`` / ``nodes``) or a :class:`vdkit.validation.hf_tables.HFTable`
    (``rows``); every table has ``name``, ``layout`` and ``warnings``. UserError for an unknown name or
    a path that is not a run directory."""
    from vdkit.validation.tables import collect_runs, grid_table, nodes_table, spec

    pub = spec(name, folder)
    if pub["layout"] == "rows":
        from vdkit.validation.hf_tables import build_rows

        return build_rows(pub, runs)
    results = collect_runs(list(runs), int(pub["steps"]))
    return grid_table(pub, results) if pub["layout"] == "grid" else nodes_table(pub, results)


def markdown(table) -> str:
    """Any built table as Markdown, in its layout's shape."""
    if table.layout == "rows":
        from vdkit.validation.hf_tables import to_markdown as rows_markdown

        return rows_markdown(table)
    from vdkit.validation.tables import to_markdown

    return to_markdown(table)
