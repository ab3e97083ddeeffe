"""What each recipe key means, read from the one place it is written: the schema's field comments.

Every field of the schema dataclasses (:class:`vdkit.composition.schema.VdkitConfig` and its sections) carries
its meaning as a trailing comment on its own line::

    nodes: int = 1  # XE9680s (or hosts) in the job: sbatch --nodes; world size = nodes x gpus_per_node

This module reads those comments back (``tokenize`` on the class source, so a ``#`` inside a string
is not a comment) for ``vdkit plan --cfg`` (the composed recipe, every key with its meaning) and
``vdkit plan --explain KEY``. Nothing here repeats a meaning: a field without a comment shows none,
and ``tests/test_keys.py`` requires one on every field.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from vdkit.errors import UserError


@dataclass(frozen=True)
class KeyDoc:
    """One recipe key: ``section.field``, its type as written in the schema, its default and meaning."""

    key: str
    type: str
    default: object
    meaning: str


def _sections() -> Dict[str, type]:
    """Section name -> its dataclass, in the schema's order (model, method, cluster, ...)."""
    from vdkit.composition.schema import VdkitConfig

    out = {}
    for f in dataclasses.fields(VdkitConfig):
        out[f.name] = f.default_factory if f.default_factory is not dataclasses.MISSING else type(f.default)
    return out


def _field_comments(cls: type) -> Dict[str, Tuple[str, str]]:
    """Field name -> (annotation as written, its trailing comment) for one schema dataclass."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: Dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = (ast.unparse(node.annotation), comments.get(node.lineno, ""))
    return out


@lru_cache(maxsize=None)
def all_keys() -> Tuple[KeyDoc, ...]:
    """Every recipe key, in schema order, with its meaning."""
    docs: List[KeyDoc] = []
    for section, cls in _sections().items():
        notes = _field_comments(cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            typ, meaning = notes.get(f.name, (str(f.type), ""))
            docs.append(KeyDoc(f"{section}.{f.name}", typ, default, meaning))
    return tuple(docs)


def lookup(key: str) -> List[KeyDoc]:
    """The docs of ``key`` (``cluster.nodes``) or of every key of a section (``cluster``).

    Raises UserError naming the closest keys when ``key`` is neither.
    """
    key = key.strip().lstrip("+~")
    keys = all_keys()
    exact = [d for d in keys if d.key == key]
    if exact:
        return exact
    section = [d for d in keys if d.key.startswith(key + ".")]
    if key and section:
        return section
    names = [d.key for d in keys]
    # a key named exactly as the last part (nodes -> cluster.nodes) first, then the spelling neighbours
    close = [n for n in names if n.endswith("." + key)]
    close += [n for n in difflib.get_close_matches(key, names, n=3, cutoff=0.6) if n not in close]
    hint = ("did you mean " + ", ".join(close[:4]) + "?") if close else (
        "the sections are " + ", ".join(_sections()) + "; `vdkit plan --cfg` prints every key")
    raise UserError(f"{key!r} is not a recipe key", hint)


def _flow(value) -> str:
    """``value`` as one line of YAML (flow style for lists and mappings)."""
    import yaml

    # Dumped inside a one-element list so that a scalar gets no document-end marker ("...").
    return yaml.safe_dump([value], default_flow_style=True, width=10**9, sort_keys=False).strip()[1:-1]


COMMENT_COLUMN = 40  # the widest padding before a key's comment in `vdkit plan --cfg`


def annotated_yaml(recipe) -> str:
    """The composed recipe as YAML, every key followed by its meaning as a comment (``vdkit plan --cfg``).

    Loads back to exactly ``recipe.to_dict()`` (the comments are YAML comments).
    """
    data = recipe.to_dict()
    meaning = {d.key: d.meaning for d in all_keys()}
    lines: List[str] = []
    for section, values in data.items():
        lines.append(f"{section}:")
        # Comments line up in one column per section; a long value (a list of adapters) is not padded.
        width = min(COMMENT_COLUMN, max((len(k) + len(_flow(v)) for k, v in values.items()), default=0) + 4)
        for name, value in values.items():
            entry = f"  {name}: {_flow(value)}"
            note = meaning.get(f"{section}.{name}")
            lines.append(f"{entry.ljust(width)}  # {note}" if note else entry)
    return "\n".join(lines) + "\n"


def explain(key: str, recipe=None) -> str:
    """What ``key`` (or every key of a section) means: type, default, the composed value, allowed groups."""
    from vdkit.composition.config import conf_dir, group_options

    out = []
    current = recipe.to_dict() if recipe is not None else {}
    for d in lookup(key):
        section, name = d.key.split(".", 1)
        value = current.get(section, {}).get(name, d.default)
        line = f"{d.key} ({d.type}; schema default {_flow(d.default)}"
        line += f"; this recipe: {_flow(value)})" if recipe is not None else ")"
        out.append(line)
        out.append(f"    {d.meaning or '(no description in the schema)'}")
    docs = lookup(key)
    section = docs[0].key.split(".", 1)[0]
    if len(docs) > 1 or docs[0].key.endswith(".name"):
        if (conf_dir() / section).is_dir():
            out.append(f"  choose a whole {section} with {section}=NAME: " + ", ".join(group_options(section))
                       + " (`vdkit list`)")
    return "\n".join(out)

