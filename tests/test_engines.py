"""The engine seam: one registry, slurm/ engine-agnostic, no CLI import loop, one home per fact."""
from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from vdkit.composition.config import compose, group_options
from vdkit.errors import UserError
from vdkit.run.jobspec import Container
from vdkit.planner.plan import make_plan
from vdkit.recipes import engines

ROOT = Path(__file__).resolve().parent.parent


def _py(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(("." * node.level) + (node.module or ""))
            out |= {f"{node.module}.{a.name}" for a in node.names if node.module}
    return out


# ----------------------------------------------------------------------------- registry
def test_config_engines_come_from_the_registry(monkeypatch):
    assert engines.names() == tuple(engines.REGISTRY)
    assert set(group_options("engine")) <= set(engines.names()), "every conf/engine/*.yaml needs a registry line"
    for name in group_options("engine"):
        assert compose([f"engine={name}"]).engine.name == name
    with pytest.raises(UserError, match="engine.name='toy' is not an engine"):
        compose(["engine.name=toy"])
    from helpers import toy_engine_module

    monkeypatch.setitem(sys.modules, "toy_engine", toy_engine_module("toy_engine", command=lambda plan, run_dir: []))
    monkeypatch.setitem(engines.REGISTRY, "toy", "toy_engine")  # config asks the registry when it validates
    assert compose(["engine.name=toy"]).engine.name == "toy"


@pytest.mark.parametrize("name", engines.names())
def test_every_registered_engine_imports_and_has_a_command(name):
    engine = engines.get(name)
    assert engine.name == name and engine.spec.name == name and callable(engine.spec.command)
    assert isinstance(engine.runs_locally, bool)


def test_unknown_engine_is_one_clear_error():
    with pytest.raises(UserError, match="engine.name='nope' is not an engine"):
        engines.get("nope")
    with pytest.raises(UserError, match="is not an engine"):
        compose(["engine.name=nope"])


def test_a_new_engine_is_a_module_plus_one_registry_line(monkeypatch, tmp_path):
    """A toy engine plugs in through the registry alone; render carries its data into the script."""
    from helpers import toy_engine_module

    toy = toy_engine_module(
        "toy_engine_for_test", command=lambda plan, run_dir: ["toy-train", "--run", str(run_dir)],
        files=lambda plan, run_dir: {"toy.cfg": f"tp={plan.tp}\n"}, env=lambda plan: {"TOY_MODE": "fast"},
        container=lambda plan, run_dir: Container("nvcr.io#nvidia/pytorch:24.01-py3",
                                                  (("the run directory", str(run_dir)),), str(run_dir)),
        runs_locally=False)
    monkeypatch.setitem(sys.modules, "toy_engine_for_test", toy)
    monkeypatch.setitem(engines.REGISTRY, "toy", "toy_engine_for_test")

    from vdkit.render.prepare import render_run

    plan = make_plan(compose(["engine.name=toy", "model=tiny_llama", "data=synthetic", "cluster.nodes=2"]))
    run_dir = render_run(plan, tmp_path, check_mounts=False)
    text = (run_dir / "launch.sbatch").read_text()
    assert (run_dir / "toy.cfg").read_text() == f"tp={plan.tp}\n"
    assert f"toy-train --run {run_dir}" in text
    assert "export TOY_MODE=fast" in text and "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in text
    assert "TOY_MODE" in next(ln for ln in text.splitlines() if "--container-env=" in ln)


def test_engine_checks_run_before_anything_is_written(tmp_path):
    from vdkit.render.prepare import prepare

    plan = make_plan(compose(["engine=reference", "model=tiny_llama", "data=synthetic", "parallelism.tp=2"]))
    with pytest.raises(UserError, match="data parallel only"):
        prepare(plan, tmp_path)
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- slurm/ knows no engine
@pytest.mark.parametrize("launcher_dir", ["slurm", "k8s"])
def test_launchers_never_import_recipes_nor_branch_on_an_engine_name(launcher_dir):
    names = set(engines.names())
    for path in _py(launcher_dir):
        tree = _tree(path)
        bad = [m for m in _imports(tree) if "recipes" in m]
        assert not bad, f"{path.name} imports {bad}: pass the engine's data in (vdkit.run.jobspec)"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "engine":
                pytest.fail(f"{path.name}:{node.lineno} reads engine.name")
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert not (consts & names), f"{path.name}:{node.lineno} compares with an engine name"


# ----------------------------------------------------------------------------- no CLI import loop
def test_commands_never_import_the_cli_and_the_cli_imports_no_verb_statically():
    for path in _py("vdkit/commands"):
        imported = _imports(_tree(path))
        assert not {m for m in imported if m == "vdkit.cli" or m.startswith("vdkit.cli.")}, path.name
    for name in ("vdkit/commands/args.py", "vdkit/render/sweep.py", "vdkit/render/prepare.py"):
        assert not {m for m in _imports(_tree(ROOT / name)) if m.startswith(("vdkit.cli", "vdkit.commands"))}, name
    for folder in ("recipes", "slurm", "validation"):
        for path in _py(folder):
            assert not {m for m in _imports(_tree(path)) if m.startswith(("vdkit.cli", "vdkit.commands"))}, path


# ----------------------------------------------------------------------------- one home per fact
RUN_DIR_NAMES = {"recipe.yaml", "plan.json", "overrides.txt", "launch.sbatch", "nemo.yaml", "job_id.txt",
                 "job_state.json", "local-1.out", "checkpoints", "index_mapping"}


def _string_constants(tree):
    """String constants that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_run_dir_file_names_live_only_in_rundir():
    for folder in ("vdkit", "recipes", "slurm", "validation"):
        for path in _py(folder):
            if path == ROOT / "vdkit" / "run" / "rundir.py":
                continue
            for node in _string_constants(_tree(path)):
                assert node.value not in RUN_DIR_NAMES, \
                    f"{path.relative_to(ROOT)}:{node.lineno} types {node.value!r}; import it from vdkit.run.rundir"


def test_training_constants_are_shared_by_nemo_and_reference():
    from vdkit.recipes.nemo.config import build_config
    from vdkit.recipes.common.training_constants import ADAM_BETAS, GPU_PRECISION, GRAD_CLIP

    cfg = build_config(make_plan(compose([])), "/runs/x")
    assert cfg["model"]["optim"]["betas"] == list(ADAM_BETAS)
    assert cfg["trainer"]["gradient_clip_val"] == GRAD_CLIP and cfg["trainer"]["precision"] == GPU_PRECISION
    for path in _py("recipes"):
        if path.name == "training_constants.py":
            continue
        tree = _tree(path)
        strings = {n.value for n in _string_constants(tree)}
        numbers = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, float)}
        assert not strings & {GPU_PRECISION, "32-true"}, path.name
        assert not numbers & {ADAM_BETAS[1]}, path.name


def test_log_metric_names_have_one_home():
    from vdkit.run import logformat
    from vdkit.recipes.common.progress import progress_line
    from vdkit.validation import tensorboard_events

    assert (tensorboard_events.TIMING_KEY, tensorboard_events.LOSS_KEY) == (logformat.TIMING_KEY, logformat.LOSS_KEY)
    line = progress_line(0, 3, 10, 1.0, 2.0, 1.5, 2, 24, 0.25)
    assert f"{logformat.TIMING_KEY}=" in line and f"{logformat.LOSS_KEY}=" in line
    for path in _py("recipes") + _py("validation"):
        for node in _string_constants(_tree(path)):
            assert node.value not in (logformat.TIMING_KEY, logformat.LOSS_KEY), f"{path.name}:{node.lineno}"


def test_downstream_reads_plan_json_instead_of_re_planning(tmp_path):
    import json

    from vdkit.run.rundir import PLAN_FILE, load_plan
    from vdkit.run.create import create_run_dir

    plan = make_plan(compose(["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=local"]))
    run_dir = create_run_dir(plan, {}, tmp_path)
    loaded = load_plan(run_dir)
    assert (loaded.tp, loaded.pp, loaded.dp, loaded.grad_accum, loaded.feasible) == \
        (plan.tp, plan.pp, plan.dp, plan.grad_accum, plan.feasible)
    assert loaded.recipe.to_dict() == plan.recipe.to_dict()
    assert loaded.memory == plan.memory and loaded.checkpoint_gb == plan.checkpoint_gb  # unrounded
    data = json.loads((run_dir / PLAN_FILE).read_text())
    data["grad_accum"] = 99  # what the run dir says wins over what re-planning would say
    (run_dir / PLAN_FILE).write_text(json.dumps(data))
    assert load_plan(run_dir).grad_accum == 99
    (run_dir / PLAN_FILE).unlink()
    with pytest.raises(UserError, match="cannot read the plan"):
        load_plan(run_dir)


def test_cells_sharing_a_run_name_get_their_own_run_dirs(tmp_path, capsys):
    from vdkit.cli import main
    from vdkit.run.rundir import SBATCH_FILE

    out = tmp_path / "runs"
    assert main(["render", "-m", "method.lr=1e-4,2e-4", "run.name=same", "--no-check-mounts", "--out", str(out)]) == 0
    dirs = [Path(p) for p in capsys.readouterr().out.split()]
    assert [d.name for d in dirs] == ["same", "same-2"]
    for d in dirs:  # each script points at its own directory, reserved before either was written
        assert f"#SBATCH --output={d}/slurm-%j.out" in (d / SBATCH_FILE).read_text()


def test_every_engine_trains_with_the_adam_betas_nemo_renders():
    """One home for Adam's betas: NeMo renders them (fine-tuning: NeMo's; pretraining: NVIDIA's) and the
    kit's own engines take the same pair from vdkit.recipes.common.training_constants.adam_betas."""
    from vdkit.recipes.nemo.config import build_config
    from vdkit.recipes.common.training_constants import ADAM_BETAS, adam_betas

    pre = make_plan(compose(["method=pretrain", "data.data_dir=/data/pile"]))
    assert tuple(build_config(pre, "/runs/x")["model"]["optim"]["betas"]) == adam_betas(pre.recipe) == (0.9, 0.95)
    sft = make_plan(compose(["method=sft"]))
    assert tuple(build_config(sft, "/runs/x")["model"]["optim"]["betas"]) == adam_betas(sft.recipe) == ADAM_BETAS


def test_no_submodule_shadows_its_packages_function():
    """Importing ``pkg.name`` sets ``pkg.name`` to the module: a package function of that name (e.g. an engine's
    ``check(plan)`` beside its ``check.py``) is replaced for the rest of the process, and the next render in it
    fails with "'module' object is not callable" (seen after `vdkit check` of a bridge run dir)."""
    root = Path(__file__).resolve().parent.parent
    clashes = []
    for init in [*root.glob("*/__init__.py"), *root.glob("*/*/__init__.py")]:
        if ".venv" in init.parts or "build" in init.parts:
            continue
        subs = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
        subs |= {p.parent.name for p in init.parent.glob("*/__init__.py")}
        defined = {n.name for n in ast.parse(init.read_text()).body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        clashes += [f"{init.parent.relative_to(root)}: {name}.py and def {name}" for name in sorted(subs & defined)]
    assert not clashes, clashes
