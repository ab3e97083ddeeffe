"""A rank killed (SIGKILL) while it writes a checkpoint, per engine the kit runs: the partial files it
leaves are removed on resume and before the next save; no published checkpoint ever holds one.

The kill is real: the rank runs with ``torch.save`` wrapped so that, at the chosen save, it writes
half a file and sends itself SIGKILL (what a node failure or Slurm's KILL after the grace does).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.run.create import create_run_dir

KILLER = r'''
import os, signal, sys
import torch
real_save, count = torch.save, [0]
def save(obj, f, *args, **kwargs):
    count[0] += 1
    if count[0] == int(os.environ["KILL_AT_SAVE"]):
        f.write(b"half a checkpoint"); f.flush(); os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)
torch.save = save
import runpy
module, sys.argv = sys.argv[1], ["rank", sys.argv[2]]
runpy.run_module(module, run_name="__main__")
'''

ENGINES = {
    "reference": ("vdkit.recipes.reference", ["engine=reference", "method=lora", "method.lr=1e-2"]),
    "megatron": ("vdkit.recipes.megatron", ["engine=megatron", "model.num_layers=4", "method=sft", "method.lr=1e-3",
                                            "train.micro_batch_size=2"]),
}
# run.mode=timing: saves only at the pinned cadence (train mode adds a save at each new best validation loss)
COMMON = ["cluster=local", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1", "train.seq_length=128",
          "method.warmup_steps=0", "train.global_batch_size=4", "train.max_steps=6",
          "engine.checkpoint_every_n_steps=2", "run.mode=timing"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    from vdkit.run.ports import free_port

    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", **extra)
    return env


def _partials(ckpts: Path) -> list:
    return sorted(str(p.relative_to(ckpts)) for p in ckpts.rglob("*") if p.name.startswith(".") or ".tmp" in p.name)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_kill_mid_save_leaves_nothing_in_a_published_checkpoint(engine, tmp_path):
    module, overrides = ENGINES[engine]
    if engine == "megatron":
        pytest.importorskip("megatron.core")
    run_dir = create_run_dir(make_plan(compose([*COMMON, *overrides])), {}, tmp_path / "runs")
    ckpts = run_dir / "checkpoints"
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    # The second save (step 4) is killed half-written.
    proc = subprocess.run([sys.executable, str(killer), module, str(run_dir)], env=_env(KILL_AT_SAVE="2"),
                          cwd=run_dir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    left = _partials(ckpts)
    assert left, "the kill left no partial file: the test did not kill mid-save"
    published = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step=") and not p.name.endswith(".sha256"))
    assert published == ["step=2.ckpt"]
    # Resume: partial files removed first, the run finishes, every published checkpoint is clean.
    proc = subprocess.run([sys.executable, "-m", module, str(run_dir)], env=_env(), cwd=run_dir,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"resuming from {ckpts / 'step=2.ckpt'}" in proc.stdout
    assert _partials(ckpts) == []
    published = sorted(p.name for p in ckpts.iterdir() if not p.name.endswith(".sha256"))
    assert published == ["step=4.ckpt", "step=6.ckpt"]  # KEEP = 2
    if engine == "megatron":  # each rank's file with its SHA-256 (vdkit.recipes.common.trust), the layout that wrote them
        for step in published:
            assert sorted(p.name for p in (ckpts / step).iterdir()) == \
                ["layout.json", "layout.json.sha256", "rank00000.pt", "rank00000.pt.sha256"]
    else:
        assert sorted(p.name for p in ckpts.iterdir() if p.name.endswith(".sha256")) == \
            ["step=4.ckpt.sha256", "step=6.ckpt.sha256"]
    print(f"\n{engine}: killed mid-save at step 4 leaving {left}; resumed from step 2, finished 6; none left")


def test_a_deepspeed_tag_a_killed_save_left_is_removed_on_resume(tmp_path):
    """ZeRO-3 (DeepSpeed's own save): a tag directory newer than the one ``latest`` names is a killed
    save's; resume removes it (the file-level rule; the ZeRO-3 engine needs GPUs to run here)."""
    from vdkit.recipes.reference.sharding import remove_partial_deepspeed

    for tag in ("step=2", "step=4", "step=6"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (tmp_path / "latest").write_text("step=4\n")
    assert remove_partial_deepspeed(tmp_path) == [tmp_path / "step=6"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step=2", "step=4"]
    (tmp_path / "latest").unlink()  # killed before the first save finished: every tag is partial
    assert sorted(p.name for p in remove_partial_deepspeed(tmp_path)) == ["step=2", "step=4"]
