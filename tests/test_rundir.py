"""Run directories (vdkit.run.rundir): plan.json carries the plan and its prediction; nothing downstream re-plans."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import make_run, series
from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.run.rundir import PLAN_FILE, load_plan
from vdkit.run.create import create_run_dir

H100_LORA = ["model=llama2_7b", "method=lora"]  # a recipe the step-time model predicts


def test_plan_json_carries_the_prediction(tmp_path):
    plan = make_plan(compose(H100_LORA))
    assert plan.prediction is not None
    run_dir = create_run_dir(plan, {}, tmp_path)
    data = json.loads((run_dir / PLAN_FILE).read_text())
    pred = plan.prediction
    assert data["predicted_step_seconds"] == round(pred.step_seconds, 4)
    assert data["predicted_minutes"] == round(pred.minutes, 2)
    assert data["predicted_tokens_per_s_per_gpu"] == round(pred.tokens_per_s_per_gpu, 1)
    assert data["predicted_gpu_hours"] == round(pred.gpu_hours, 3)
    loaded = load_plan(run_dir)
    assert loaded.prediction == pred  # unrounded, term by term
    assert (loaded.params, loaded.trainable_params, loaded.runner_up) == (plan.params, plan.trainable_params,
                                                                         plan.runner_up)
    data["prediction"]["step"]["compute_s"] *= 2  # what the run dir says wins over what re-planning would say
    (run_dir / PLAN_FILE).write_text(json.dumps(data))
    assert load_plan(run_dir).prediction.step.compute_s == pytest.approx(2 * pred.step.compute_s)


def test_a_plan_without_prediction_reads_back_as_none(tmp_path):
    plan = make_plan(compose(["model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic"]))
    assert plan.prediction is None  # a CPU: the model describes no such GPU
    run_dir = create_run_dir(plan, {}, tmp_path)
    assert json.loads((run_dir / PLAN_FILE).read_text())["predicted_minutes"] is None
    assert load_plan(run_dir).prediction is None


BLOCK_THE_PLANNER = """
import sys
for name in ("vdkit.planner.plan", "vdkit.planner.sharded", "vdkit.planner.predict", "vdkit.planner.predict_hf"):
    sys.modules[name] = None  # any import of the planner now raises ImportError
