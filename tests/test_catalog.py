"""`vdkit list`: everything that exists, one line each, read from conf/, the registries and the tables."""
import re
from pathlib import Path

import pytest

from vdkit.commands import catalog, keys
from vdkit.cli import build_parser, main
from vdkit.composition.config import conf_dir
from vdkit.launch.launchers import names as launcher_names
from vdkit.recipes import engines

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"models": "model", "methods": "method", "clusters": "cluster", "data": "data", "recipes": "recipe",
          "deepspeed": "deepspeed", "tp_overlap": "tp_overlap", "sweeps": "sweep"}


def listing(capsys, *kinds) -> dict:
    """{kind: {name: text}} from `vdkit list KINDS`."""
    assert main(["list", *kinds]) == 0
    out, blocks = capsys.readouterr().out, {}
    current = None
    for line in out.splitlines():
        head = re.match(r"^(\w+) \(", line)
        if head:
            current = blocks.setdefault(head.group(1), {})
        elif line.startswith("  ") and current is not None:
            name, _, text = line.strip().partition("  ")
            current[name] = text.strip()
    return blocks


def test_every_config_group_file_is_listed_with_a_description(capsys):
    blocks = listing(capsys)
    for kind, group in GROUPS.items():
        files = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
        assert sorted(blocks[kind]) == files, kind
        empty = [name for name, text in blocks[kind].items() if not text]
        assert empty == [], f"conf/{group}/: give these files a header comment saying what they are: {empty}"


def test_engines_and_launchers_come_from_their_registries(capsys):
    blocks = listing(capsys, "engines", "launchers")
    assert list(blocks["engines"]) == list(engines.REGISTRY)
    assert set(blocks["launchers"]) >= set(launcher_names())
    assert all(blocks["engines"].values()) and all(blocks["launchers"].values())


def test_tables_are_the_published_files(capsys):
    blocks = listing(capsys, "tables")
    files = sorted(p.stem for p in (ROOT / "validation" / "published").glob("*.yaml"))
    assert sorted(blocks["tables"]) == files
    assert blocks["tables"]["table9"].endswith("Table 9. Time for model customization, 1000 steps (minutes)")


def test_models_show_their_size_from_the_arithmetic(capsys):
    blocks = listing(capsys, "models")
    assert blocks["models"]["llama2_7b"].startswith("6.74B params, 32 layers")
    assert blocks["models"]["llama2_70b"].startswith("69.0B params, 80 layers")


def test_one_line_each(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    entries = [ln for ln in lines if ln.startswith("  ")]
    assert len(entries) >= 40
    longest_name = max(len(ln.strip().split("  ")[0]) for ln in entries)
    # a name, two spaces, facts and a summary cut at a word: never a wrapped paragraph
    assert max(len(ln) for ln in entries) <= 2 + longest_name + 2 + 60 + catalog.SUMMARY_CHARS + 4


def test_list_keys_is_every_recipe_key(capsys):
    blocks = listing(capsys, "keys")
    assert list(blocks["keys"]) == [d.key for d in keys.all_keys()]


def test_unknown_kind_is_one_line_exit_2(capsys):
    assert main(["list", "modles"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vdkit list: error: 'modles' is not a kind") and "\n" not in err and "models" in err


@pytest.mark.parametrize("verb", ["plan", "render", "submit", "demo"])
def test_sweep_help_names_every_sweep(verb):
    sub = next(a for a in build_parser()._actions if a.dest == "verb").choices[verb]
    text = next(a.help for a in sub._actions if a.dest == "sweep")
    for path in (conf_dir() / "sweep").glob("*.yaml"):
        assert path.stem in text, (verb, path.stem)


def test_first_sentence():
    assert catalog.first_sentence("LoRA on QKV, e.g. 32. More words.") == "LoRA on QKV, e.g. 32"
    assert catalog.first_sentence("a " * 100).endswith(" ...")
    assert len(catalog.first_sentence("word " * 100)) <= catalog.SUMMARY_CHARS + 4


def test_a_registered_module_that_cannot_import_is_a_line_not_a_traceback():
    assert catalog.docstring_line("vdkit.no_such_module").startswith("(cannot import vdkit.no_such_module here")
