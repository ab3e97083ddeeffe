"""Shared fixtures: the session's real local Slurm (six emulated XE9680 nodes).

``local_slurm`` starts Debian's slurm-wlm + munge once per session in a pytest temp directory
(vdkit.slurm.localcluster), points every Slurm client of the session at it through SLURM_CONF,
and stops it at the end. Where Slurm cannot start (not root, packages missing, munge failing)
tests using it are skipped with the reason, unless VDKIT_REQUIRE_SLURM=1 (CI), which turns the
reason into an error so that a broken cluster cannot hide behind a skip. Tests that use the
fixture are marked ``slurm`` automatically (select or drop them with ``-m slurm``/``-m 'not slurm'``).
"""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "local_slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


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
    """NeMo 1.23's own venv for `vdkit check` (vdkit.recipes.nemo_check.venv): made once from the package
    index (about a minute), reused while its pins and this checkout are unchanged. A failure to make it fails
    the test."""
    from vdkit.recipes.nemo_check import venv

    try:
        return venv.ensure()
    except venv.CannotCheck as exc:
        pytest.fail(str(exc))
