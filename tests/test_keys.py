"""What a key means: the schema's field comments, read back by `vdkit plan --explain KEY` and `--cfg`."""
import dataclasses
import inspect
import re

import pytest
import yaml

from vdkit.composition import config, schema
from vdkit.commands import keys
from vdkit.cli import main
from vdkit.errors import UserError


def test_every_schema_field_says_what_it_means():
    undocumented = [d.key for d in keys.all_keys() if not d.meaning]
    assert undocumented == [], "add a trailing `# meaning` comment to these fields in the schema: " + ", ".join(undocumented)


def test_every_schema_field_is_a_key():
    sections = {f.name: f.default_factory for f in dataclasses.fields(schema.VdkitConfig)}
    expected = {f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)}
    assert {d.key for d in keys.all_keys()} == expected


def test_the_meaning_is_the_comment_on_the_fields_line():
    # read independently of keys.py: the line `    nodes: int = ...  # ...` of ClusterCfg's source
    source = inspect.getsource(schema.ClusterCfg)
    line = next(ln for ln in source.splitlines() if re.match(r"\s+nodes: int\b", ln))
    comment = line.split("  # ", 1)[1].strip()
    assert keys.lookup("cluster.nodes")[0].meaning == comment
    assert keys.lookup("cluster.nodes")[0].type == "int"


def test_a_hash_inside_a_string_default_is_not_a_comment():
    @dataclasses.dataclass
    class Demo:
        color: str = "#ff0000"
        width: int = 3  # pixels

    notes = keys._field_comments(Demo)
    assert notes == {"color": ("str", ""), "width": ("int", "pixels")}


@pytest.mark.parametrize("overrides", [[], ["model=llama2_70b", "cluster.nodes=2"], ["model=tiny_opt", "engine=reference",
                                                                                    "cluster=local"]])
def test_annotated_cfg_loads_back_to_the_recipe(overrides):
    recipe = config.compose(overrides)
    text = keys.annotated_yaml(recipe)
    assert yaml.safe_load(text) == recipe.to_dict()
    assert "# nodes in the job" in text


def test_plan_cfg_prints_meanings(capsys):
    assert main(["plan", "--cfg", "cluster.nodes=2"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("nodes:"))
    assert line.split("#")[0].strip() == "nodes: 2" and keys.lookup("cluster.nodes")[0].meaning in line


def test_explain_shows_type_default_value_and_meaning(capsys):
    assert main(["plan", "--explain", "cluster.nodes", "cluster.nodes=3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "cluster.nodes (int; schema default 1; this recipe: 3)"
    assert keys.lookup("cluster.nodes")[0].meaning in out


def test_explain_a_section_lists_its_keys_and_the_group_options(capsys):
    assert main(["plan", "--explain", "method"]) == 0
    out = capsys.readouterr().out
    assert "method.lora_adapter_dim (int;" in out and "LoRA rank" in out
    assert "method=NAME: " + ", ".join(config.group_options("method")) in out


@pytest.mark.parametrize("key,suggestion", [("cluster.node", "cluster.nodes"), ("nodes", "cluster.nodes"),
                                            ("train.gbs", None), ("", None)])
def test_explain_an_unknown_key_is_one_line(capsys, key, suggestion):
    assert main(["plan", "--explain", key]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vdkit plan: error:") and "\n" not in err and "is not a recipe key" in err
    if suggestion:
        assert f"did you mean {suggestion}" in err
    with pytest.raises(UserError):
        keys.lookup(key)
