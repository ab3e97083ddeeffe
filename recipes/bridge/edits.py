"""A hand-edited ``bridge.yaml`` held to the types Megatron-Bridge's dataclasses declare: `vdkit check` and
`vdkit run --resume`'s door, after Bridge's own strict loader and before ``runtime_config_update``.

Bridge's ``ConfigContainer.from_yaml`` (strict) refuses an unknown key or class, but not a value of the wrong
type: ``train_iters: fifty`` or ``micro_batch_size: [1, 2]`` load and pass ``validate()``, and the ranks fail
later or train on the wrong value; a count of 0 or less passes too. This module compares the file, read as Bridge
reads it (``yaml.safe_load``, then OmegaConf with interpolations resolved), with the kit's render of the run's own
recipe.yaml / plan.json (:func:`vdkit.recipes.bridge.render_bridge_yaml`, passed in) through the one comparison
the engines share (:mod:`vdkit.recipes.common.edits`).

What a key may hold: the annotation of its field in the dataclass Bridge instantiates there (the section's
``_target_`` as edited, e.g. ``TrainingConfig.micro_batch_size: Optional[int]``), because that is what Bridge
itself declares - the render shows one value of a field, the annotation every legitimate one (``null`` where a
field is Optional, a str or a mapping for ``mixed_precision``, ``Literal`` values). Where an annotation fixes no
YAML kind (an enum, a callable, ``torch.dtype``) or no class is known (a plain mapping), the render's kind is the
reference (null there: anything). Unknown keys are left to Bridge's loader, which has already refused them.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, List, Optional, Tuple

from vdkit.recipes.bridge.versions import BRIDGE_VERSION
from vdkit.recipes.common import edits as common
from vdkit.recipes.common.edits import FIX_RERENDER

STACK = f"Megatron-Bridge {BRIDGE_VERSION}"
# Besides Megatron's sizes (common.MEGATRON_POSITIVE), what Bridge 0.3.1's loop needs > 0: train_iters (train.py
# `while step < train_iters`: 0 or less trains nothing and saves an untrained model), logger.log_interval
# (train.py `iteration % log_interval`: 0 divides by zero at the first step), the LoRA rank peft.dim.
# peft.alpha: LoRA scales its update by alpha / dim (peft/utils.py:249, and the adapter's forward :648): 0 multiplies
# every adapter gradient by zero (the base frozen: nothing trains, the check's trainable count still matched).
POSITIVE = common.MEGATRON_POSITIVE | frozenset({"train_iters", "log_interval", "peft.dim", "peft.alpha"})
POSITIVE_WHY = {"train_iters": " (its loop runs while step < train_iters: it would train nothing)",
                "alpha": " (LoRA scales its update by alpha / dim, peft/utils.py:648: at 0 every adapter gradient is "
                         "zero and, the base frozen, nothing trains; below 0 the update's sign flips)",
                "log_interval": " (its loop takes iteration % log_interval: a division by zero)"}
# The numbers the command line holds to a range (common.Range; any *dropout key is a probability anyway).
RANGES = {"optimizer.lr": common.domain("method.lr"), "optimizer.min_lr": common.domain("method.min_lr"),
          "optimizer.weight_decay": common.domain("method.weight_decay"),
          "scheduler.lr_warmup_iters": common.domain("method.warmup_steps"),
          "peft.dim": common.domain("method.lora_adapter_dim")}
KEEP = "checkpoint.most_recent_k"
# Input paths the job's pre-flight checks and launch.sbatch mounts as rendered (common.moved_input).
INPUT_KEYS = ("checkpoint.pretrained_checkpoint", "dataset.dataset_root", "tokenizer.tokenizer_model", "dataset.blend")
OUTPUT_KEYS = ("checkpoint.save", "logger.tensorboard_dir")  # where the run writes, as rendered: its run directory
TARGET = "_target_"


@functools.lru_cache(maxsize=None)
def _class(target: str):
    """The class a ``_target_`` names, or None where it cannot be imported (Bridge's loader reports that)."""
    import importlib

    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - any import failure means: no annotation known here
        return None


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    """``{field: annotation}`` of a dataclass, resolved; per field where one forward reference does not resolve
    (a name Bridge imports only for type checking): that field is left out."""
    import dataclasses
    import sys
    import typing

    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - fall back to the fields one by one
        pass
    out = {}
    for base in reversed(cls.__mro__):
        namespace = vars(sys.modules.get(base.__module__, typing))
        for name, ann in vars(base).get("__annotations__", {}).items():
            try:
                out[name] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307 - Bridge's own source
            except Exception:  # noqa: BLE001
                out.pop(name, None)
    return out


def _node(tree: Any, parts) -> Any:
    for p in parts:
        tree = tree.get(p) if isinstance(tree, dict) else None
    return tree


def _annotation(tree: dict, parts: Tuple[str, ...]):
    """(annotation, "Class.field") of the key ``parts`` in the edited ``tree``, or None where none is known."""
    import typing

    parent = _node(tree, parts[:-1])
    if isinstance(parent, dict) and isinstance(parent.get(TARGET), str):
        cls = _class(parent[TARGET])
        hints = _hints(cls) if cls is not None else {}
        if parts[-1] in hints:
            return hints[parts[-1]], f"{cls.__name__}.{parts[-1]}"
        return None
    if len(parts) < 2:
        return None
    above = _annotation(tree, parts[:-1])  # a plain mapping: its field's dict[K, V] gives V for every key
    if above is None:
        return None
    ann, where = above
    import types

    union = typing.get_origin(ann) in (typing.Union, getattr(types, "UnionType", typing.Union))
    for member in (typing.get_args(ann) if union else ()) or (ann,):
        if typing.get_origin(member) is dict and len(typing.get_args(member)) == 2:
            return typing.get_args(member)[1], f"{where}[{parts[-1]!r}]"
    return None


def _expect(tree: dict, rendered: dict):
    """``expect(key)`` for :func:`common.compare`: the dataclass annotation first, else the render's kind."""
    import typing

    def expect(key: str) -> Optional[common.Expect]:
        parts = tuple(key.split("."))
        if parts[-1] == TARGET:
            return common.OPEN  # the class itself: Bridge's loader imports it (and has refused a wrong one)
        found = _annotation(tree, parts)
        if found is not None:
            ann, where = found
            if ann is typing.Any:
                return common.OPEN
            got = common.annotation_expect(ann, f"{where}: {_shown(ann)}")
            if got is not None:
                return _with_render(got, rendered, key)
        if common.under_open(key, rendered):
            return common.OPEN
        return common.rendered_expect(rendered, key)

    return expect


def _with_render(want: common.Expect, rendered: dict, key: str) -> common.Expect:
    """The annotation's kinds plus the render's own: what the kit renders is taken by Bridge in every shipped cell
    (tests), even where it differs from the annotation (``rotary_base: 10000.0`` for an ``int`` field)."""
    value = rendered.get(key)
    if value is None or common.kind(value) in want.kinds:
        return want
    return common.Expect(want.kinds + (common.kind(value),), want.choices + ((value,) if want.choices else ()),
                         want.source)


def _shown(ann) -> str:
    """An annotation as its source reads (Optional[int], GPTDatasetConfig; not typing.Optional, module paths)."""
    import re

    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return text or re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", str(ann)).replace("NoneType", "None")


def _load(path: Path) -> dict:
    """bridge.yaml as Bridge's ``from_yaml`` reads it: ``yaml.safe_load`` (through the kit's bounded reader:
    ``lr: 1e-4`` is a str there, as for Bridge), then OmegaConf with interpolations resolved."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vdkit.errors import UserError
    from vdkit.composition.files import load_yaml

    data = load_yaml(path, "Bridge config")
    try:  # a bad interpolation or a key OmegaConf cannot hold: one line, as Bridge's own loader would stop
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True) if isinstance(data, dict) else {}
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        raise UserError(f"{path}: {' '.join(str(exc).split()).split(' full_key:')[0]}",
                        f"correct it, {FIX_RERENDER}") from None


def compare(run_dir: Path, plan, render) -> Tuple[List[common.Defect], List[str]]:
    """The edits of ``run_dir/bridge.yaml`` against ``render(plan, run_dir)`` (the engine's
    :func:`vdkit.recipes.bridge.render_bridge_yaml`, passed in: the engine package imports this module).

    Returns (defects, the keys whose value differs from the render, removed ones marked). For a file Bridge's
    loader has already taken (a regular file that parses)."""
    import yaml

    from vdkit.errors import UserError
    from vdkit.recipes.bridge.config import CONFIG_FILE
    from vdkit.run.rundir import RECIPE_FILE

    path = Path(run_dir) / CONFIG_FILE
    try:
        tree = _load(path)
    except UserError as exc:
        return [common.Defect(exc.what, CONFIG_FILE, exc.fix or FIX_RERENDER)], []
    try:
        rendered_tree = yaml.safe_load(render(plan, Path(run_dir).absolute()))
    except UserError as exc:
        return [common.Defect(f"the kit cannot render this run's Bridge config to compare with: {exc.what}",
                              RECIPE_FILE, exc.fix or FIX_RERENDER)], []
    rendered = common.flat(rendered_tree)
    edited = common.flat(tree)
    defects, changed, removed = common.compare(
        path, edited, rendered, _expect(tree, rendered), stack=STACK, fix=FIX_RERENDER,
        positive=POSITIVE, positive_why=POSITIVE_WHY, ranges=RANGES)
    if not defects:  # an input path edited away from what the pre-flight checks and the sbatch mounts
        defects += common.moved_input(edited, rendered, INPUT_KEYS, STACK, "set the recipe's input "
                                      "(model.megatron_path, data.data_dir, data.tokenizer_model)",
                                      strict={"checkpoint.pretrained_checkpoint"})
    if not defects:  # checkpoints / logs written off the run directory (checkpoint.load: loadcheck's rules)
        defects += common.moved_output(edited, rendered, OUTPUT_KEYS, STACK, FIX_RERENDER)
    keep = edited.get(KEEP)
    if common.kind(keep) == "int" and keep != -1 and keep < 1:
        # checkpointing.py (0.3.1) cleanup_old_non_persistent_checkpoint: sorted_iter_ckpts[:-leave_ckpt_num] is
        # [:-0] == [] for 0, so every checkpoint is kept; below -1 the `most_recent_k > -1` guard skips it too
        defects.append(common.Defect(
            f"{KEEP}={keep} in {path}: {STACK} keeps every checkpoint then (checkpointing.py "
            "cleanup_old_non_persistent_checkpoint removes sorted_iter_ckpts[:-most_recent_k], empty for 0)", KEEP,
            f"keep a number >= 1{common.was(rendered, KEEP)}, {FIX_RERENDER}"))
    return defects, changed + [f"{k} (removed: Bridge's default)" for k in removed]


def check(run_dir: Path, plan, report, render) -> bool:
    """The comparison's lines into ``report`` (:class:`vdkit.run.jobcheck.Report`); True when no edit was refused."""
    from vdkit.recipes.bridge.config import CONFIG_FILE

    from vdkit.recipes.common import steps_edit

    defects, changed = compare(run_dir, plan, render)
    if not common.report(defects, changed, report, CONFIG_FILE, f"of the type {STACK}'s dataclass field declares"):
        return False
    steps = (_load(Path(run_dir) / CONFIG_FILE).get("train") or {}).get("train_iters")  # Bridge's loop runs that many
    return steps_edit.check(plan, run_dir, f"{CONFIG_FILE} train.train_iters", steps, report)
