"""Rebuilding a published table from run directories: the table, its files and plots.

The domain half of ``vdkit report``; ``vdkit demo`` calls :func:`write_report` directly. Every
published table goes through the one builder (:func:`vdkit.validation.tables.build`) and the one
writer (:mod:`vdkit.validation.table_output`).
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
    from vdkit.validation.table_output import write

    for r in runs:
        if not Path(r).is_dir():
            raise UserError(f"{r} is not a run directory", "pass run directories, e.g. `vdkit report runs/*`")
    table = build(table_name, list(runs))
    return table, write(table, out, plots=plots)


def build(name: str, runs: Sequence = (), folder: Optional[Path] = None):
    """The published table ``name`` rebuilt from the run directories ``runs`` (none: the planned table):
    :func:`vdkit.validation.tables.build`."""
    from vdkit.validation.tables import build as build_table

    return build_table(name, runs, folder)


def markdown(table) -> str:
    """Any built table as Markdown, in its layout's shape."""
    from vdkit.validation.table_output import to_markdown

    return to_markdown(table)
