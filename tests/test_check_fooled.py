"""`vdkit check` cannot be fooled: a run dir's files are the kit's render of its recipe before anything of it runs,
each run dir is checked in its own process with a time limit, hand-edited values follow the command line's rules,
and a file's contents are never echoed."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from vdkit.cli import main

NEMO = ["model=llama2_7b", "method=lora", "cluster.nodes=1"]


def _render(out: Path, name: str, *overrides) -> Path:
    assert main(["render", *overrides, f"run.name={name}", "--out", str(out), "--no-check-mounts"]) == 0
    return out / name


def _check(capsys, *dirs):
    capsys.readouterr()
    code = main(["check", *map(str, dirs)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _errors(err: str, run_dir: Path) -> list:
    return [ln for ln in err.splitlines() if ln.startswith(f"vdkit check: error: {run_dir}:")]


def _edit(path: Path, edit) -> None:
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture()
def no_nemo(tmp_path, monkeypatch):
    """NeMo's venv cannot be made (its place is under a file): these NeMo dirs are refused before its probe."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VDKIT_NEMO_VENV", str(blocker / "venv"))


def _set_at(path, value):
    """An edit of a loaded YAML: ``value`` at the key path ``path``."""
    def edit(data):
        node = data
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


@pytest.mark.slow  # several renders and one `vdkit check` (Bridge imported): ~20-60 s on 2 cores
def test_scripts_differing_from_the_render_are_refused(tmp_path, capsys, no_nemo):
    """A copied run dir (its scripts name the original), launch.sbatch with --nodes=64 or --time=1, a deleted
    launch.sbatch, a bridge_job.py that starts with `raise SystemExit(0)`, an edited NeMo callback: one line each,
    exit 2, and nothing of them runs (the SystemExit never silences the check of the others)."""
    src = _render(tmp_path, "src", *NEMO)
    copied = tmp_path / "copied"
    shutil.copytree(src, copied)
    nodes = _render(tmp_path, "nodes", *NEMO)
    text = (nodes / "launch.sbatch").read_text()
    (nodes / "launch.sbatch").write_text(text.replace("#SBATCH --nodes=1", "#SBATCH --nodes=64"))
    assert "--nodes=64" in (nodes / "launch.sbatch").read_text()
    gone = _render(tmp_path, "gone", *NEMO)
    (gone / "launch.sbatch").unlink()
    callback = _render(tmp_path, "callback", *NEMO)
    cb = next((callback / "nemo_callbacks").glob("*.py"))
    cb.write_text("import os\nos._exit(0)\n" + cb.read_text())
    bridge = ["engine=bridge", "model=llama2_7b", "method=lora", "cluster.nodes=2", "model.megatron_path=/shared/base"]
    silent = _render(tmp_path, "silent", *bridge)
    (silent / "bridge_job.py").write_text("raise SystemExit(0)\n" + (silent / "bridge_job.py").read_text())
    code, out, err = _check(capsys, src, copied, nodes, gone, callback, silent)
    assert code == 2
    assert _errors(err, src) == []
    for d, frag in ((copied, "launch.sbatch (from line"), (nodes, "launch.sbatch (from line"),
                    (gone, "launch.sbatch is missing"), (callback, f"nemo_callbacks/{cb.name} (from line 1)"),
                    (silent, "bridge_job.py (from line 1)")):
        (line,) = _errors(err, d)
        assert frag in line and "fix: re-render" in line, line
    assert f"{silent} (engine=bridge)" in out  # refused before Bridge was imported for it


def test_a_link_is_refused_and_never_echoed(tmp_path, capsys, no_nemo):
    """nemo.yaml linked to /etc/passwd, a link loop, a FIFO'd bridge_job.py: one line each, no file's text printed."""
    passwd = _render(tmp_path, "passwd", *NEMO)
    (passwd / "nemo.yaml").unlink()
    secret = tmp_path / "secret.yaml"
    secret.write_text("root: x:0:0:root:/root:/bin/bash\ndaemon: x:1:1\n")
    (passwd / "nemo.yaml").symlink_to(secret)
    loop = _render(tmp_path, "loop", *NEMO)
    (loop / "nemo.yaml").unlink()
    (loop / "nemo.yaml").symlink_to(loop / "nemo.yaml")
    code, out, err = _check(capsys, passwd, loop)
    assert code == 2 and "x:0:0" not in out + err and "daemon" not in out + err
    for d in (passwd, loop):
        (line,) = _errors(err, d)
        assert "nemo.yaml is a symbolic link" in line, line


