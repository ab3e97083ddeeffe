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


def plant(out: Path, rows=None) -> dict:
    """Render each row's cell (``rows``: these, else the table's) as its own run and apply its edits; id -> run dir."""
    from vdkit.cli import main

    dirs, fixtures = {}, {}
    for row in rows or CASES["rows"]:
        cell = CASES["cells"][row["cell"]]
        if any("@CHAT_" in arg for arg in cell) and not fixtures:
            fixtures = _chat_fixtures(out)
        for placeholder, path in fixtures.items():
            cell = [arg.replace(placeholder, path) for arg in cell]
        assert main(["render", *cell, f"run.name={row['id']}", "--out", str(out), "--no-check-mounts"]) == 0
        d = out / row["id"]
        name = "bridge.yaml" if (d / "bridge.yaml").is_file() else "nemo.yaml"
        data = yaml.safe_load((d / name).read_text())
        for key, value in row["set"].items():
            _set(data, key, value)
        (d / name).write_text(yaml.safe_dump(data, sort_keys=False))
        dirs[row["id"]] = d
    return dirs


def test_table_is_grown_from_nvidias_source():
    rows = CASES["rows"]
    assert len(rows) >= 25 and len({r["id"] for r in rows}) == len(rows)
    assert all(r.get("cite") and ".py:" in r["cite"] or "tokenizer.py" in r["cite"] for r in rows)
    assert {r["id"][0] for r in rows} == {"b", "n"}


@pytest.mark.slow  # 26 renders and one `vdkit check` of both stacks (NeMo's probe): ~2-4 min on 2 cores
def test_every_planted_defect_is_one_line(tmp_path, nemo_venv, capsys):
    dirs = plant(tmp_path)
    capsys.readouterr()
    p = subprocess.run([sys.executable, "-m", "vdkit", "check", *map(str, dirs.values())], capture_output=True,
                       text=True, timeout=1200, env={**os.environ, "VDKIT_NEMO_VENV": str(Path(nemo_venv).parents[1])})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    missed = {}
    for row in CASES["rows"]:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith(f"vdkit check: error: {dirs[row['id']]}:")]
        if len(lines) != 1 or row["expect"] not in lines[0]:
            missed[row["id"]] = lines
    assert not missed, missed


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
