"""The engine spec (vdkit.recipes.spec): checked when built, read at the door, listed as `vdkit list engines`,
and a model family added as data (Qwen2.5-7B) built exactly or refused in one line by every engine."""
from __future__ import annotations

import ast
import dataclasses
import json
import sys

import pytest

from helpers import toy_engine_module
from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.recipes import engines
from vdkit.recipes.spec import EngineSpec
from vdkit.composition.schema import METHODS, PRECISIONS, SHARDINGS, ModelCfg

QWEN_PARAMS = 7_615_616_512  # Qwen2.5-7B's published parameter count


# ----------------------------------------------------------------------------- registration
def test_a_spec_that_omits_a_model_field_fails_at_registration(monkeypatch):
    base = engines.get("reference").spec
    maps = {k: v for k, v in base.maps.items() if k != "qkv_bias"}
    with pytest.raises(TypeError, match="model field.*qkv_bias neither mapped, ignored nor refused"):
        dataclasses.replace(base, name="toy", maps=maps)
    # the registry refuses a module without a spec, or one registered under another name
    bare = type(sys)("toy_engine_without_spec")
    bare.command = lambda plan, run_dir: []
    monkeypatch.setitem(sys.modules, bare.__name__, bare)
    monkeypatch.setitem(engines.REGISTRY, "toy", bare.__name__)
    with pytest.raises(TypeError, match="has no SPEC"):
        engines.get("toy")
    monkeypatch.setitem(sys.modules, "toy_named_otherwise", toy_engine_module("toy_named_otherwise", "other",
                                                                              command=lambda plan, run_dir: []))
    monkeypatch.setitem(engines.REGISTRY, "toy", "toy_named_otherwise")
    with pytest.raises(TypeError, match="registered as 'toy' but its SPEC is named 'other'"):
        engines.get("toy")


@pytest.mark.parametrize("change,message", [
    ({"context_parrallel": True}, "context_parrallel"),  # a misspelt capability is an error, never a default
    ({"methods": ("sft", "dpo")}, r"methods names \['dpo'\]"),
    ({"methods": "sft"}, "methods must be a tuple"),
    ({"step_time_regime": "fast"}, "step_time_regime='fast'"),
    ({"pads_rows_to": "step"}, "pads_rows_to='step' is not one of micro_batch, global_batch"),
    ({"refuses": {"qkv_bias": "x", "no_such_field": "y"}}, "no_such_field, which is not a model field"),
    ({"ignores": {"qkv_bias": "twice"}}, "qkv_bias named in more than one"),
    ({"base_model_key": "megatron_pth"}, "base_model_key='megatron_pth' is not a model field"),
    ({"make_base": lambda recipe, directory: directory, "base_model_key": None}, "make_base without the base_model_key"),
])
def test_a_spec_is_checked_when_built(change, message):
    with pytest.raises(TypeError, match=message):
        dataclasses.replace(engines.get("megatron").spec, **change)


def test_every_registered_spec_names_every_model_field_once():
    fields = {f.name for f in dataclasses.fields(ModelCfg)}
    for spec in engines.specs():
        named = [*spec.maps, *spec.ignores, *spec.refuses]
        assert sorted(named) == sorted(fields), spec.name


# ----------------------------------------------------------------------------- the door
@dataclasses.dataclass
class _ModelWithAThrowawayField(ModelCfg):
    sparkle_bias: bool = False  # a field added to the schema that no engine's spec has heard of


def test_a_model_field_no_engine_maps_is_refused_at_plan_for_every_engine():
    for name in engines.names():
        r = compose(["model=tiny_llama", "data=synthetic", f"engine={name}"])
        quiet = dataclasses.replace(r, model=_ModelWithAThrowawayField(**dataclasses.asdict(r.model)))
        engines.check_recipe(quiet)  # at its default the field changes nothing: accepted
        loud = dataclasses.replace(quiet, model=dataclasses.replace(quiet.model, sparkle_bias=True))
        with pytest.raises(UserError) as err:
            engines.check_recipe(loud)
        text = str(err.value)
        assert text.startswith(f"model.sparkle_bias=true (model tiny_llama): engine={name} does not build it"), text
        assert "no registered engine builds it" in text and "\n" not in text


def _accepts(engine: str, key: str, value: str) -> bool:
    extra = {"method.name": [f"method={value}"], "parallelism.sharding": [f"parallelism.sharding={value}"],
             "train.precision": [f"train.precision={value}"]}[key]
    try:
        compose(["model=tiny_llama", "data=synthetic", f"engine={engine}", *extra])
    except UserError as exc:
        assert str(exc).startswith(f"{key}={value}: engine={engine} has no such"), str(exc)  # one line naming it
        return False
    return True


