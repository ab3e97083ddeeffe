"""Every cell of every shipped sweep (conf/sweep/*.yaml), for the engines each sweep renders, passes
`vdkit check` - in ONE `vdkit check` process for all of them (each stack imported once: Bridge and
megatron-core in-process, transformers + peft, NeMo 1.23 in its own venv through one probe process).
Also the Bridge cluster shapes no shipped sweep renders with engine=bridge: the training sweep's
pretraining cells and Table 9's LoRA / SFT cells.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vdkit.composition.conftree import conf_dir


def _sweeps():
    return sorted(p.stem for p in (conf_dir() / "sweep").glob("*.yaml"))


def _render(out: Path, *args) -> list:
    p = subprocess.run([sys.executable, "-m", "vdkit", "render", *args, "--out", str(out), "--no-check-mounts"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return [Path(line) for line in p.stdout.split()]


@pytest.mark.slow  # every sweep rendered and checked: the quick loop's slowest test (412 s at load ~15)
def test_every_shipped_sweep_cell_passes_check(tmp_path, nemo_venv):
    base = tmp_path / "base"  # the demo's Bridge cell fine-tunes a converted base: only its marker is read here
    base.mkdir()
    (base / "latest_checkpointed_iteration.txt").write_text("0")
    (base / "iter_0000000").mkdir()  # the layout the render's base check reads (vdkit.recipes.common.preflight)
    (base / "iter_0000000" / "metadata.json").write_text("{}")
    dirs = []
    for name in _sweeps():
        extra = [f"model.megatron_path={base}"] if name == "demo" else []
        dirs += _render(tmp_path / name, "--sweep", name, *extra)
    dirs += _render(tmp_path / "bridge_training", "--sweep", "training", "engine=bridge")
    for method in ("lora", "sft"):
        dirs += _render(tmp_path / f"bridge_{method}", "-m", "model=llama2_7b,llama2_70b", f"method={method}",
                        "engine=bridge", "cluster.nodes=2", "model.megatron_path=/shared/models/base-bridge")
    p = subprocess.run([sys.executable, "-m", "vdkit", "check", *map(str, dirs)], capture_output=True, text=True,
                       timeout=1200, env={**os.environ, "VDKIT_NEMO_VENV": str(Path(nemo_venv).parents[1])})
    print(p.stdout)  # the per-cell reports and timings, for the log
    assert p.returncode == 0, "\n".join(ln for ln in p.stderr.splitlines() if "vdkit check: error" in ln)
    for d in dirs:
        assert f"\n{d} (" in "\n" + p.stdout, f"{d} has no report"