"""


def test_the_report_builds_with_the_planner_unimportable(tmp_path):
    """validate and report read plan.json (the prediction included); they never import the planner."""
    runs = [make_run(tmp_path / "runs", H100_LORA + [f"cluster.nodes={n}"], series(5.0)) for n in (1, 2)]
    expected = {n: make_plan(compose(H100_LORA + [f"cluster.nodes={n}"])).prediction.step_seconds for n in (1, 2)}
    code = BLOCK_THE_PLANNER + textwrap.dedent(f"""
        import json
        from pathlib import Path
        from vdkit.cli import main
        assert main(["validate", {str(runs[0])!r}, "--json"]) == 0
        assert main(["report", *{[str(r) for r in runs]!r}, "--table", "table9", "--out", {str(tmp_path / "report")!r},
                     "--no-plots"]) == 0
        assert "vdkit.planner.plan" not in sys.modules or sys.modules["vdkit.planner.plan"] is None
        table = json.loads((Path({str(tmp_path / "report")!r}) / "table9.json").read_text())
        print(json.dumps(table["cells"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads(proc.stdout.strip().splitlines()[-1])
    ran = {c["gpus"]: c for c in cells if c["runs"] and c["method"] == "lora"}
    steps = 1000  # Table 9's steps
    for nodes, step_s in expected.items():
        assert ran[8 * nodes]["predicted_minutes"] == pytest.approx(step_s * steps / 60, rel=1e-3)
        assert ran[8 * nodes]["minutes"] is not None  # measured, extrapolated


# ----------------------------------------------------------------------------- a hand-edited recipe.yaml
LOCAL_REF = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=local"]
FIX = "or re-render the run with `vdkit render`)"
# key -> (the value edited into recipe.yaml, the one line after "<verb>: error: <run dir>/recipe.yaml")
RECIPE_EDITS = {
    "model.num_layers": (-3, ": model.num_layers=-3 must be >= 1 (fix: edit it (use e.g. model.num_layers=32), " + FIX),
    "cluster.nodes": (0, ": cluster.nodes=0 must be >= 1 (fix: edit it (use e.g. cluster.nodes=1), " + FIX),
    "model.hidden_size": ("big", ": model.hidden_size: Value 'big' of type 'str' could not be converted to Integer "
                                 "(key model.hidden_size) (fix: correct that key, " + FIX),
    "engine.name": ("vllm", ": engine.name='vllm' is not an engine (fix: edit it (use engine=nemo or engine=reference or "
                            "engine=megatron or engine=bridge), " + FIX),
}


def _edited_run(tmp_path, key, value):
    import yaml

    run_dir = create_run_dir(make_plan(compose(LOCAL_REF)), {}, run_dir=tmp_path / "run")
    data = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    section, name = key.split(".")
    data[section][name] = value
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return run_dir


@pytest.mark.parametrize("key", list(RECIPE_EDITS))
def test_a_hand_edited_recipe_is_one_exact_line(key, tmp_path, capsys, monkeypatch):
    """`vdkit run --resume`, `vdkit check` and the rank's own entry refuse a recipe.yaml value render would have
    refused: the exact line naming the file, the key and the fix, exit 2, nothing trained (before: a traceback in a
    rank for a negative layer count, a run of 0 nodes or of an unknown engine that trained, `check` exit 0)."""
    from vdkit.cli import main
    from vdkit.recipes.reference.train import main as rank_main

    import signal

    # The rank's entry installs its stop handlers for good (a real rank keeps them until it exits): put them back;
    # and it sets TOKENIZERS_PARALLELISM for the process (monkeypatch restores it).
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    value, line = RECIPE_EDITS[key]
    run_dir = _edited_run(tmp_path, key, value)
    invalid = "invalid " if key == "model.hidden_size" else ""  # the schema's type check, before the value rules
    try:
        for prog, call in (("vdkit run", lambda: main(["run", "--resume", str(run_dir)])),
                           ("vdkit check", lambda: main(["check", str(run_dir)])),
                           ("vdkit reference", lambda: rank_main([str(run_dir)]))):
            assert call() == 2, prog
            out, err = capsys.readouterr()
            assert err == f"{prog}: error: {invalid}{run_dir / 'recipe.yaml'}{line}\n", prog
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "logs").exists()


def test_every_rendered_recipe_loads_back(tmp_path, capsys):
    """What the kit renders passes the value rules it is read back with (status / validate / report on a
    run dir must keep working): cells of every engine and launcher, rendered by the CLI, loaded back."""
    from vdkit.cli import main
    from vdkit.run.rundir import RECIPE_FILE, load_recipe

    image = "engine.container_image=nvcr.io/nvidia/nemo:24.01.01.framework"
    volumes = "cluster.kubernetes.storage=[" + ",".join(f"{{mount_path:{p},claim:c{i}}}" for i, p in enumerate(
        ("/data", "/shared", "/models", str(tmp_path)))) + "]"
    for args in (["--sweep", "table9"], ["--sweep", "table9_fast"], ["--sweep", "training"], ["--sweep", "alpaca_opt"],
                 ["--sweep", "llama31_roce"],
                 ["-m", "engine=megatron,reference", *LOCAL_REF[1:]],
                 ["engine=bridge", "method=pretrain", *LOCAL_REF[1:]],
                 ["engine=bridge", "model=llama2_7b", "method=lora", "model.megatron_path=/shared/llama2_7b_mcore"],
                 ["cluster=k8s_h100", "model=llama2_7b", "method=lora", image, volumes]):
        assert main(["render", *args, "--out", str(tmp_path / "runs"), "--no-check-mounts"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    recipes = [load_recipe(p) for p in sorted((tmp_path / "runs").glob(f"*/{RECIPE_FILE}"))]
    assert len(recipes) >= 30
    assert {(r.engine.name, r.cluster.launcher) for r in recipes} >= {
        ("nemo", "slurm"), ("nemo", "kubernetes"), ("reference", "slurm"), ("reference", "local"),
        ("megatron", "local"), ("bridge", "local"), ("bridge", "slurm")}
    assert {r.method.name for r in recipes} >= {"lora", "sft", "ptuning", "pretrain"}
    assert any(r.model.rope_scaling for r in recipes)  # Llama 3.1 (llama3 RoPE scaling) read back too


def test_a_local_run_read_back_on_a_smaller_machine_is_not_refused(tmp_path, monkeypatch):
    """The rules that read this machine (cluster.cpus_per_task against its CPU count, for a launcher that starts
    the ranks here) hold at composition, not when a run directory is read back: `vdkit status`, `report` or a
    rank on another machine must not refuse a run rendered with more CPUs per task than it has."""
    import os

    from vdkit.errors import UserError
    from vdkit.run.rundir import load_recipe

    have = os.cpu_count() or 1
    run_dir = create_run_dir(make_plan(compose([*LOCAL_REF, f"cluster.cpus_per_task={have}"])), {},
                             run_dir=tmp_path / "run")
    monkeypatch.setattr(os, "cpu_count", lambda: max(1, have // 2) if have > 1 else 0)
    with pytest.raises(UserError, match="cpus_per_task"):  # composing here now would refuse it
        compose([*LOCAL_REF, f"cluster.cpus_per_task={have + 1 if have == 1 else have}"])
    assert load_recipe(run_dir).cluster.cpus_per_task == have


@pytest.mark.parametrize("scaling, what", [
    ({"rope_type": ["llama3"], "factor": 8.0}, "model.rope_scaling.rope_type=['llama3'] is not a RoPE scaling"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": "fast", "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "model.rope_scaling.low_freq_factor='fast' is not a number"),
    ({"rope_type": "linear", "factor": float("nan")}, "model.rope_scaling.factor=nan is not a number")])
def test_an_edited_rope_scaling_of_the_wrong_kind_is_one_line(scaling, what, tmp_path):
    """A list for rope_type, a word or NaN for a factor: one line naming the key at load (before: a TypeError
    from a set lookup, or a ValueError from float() in the context rules, as a traceback in every verb)."""
    from vdkit.errors import UserError
    from vdkit.run.rundir import load_recipe

    run_dir = _edited_run(tmp_path, "model.rope_scaling", scaling)
    with pytest.raises(UserError) as err:
        load_recipe(run_dir)
    assert what in str(err.value) and str(run_dir / "recipe.yaml") in str(err.value)


@pytest.mark.parametrize("edit", [{"dp": 1e999}, {"schedule": "x"}])
def test_a_plan_json_with_an_infinite_count_or_a_scalar_schedule_is_one_line(edit, tmp_path):
    """plan.json's dp written as 1e999 (JSON's infinity: int() overflows) or a schedule that is not an object
    (before: OverflowError / AttributeError tracebacks from every verb that reads the plan)."""
    import json

    from vdkit.errors import UserError
    from vdkit.run.rundir import PLAN_FILE, load_plan

    run_dir = create_run_dir(make_plan(compose(LOCAL_REF)), {}, run_dir=tmp_path / "run")
    data = json.loads((run_dir / PLAN_FILE).read_text())
    data.update(edit)
    (run_dir / PLAN_FILE).write_text(json.dumps(data))
    with pytest.raises(UserError, match="cannot read the plan of"):
        load_plan(run_dir)


def test_two_engines_rendering_one_recipe_get_dirs_that_name_the_engine(tmp_path, capsys):
    """Issue 36: a second engine's render of the same recipe was ``NAME-2``, telling the two apart by nothing.
    Now ``NAME-ENGINE`` (a sweep over engines too); a re-render by the same engine is still ``NAME-2``, and the
    first dir keeps its plain name (what a resume or an earlier script looks up)."""
    from vdkit.cli import main

    out = tmp_path / "runs"
    for engine in ("megatron", "reference", "reference"):
        assert main(["render", f"engine={engine}", *LOCAL_REF[1:], "--out", str(out)]) == 0, capsys.readouterr().err
    stem = "tiny_llama_lora_1n1g"
    assert sorted(p.name for p in out.iterdir()) == [stem, f"{stem}-reference", f"{stem}-reference-2"]
    assert main(["render", "-m", "engine=megatron,reference", *LOCAL_REF[1:], "--out", str(tmp_path / "sweep")]) == 0
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [stem, f"{stem}-reference"]


def test_a_name_held_by_a_fifo_recipe_is_skipped_without_reading_it(tmp_path):
    """Naming reads the occupant's recipe.yaml for its engine: a FIFO there (a hostile run dir) is never
    opened (a read would block for ever); the dir counts as taken by no engine, so the next name is NAME-2."""
    import os

    from vdkit.run.rundir import RECIPE_FILE
    from vdkit.run.create import reserve_run_dir

    recipe = compose(["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=local"])
    taken = tmp_path / "tiny_llama_lora_1n1g"
    taken.mkdir()
    os.mkfifo(taken / RECIPE_FILE)
    assert reserve_run_dir(recipe, tmp_path).name == "tiny_llama_lora_1n1g-2"
