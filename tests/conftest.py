"""Shared fixtures: the session's real local Slurm (six emulated XE9680 nodes).

``local_slurm`` starts Debian's slurm-wlm + munge once per session in a pytest temp directory
(vdkit.slurm.localcluster), points every Slurm client of the session at it through SLURM_CONF,
and stops it at the end. Where Slurm cannot start (not root, packages missing, munge failing)
tests using it are skipped with the reason, unless VDKIT_REQUIRE_SLURM=1 (CI), which turns the
reason into an error so that a broken cluster cannot hide behind a skip. Tests that use the
fixture are marked ``slurm`` automatically (select or drop them with ``-m slurm``/``-m 'not slurm'``).

The bad-input tables (tests/test_bad_inputs.py, tests/test_bad_input_classes.py: half the collected
tests) run a fixed sample of each defect class unless ``VDKIT_FULL_TESTS=1`` (CI: .ci/run sets it): a
module's ``TABLE_CLASSES`` maps each row's test id to its class, and ``SAMPLE_FRACTION`` of each class
(at least ``SAMPLE_MIN`` rows), drawn with a fixed seed, is kept; the rest are deselected (the summary
counts them). Naming rows (``-k``, ``file::test[id]``) runs what was named, unsampled.
"""
from __future__ import annotations

import json
import math
import os
import random
from collections import defaultdict

import pytest

from helpers import FULL_TESTS_ENV  # noqa: E402 - the one home (test_readme reads it too)
SAMPLE_FRACTION = 1 / 8
SAMPLE_MIN = 3
SAMPLE_SEED = "vdkit-bad-inputs"


def full_tests() -> bool:
    """True when every row of the bad-input tables runs (CI), False for the sampled default."""
    return os.environ.get(FULL_TESTS_ENV) == "1"


def _narrowed(config) -> bool:
    """A selection by keyword or node id: the developer named the rows to run."""
    return bool(config.getoption("keyword")) or any("::" in str(a) for a in config.args)


def sampled_out(items) -> list:
    """The table rows not in the fixed per-class sample (deterministic: the same rows every run)."""
    by_class = defaultdict(list)
    for item in items:
        classes = getattr(getattr(item, "module", None), "TABLE_CLASSES", None)
        callspec = getattr(item, "callspec", None)
        if classes and callspec is not None and callspec.id in classes:
            by_class[(item.module.__name__, classes[callspec.id])].append(item)
    drop = []
    for (module, cls), rows in sorted(by_class.items(), key=lambda kv: str(kv[0])):
        n = min(len(rows), max(SAMPLE_MIN, math.ceil(len(rows) * SAMPLE_FRACTION)))
        keep = set(random.Random(f"{SAMPLE_SEED}:{module}:{cls}").sample(range(len(rows)), n))
        drop += [row for i, row in enumerate(rows) if i not in keep]
    return drop


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "local_slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    if full_tests() or _narrowed(config):
        return
    drop = {id(item) for item in sampled_out(items)}
    if drop:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in drop])
        items[:] = [item for item in items if id(item) not in drop]


def pytest_report_header(config):
    if full_tests():
        return f"bad-input tables: every row ({FULL_TESTS_ENV}=1)"
    return (f"bad-input tables: a fixed sample of each defect class ({FULL_TESTS_ENV}=1 runs every row, "
            "as CI does)")


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    """A running local Slurm (a vdkit.slurm.localcluster.LocalCluster); SLURM_CONF is set for the session."""
    from vdkit.slurm.localcluster import LocalSlurmUnavailable, up, why_unavailable

    required = os.environ.get("VDKIT_REQUIRE_SLURM") == "1"
    reason = why_unavailable()
    if reason:
        if required:
            pytest.fail(f"local Slurm required (VDKIT_REQUIRE_SLURM=1) but unavailable: {reason}")
        pytest.skip(f"local Slurm unavailable: {reason}")
    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = up(root)
    except LocalSlurmUnavailable as exc:
        if required:
            pytest.fail(f"local Slurm required (VDKIT_REQUIRE_SLURM=1) but failed to start: {exc}")
        pytest.skip(f"local Slurm failed to start: {exc}")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.down()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture(scope="session")
def nemo_venv():
    """NeMo 1.23's own venv for `vdkit check` (vdkit.recipes.nemo.runcheck.venv): made once from the package
    index (about a minute), reused while its pins and this checkout are unchanged. A failure to make it fails
    the test."""
    import fcntl

    from vdkit.recipes.nemo.runcheck import venv

    lock = venv.location().with_name(venv.location().name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "w") as held:
            # one maker at a time: xdist workers (-n 2) and other checkouts share the venv's location
            fcntl.flock(held, fcntl.LOCK_EX)
            return venv.ensure()
    except venv.CannotCheck as exc:
        pytest.fail(str(exc))


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """A kubectl that records its argv (JSON lines) and answers ``get`` with $FAKE_STATE (``get pods``: $FAKE_PODS, the
    pod list's JSON)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "kubectl.log"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:3] == ['get', 'pods']: print(os.environ.get('FAKE_PODS', '{\"items\": []}'), end='')\n"
        "elif sys.argv[1] == 'get': print(os.environ.get('FAKE_STATE', ''), end='')\n"
        "elif '--dry-run=server' in sys.argv: print('rayjob.ray.io/x created (server dry run)')\n"
        "else: print('rayjob.ray.io/x created')\n")
    (bin_dir / "kubectl").chmod(0o755)
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUBECONFIG", str(config))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(scope="module")
def one_rank():
    """megatron-core on this process as one CPU rank (TP = PP = 1, the model-parallel RNG seeded): the local layer's
    tests build real megatron-core modules on it (test_activation_memory, test_local_traffic, test_host_time)."""
    pytest.importorskip("megatron.core")
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from vdkit.recipes.common import mcore_cpu

    mcore_cpu.apply()
    mcore_cpu.single_rank_model_parallel()
    model_parallel_cuda_manual_seed(1)
