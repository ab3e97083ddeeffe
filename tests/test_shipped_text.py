"""What ships (the package, its configs and published data, the docs, README, pyproject) points only at
things a user has: never at the team's ../shared/ folder or a DESIGN.md that is not in the repository."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["README.md", "pyproject.toml", "conf", "vdkit", "recipes", "slurm", "k8s", "validation", "docs", "benchmarks"]
FORBIDDEN = re.compile(r"\.\./shared|/work/shared|DESIGN\.md")


def shipped_files():
    for top in SHIPPED:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" not in f.parts and f.suffix in (".py", ".yaml", ".md", ".toml", ".txt", ".json"):
                yield f


def test_the_scan_sees_the_shipped_files():
    names = {f.relative_to(ROOT).as_posix() for f in shipped_files()}
    assert {"README.md", "pyproject.toml", "conf/config.yaml", "validation/published/table9.yaml"} <= names


@pytest.mark.parametrize("path", list(shipped_files()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_pointer_outside_the_repository(path):
    bad = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
           if FORBIDDEN.search(line)]
    assert bad == [], f"{path.relative_to(ROOT)} points at files a user does not have: {bad}"


def test_a_report_names_its_source_without_a_team_path(tmp_path):
    from vdkit.validation import tables

    for name in ("table9", "training"):
        assert not FORBIDDEN.search(tables.load_published(name)["source"])
