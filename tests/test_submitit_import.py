"""The kit's door to submitit (vdkit.slurm.submitit_import): importing submitit closes no one else's stream.

submitit's import-time ``logging.config.dictConfig`` closes every handler in the process, and absl's handler
(tensorboard's, reached by importing Megatron-Bridge) closes its stream when that is no longer sys.stderr. In
one pytest process an in-process Bridge import then a render under capsys closed pytest's own capture file
(tests/test_fp8_attention.py then tests/test_planted.py: pytest crashed at exit, "I/O operation on closed
file"). The same pair in miniature, in a pytest of its own: an absl handler made under pytest's capture, then
the kit's first submitit import under capsys.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOOR = ROOT / "slurm" / "submitit_import.py"

PAIR = '''
HANDLERS = []


def test_a_library_keeps_the_stderr_it_was_made_with():
    from absl.logging import PythonHandler  # what absl makes at import: bound to pytest's capture file

    HANDLERS.append(PythonHandler())


def test_the_kit_imports_submitit_under_capsys(tmp_path, capsys):
    from vdkit.slurm.submit import Submission

    assert Submission(run_dir=tmp_path, job_id=None).job() is None  # imports submitit's SlurmJob first
'''


def test_importing_submitit_leaves_pytests_capture_open(tmp_path):
    (tmp_path / "test_pair.py").write_text(PAIR)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repository's configuration
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        str(tmp_path / "test_pair.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "I/O operation on closed file" not in p.stdout + p.stderr, p.stderr[-2000:]
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]


def test_submitit_is_imported_only_through_the_door():
    """Any other ``import submitit`` that runs first would bring its logging set-up back."""
    import tomllib

    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    bad = []
    for path in sorted({p for folder in folders for p in (ROOT / folder).rglob("*.py")} - {DOOR}):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "submitit"]
    assert not bad, "submitit imported directly (use vdkit.slurm.submitit_import.submitit):\n" + "\n".join(bad)