def test_duplicated_key_is_one_line(tmp_path, capsys, no_nemo):
    nemo = _render(tmp_path, "nemo", *NEMO)
    text = (nemo / "nemo.yaml").read_text()
    (nemo / "nemo.yaml").write_text(text.replace("trainer:\n", "trainer:\n  max_steps: 7\n", 1))
    code, _out, err = _check(capsys, nemo)
    (line,) = _errors(err, nemo)
    assert code == 2 and "nemo.yaml holds key 'max_steps' twice (line" in line, line


# key path, value, fragment of the one line. Each passed `vdkit check` before (the type was the render's).
NEMO_VALUES = [
    (("model", "optim", "lr"), 1e30, "model.optim.lr=1e+30 in"),
    (("model", "optim", "lr"), -0.001, "model.optim.lr=-0.001 in"),
    (("model", "optim", "lr"), float("nan"), "model.optim.lr=nan in"),
    (("model", "peft", "lora_tuning", "adapter_dropout"), -0.5, "adapter_dropout=-0.5"),
    (("model", "peft", "lora_tuning", "adapter_dropout"), 2.0, "adapter_dropout=2.0"),
    (("model", "micro_batch_size"), 1000, "model.micro_batch_size=1000 does not divide model.global_batch_size=128"),
]


@pytest.mark.slow  # several renders and one `vdkit check` (Bridge imported): ~20-60 s on 2 cores
def test_hand_edited_values_follow_the_command_lines_rules(tmp_path, capsys, no_nemo):
    dirs = []
    for i, (path, value, frag) in enumerate(NEMO_VALUES):
        d = _render(tmp_path, f"v{i}", *NEMO)

        _edit(d / "nemo.yaml", _set_at(path, value))
        dirs.append((d, frag))
    b = ["engine=bridge", "model=llama2_7b", "method=lora", "cluster.nodes=2", "model.megatron_path=/shared/base"]
    keep = _render(tmp_path, "keep0", *b)
    _edit(keep / "bridge.yaml", lambda d: d["checkpoint"].update(most_recent_k=0))
    lr = _render(tmp_path, "lr", *b)
    _edit(lr / "bridge.yaml", lambda d: d["optimizer"].update(lr=1e30))
    dirs += [(keep, "checkpoint.most_recent_k=0"), (lr, "optimizer.lr=1e+30")]
    code, _out, err = _check(capsys, *(d for d, _ in dirs))
    assert code == 2
    for d, frag in dirs:
        (line,) = _errors(err, d)
        assert frag in line and "fix:" in line, line


# nemo.yaml edits of the rendered type that passed `vdkit check` (the NeMo probe ran, green): each is refused at
# start-up by NeMo 1.23 / Lightning, or trains another run than the plan's. key path, value, fragment of the line.
NEMO_TRAPS = [
    (("trainer", "devices"), 4, "trainer.devices=4 differs from the 8 tasks per node"),  # Lightning vs srun
    (("trainer", "num_nodes"), 2, "trainer.num_nodes=2 differs from cluster.nodes=1"),
    (("trainer", "val_check_interval"), 200, "val_check_interval=200 is above trainer.max_steps=50"),  # fit_loop.py
    (("model", "data", "validation_ds", "global_batch_size"), 100,  # megatron_batch_samplers.py:104
     "validation_ds.global_batch_size=100 is not a multiple of its micro_batch_size x DP = 1 x 8"),
    (("model", "data", "train_ds", "concat_sampling_probabilities"), [0.5, 0.5],  # megatron_gpt_sft_model.py:222
     "concat_sampling_probabilities must be a list with one entry per file (1)"),
    (("model", "optim", "sched", "min_lr"), 0.001, "min_lr=0.001 is above model.optim.lr=0.0001"),  # lr_scheduler.py:409
    (("model", "data", "train_ds", "max_seq_length"), 8192, "max_seq_length=8192 is not the plan's sequence length 2048"),
    (("exp_manager", "resume_ignore_no_checkpoint"), False, "raises NotFoundError"),  # exp_manager.py:618
    (("model", "restore_from_path"), "/models/llama2-13b.nemo",  # not the pre-flight's path, not checked anywhere
     "model.restore_from_path is edited to '/models/llama2-13b.nemo' (rendered '/models/llama2-7b.nemo')"),
    (("exp_manager", "max_time_per_run"), "6:04", "Lightning's Timer (NeMo's StatelessTimer) refuses it at start-up"),
    (("exp_manager", "max_time_per_run"), "00:05:00:00", "is longer than the plan's 00:00:06:04"),  # Slurm kills first
]
PRETRAIN = ["model=llama2_7b", "method=pretrain", "cluster.nodes=1", "run.mode=timing"]
PRETRAIN_TRAPS = [(("model", "data", "seq_length"), 8192, "model.data.seq_length=8192 is not the plan's sequence length 4096")]


