"""`vdkit plan`'s published line: the published figure of which a planned recipe is a cell.

A recipe is a cell of a published table (validation/published/*.yaml, read by :mod:`vdkit.validation.tables`)
only when it is that run: it meets every condition of the table's ``recipe`` (the GPU the figures were
measured on among them) and of the cell's own, its key fields name the cell, and its model is the published
one dimension for dimension (:func:`same_model`), not only by name.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from vdkit.validation.tables import figure, key_of, published_cells, spec, table_names

# ModelCfg fields that do not change the model a published figure is for: its name (the cell's key), where
# its weights are, the training guide's layout hints.
NOT_ARCHITECTURE = ("name", "nemo_path", "hf_path", "megatron_path", "pretrain_tp", "pretrain_pp")


def matches(recipe, conditions: dict) -> bool:
    """Whether ``recipe`` has every ``{dotted.field: value}`` of ``conditions`` (a list: any of them; a
    string may be a glob, e.g. ``MI300X*``)."""
    for path, want in (conditions or {}).items():
        value = recipe
        for part in path.split("."):
            value = getattr(value, part)
        options = want if isinstance(want, list) else [want]
        if not any(value == w or (isinstance(w, str) and isinstance(value, str) and fnmatch.fnmatchcase(value, w))
                   for w in options):
            return False
    return True


def _shipped_model(name: str) -> Optional[tuple]:
    """The architecture of the kit's ``conf/model/<name>.yaml`` (:func:`_architecture`), None without one."""
    from vdkit.composition.conftree import conf_dir

    path = conf_dir() / "model" / f"{name}.yaml"
    return _model_file(str(path), path.stat().st_mtime_ns) if path.is_file() else None


@lru_cache(maxsize=64)
def _model_file(path: str, mtime_ns: int) -> tuple:
    """One parse per model file version (`vdkit plan --sweep` cites a table for every cell)."""
    from omegaconf import OmegaConf

    from vdkit.composition.files import load_yaml
    from vdkit.composition.schema import ModelCfg

    # typed as composition types it (a YAML "1e-5" is a float there too)
    data = load_yaml(path, "model config")
    return _architecture(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelCfg), data)))


def _architecture(model) -> tuple:
    """Every field of ``model`` (a ModelCfg) but its name, weights' paths and layout hints: the model itself."""
    import dataclasses

    return tuple((f.name, getattr(model, f.name)) for f in dataclasses.fields(model) if f.name not in NOT_ARCHITECTURE)


def same_model(model) -> bool:
    """Whether ``model`` is the published model its name says: the kit's conf/model/<name>.yaml, dimension for
    dimension (``model=llama2_7b model.num_layers=1000000000`` is a model no table published)."""
    return _shipped_model(model.name) == _architecture(model)


@dataclass(frozen=True)
class PublishedFigure:
    """The published figure of a planned recipe, when the recipe is a cell of a published table."""

    table: str  # how the table is cited (a spec's cited_as)
    text: str  # the figure as the source prints it, with its unit
    minutes: Optional[float]  # in minutes for `steps` steps (None: an upper bound, out of memory or N/A)
    steps: int  # the steps the minutes are for (the table's steps, else the recipe's train.target_steps)
    short: str = ""  # for a table cell when there are no minutes: "< 10", "OOM", "N/A"
    rate: bool = False  # the figure is for a step count (the table's steps): the same rate holds for others

    def minutes_for(self, steps: int) -> Optional[float]:
        """The published minutes for ``steps`` steps (a figure for a whole run or an epoch: as it is)."""
        if self.minutes is None or not self.rate:
            return self.minutes
        return self.minutes * steps / self.steps

    def line(self, prediction) -> str:
        """'<table>: <figure>; predicted <minutes> (<ratio>)' for `vdkit plan`."""
        out = f"{self.table}: {self.text}"
        if prediction is not None:
            mine = prediction.step_seconds * self.steps / 60.0
            out += f"; predicted {mine:,.1f} min"
            if self.minutes:
                out += f" ({mine / self.minutes:.2f}x the published)"
        return out


def published_for(recipe, folder: Optional[Path] = None) -> Optional[PublishedFigure]:
    """The published figure of which ``recipe`` is a cell (the first table whose ``recipe`` conditions it
    meets and that has its key), in minutes (:meth:`PublishedFigure.minutes_for` other step counts); else None."""
    steps = recipe.train.target_steps
    for name in table_names(folder):
        pub = spec(name, folder)
        if not pub.get("recipe") or not matches(recipe, pub["recipe"]):
            continue
        cell = published_cells(pub).get(key_of(pub, recipe))
        if cell is None or not matches(recipe, cell.get("recipe")) or not same_model(recipe.model):
            continue
        where, unit = pub["cited_as"], pub["figure_unit"]
        value, text = figure(pub, cell)
        if cell.get("oom"):
            return PublishedFigure(where, "out of memory", None, steps, "OOM")
        if "below" in cell:
            return PublishedFigure(where, f"under {cell['below']:g} {unit}", None, steps, text)
        if value is None:
            return PublishedFigure(where, "N/A (not published)", None, steps, "N/A")
        note = (pub.get("footnotes") or {}).get(str(cell.get("footnote"))) if cell.get("footnote") else None
        minutes = value / 60.0 if "second" in pub["units"] else value
        return PublishedFigure(where, f"{text} {unit}" + (f" ({note})" if note else ""), minutes,
                               int(pub.get("steps") or steps), rate=bool(pub.get("steps")))
    return None
