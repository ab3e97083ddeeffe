"""A hand-edited ``nemo.yaml`` held to what NeMo 1.23 reads, before the (slow) NeMo probe: `vdkit check`.

NeMo's scripts run with ``--config-path=<run dir> --config-name=nemo.yaml``, so the edited file is the whole
config NeMo composes, and its Hydra config is not struct: an unknown key is ignored in silence, a wrong type
or a nonsense count fails (or misbehaves) on the cluster, hours into a queue. The reference is what the kit
renders from the run's own recipe.yaml and plan.json (:func:`vdkit.recipes.nemo.render_nemo_yaml`, the same
function render uses): it holds every key of NeMo 1.23's own config for the script (tests/test_nemo_contract.py
reads NeMo's YAMLs and asserts it), plus the keys the kit adds on purpose
(:data:`vdkit.recipes.nemo_contract.DELIBERATE_ADDITIONS`, with their types). Against it:

- a key neither has -> refused, with the nearest known key (difflib);
- a value whose type differs from the rendered one (bool / int / float / str / list / mapping; an int where a
  float is rendered is fine, as is anything where the render has null) -> refused;
- a count NeMo needs positive (:data:`POSITIVE`) that is <= 0 -> refused;
- everything else (a new lr, another path) is accepted, and the keys that differ are listed.

Pure Python on the kit's side (yaml + omegaconf, as NeMo loads the file); no NeMo import.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Dict, List, Tuple

# Keys (the last part of a dotted key, wherever it sits) whose value NeMo 1.23 / Lightning 2.0.7 need > 0.
# trainer.max_steps: Lightning takes -1 (no limit), but NeMo 1.23 sizes its datasets from it:
# megatron_gpt_sft_model.py _build_dataset raises "Trainer max_steps must be set to a positive integer" for
# <= 0, and megatron_gpt_model.py asks for max_steps x GBS (negative) pretraining samples. val_check_interval:
# Lightning takes an int > 0 or a fraction in (0, 1]. The rest are sizes and counts (0 or less cannot build).
POSITIVE = frozenset({
    "devices", "num_nodes", "max_steps", "val_check_interval",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "micro_batch_size", "global_batch_size",
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "encoder_seq_length", "max_position_embeddings", "max_seq_length", "seq_length",
    "adapter_dim", "virtual_tokens", "bottleneck_dim", "embedding_dim",
})
POSITIVE_WHY = {"max_steps": " (it sizes its datasets from it: Lightning's -1, no limit, fails there)"}
FIX_RERENDER = "or re-render the run with `vdkit render`"


def _flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    """Every dotted key of a nested mapping, mappings included (a list is one value)."""
    out: Dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out[key] = v
            out.update(_flat(v, key + "."))
    return out


def _kind(value: Any) -> str:
    """The YAML type a value has, as NeMo's config sees it (bool before int: True is an int in Python)."""
    for name, types in (("null", type(None)), ("bool", bool), ("int", int), ("float", float), ("str", str),
                        ("list", (list, tuple)), ("mapping", dict)):
        if isinstance(value, types):
            return name
    return type(value).__name__


