"""Which published rows set which prediction range, and the ranges they give.

conf/calibration/step_time.yaml's ``intervals`` name, per range group (vdkit.planner.interval.group), the row
sets whose leave-one-out errors set it (``derived_from``) and why those (``why``). ``bench_prediction.py`` prints
each group's range from them (its ``range`` lines) and, with ``--fit``, writes ``min``, ``max`` and the
``figures`` text a plan prints; a row set named by no group (Table 4) stays in the fit and in the tables but
sets no range.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

#: the published row sets a range can be derived from, and how a plan's range text names them ({n}: how many)
ROW_SETS = {
    "table9": "Table 9's {n} fine-tuning cells (NeMo 1.x unfused defaults)",
    "table4": "Table 4's {n} pretraining rows (PowerScale storage paper)",
    "nvidia_pretrain": "NVIDIA's {n} Llama 2 pretraining rows",
    "nvidia_finetune": "NVIDIA's {n} Llama 2 fine-tuning rows (SFT, LoRA; packed 4096)",
}


def row_set(table: str, method: str) -> str:
    """The row set of a published figure: its table (table9 | table4 | nvidia), NVIDIA's split by what it ran."""
    if table != "nvidia":
        return table
    return "nvidia_pretrain" if method == "pretrain" else "nvidia_finetune"


def derive(rows: Iterable[Tuple[str, str, float]], spec: Dict[str, dict]) -> Dict[str, dict]:
    """Each group's range from ``rows`` (row set, row name, leave-one-out error) and ``spec`` (the calibration
    file's ``intervals``: ``derived_from`` per group). Returns min / max error, the rows that set them, and the
    count per row set; a group whose row sets hold no row is an error (nothing would back its range)."""
    rows = list(rows)
    out = {}
    for group, entry in spec.items():
        sets = list(entry.get("derived_from") or [])
        unknown = [s for s in sets if s not in ROW_SETS]
        if unknown:
            raise ValueError(f"intervals.{group}.derived_from names {unknown}; known row sets: {sorted(ROW_SETS)}")
        mine = [(s, name, err) for s, name, err in rows if s in sets]
        if sets and not mine:
            raise ValueError(f"intervals.{group}: no published row in {sets}")
        if not mine:
            continue  # a group derived elsewhere (hf_step_time.yaml's)
        lo, hi = min(mine, key=lambda r: r[2]), max(mine, key=lambda r: r[2])
        out[group] = {"min": lo[2], "max": hi[2], "min_row": lo[1], "max_row": hi[1], "n": len(mine),
                      "counts": {s: sum(1 for r in mine if r[0] == s) for s in sets}}
    return out


def width(d: dict) -> float:
    """How many times wider the range's high end is than its low end: (1 + max) / (1 + min)."""
    return (1 + d["max"]) / (1 + d["min"])


def figures_text(d: dict, why: str = "") -> str:
    """The line a plan prints: what the range is derived from, the errors and the rows at its ends, its width."""
    parts = " and ".join(ROW_SETS[s].format(n=n) for s, n in d["counts"].items())
    text = (f"derived from {parts}: leave-one-out {d['min']:+.0%} ({d['min_row']}) .. {d['max']:+.0%} "
            f"({d['max_row']}), {width(d):.2f}x wide")
    return text.replace("%", " %") + (f"; {why}" if why else "")


def _entry(group: str, d: dict, sets: List[str], why: str) -> str:
    lo, hi = math.floor(d["min"] * 1000) / 1000, math.ceil(d["max"] * 1000) / 1000  # outward: the ends stay inside
    q = lambda s: s.replace('"', "'")  # noqa: E731 - one YAML double-quoted scalar each
    return (f"  {group}: {{min: {lo:.3f}, max: {hi:.3f}, derived_from: [{', '.join(sets)}],\n"
            f"    why: \"{q(why)}\",\n    figures: \"{q(figures_text(d, why))}\"}}")


def write(path: Path, ranges: Dict[str, dict], spec: Dict[str, dict]) -> None:
    """Rewrite each derived group's entry under ``intervals:`` in ``path`` (comments and other keys kept)."""
    text = path.read_text()
    for group, d in ranges.items():
        entry = _entry(group, d, list(spec[group]["derived_from"]), spec[group].get("why", ""))
        text, n = re.subn(rf"\n  {group}: \{{.*?\}}(?=\n)", lambda m: "\n" + entry, text, flags=re.S)
        if n != 1:
            raise ValueError(f"{path}: intervals.{group} not found once")
    path.write_text(text)
