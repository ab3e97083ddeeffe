"""A hand edit of a rendered run's step count (recipes/common/steps_edit.py) on every engine: `vdkit check`
re-runs the time plan at the edited count, refusing one that needs more than launch.sbatch asks with the re-plan
command."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

# engine -> (the cell, the file its job reads the step count from, the key there)
CELLS = {
    "nemo": (["model=llama2_7b", "method=lora", "cluster.nodes=1"], "nemo.yaml", "trainer.max_steps"),
    "bridge": (["engine=bridge", "model=llama2_7b", "method=lora", "cluster.nodes=2", "model.megatron_path=/shared/base"],
               "bridge.yaml", "train.train_iters"),
    "megatron": (["engine=megatron", "model=tiny_llama", "method=lora", "cluster.nodes=2", "data=dolly"],
                 "recipe.yaml", "train.max_steps"),
    "reference": (["engine=reference", "model=tiny_llama", "method=lora", "cluster.nodes=2", "data=dolly"],
                  "recipe.yaml", "train.max_steps"),
}


def _edited(tmp_path: Path, engine: str, steps: int) -> Path:
    """A fresh timing render (50 steps) of the engine's cell with its step count edited to ``steps``."""
    from vdkit.cli import main

    cell, name, key = CELLS[engine]
    assert main(["render", *cell, f"run.name={engine}", "--out", str(tmp_path), "--no-check-mounts"]) == 0
    d = tmp_path / engine
    data = yaml.safe_load((d / name).read_text())
    section, field = key.split(".")
    assert data[section][field] == 50
    data[section][field] = steps
    (d / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return d


def _engine_check(engine: str, run_dir: Path):
    """The engine's check up to its step-count line (no stack's slow probes): its Report."""
    from vdkit.run.jobcheck import Report
    from vdkit.run.rundir import load_plan

    rep = Report(run_dir)
    if engine == "nemo":
        from vdkit.recipes.nemo import render_nemo_yaml
        from vdkit.recipes.nemo.runcheck import edits

        edits.check(run_dir, rep, render_nemo_yaml)
    elif engine == "bridge":
        from vdkit.recipes.bridge import edits, render_bridge_yaml

        edits.check(run_dir, load_plan(run_dir), rep, render_bridge_yaml)
    else:  # the kit's engines: the step count is checked first, a refusal returns before the model is built
        from importlib import import_module

        import_module(f"vdkit.recipes.{engine}.runcheck")._check(run_dir, rep)
    return rep


@pytest.mark.parametrize("engine", sorted(CELLS))
def test_a_step_count_past_the_rendered_time_is_refused_with_the_replan(tmp_path, engine, capsys):
    d = _edited(tmp_path, engine, 100_000)
    capsys.readouterr()
    defects = _engine_check(engine, d).defects
    _, name, key = CELLS[engine]
    assert len(defects) == 1, defects
    assert f"{name} {key}=100000 is not the plan's 50 steps" in defects[0]
    assert "the rendered launch asks --time" in defects[0]
    # the re-plan command: the run's own overrides with the edited count
    assert f"`vdkit render {' '.join(CELLS[engine][0])} run.name={engine} train.max_steps=100000`" in defects[0]


def test_a_shorter_run_is_checked_with_the_plans_time_at_its_count(tmp_path, capsys):
    d = _edited(tmp_path, "nemo", 20)
    capsys.readouterr()
    rep = _engine_check("nemo", d)
    assert not rep.defects
    line = next(text for _kind, text in rep.lines if "trainer.max_steps=20" in text)
    assert "(the plan's 50): the plan's time plan at 20 steps of" in line and "GPU-hours in 1 allocation(s)" in line


def test_a_bridge_run_lengthened_past_its_decay_at_zero_min_lr_is_a_defect():
    # bridge.yaml's lr_decay_iters is the rendered count: megatron-core holds every later step at min_lr
    # (optimizer_param_scheduler.py:237); at 0 they train nothing. NeMo / megatron / reference decay over the edited count.
    from types import SimpleNamespace as NS

    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from vdkit.recipes.bridge.runcheck_sched import _trains
    from vdkit.run.jobcheck import Report

    def run(iters, decay_iters, min_lr=0.0, gbs=8):
        """Bridge's config as rendered (cosine from 1e-4, 2 warm-up steps) with the run's and the decay's lengths;
        megatron-core's own scheduler over a one-group stand-in optimizer."""
        cfg = NS(train=NS(train_iters=iters, global_batch_size=gbs), scheduler=NS(lr_decay_iters=decay_iters),
                 optimizer=NS(min_lr=min_lr))
        sched = OptimizerParamScheduler(NS(param_groups=[{}]), 0.0, 1e-4, min_lr, 2 * gbs, decay_iters * gbs,
                                        "cosine", 0.01, 0.01, decay_iters * gbs, "constant")
        return cfg, sched

    rep = Report(Path("."))
    assert not _trains(*run(55, 50), rep) and len(rep.defects) == 1
    assert "train.train_iters=55 runs past scheduler.lr_decay_iters=50" in rep.defects[0]
    assert "the last 5 steps train nothing" in rep.defects[0] and "scheduler.lr_decay_iters=55" in rep.defects[0]
    for fine in (run(50, 50), run(40, 50), run(55, 55), run(55, 50, min_lr=1e-6)):  # as rendered, shorter, decay too, a floor
        assert _trains(*fine, rep)
    assert len(rep.defects) == 1