def test_nemo_edits_its_start_up_refuses_are_one_line_before_its_probe(tmp_path, capsys, no_nemo):
    """The render's own traps (check_nemo_config) on the edited nemo.yaml: one line each, before NeMo's venv (none
    here) is needed."""
    dirs = []
    for i, (path, value, frag) in enumerate(NEMO_TRAPS + PRETRAIN_TRAPS):
        d = _render(tmp_path, f"t{i}", *(NEMO if i < len(NEMO_TRAPS) else PRETRAIN))

        _edit(d / "nemo.yaml", _set_at(path, value))
        dirs.append((d, frag))
    code, _out, err = _check(capsys, *(d for d, _ in dirs))
    assert code == 2
    for d, frag in dirs:
        (line,) = _errors(err, d)
        assert frag in line and "fix:" in line, line


def test_command_line_refuses_an_absurd_lr(capsys):
    assert main(["plan", "model=llama2_7b", "method=lora", "method.lr=1e30"]) == 2
    assert "method.lr=1e+30 must be in [0, 1]" in capsys.readouterr().err


def _exits(run_dir, rep):
    raise SystemExit(0)


def _hangs(run_dir, rep):
    while True:
        pass


def _dies(run_dir, rep):
    os._exit(0)


def _fine(run_dir, rep):
    rep.checked(f"fine {run_dir.name}")


def test_each_run_dir_in_its_own_process_with_a_time_limit(tmp_path):
    """One run dir's check that exits, hangs or kills its interpreter is its own defect: the others are reported."""
    from vdkit.run.jobcheck import isolated

    start = time.monotonic()
    reps = [isolated(tmp_path / n, "s", fn, "who", "setting", 2.0)
            for n, fn in (("a", _exits), ("b", _hangs), ("c", _dies), ("d", _fine))]
    assert time.monotonic() - start < 20
    assert "who stopped the check: SystemExit" in reps[0].defects[0]
    assert "did not finish in 2 s" in reps[1].defects[0]
    assert "ended without a report (exit 0" in reps[2].defects[0]
    assert reps[3].lines == [("checked", "fine d")]


def test_one_run_dirs_unreadable_recipe_is_its_defect_and_the_others_are_checked(tmp_path, capsys, no_nemo):
    """A hand-edited recipe.yaml the value rules refuse is that run dir's one line; the next dir is still checked
    (it stopped the whole check before, with every other dir unreported)."""
    bad = _render(tmp_path, "bad", *NEMO)
    _edit(bad / "recipe.yaml", lambda d: d["model"].update(num_query_groups=3))
    dup = _render(tmp_path, "dup", *NEMO)
    text = (dup / "nemo.yaml").read_text()
    (dup / "nemo.yaml").write_text(text.replace("trainer:\n", "trainer:\n  max_steps: 7\n", 1))
    code, _out, err = _check(capsys, bad, dup)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.startswith(f"vdkit check: error: {bad / 'recipe.yaml'}: ")]
    assert "num_query_groups" in line and "fix:" in line, line
    (line,) = _errors(err, dup)
    assert "holds key 'max_steps' twice" in line, line


