"""NeMo's ranks beat (vdkit.recipes.nemo.heartbeat): the rendered job installs the callback through Lightning's
entry points, and a Trainer built without naming it reports every step, save and the exit.

NeMo cannot train on this CPU: the rank command the sbatch runs is executed as rendered, with NeMo's script
swapped for a tiny plain-Lightning one (a Trainer built the way NeMo's scripts build theirs: no callback named),
in a process where vdkit cannot be imported (NVIDIA's image has none).
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from vdkit.cli import main

pytest.importorskip("pytorch_lightning")

CELL = ["engine=nemo", "model=llama2_13b", "method=lora", "run.results_dir=/shared/results", "train.max_steps=50"]
SCRIPT = """
import sys, torch, pytorch_lightning as pl
sys.modules["vdkit"] = None  # as in NVIDIA's image: the callback must not need vdkit
from torch.utils.data import DataLoader, TensorDataset

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

seen = []
class Watch(pl.Callback):  # runs before the heartbeat's hooks (Lightning appends entry-point callbacks)
    def on_train_batch_start(self, trainer, *a):
        import vdkit_nemo_heartbeat as cb  # the run dir's copy, on PYTHONPATH as the rendered command puts it

        seen.append([cb._BEAT[0].step, cb._BEAT[0].phase])

ckpt = pl.callbacks.ModelCheckpoint(dirpath=sys.argv[2], every_n_train_steps=2, save_top_k=-1)
trainer = pl.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[Watch(), ckpt])
print("CALLBACKS", [type(c).__name__ for c in trainer.callbacks])
trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4))
print("SEEN", seen)
"""


def test_the_rendered_nemo_job_installs_the_heartbeat_and_a_lightning_trainer_beats(tmp_path, capsys):
    from vdkit.run import faults

    import tarfile

    base = tmp_path / "base.nemo"  # the rank's pre-flight opens the base .nemo before NeMo's script starts
    (tmp_path / "model_config.yaml").write_text("precision: bf16\n")
    with tarfile.open(base, "w") as tar:
        tar.add(tmp_path / "model_config.yaml", arcname="./model_config.yaml")
    assert main(["render", *CELL, f"model.nemo_path={base}", "--out", str(tmp_path / "runs")]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    sbatch = (run_dir / "launch.sbatch").read_text()
    assert "vdkit_watchdog 9>&- & WATCH_PID=$!" in sbatch and "export VDKIT_HEARTBEAT_DIR=" in sbatch
    # the rank command, as srun runs it: bash -c '<PYTHONPATH=callbacks...> exec python -u <NeMo script> ...'
    from vdkit.recipes import engines
    from vdkit.run.rundir import load_plan

    argv = engines.get("nemo").command(load_plan(run_dir), run_dir)
    assert shlex.join(argv) in sbatch
    script = tmp_path / "tiny_lightning.py"
    script.write_text(SCRIPT)
    line = re.sub(r"exec python -u \S+ .*$", f"exec python -u {script} {tmp_path / 'hb'} {tmp_path / 'ckpt'}", argv[2])
    assert line != argv[2]
    import os
    import sys

    env = {**os.environ, faults.HEARTBEAT_ENV: str(tmp_path / "hb"), "SLURM_PROCID": "3",
           "SLURMD_NODENAME": "xe9680-2", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run([argv[0], argv[1], line], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "VdkitHeartbeat" in res.stdout.split("CALLBACKS", 1)[1].splitlines()[0]  # found by Lightning itself
    # issue 34: the same rank with its base gone refuses in one line, exit 2 (the recipe's fault), before NeMo's script
    base.rename(tmp_path / "elsewhere.nemo")
    gone = subprocess.run([argv[0], argv[1], line], env=env, capture_output=True, text=True, timeout=300)
    assert gone.returncode == 2 and "CALLBACKS" not in gone.stdout, gone.stdout[-2000:] + gone.stderr[-2000:]
    assert gone.stderr.strip().splitlines() == [gone.stderr.strip()] and f"model.nemo_path={base}" in gone.stderr
    assert "no step trained" in gone.stderr
    seen = eval(res.stdout.split("SEEN", 1)[1].strip())  # noqa: S307 - our own script's list of lists
    # each step's start sees the previous step's progress; a save (every 2 steps) is phase 'save' until then
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4]
    assert [s[-1] for s in seen] == ["start", "train", "save", "train", "save"]
    beat, prog, step, ms, node, phase, compute, device = (tmp_path / "hb" / "rank3").read_text().split()
    assert (step, node, phase, compute) == ("5", "xe9680-2", "exit", "-")  # NeMo 1.23 reports no compute time (docs/cluster-guide.md)
    import torch

    assert device == ("gpu" if torch.cuda.is_available() else "cpu")  # what the Lightning trainer's torch trains on


def test_no_heartbeat_asked_no_callback(tmp_path):
    """Without the launcher's $VDKIT_HEARTBEAT_DIR (a NeMo job run by hand) the factories add nothing."""
    import os

    from vdkit.recipes.nemo import heartbeat as nemo_heartbeat
    from vdkit.recipes.common.heartbeat import STANDALONE_NAME

    assert nemo_heartbeat.HEARTBEAT_MODULE == STANDALONE_NAME
    saved = os.environ.pop("VDKIT_HEARTBEAT_DIR", None)
    try:
        assert nemo_heartbeat.pytorch_lightning_callbacks() == [] and nemo_heartbeat.lightning_callbacks() == []
    finally:
        if saved is not None:
            os.environ["VDKIT_HEARTBEAT_DIR"] = saved
