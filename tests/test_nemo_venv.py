"""NeMo 1.23's venv for `vdkit check` (vdkit/recipes/nemo/runcheck/venv.py): complete, this checkout's own, and
a check that cannot make it is not a pass."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _readme_extras() -> list:
    """The extras README's first install line gives a user (`pip install ... -e ".[...]"`)."""
    m = re.search(r'-e "\.\[([^\]]+)\]"', (ROOT / "README.md").read_text())
    return m.group(1).split(",")


def _readme_no_deps() -> list:
    """What README's install line adds with --no-deps (Megatron-Bridge and its two)."""
    m = re.search(r"pip install --no-deps ([^&]+)&&", (ROOT / "README.md").read_text())
    return [Requirement(t).name for t in m.group(1).split()]


def _closure(extras) -> set:
    """Every distribution `pip install -e .[extras]` installs (the kit's requirements, transitively)."""
    import importlib.metadata as md

    seen, todo = {canonicalize_name(n) for n in _readme_no_deps()}, [("vdkit", list(extras))]  # not expanded
    while todo:
        name, ex = todo.pop()
        if canonicalize_name(name) in seen:
            continue
        seen.add(canonicalize_name(name))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ["", *ex]):
                continue
            todo.append((req.name, list(req.extras)))
    return seen


WRAP = """
import importlib.metadata as md, json, runpy, sys
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
finally:
    owner = {}  # file -> its distribution (namespace packages such as google.* span several)
    for dist in md.distributions():
        for f in dist.files or ():
            if f.suffix in (".py", ".so"):
                owner[str(dist.locate_file(f).resolve())] = dist.metadata["Name"]
    files = {str(__import__("pathlib").Path(m.__file__).resolve()) for m in list(sys.modules.values())
             if getattr(m, "__file__", None)}
    sys.stderr.write("DISTS " + json.dumps(sorted({owner[f] for f in files if f in owner})) + "\\n")
"""


@pytest.mark.slow  # a render and NeMo 1.23's probe in its venv: ~30-60 s on 2 cores
def test_probe_imports_only_pinned_or_declared_packages(tmp_path, nemo_venv):
    """Every distribution NeMo's probe imports (a LoRA cell with its data here: optimizer registry, restore merge,
    GPTSFTDataset) is pinned in the venv or installed by README's install line - none is in the kit's
    environment by chance (a fresh clone failed every NeMo job with `No module named 'requests'`)."""
    from vdkit.cli import main
    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files
    from vdkit.recipes.nemo.runcheck import PROBE, _cell
    from vdkit.recipes.nemo.runcheck.venv import PINS

    data = tmp_path / "data"
    data.mkdir()
    rows = "".join(json.dumps({"input": f"q {i}?", "output": f"a {i}."}) + "\n" for i in range(4))
    (data / "training.jsonl").write_text(rows)
    (data / "validation.jsonl").write_text(rows)
    assert main(["render", "model=llama2_7b", "method=lora", "cluster.nodes=1", f"data.data_dir={data}",
                 "run.name=c", "--out", str(tmp_path), "--no-check-mounts"]) == 0
    tok = tmp_path / "tok"
    tok.mkdir()
    for name, text in byte_tokenizer_files("").items():
        (tok / Path(name).name).write_text(text)
    p = subprocess.run([str(nemo_venv), "-c", WRAP, str(PROBE)], input=json.dumps([_cell(tmp_path / "c", str(tok))]),
                       capture_output=True, text=True, timeout=600)
    assert '"kind": "done"' in p.stdout and '"defect"' not in p.stdout, p.stdout + p.stderr[-2000:]
    assert "GPTSFTDataset" in p.stdout
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("DISTS ")]
    used = {canonicalize_name(d) for d in json.loads(line[6:])}
    pinned = {canonicalize_name(Requirement(p).name) for p in PINS}
    borrowed = used - pinned - _closure(_readme_extras())
    assert not borrowed, f"the probe imports {sorted(borrowed)}: pin them in venv.PINS"


def test_venv_location_is_this_checkouts(monkeypatch):
    """The default location names this checkout's kit, Python and environment: another checkout (another source
    directory) or another environment gets its own venv, and a venv stamped for another environment is not used."""
    import sys

    import vdkit
    from vdkit.recipes.nemo.runcheck import venv

    monkeypatch.delenv("VDKIT_NEMO_VENV", raising=False)
    here = venv.location()
    assert venv.key() in here.name and f"py{sys.version_info.major}.{sys.version_info.minor}" in here.name
    monkeypatch.setattr(vdkit, "__file__", "/elsewhere/checkout/vdkit/__init__.py")
    assert venv.location() != here
    monkeypatch.undo()
    monkeypatch.setattr(sys, "prefix", "/another/env")
    assert venv.location() != here


def test_stamped_for_another_environment_is_remade(tmp_path):
    from vdkit.recipes.nemo.runcheck import venv

    (tmp_path / venv.READY).write_text("\n".join(venv.PINS))  # yesterday's stamp: the pins only
    assert venv.python(tmp_path) is None


def test_check_without_nemo_venv_never_exits_0(tmp_path, monkeypatch, capsys):
    """Where NeMo's venv cannot be made (here: its location is under a file), a clean NeMo cell is not a pass:
    one line saying the check could not run NeMo's code, exit 3; stdout says so for the run dir."""
    from vdkit.cli import main
    from vdkit.run.jobcheck import EXIT_NOT_CHECKED

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VDKIT_NEMO_VENV", str(blocker / "venv"))
    for name in ("a", "b"):
        assert main(["render", "model=llama2_7b", "method=lora", "cluster.nodes=1", f"run.name={name}", "--out",
                     str(tmp_path), "--no-check-mounts"]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "a"), str(tmp_path / "b")]) == EXIT_NOT_CHECKED == 3
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("vdkit check:")]
    assert lines[0].startswith("vdkit check: making NeMo 1.23.0's own venv"), err
    (line,) = lines[1:]
    assert line.startswith("vdkit check: cannot check 2 run directories: NeMo 1.23.0's code did not run: could not "
                           "make NeMo 1.23.0's venv at"), line
    assert "fix:" in line and "Traceback" not in err
    assert out.count("could not check") == 2


def test_readme_names_the_check_and_its_first_use_cost():
    from vdkit.recipes.nemo.runcheck.venv import ABOUT, PINS

    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`vdkit check RUN_DIR...`" in text and f"({ABOUT}, {len(PINS)} packages from the package index" in text
    assert "exits 3" in text