def test_list_engines_json_agrees_with_what_plan_accepts(capsys):
    assert main(["list", "engines", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == list(engines.names())
    for r in records:
        for key, field, vocabulary in (("method.name", "methods", METHODS), ("parallelism.sharding", "shardings", SHARDINGS),
                                       ("train.precision", "precisions", PRECISIONS)):
            for value in vocabulary:
                assert _accepts(r["name"], key, value) == (value in r[field]), (r["name"], key, value)
    assert main(["list", "engines"]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in engines.names()) and "refuses model fields" in table
    # the LoRA placements each engine can render (its spec), so NeMo 1.23's QKV-only is seen before plan refuses it
    lora = {line.split(")", 1)[0]: line.split(")", 1)[1].split() for line in table.splitlines() if "(method.lora_" in line}
    a2a = dict(zip(engines.names(), lora["  LoRA all-to-all (method.lora_a2a"]))
    assert a2a == {r["name"]: ("yes" if r["lora_a2a"] else "no") for r in records}
    assert "linear_proj," in table.split("LoRA targets (method.lora_targets)")[1].split("\n")[0]


# ----------------------------------------------------------------------------- Qwen2.5-7B, added as data
def test_qwen_plans_its_published_parameter_count():
    from vdkit.planner.arch import param_counts

    for engine in ("megatron", "reference", "bridge"):
        assert param_counts(compose(["model=qwen2_5_7b", f"engine={engine}"]).model).total == QWEN_PARAMS


@pytest.mark.parametrize("engine", ["nemo"])
def test_engines_that_cannot_build_qwen_refuse_it_in_one_line(engine):
    with pytest.raises(UserError) as err:
        compose(["model=qwen2_5_7b", f"engine={engine}"])
    text = str(err.value)
    assert text.startswith(f"model.qkv_bias=true (model qwen2_5_7b): engine={engine} does not build it")
    assert "use engine=reference or engine=megatron" in text and "\n" not in text


@pytest.mark.parametrize("engine,extra", [("megatron", []), ("reference", ["parallelism.sharding=fsdp"]),
                                          ("bridge", [])])
def test_engines_that_build_qwen_build_it_exactly(engine, extra, tmp_path):
    """`vdkit check`: the job's own model builder on the meta device counts the published 7,615,616,512 (Bridge:
    its Qwen25ModelProvider7B.provide(), Q/K/V biases and all)."""
    pytest.importorskip({"megatron": "megatron.core", "reference": "transformers", "bridge": "megatron.core"}[engine])
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import render_run

    plan = make_plan(compose(["model=qwen2_5_7b", f"engine={engine}", "method=sft", *extra]))
    run_dir = render_run(plan, tmp_path, check_mounts=False)
    (report,) = engines.get(engine).check_runs([run_dir])
    text = report.text()
    assert f"{QWEN_PARAMS:,} parameters" in text and f"plan {QWEN_PARAMS:,}" in text, text
    assert not report.defects, text


def test_bridge_renders_a_qwen_lora_with_autobridge_importing_its_hf_weights(tmp_path):
    """`vdkit render engine=bridge model=qwen2_5_7b method=lora`: Bridge's Qwen2.5 provider, and the one-time import
    job converts the staged HF weights with AutoBridge (its Qwen2ForCausalLM bridge: models/qwen/qwen2_bridge.py:28)."""
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import render_run

    plan = make_plan(compose(["model=qwen2_5_7b", "engine=bridge", "method=lora"]))
    run_dir = render_run(plan, tmp_path, check_mounts=False)
    yaml_text = (run_dir / "bridge.yaml").read_text()
    assert "_target_: megatron.bridge.models.qwen.qwen_provider.Qwen25ModelProvider7B" in yaml_text
    job = (run_dir / "import_hf.sbatch").read_text()
    assert "AutoBridge.import_ckpt" in job and "/shared/models/Qwen2.5-7B" in job


def test_no_engine_name_is_compared_or_keyed_in_the_core():
    """What an engine can do is its spec's: vdkit/ never compares with an engine's name nor keys a table by one."""
    import ast
    from pathlib import Path

    names = set(engines.names())
    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "vdkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
            elif isinstance(node, ast.Dict):
                consts = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            else:
                continue
            if consts & names:
                found.append(f"{path.name}:{node.lineno} {sorted(consts & names)}")
    assert not found, "engine names in the core (read the engine's spec instead):\n" + "\n".join(found)


def _old_style_constants(tree, fields) -> list:
    """``(name, line, spec field)`` for each module-level UPPERCASE name that is, or nearly is, an EngineSpec
    field's name: the module constants the spec replaced (the registry read them with getattr defaults, so a
    misspelt ``CONTEXT_PARRALLEL = True`` was silently the default). Nothing reads one now."""
    import difflib

    upper = {f.upper(): f for f in fields}
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Name) and n.id.isupper() and n.id != "SPEC":
                    close = difflib.get_close_matches(n.id, upper, 1, 0.8)
                    if close:
                        found.append((n.id, n.lineno, upper[close[0]]))
    return found


def test_no_engine_module_keeps_an_old_style_capability_constant():
    """An engine's capabilities are its SPEC's fields; an UPPERCASE module constant named like one (or misspelt
    like one) in an engine module is stale: its value reaches nothing."""
    import importlib.util
    from pathlib import Path

    fields = [f.name for f in dataclasses.fields(EngineSpec)]
    found = []
    for name, module in engines.REGISTRY.items():
        path = Path(importlib.util.find_spec(module).origin)
        for const, line, field in _old_style_constants(ast.parse(path.read_text(), str(path)), fields):
            found.append(f"{path.relative_to(path.parents[2])}:{line} {const} (engine {name}): set SPEC's {field}")
    assert not found, "old-style engine constants (set the SPEC field instead):\n" + "\n".join(found)
    planted = ast.parse("CONTEXT_PARRALLEL = True\nFAMILIES: tuple = ('llama',)\nFINETUNE_SCRIPT = 'x.py'\n"
                        "SPEC = None\ndef f():\n    METHODS = ()\n")
    assert _old_style_constants(planted, fields) == [("CONTEXT_PARRALLEL", 1, "context_parallel"),
                                                     ("FAMILIES", 2, "families")]
