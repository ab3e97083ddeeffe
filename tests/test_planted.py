"""Planted defects as data (tests/planted/cases.yaml): each row, a fresh render with one setting NVIDIA's code
refuses at start-up, fails `vdkit check` in exactly one line (exit 2), all rows in one `vdkit check` process
(each stack imported once; NeMo 1.23 in its venv through one probe)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CASES = yaml.safe_load((Path(__file__).parent / "planted" / "cases.yaml").read_text())


def _set(data: dict, key: str, value) -> None:
    node = data
    parts = key.split(".")
    for k in parts[:-1]:
        node = node.setdefault(k, {})
    node[parts[-1]] = value


def _chat_fixtures(out: Path) -> dict:
    """An Instruct-like tokenizer (a chat template) and `vdkit data prepare --chat` rows for the cells that name
    them (placeholder -> path)."""
    from helpers import prepared_dolly, tiny_chat_tokenizer

    root = out / "_chat"
    root.mkdir()
    return {"@CHAT_TOKENIZER@": str(tiny_chat_tokenizer(root / "tok")), "@CHAT_DATA@": str(prepared_dolly(root, True))}


# one row of each kit-engine probe in the fast test below (no NeMo venv, no Bridge import); every other row in the slow one
KIT_ROWS = [r for r in CASES["rows"] if r["id"] in ("m-gbs-not-divisible", "m-vp-without-pp", "r-lora-matches-nothing")]
STACK_ROWS = [r for r in CASES["rows"] if r not in KIT_ROWS]
CONFIG_FILES = ("bridge.yaml", "nemo.yaml", "recipe.yaml")  # the file a row edits: the engine's config, else the recipe


def plant(out: Path, rows=None) -> dict:
    """Render each row's cell (``rows``, default all) as its own run, stage its files and apply its edits; id -> run
    dir."""
    rows = CASES["rows"] if rows is None else rows
    from helpers import EMPTY_SAFETENSORS
    from vdkit.cli import main

    import json

    dirs, fixtures = {}, {}
    for row in rows:
        stage = out / "stage" / row["id"]
        for name, content in (row.get("stage") or {}).items():
            stage.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(json.dumps(content))
        if "config.json" in (row.get("stage") or {}):  # a staged model has weights (the job's pre-flight, which
            (stage / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)  # `vdkit check` runs here, wants whole
            # weights; nothing loads them)
        cell = [arg.replace("{stage}", str(stage)) for arg in CASES["cells"][row["cell"]]]
        if any("@CHAT_" in arg for arg in cell) and not fixtures:
            fixtures = _chat_fixtures(out)
        for placeholder, path in fixtures.items():
            cell = [arg.replace(placeholder, path) for arg in cell]
        assert main(["render", *cell, f"run.name={row['id']}", "--out", str(out), "--no-check-mounts"]) == 0
        d = out / row["id"]
        name = next(n for n in CONFIG_FILES if (d / n).is_file())
        data = yaml.safe_load((d / name).read_text())
        for key, value in row["set"].items():
            _set(data, key, value)
        (d / name).write_text(yaml.safe_dump(data, sort_keys=False))
        dirs[row["id"]] = d
    return dirs


def _missed(rows, dirs: dict, stderr: str) -> dict:
    """Row id -> its error lines, for each row whose run dir did not fail in exactly one line holding its expect."""
    missed = {}
    for row in rows:
        lines = [ln for ln in stderr.splitlines() if ln.startswith(f"vdkit check: error: {dirs[row['id']]}:")]
        if len(lines) != 1 or row["expect"] not in lines[0]:
            missed[row["id"]] = lines
    return missed


def test_table_is_grown_from_nvidias_source():
    rows = CASES["rows"]
    assert len(rows) >= 25 and len({r["id"] for r in rows}) == len(rows)
    assert all(r.get("cite") and ".py:" in r["cite"] or "tokenizer.py" in r["cite"] for r in rows)
    assert {r["id"][0] for r in rows} == {"b", "n", "m", "r"}


def test_kit_engine_rows_are_one_line_each(tmp_path, capsys):
    """The kit's own engines' start-up refusals (megatron-core's parallel state and micro-batch calculator, peft's
    matcher, the ranks' rules): one `vdkit check`, no NeMo venv, no Bridge import (tiny models on the meta device and
    a fake process group)."""
    dirs = plant(tmp_path, KIT_ROWS)
    capsys.readouterr()
    p = subprocess.run([sys.executable, "-m", "vdkit", "check", *map(str, dirs.values())], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert not _missed(KIT_ROWS, dirs, p.stderr)


@pytest.mark.slow  # 38 renders and one `vdkit check` of every stack (NeMo's probe): ~3-5 min on 2 cores
def test_every_planted_defect_is_one_line(tmp_path, nemo_venv, capsys):
    dirs = plant(tmp_path, STACK_ROWS)
    capsys.readouterr()
    p = subprocess.run([sys.executable, "-m", "vdkit", "check", *map(str, dirs.values())], capture_output=True,
                       text=True, timeout=1200, env={**os.environ, "VDKIT_NEMO_VENV": str(Path(nemo_venv).parents[1])})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert not _missed(STACK_ROWS, dirs, p.stderr)


def test_no_shipped_nemo_peft_cell_interleaves_the_pipeline(capsys):
    """NeMo 1.23's add_adapter refuses VP with PEFT (nlp_adapter_mixins.py:176; the check found table9_fast's 70B
    LoRA / P-tuning cells planned with VP 2): the planner never picks it there."""
    import json

    from vdkit.cli import main
    from vdkit.composition.conftree import conf_dir

    for sweep in sorted(p.stem for p in (conf_dir() / "sweep").glob("*.yaml")):
        capsys.readouterr()
        assert main(["plan", "--sweep", sweep, "--json"]) == 0
        for line in capsys.readouterr().out.splitlines():
            cell = json.loads(line)
            if cell["engine"] == "nemo" and cell["method"] in ("lora", "ptuning"):
                assert (cell["vp"] or 1) == 1, (sweep, cell["model"], cell["method"], cell["nodes"], cell["vp"])
