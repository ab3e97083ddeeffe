"""A hand-edited engine config in a run dir held to what the stack reads, before its slow checks: one comparison
for every engine (`vdkit check`, `vdkit run --resume`'s door).

The engine gives the edited file and the kit's own render of the run's recipe.yaml / plan.json, both as nested
mappings, and says what its stack reads at a key (:class:`Expect`: the YAML kinds and, for a Literal, the values;
or :data:`OPEN`: anything, below it too; or None: a key the stack does not know). :func:`compare` then finds

- a key the stack does not know -> refused with the nearest known key (difflib), where the engine refuses
  unknown keys (NeMo 1.23 ignores them in silence; Bridge's own loader already refuses them);
- a value of another kind than the stack reads (bool / int / float / str / list / mapping / null; an int where
  a float is read is fine), or not one of a Literal's values -> refused;
- a count the stack needs positive (the engine's set, :data:`MEGATRON_POSITIVE` shared) that is <= 0 -> refused;
- a number outside the range the command line holds its recipe key to (:class:`Range`, the engine's table, most
  from :data:`vdkit.rules.numbers.DOMAINS`: an lr of 1e30, -0.001 or NaN, a dropout outside [0, 1)), a number that
  is not finite where the render has a number, a micro-batch that does not divide its global batch -> refused;
- everything else (a new lr, another path) accepted, and the keys that differ from the render listed.

Pure Python (no engine import: an engine imports this module, never the reverse).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

# Megatron's sizes and counts, the same names in NeMo 1.23's and Bridge's configs: 0 or less cannot build a layout
# or a model (megatron-core divides by them or makes that many).
MEGATRON_POSITIVE = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "micro_batch_size", "global_batch_size",
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "seq_length",
})
FIX_RERENDER = "or re-render the run with `vdkit render`"  # the end of every edit refusal's fix
_MISSING = object()  # a key the render lacks (its value can be None)


def moved_input(edited: dict, rendered: dict, keys, stack: str, fix: str, strict=()) -> List[Defect]:
    """An input path (``keys``: flat keys of the engine's config) edited away from the render: the job's pre-flight
    checks the rendered paths (preflight.json) and launch.sbatch mounts their directories, so the stack would read a
    path nobody checked (a typo; another model's base). Refused where the edited path is not on this machine, and
    for the ``strict`` keys (the base model, which the check's probes read from the recipe) whatever it is; one on
    this machine goes on to the stack's probe, which reads it, as does a value that is not an absolute path (a hub
    id: the stack's tokenizer check says so). The first such key, one line."""
    from pathlib import Path

    def paths(value) -> list:  # absolute paths only: a hub id (or a relative name) is the stack's tokenizer line's
        return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v.startswith("/")]

    for k in keys:
        if k not in edited or k not in rendered or edited[k] == rendered[k]:
            continue
        if any(k in strict or not Path(v).exists() for v in paths(edited[k])):
            return [Defect(f"{k} is edited to {edited[k]!r} (rendered {rendered[k]!r}): the job's pre-flight checks "
                           f"the rendered inputs and launch.sbatch mounts their directories only, so {stack} would "
                           "read an input nobody checked, perhaps not mounted", k, f"{fix} and re-render the run "
                           "with `vdkit render`")]
    return []


def moved_output(edited: dict, rendered: dict, keys, stack: str, fix: str) -> List[Defect]:
    """Where the job writes its checkpoints or logs (``keys``), edited to another path than the render's run directory:
    the stack follows the edit (its resume looks there too), but launch.sbatch mounts only the run directory, the
    next allocation may land on other nodes (a node's /tmp: lost with it), and `vdkit status` / `validate` / the
    export read the run directory. A null is the stack's own business (no checkpoints). The first such key."""
    for k in keys:
        value = edited.get(k)
        if isinstance(value, str) and k in rendered and value != rendered[k]:
            return [Defect(f"{k} is edited to {value!r} (rendered {rendered[k]!r}): {stack} would write the run's "
                           "checkpoints or logs there, outside the run directory launch.sbatch mounts on every node, "
                           "where the next allocation's resume, `vdkit status` and `vdkit validate` do not find them (a "
                           "node's /tmp: lost with the node)", k, f"keep the rendered path (run.results_dir moves the "
                           f"whole run), {fix}")]
    return []


def other_seq_length(key: str, asked, planned: int):
    """(what, fix) when an engine config or recipe.yaml edited since the plan trains at another sequence length than
    the plan's (every stack trains at the length its config says; the plan's memory and step time are for its own),
    else None. The one wording for every engine's check."""
    if asked == planned:
        return None
    return (f"{key}={asked} is not the plan's sequence length {planned}: the job would train samples up to that length "
            f"while the plan's memory and step time are for {planned}",
            f"re-render the run with train.seq_length={asked} (`vdkit plan` says if it fits), or edit it back")
KINDS = (("null", type(None)), ("bool", bool), ("int", int), ("float", float), ("str", str),
         ("list", (list, tuple)), ("mapping", dict))


@dataclass(frozen=True)
class Expect:
    """What a stack reads at one key: the YAML kinds it takes, the values a Literal allows (empty: any), and where
    that is written (e.g. ``TrainingConfig.micro_batch_size: Optional[int]``; empty where it is the render's)."""

    kinds: Tuple[str, ...]
    choices: Tuple[Any, ...] = ()
    source: str = ""


OPEN = Expect(("any",))  # anything goes here, and below it


class Defect(NamedTuple):
    """One refused edit: what is wrong (names the file), the key, how to fix it."""

    what: str
    setting: str
    fix: str


@dataclass(frozen=True)
class Range:
    """The values a number may take, as the command line holds its recipe key (``source``) to them."""

    lo: float
    lo_in: bool
    hi: float
    hi_in: bool
    source: str

    def holds(self, v: float) -> bool:
        return (v >= self.lo if self.lo_in else v > self.lo) and (v <= self.hi if self.hi_in else v < self.hi)

    def text(self) -> str:
        lo, hi = f"{'[' if self.lo_in else '('}{self.lo:g}", f"{self.hi:g}{']' if self.hi_in else ')'}"
        return f"in {lo}, {hi}" if math.isfinite(self.hi) else (f">= {self.lo:g}" if self.lo_in else f"> {self.lo:g}")


def domain(recipe_key: str) -> Range:
    """The command line's range of a recipe key (:data:`vdkit.rules.numbers.DOMAINS`), for a config key that
    carries it."""
    from vdkit.rules.numbers import DOMAINS

    lo, lo_in, hi, hi_in, _fix = DOMAINS[recipe_key]
    return Range(lo, lo_in, hi, hi_in, f"the command line's {recipe_key}")


# Any key whose last part ends in "dropout" is a probability (the model's hidden / attention / ffn dropout, an
# adapter's): method.lora_dropout's range.
DROPOUT_SUFFIX = "dropout"


def _range_of(key: str, ranges: Dict[str, Range]) -> Optional[Range]:
    last = key.rsplit(".", 1)[-1]
    for k in (key, ".".join(key.split(".")[-2:]), last):
        if k in ranges:
            return ranges[k]
    return domain("method.lora_dropout") if last.endswith(DROPOUT_SUFFIX) else None


def value_defects(path, edited: Dict[str, Any], rendered: Dict[str, Any], ranges: Dict[str, Range], *, stack: str,
                  fix: str, skip=()) -> List[Defect]:
    """Numbers held to the command line's value rules (``ranges``: config key, its last two parts or its last part
    -> :class:`Range`), finite where the render has a number, and each micro-batch dividing its global batch."""
    out: List[Defect] = []
    for key, value in edited.items():
        if key in skip or kind(value) not in ("int", "float"):
            continue
        rng = _range_of(key, ranges)
        if isinstance(value, float) and not math.isfinite(value) and (rng or kind(rendered.get(key)) in ("int", "float")):
            out.append(Defect(f"{key}={value} in {path} is not a finite number", key, f"write a number{was(rendered, key)}, {fix}"))
        elif rng is not None and not rng.holds(value):
            out.append(Defect(f"{key}={value} in {path} must be {rng.text()} (as {rng.source}; {stack} would take it and "
                              "train on it)", key, f"write a value {rng.text()}{was(rendered, key)}, {fix}"))
    for key, gbs in edited.items():
        if not key.endswith("global_batch_size") or key in skip:
            continue
        mkey = key[: -len("global_batch_size")] + "micro_batch_size"
        mbs = edited.get(mkey)
        if kind(gbs) == kind(mbs) == "int" and gbs > 0 and mbs > 0 and gbs % mbs:
            out.append(Defect(f"{mkey}={mbs} does not divide {key}={gbs} in {path}: Megatron's micro-batch calculator "
                              "asserts global batch % (micro batch x data-parallel size) == 0 at start-up", mkey,
                              f"use a micro-batch that divides the global batch{was(rendered, mkey)}, {fix}"))
    return out


def flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    """Every dotted key of a nested mapping, mappings included (a list is one value)."""
    out: Dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out[key] = v
            out.update(flat(v, key + "."))
    return out


def kind(value: Any) -> str:
    """The YAML kind of a value (bool before int: True is an int in Python)."""
    for name, types in KINDS:
        if isinstance(value, types):
            return name
    return type(value).__name__


def rendered_expect(rendered: Dict[str, Any], key: str) -> Optional[Expect]:
    """What the render says of ``key``: its kind (null: anything, below it too), or None where it lacks the key."""
    if key not in rendered:
        return None
    return OPEN if rendered[key] is None else Expect((kind(rendered[key]),))


def under_open(key: str, rendered: Dict[str, Any]) -> bool:
    """Whether an ancestor of ``key`` is rendered as null (a list or mapping the stack leaves unset)."""
    parts = key.split(".")
    return any(rendered.get(".".join(parts[:i]), 0) is None for i in range(1, len(parts)))


def a(name: str) -> str:
    """``name`` with its article (an int, a float)."""
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def was(rendered: Dict[str, Any], key: str) -> str:
    """' (the kit rendered X)' for a scalar the render has, else ''."""
    value = rendered.get(key)
    return "" if key not in rendered or isinstance(value, (dict, list)) else f" (the kit rendered {value!r})"


def nearest(key: str, known) -> str:
    """The known key a misspelt one most likely meant: a sibling with a close name first, then any close key."""
    parent, _, last = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(last, list(siblings), n=1, cutoff=0.6)
    if near:
        return siblings[near[0]]
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return near[0] if near else ""


def positive_key(key: str, positive) -> bool:
    """Whether ``key`` is one the stack needs > 0: its full dotted name or its last part is in ``positive``."""
    return key in positive or key.rsplit(".", 1)[-1] in positive


def compare(path, edited: Dict[str, Any], rendered: Dict[str, Any], expect: Callable[[str], Optional[Expect]], *,
            stack: str, fix: str, positive=MEGATRON_POSITIVE, positive_why: Optional[Dict[str, str]] = None,
            unknown: Optional[str] = None, known=(), ranges: Optional[Dict[str, Range]] = None
            ) -> Tuple[List[Defect], List[str], List[str]]:
    """The edits of one file: ``edited`` and ``rendered`` flat (:func:`flat`), ``expect(key)`` what ``stack`` reads
    there. ``unknown``: why a key ``expect`` does not know is refused (None: such keys pass, the stack's own loader
    judges them); ``known``: the keys offered as did-you-mean. ``fix`` ends every fix (how to start over).
    ``ranges``: the engine's value rules for :func:`value_defects` (dropout keys are held to [0, 1) always).

    Returns (defects, keys whose value differs from the render, keys the render has and the file lacks)."""
    why = positive_why or {}
    defects: List[Defect] = []
    changed: List[str] = []
    for key, value in edited.items():
        if any(key.startswith(d.setting + ".") for d in defects):
            continue  # a refused section is one line, not one per key under it
        want = expect(key)
        if want is None and unknown is None:
            if kind(value) != "mapping" and rendered.get(key, _MISSING) != value:
                changed.append(key)
            continue
        if want is None:
            near = nearest(key, known)
            defects.append(Defect(f"unknown key {key} in {path}: {unknown}" + (f"; did you mean {near}?" if near else ""),
                                  key, (f"rename it {near}" if near else "remove it") + f", {fix}"))
            continue
        got = kind(value)
        # A count must be > 0 whatever the render held there (a key rendered null is open to any type); NaN is
        # not > 0 either.
        if positive_key(key, positive) and got in ("int", "float") and not value > 0:
            defects.append(Defect(f"{key}={value} in {path}: {stack} needs it > 0{why.get(key.rsplit('.', 1)[-1], '')}",
                                  key, f"set a positive value{was(rendered, key)}, {fix}"))
            continue
        if want is OPEN or "any" in want.kinds:
            if got != "mapping" and rendered.get(key, _MISSING) != value:
                changed.append(key)
            continue
        if not (got in want.kinds or (got == "int" and "float" in want.kinds)):
            shown = "a mapping" if got == "mapping" else "a list" if got == "list" else f"{value!r}, {a(got)}"
            reads = " or ".join(a(w) for w in want.kinds)
            defects.append(Defect(f"{key} is {shown} in {path}; {stack} reads {reads} there"
                                  + (f" ({want.source})" if want.source else ""),
                                  key, f"write {reads}{was(rendered, key)}, {fix}"))
            continue
        if want.choices and value not in want.choices and got != "null":
            allowed = ", ".join(repr(c) for c in want.choices)
            defects.append(Defect(f"{key}={value!r} in {path}: {stack} takes one of {allowed} there"
                                  + (f" ({want.source})" if want.source else ""), key,
                                  f"write one of them{was(rendered, key)}, {fix}"))
            continue
        if got != "mapping" and rendered.get(key, _MISSING) != value:
            changed.append(key)
    refused = {d.setting for d in defects}
    defects += value_defects(path, edited, rendered, ranges or {}, stack=stack, fix=fix, skip=refused)
    removed = [k for k in rendered if k not in edited and (k.rpartition(".")[0] in edited or "." not in k)]
    return defects, changed, removed


def annotation_expect(annotation: Any, where: str) -> Union[Expect, None]:
    """What a Python type annotation lets a YAML value be, for :func:`compare` (``where``: its name, for messages):
    Optional / Union / ``X | Y`` their members together, a Literal its values, a dataclass a mapping, Path a str;
    None where the annotation does not fix a YAML kind (Any, an enum, a callable, torch.dtype: the stack's loader
    converts or takes anything there), so the caller falls back to what it knows otherwise."""
    import dataclasses
    import pathlib
    import types
    import typing

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        parts = [annotation_expect(a_, where) for a_ in args]
        if any(p is None for p in parts):
            return None
        kinds = tuple(dict.fromkeys(k for p in parts for k in p.kinds))
        choices = () if any(not p.choices and p.kinds != ("null",) for p in parts) else \
            tuple(c for p in parts for c in p.choices)
        return Expect(kinds, choices, where)
    if origin is typing.Literal:
        return Expect(tuple(dict.fromkeys(kind(v) for v in args)), tuple(args), where)
    base = origin or annotation
    simple = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str", pathlib.Path: "str",
              list: "list", tuple: "list", set: "list", frozenset: "list", dict: "mapping"}
    if base in simple:
        return Expect((simple[base],), (), where)
    if isinstance(base, type) and dataclasses.is_dataclass(base):
        return Expect(("mapping",), (), where)
    import collections.abc as abc

    if base in (abc.Sequence, abc.MutableSequence):
        return Expect(("list",), (), where)
    if base in (abc.Mapping, abc.MutableMapping):
        return Expect(("mapping",), (), where)
    return None


def report(defects: List[Defect], changed: List[str], rep, file_name: str, known_to: str) -> bool:
    """The comparison's lines into ``rep`` (:class:`vdkit.run.jobcheck.Report`); True when no edit was refused.
    ``known_to``: what every accepted key was held to (e.g. "known to NeMo 1.23, of the rendered type")."""
    for d in defects:
        rep.defect(d.what, d.setting, d.fix)
    if defects:
        return False
    if changed:
        rep.checked(f"{file_name} differs from the kit's render of recipe.yaml at {len(changed)} key(s) "
                    f"(each {known_to}): {', '.join(changed)}")
    else:
        rep.checked(f"{file_name} is the kit's render of recipe.yaml and plan.json (no hand edits)")
    return True
