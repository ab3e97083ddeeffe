"""`vdkit data` under hostile conditions (issue 12 items 4, 9, 15): racing writers, unreadable files, modes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.files import DirLock
from vdkit.recipes.data import MANIFEST_FILE, PREPARE_LOCK, SPLIT_FILES


def _dolly(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"instruction": f"question {i} " + "word " * 40, "context": "",
                                        "response": f"answer {i}", "category": "open_qa"}) + "\n"
                            for i in range(n)))
    return path


def _unreadable(tmp_path: Path) -> Path:
    """A regular file this process cannot read, even as root (a write-only procfs file)."""
    if os.geteuid() == 0:
        p = Path("/proc/sys/vm/compact_memory")
        if not p.is_file():
            pytest.skip("no write-only procfs file to stand for an unreadable file as root")
        return p
    p = tmp_path / "secret.jsonl"
    p.write_text('{"input": "a", "output": "b"}\n')
    p.chmod(0)
    return p


@pytest.mark.parametrize("argv", [["data", "stats"], ["data", "pack"], ["data", "prepare", "dolly"]])
def test_unreadable_file_is_one_line_not_a_traceback(tmp_path, capsys, argv):
    bad = _unreadable(tmp_path)
    extra = {"stats": [str(bad)], "pack": [str(bad), str(tmp_path / "p.jsonl"), "--tokenizer", str(bad)],
             "prepare": [str(bad), str(tmp_path / "out")]}[argv[1]]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "fix:" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if bad.parent != tmp_path else [bad.name])


def test_prepared_files_follow_the_umask(tmp_path, capsys):
    src = _dolly(tmp_path / "dolly.jsonl", 20)
    old = os.umask(0o022)
    try:
        assert main(["data", "prepare", "dolly", str(src), str(tmp_path / "a")]) == 0
        os.umask(0o002)
        assert main(["data", "prepare", "dolly", str(src), str(tmp_path / "b")]) == 0
    finally:
        os.umask(old)
    for d, mode in (("a", 0o644), ("b", 0o664)):
        for name in [*SPLIT_FILES.values(), MANIFEST_FILE]:
            assert stat.S_IMODE((tmp_path / d / name).stat().st_mode) == mode, (d, name)
        assert not (tmp_path / d / PREPARE_LOCK).exists()


def test_a_second_prepare_while_one_writes_is_refused(tmp_path, capsys):
    src = _dolly(tmp_path / "dolly.jsonl", 20)
    out = tmp_path / "out"
    out.mkdir()
    with DirLock(out, PREPARE_LOCK, "held", "wait"):  # stands for a prepare in progress
        assert main(["data", "prepare", "dolly", str(src), str(out), "--force"]) == 2
        err = capsys.readouterr().err.strip()
        assert "another `vdkit data prepare` is writing there now" in err and len(err.splitlines()) == 1
        assert [p.name for p in out.iterdir()] == [PREPARE_LOCK]
    assert list(out.iterdir()) == []
    assert main(["data", "prepare", "dolly", str(src), str(out)]) == 0


def test_two_racing_prepares_one_wins_whole_the_other_is_refused(tmp_path):
    """Two real processes, different seeds, started together: exactly one exits 0 and its files are
    all there (manifest and splits agree); the other exits 2 with one line."""
    src = _dolly(tmp_path / "dolly.jsonl", 30000)  # about a second of reading: the two overlap
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "vdkit", "data", "prepare", "dolly", str(src), str(out),
                               "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read(), seed) for p, seed in zip(procs, (1, 2))]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    winner = next(seed for rc, _, seed in results if rc == 0)
    loser_err = next(err for rc, err, _ in results if rc == 2).strip()
    assert len(loser_err.splitlines()) == 1 and "Traceback" not in loser_err
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["seed"] == winner
    for name, fname in SPLIT_FILES.items():
        lines = (out / fname).read_text().splitlines()
        assert len(lines) == manifest["written"][name]
    assert sorted(p.name for p in out.iterdir()) == sorted([*SPLIT_FILES.values(), MANIFEST_FILE])