def test_a_megatron_run_edited_to_another_rank_count_is_refused_before_its_resume(tmp_path, capsys):
    """A stopped megatron run whose recipe.yaml now asks another GPU count than its latest checkpoint was written by:
    each rank would stop at resume ('checkpoint does not match the model'); `vdkit check` says so instead of green."""
    from vdkit.run.rundir import checkpoint_dir, load_recipe

    run = _render(tmp_path, "shrunk", "engine=megatron", "model=tiny_llama", "data=synthetic", "cluster=local",
                  "cluster.gpus_per_node=1")
    step = checkpoint_dir(load_recipe(run), run) / "step=11.ckpt"
    step.mkdir(parents=True)
    for rank in (0, 1):  # what a 2-GPU layout of the run published before the edit
        (step / f"rank{rank:05d}.pt").write_bytes(b"")
    code, _, err = _check(capsys, run)
    assert code == 2 and _errors(err, run), err
    assert "holds 2 rank file(s); this run has 1 rank(s)" in err



def test_a_kit_engine_run_edited_since_its_plan_is_refused(tmp_path, capsys):
    """recipe.yaml edited after the plan: the LoRA dim 32 -> 4 (the check compared the model with a count recomputed
    from the edited recipe, 'plan 2,560', not plan.json's; megatron's check the same) and the sequence 2048 -> 8192
    (the job trains at it, the plan's memory is for 2048; megatron's shares the probe). Both were green."""
    base = ["engine=reference", "model=tiny_llama", "method=lora", "data=synthetic", "cluster=local",
            "cluster.gpus_per_node=1"]
    dim = _render(tmp_path, "dim", *base)
    _edit(dim / "recipe.yaml", lambda d: d["method"].update(lora_adapter_dim=4))
    seq = _render(tmp_path, "seq", *base)
    _edit(seq / "recipe.yaml", lambda d: d["train"].update(seq_length=8192))
    code, _, err = _check(capsys, dim, seq)
    (line,) = _errors(err, dim)
    assert code == 2 and "2,560 train; plan 178,496 / 20,480" in line, line
    (line,) = _errors(err, seq)
    assert "train.seq_length (recipe.yaml)=8192 is not the plan's sequence length 2048" in line, line


def test_a_megatron_run_edited_to_another_layout_of_the_same_rank_count_is_refused_before_its_resume(tmp_path, capsys):
    """A stopped megatron run written at TP 2 whose recipe.yaml now asks DP 2 (the same 2 ranks): each rank would
    stop at resume ('checkpoint does not match the model'); `vdkit run --resume` and `vdkit check`'s resume probe
    refuse it at the door from the layout the checkpoint records (recipes/megatron/checkpoint.py layout.json), and
    pass the layout that wrote it. (`vdkit check` reaching that probe: the rank-count test above.)"""
    import json

    from vdkit.recipes.megatron.checkpoint import LAYOUT_FILE, layout_of
    from vdkit.recipes.megatron.runcheck import _check_resume
    from vdkit.run.jobcheck import CHECKED, DEFECT, Report
    from vdkit.run.rundir import checkpoint_dir, load_plan

    run = _render(tmp_path, "relaid", "engine=megatron", "model=tiny_llama", "data=synthetic", "cluster=local",
                  "cluster.gpus_per_node=2", "parallelism.tp=1")
    plan = load_plan(run)
    step = checkpoint_dir(plan.recipe, run) / "step=11.ckpt"
    step.mkdir(parents=True)
    for rank in (0, 1):
        (step / f"rank{rank:05d}.pt").write_bytes(b"")
    mine = layout_of(plan)
    assert mine["tp"] == 1 and mine["dp"] == 2
    (step / LAYOUT_FILE).write_text(json.dumps(dict(mine, tp=2, dp=1)))  # what the run wrote at TP 2 before the edit
    capsys.readouterr()
    assert main(["run", "--resume", str(run)]) == 2  # refused before any rank starts
    err = capsys.readouterr().err
    assert "was written by TP 2 PP 1 VP 1 DP 1" in err and "this run is TP 1 PP 1 VP 1 DP 2" in err, err
    assert "fix: edit recipe.yaml back" in err and "Traceback" not in err, err
    rep = Report(run)
    _check_resume(plan, run, rep)
    ((kind, line),) = rep.lines
    assert "was written by TP 2" in line and "fix: edit recipe.yaml back" in line and kind == DEFECT, rep.lines
    (step / LAYOUT_FILE).write_text(json.dumps(mine))  # the layout that wrote it: the resume's probe is green
    rep = Report(run)
    _check_resume(plan, run, rep)
    ((kind, line),) = rep.lines
    assert kind == CHECKED and "written by this run's layout (TP 1 PP 1 VP 1 DP 2" in line, rep.lines
