"""Checkpoint sums, set-aside and the room check (vdkit.recipes.common.trust), on real files."""
from __future__ import annotations

import os
import subprocess

import pytest

from vdkit.run.faults import EXIT_NO_SPACE
from vdkit.recipes.common import trust
from vdkit.recipes.common.checkpoint import checkpoints


def _ckpt(d, step, payload=b"x" * 4096):
    path = d / f"step={step}.ckpt"
    path.write_bytes(payload + bytes([step % 256]))
    trust.write_sum(path)
    return path


def test_a_sum_is_what_sha256sum_checks(tmp_path):
    path = _ckpt(tmp_path, 3)
    assert trust.check(path) is None
    out = subprocess.run(["sha256sum", "-c", path.name + ".sha256"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_damage_is_named(tmp_path, damage):
    path = _ckpt(tmp_path, 5)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:100])
    elif damage == "flip":
        path.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    else:
        path.unlink()
    why = trust.check(path)
    assert why and path.name in why


def test_a_directory_checks_each_file_or_only_mine(tmp_path):
    d = tmp_path / "step=4.ckpt"
    d.mkdir()
    for r in range(2):
        (d / f"rank{r:05d}.pt").write_bytes(bytes([r]) * 100)
        trust.write_sum(d / f"rank{r:05d}.pt")
    assert trust.check(d) is None
    (d / "rank00001.pt").write_bytes(b"bad")
    assert "rank00001.pt" in trust.check(d)
    assert trust.check(d, [d / "rank00000.pt"]) is None


def test_trusted_latest_sets_the_damaged_aside_and_keeps_its_bytes(tmp_path):
    _ckpt(tmp_path, 10)
    bad = _ckpt(tmp_path, 20)
    bad.write_bytes(bad.read_bytes()[:-1] + b"!")
    said = []
    found = trust.trusted_latest(tmp_path, lambda: checkpoints(tmp_path), trust.check, bool, True,
                                 lambda: None, said.append)
    assert found.name == "step=10.ckpt"
    aside = [p.name for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 2 and any(n.endswith(".sha256") for n in aside)  # the file and its sum, renamed
    assert len(said) == 1 and "step=20.ckpt is damaged" in said[0] and "resuming from step=10" in said[0]


def test_the_leader_names_the_rank_and_file_another_rank_found_damaged(tmp_path):
    # A megatron checkpoint: rank 1's file is damaged, rank 0 (the leader) finds its own good and learns of the
    # damage from the gathered verdicts; its line names the rank, the file and why, not "on another rank".
    for step in (10, 20):
        d = tmp_path / f"step={step}.ckpt"
        d.mkdir()
        for r in range(2):
            (d / f"rank{r:05d}.pt").write_bytes(bytes([r, step]) * 50)
            trust.write_sum(d / f"rank{r:05d}.pt")
    (tmp_path / "step=20.ckpt" / "rank00001.pt").write_bytes(b"cut")
    said, asked = [], []

    def mine(path):  # rank 0's own file
        asked.append(path)
        return trust.check(path, [path / "rank00000.pt"])

    def first_damage(why):  # the gather: rank 1 checks its own file of the same checkpoint
        theirs = trust.check(asked[-1], [asked[-1] / "rank00001.pt"])
        return next((f"rank {r}: {w}" for r, w in enumerate([why, theirs]) if w), None)
    found = trust.trusted_latest(tmp_path, lambda: checkpoints(tmp_path), mine, None, True, lambda: None,
                                 said.append, first_damage)
    assert found.name == "step=10.ckpt"
    assert "step=20.ckpt is damaged (rank 1: rank00001.pt: SHA-256" in said[0] and "resuming from step=10" in said[0]


def test_no_good_checkpoint_left_starts_from_zero(tmp_path):
    bad = _ckpt(tmp_path, 7)
    bad.write_bytes(b"")
    said = []
    assert trust.trusted_latest(tmp_path, lambda: checkpoints(tmp_path), trust.check, bool, True,
                                lambda: None, said.append) is None
    assert "starts again from step 0" in said[-1]


def test_check_room_refuses_with_the_path_and_exit_74(tmp_path):
    with pytest.raises(trust.SaveRefused) as err:
        trust.check_room(tmp_path / "ck", 10 ** 15)
    assert err.value.exit_code == EXIT_NO_SPACE == 74 and str(tmp_path / "ck") in str(err.value)
    trust.check_room(tmp_path / "ck", 1000)  # room enough: no error


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_check_room_refuses_a_read_only_directory(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(trust.SaveRefused, match="not writable"):
            trust.check_room(tmp_path, 10)
    finally:
        tmp_path.chmod(0o700)
