"""A sweep file (conf/sweep/NAME.yaml) read as data and checked before any cell is expanded.

Its size is checked before it is read, it is read as YAML data only (tags refused), and its cells are
counted - lists and ranges multiplied, nothing expanded - so a binary file, a top-level list or 20,000
cells is one line at once (:mod:`vdkit.composition.config` expands the cells that pass).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

from vdkit.errors import UserError

FIX = "write it as conf/sweep/table9.yaml is: a mapping with cells: [[override, ...], ...] (and base:)"
_SCALAR = (str, int, float, bool)


def read(path: Path) -> dict:
    """The sweep file at ``path`` (which exists) as a mapping; a UserError for anything else."""
    from vdkit.composition.files import load_yaml
    from vdkit.composition.limits import MAX_SWEEP_FILE_BYTES, check_size

    if path.is_file():
        check_size(path, MAX_SWEEP_FILE_BYTES, "sweep file", FIX)
        with open(path, "rb") as fh:
            if b"\0" in fh.read(8192):
                raise UserError(f"sweep file {path} is binary (NUL bytes), not YAML text", FIX)
    data = load_yaml(path, "sweep file", FIX)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"sweep file {path} holds a {type(data).__name__}, not a mapping", FIX)
    return data


def checked_cells(name: str, path: Path, data: dict, extra: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    """(base, cells) of a sweep file's data as override strings, refused when malformed or when the cells
    (times the command line's ``extra`` lists) number more than MAX_CELLS - counted, not expanded."""
    from vdkit.rules.overrides import MAX_CELLS, sweep_size

    cells, base = data.get("cells"), data.get("base") or []
    if not isinstance(cells, list) or not cells or not all(isinstance(c, list) for c in cells) \
            or not all(isinstance(x, _SCALAR) for c in cells for x in c):
        raise UserError(f"sweep file {path} has no 'cells' list of override lists", "see conf/sweep/table9.yaml")
    if not isinstance(base, list) or not all(isinstance(x, _SCALAR) for x in base):
        raise UserError(f"sweep file {path}: 'base' is not a list of overrides", "see conf/sweep/table9.yaml")
    base = [str(x) for x in base]
    cells = [[str(x) for x in cell] for cell in cells]
    total = len(cells)  # each cell is at least one, and its lists multiply
    if total <= MAX_CELLS:
        total = 0
        for cell in cells:
            total += sweep_size(base + cell + list(extra), MAX_CELLS + 1 - total)
            if total > MAX_CELLS:
                break
    if total > MAX_CELLS:
        raise UserError(f"--sweep {name} has {f'{total:,}' if total == len(cells) else f'{total:,}+'} cells, more "
                        f"than the {MAX_CELLS} vdkit plans in one command", "split the sweep file into smaller ones, "
                        "or narrow the comma lists / range() of its cells and of the command line")
    return base, cells