def _load(path: Path) -> dict:
    """nemo.yaml as NeMo reads it: OmegaConf's YAML loader (1e-4 is a float there), interpolations resolved.
    ValueError (one line) for a file NeMo could not compose."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vdkit.files import load_yaml

    load_yaml(path, "NeMo config")  # size, aliases, FIFOs, syntax: the kit's bounded reader refuses first
    try:
        cfg = OmegaConf.load(path)
        data = OmegaConf.to_container(cfg, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ValueError(" ".join(str(exc).split()).split(" full_key:")[0]) from None
    if not isinstance(data, dict):
        raise ValueError("it is not a mapping of sections (trainer, exp_manager, model)")
    return data


def compare(run_dir: Path, render) -> Tuple[List[Tuple[str, str, str]], List[str]]:
    """The edits of ``run_dir/nemo.yaml`` against the kit's render of the run's own recipe and plan
    (``render(plan, run_dir)``: the engine's :func:`vdkit.recipes.nemo.render_nemo_yaml`, passed in so that this
    package, which the engine module imports, never imports it back).

    Returns (defects as (what, setting, fix), the keys whose value differs from the render). UserError
    (one line) for a recipe.yaml / plan.json the kit cannot read.
    """
    import yaml

    from vdkit.errors import UserError
    from vdkit.recipes.nemo_contract import DELIBERATE_ADDITIONS, WIDENED_TYPES
    from vdkit.rundir import NEMO_CONFIG_FILE, RECIPE_FILE, load_plan

    path = Path(run_dir) / NEMO_CONFIG_FILE
    try:  # a missing file, a FIFO, a directory: load_yaml's one line, never an open that blocks
        edited = _flat(_load(path))
    except UserError as exc:
        return [(exc.what, NEMO_CONFIG_FILE, exc.fix or FIX_RERENDER)], []
    except ValueError as exc:
        return [(f"NeMo cannot compose {path}: {exc}", NEMO_CONFIG_FILE, f"correct the file, {FIX_RERENDER}")], []
    plan = load_plan(run_dir)
    try:
        rendered = _flat(yaml.safe_load(render(plan, Path(run_dir).absolute())))
    except UserError as exc:
        return [(f"the kit cannot render this run's NeMo config to compare with: {exc.what}", RECIPE_FILE,
                 exc.fix or FIX_RERENDER)], []
    known = {**{k: (_kind(v),) for k, v in rendered.items()},
             **{k: tuple(sorted({_kind(t()) for t in a.types})) for k, a in DELIBERATE_ADDITIONS.items()
                if k not in rendered}}
    for k, types in WIDENED_TYPES.items():
        known[k] = tuple(sorted({_kind(t()) for t in types}))
    defects, changed = [], []
    for key, value in edited.items():
        if any(key.startswith(setting + ".") for _what, setting, _fix in defects):
            continue  # a refused section is one line, not one per key under it
        if _under_open(key, rendered):
            changed.append(key)  # below a key the render leaves null (open): any structure goes
            continue
        if key not in known:
            near = _nearest(key, known)
            defects.append((f"unknown key {key} in {path}: NeMo 1.23 ignores it silently"
                            + (f"; did you mean {near}?" if near else ""), key,
                            (f"rename it {near}" if near else "remove it") + f", {FIX_RERENDER}"))
            continue
        kind, want = _kind(value), known[key]
        if not ("null" in want or kind in want or (kind == "int" and "float" in want)):
            shown = "a mapping" if kind == "mapping" else "a list" if kind == "list" else f"{value!r}, {_a(kind)}"
            defects.append((f"{key} is {shown} in {path}; NeMo 1.23 reads {' or '.join(_a(w) for w in want)} there",
                            key, f"write {' or '.join(_a(w) for w in want)}{_was(rendered, key)}, {FIX_RERENDER}"))
            continue
        last = key.rsplit(".", 1)[-1]
        if last in POSITIVE and kind in ("int", "float") and value <= 0:
            why = POSITIVE_WHY.get(last, "")
            defects.append((f"{key}={value} in {path}: NeMo 1.23 needs it > 0{why}", key,
                            f"set a positive value{_was(rendered, key)}, {FIX_RERENDER}"))
            continue
        if kind != "mapping" and (key not in rendered or rendered[key] != value):
            changed.append(key)
    removed = [k for k in rendered if k not in edited and k.rpartition(".")[0] in edited or "." not in k and k not in edited]
    sections = [k for k in removed if "." not in k]
    if sections:  # NeMo's script reads cfg.trainer / cfg.exp_manager / cfg.model: it stops at once without one
        many = len(sections) > 1
        defects.append((f"{path} has no {', '.join(sections)} {'sections' if many else 'section'}: NeMo 1.23's script "
                        f"reads {'them' if many else 'it'}", sections[0],
                        f"restore it, {FIX_RERENDER}"))
    return defects, changed + [f"{k} (removed)" for k in removed]


def _under_open(key: str, rendered: Dict[str, Any]) -> bool:
    """Whether an ancestor of ``key`` is rendered as null (e.g. a list or mapping NeMo leaves unset)."""
    parts = key.split(".")
    return any(rendered.get(".".join(parts[:i]), 0) is None for i in range(1, len(parts)))


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _was(rendered: Dict[str, Any], key: str) -> str:
    """' (the kit rendered X)' for a scalar the render has, else ''."""
    value = rendered.get(key)
    return "" if key not in rendered or isinstance(value, (dict, list)) else f" (the kit rendered {value!r})"


def _nearest(key: str, known) -> str:
    """The known key a misspelt one most likely meant: a sibling with a close name first, then any close key."""
    parent, _, last = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(last, list(siblings), n=1, cutoff=0.6)
    if near:
        return siblings[near[0]]
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return near[0] if near else ""


def check(run_dir: Path, report, render) -> bool:
    """Add the comparison's lines to ``report`` (:class:`vdkit.jobcheck.Report`); True when the file may go on
    to NeMo's own code (no defect). ``render``: as for :func:`compare`."""
    defects, changed = compare(run_dir, render)
    for what, setting, fix in defects:
        report.defect(what, setting, fix)
    if defects:
        return False
    from vdkit.rundir import NEMO_CONFIG_FILE

    if changed:
        report.checked(f"{NEMO_CONFIG_FILE} differs from the kit's render of recipe.yaml at {len(changed)} key(s) "
                       f"(each known to NeMo 1.23, of the rendered type): {', '.join(changed)}")
    else:
        report.checked(f"{NEMO_CONFIG_FILE} is the kit's render of recipe.yaml and plan.json (no hand edits)")
    return True
