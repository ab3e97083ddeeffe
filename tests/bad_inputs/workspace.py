"""The prepared inputs the bad-input cases name as ``{ws}/...``: built once, copied per case.

Heavy or odd inputs (3,000 symlinks, a FIFO) are ``EXTRAS``: a case lists what it ``needs`` and
only that case's copy gets them.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

REF = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
       "cluster.mpi=none", "cluster.socket_ifname=lo"]


def nemo1_log(timings, steps=None, total=None) -> str:
    """A NeMo 1.x progress stream (``\\r``-separated updates) with one update per step."""
    total = total or len(timings)
    steps = steps if steps is not None else list(range(len(timings)))
    parts = []
    for i, (step, t) in enumerate(zip(steps, timings)):
        parts.append(f"Epoch 0: : {100 * (i + 1) // total}%|#| {i + 1}/{total} [00:10<00:10, "
                     f"reduced_train_loss=1.5, global_step={step}, consumed_samples={128 * (i + 1)}, "
                     f"train_step_timing in s={t}]")
    return "\r".join(parts) + "\n"


def megatron_log(n: int, loss: str = "2.5E+00", ms: float = 1000.0, reverse: bool = False, repeat: int = 1) -> str:
    """Megatron-LM iteration lines, one per 10 iterations (``repeat``: each printed that many times, unlabelled)."""
    lines = [f" [2024-01-01 00:00:00] iteration {it:8d}/{10 * n:8d} | consumed samples: {it * 8:10d} | elapsed time per "
             f"iteration (ms): {ms} | learning rate 1.0E-04 | global batch size: 8 | lm loss: {loss} | loss scale: 1.0 |"
             for it in range(10, 10 * n + 1, 10)]
    return "\n".join(line for line in (lines[::-1] if reverse else lines) for _ in range(repeat)) + "\n"


def nemo2_log(n: int, loss: str = "1.5", reverse: bool = False, repeat: int = 1) -> str:
    """NeMo 2.x training lines (one per step)."""
    lines = [f"Training epoch 0, iteration {i}/{n} | lr: 3e-05 | consumed_samples: {i + 1} | global_batch_size: 1 | "
             f"global_step: {i} | reduced_train_loss: {loss} | train_step_timing in s: 5.0" for i in range(n)]
    return "\n".join(line for line in (lines[::-1] if reverse else lines) for _ in range(repeat)) + "\n"


ALIAS_BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                       + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
                          for i in range(9)]) + "\n"


def build_template(root: Path) -> Path:
    """Write every shared input under ``root`` (returns it)."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    root.mkdir(parents=True, exist_ok=True)
    (root / "afile").write_text("a file, not a directory\n")
    (root / "emptydir").mkdir()
    (root / "notes.txt").write_text("no steps here\n")
    row = {"instruction": "q", "context": "", "response": "a", "category": "open_qa"}
    (root / "dolly.jsonl").write_text("".join(json.dumps(row) + "\n" for _ in range(10)))
    (root / "sft.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    # an Instruct tokenizer's chat template (what engine=bridge reads at render) and prepared rows without
    # `messages` (`vdkit data prepare` without --chat)
    (root / "chat_tok").mkdir()
    (root / "chat_tok" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"
                                                                         "{{ m['content'] }}{% endfor %}"}))
    (root / "plain_sft").mkdir()
    for name in ("training.jsonl", "validation.jsonl"):
        (root / "plain_sft" / name).write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    # data inputs that used to escape as tracebacks
    (root / "surrogate.jsonl").write_text('{"instruction": "\\ud800", "context": "", "response": "a", '
                                          '"category": "open_qa"}\n' * 10)
    (root / "deep.jsonl").write_text("[" * 200_000 + "]" * 200_000 + "\n")
    (root / "deep_obj.jsonl").write_text('{"instruction": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    (root / "alpaca_surrogate.json").write_text('[{"instruction": "\\udfff", "input": "", "output": "a"}]\n')
    # DeepSpeed configs
    (root / "ds_stage2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (root / "ds_notjson.json").write_text("{not json")
    (root / "ds_list.json").write_text("[1, 2]")
    # logs for validate
    good = [5.0] * 50
    (root / "good.out").write_text(nemo1_log(good))
    (root / "allneg.out").write_text(nemo1_log([-1.0] * 50))
    (root / "allzero.out").write_text(nemo1_log([0.0] * 50))
    (root / "huge.out").write_text(nemo1_log([1e308] * 50))
    (root / "mixhuge.out").write_text(nemo1_log([5.0] * 25 + [1e308] * 25))
    (root / "mostlyneg.out").write_text(nemo1_log([-1.0 if i % 7 else 5.0 for i in range(50)]))
    (root / "somenan.out").write_text(nemo1_log([float("nan") if i in (20, 30, 40) else 5.0 for i in range(50)]))
    (root / "allnan.out").write_text(nemo1_log([float("nan")] * 50))
    (root / "somezero.out").write_text(nemo1_log([0.0 if i in (20, 30, 40) else 5.0 for i in range(50)]))
    (root / "restart.out").write_text(nemo1_log(good[:30], steps=list(range(30)))
                                      + nemo1_log(good[:30], steps=list(range(30))))
    (root / "negstep.out").write_text(nemo1_log(good, steps=[i - 25 for i in range(50)]))
    (root / "bigstep.out").write_text(nemo1_log(good, steps=[int("9" * 400) + i for i in range(50)]))
    (root / "tiny.out").write_text(nemo1_log([5.0] * 3))
    # a TensorBoard event file whose first record claims 2**40 bytes
    (root / "tbbomb").mkdir()
    (root / "tbbomb" / "events.out.tfevents.1.host").write_bytes((2 ** 40 + 7).to_bytes(8, "little") + b"\0" * 64)
    (root / "tbtrunc").mkdir()
    (root / "tbtrunc" / "events.out.tfevents.1.host").write_bytes(b"\x10\0\0\0")
    # run directories
    create_run_dir(make_plan(compose(REF)), {}, run_dir=root / "run")
    for name, recipe in (("run_bomb", ALIAS_BOMB), ("run_badrecipe", "model: {name: [unclosed\n"),
                         ("run_listrecipe", "- 1\n- 2\n"), ("run_badtypes", "train: {max_steps: many}\n")):
        shutil.copytree(root / "run", root / name)
        (root / name / "recipe.yaml").write_text(recipe)
        (root / name / "local-1.out").write_text(nemo1_log(good))
    shutil.copytree(root / "run", root / "run_badplan")
    (root / "run_badplan" / "plan.json").write_text("{not json")
    (root / "run_badplan" / "local-1.out").write_text(nemo1_log(good))
    shutil.copytree(root / "run", root / "run_logs")
    (root / "run_logs" / "local-1.out").write_text(nemo1_log(good))
    (root / "bomb.yaml").write_text(ALIAS_BOMB)
    # data files for `data stats` / `data prepare` (the second hostile pass)
    (root / "empty.jsonl").write_text("")
    (root / "blank.jsonl").write_text("\n\n  \n")
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (root / "latin1.jsonl").write_bytes('{"input": "caf\xe9", "output": "a"}\n'.encode("latin-1"))
    (root / "nonobj.jsonl").write_text("[1, 2]\n")
    (root / "nofields.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    (root / "numfields.jsonl").write_text('{"input": 1, "output": 2}\n')
    (root / "nullfields.jsonl").write_text('{"input": null, "output": null}\n')
    (root / "halfbad.jsonl").write_text('{"input": "q", "output": "a"}\n{not json\n')
    (root / "dolly_array.json").write_text(json.dumps([row] * 3))
    (root / "gz.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 40)
    # numbers Python refuses to read (over 4300 digits) in data rows and logs (the third hostile pass)
    digits = "9" * 5000
    (root / "digits_input.jsonl").write_text(f'{{"input": {digits}, "output": "a"}}\n')
    (root / "digits_neg.jsonl").write_text(f'{{"input": "q", "output": -{digits}}}\n')
    (root / "digits_extra.jsonl").write_text(f'{{"input": "q", "output": "a", "id": {digits}}}\n' * 3)
    (root / "digits_line9.jsonl").write_text('{"input": "q", "output": "a"}\n' * 8 + f'{{"input": "q", "output": "a", "n": {digits}}}\n')
    (root / "digits_dolly.jsonl").write_text(json.dumps(row)[:-1] + f', "n": {digits}}}\n')
    (root / "digits_dolly_field.jsonl").write_text(f'{{"instruction": {digits}, "context": "", "response": "a", "category": "open_qa"}}\n')
    (root / "digits_alpaca.json").write_text(f'[{{"instruction": "q", "input": "", "output": "a", "n": {digits}}}]\n')
    (root / "digits_pubmedqa.json").write_text(f'{{"1": {{"QUESTION": "q", "CONTEXTS": ["c"], "final_decision": "yes", "n": {digits}}}}}\n')
    (root / "digitstep.out").write_text(nemo1_log(good, steps=[digits[:-2] + f"{i:02d}" for i in range(50)]))
    # adversarial logs for validate / report: diverged runs, counters going down, unlabelled repeats, odd timings
    nan_loss = nemo1_log(good).replace("reduced_train_loss=1.5", "reduced_train_loss=nan")
    logs = {"nanloss.out": nan_loss, "infloss.out": nan_loss.replace("=nan", "=inf"),
            "neginfloss.out": nan_loss.replace("=nan", "=-inf"),
            "halfnanloss.out": nemo1_log(good[:25]) + nan_loss.split("\r", 25)[-1],
            "fast.out": nemo1_log([1e-7] * 50), "slow.out": nemo1_log([50_000.0] * 50),
            "megnan.out": megatron_log(50, loss="nan"), "meginf.out": megatron_log(50, loss="inf"),
            "megdown.out": megatron_log(50, reverse=True), "megdup.out": megatron_log(50, repeat=8),
            "megdup2.out": megatron_log(50, repeat=2), "nemo2dup.out": nemo2_log(50, repeat=8),
            "nemo2down.out": nemo2_log(50, reverse=True), "nemo2nan.out": nemo2_log(50, loss="nan"),
            "megfast.out": megatron_log(50, ms=0.0001), "megslow.out": megatron_log(50, ms=7_200_000.0)}
    for name, text in logs.items():
        (root / name).write_text(text)
    for name, log in (("run_nanloss", "nanloss.out"), ("run_megnan", "megnan.out"), ("run_megdup", "megdup.out")):
        shutil.copytree(root / "run", root / name)
        shutil.copy(root / log, root / name / "local-1.out")
    # run directories `vdkit run --resume` / `report` meet
    for name, plan_text in (("run_planlist", "[1, 2]\n"), ("run_plantypes", '{"recipe": 5}\n'),
                            ("run_emptyplan", "")):
        shutil.copytree(root / "run", root / name)
        (root / name / "plan.json").write_text(plan_text)
    shutil.copytree(root / "run", root / "run_noplan")
    (root / "run_noplan" / "plan.json").unlink()
    shutil.copytree(root / "run", root / "run_finished")
    (root / "run_finished" / "finished").write_text("")
    create_run_dir(make_plan(compose([])), {}, run_dir=root / "run_slurm")
    (root / "run_slurm" / "local-1.out").write_text(nemo1_log(good))
    # secrets files
    (root / "secrets").mkdir()
    for name, text in (("ok.env", "HF_TOKEN=hf_abc\n"), ("path.env", "PATH=/nowhere\n"), ("uid.env", "UID=0\n"),
                       ("ld.env", "LD_PRELOAD=/tmp/x.so\n"), ("slurm.env", "SLURM_JOB_ID=1\n"),
                       ("home.env", "HOME=/tmp\n"), ("badname.env", "1BAD=x\n"), ("noeq.env", "just a token\n"),
                       ("cuda.env", "CUDA_VISIBLE_DEVICES=0\n"), ("master.env", "MASTER_ADDR=evil\n"),
                       ("pythonpath.env", "PYTHONPATH=/tmp\n"), ("nccl.env", "NCCL_SOCKET_IFNAME=eth9\n"),
                       ("bash.env", "BASH_ENV=/tmp/x\n"), ("shell.env", "SHELL=/bin/false\n"),
                       ("ifs.env", "IFS=x\n"), ("rank.env", "RANK=3\n"), ("world.env", "WORLD_SIZE=99\n"),
                       ("user.env", "USER=root\n"), ("pmix.env", "PMIX_RANK=1\n"),
                       ("torch.env", "TORCHELASTIC_RUN_ID=x\n"), ("open.env", "HF_TOKEN=hf_abc\n")):
        (root / "secrets" / name).write_text(text)
        os.chmod(root / "secrets" / name, 0o644 if name == "open.env" else 0o600)  # open.env: readable by all
    os.chmod(root / "secrets", 0o700)
    # a fake sbatch that "succeeds" without a job id, and one that cannot reach a controller
    (root / "fakebin").mkdir()
    (root / "fakebin" / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (root / "fakebin" / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (root / "fakebin" / "sacct").write_text("#!/bin/sh\nexit 0\n")
    (root / "deadbin").mkdir()
    (root / "deadbin" / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                             "Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    for d in ("fakebin", "deadbin"):
        for f in (root / d).iterdir():
            f.chmod(0o755)
    return root


def _badconf(ws: Path) -> None:
    """A copy of conf/ (VDKIT_CONF_DIR) whose sweep/ holds hostile sweep files (the third hostile pass)."""
    from vdkit.composition.conftree import conf_dir

    conf = ws / "badconf"
    shutil.copytree(conf_dir(), conf)
    sw = conf / "sweep"
    (sw / "sw_binary.yaml").write_bytes(bytes(range(256)) * 16)
    (sw / "sw_list.yaml").write_text("- [model=llama2_7b]\n- [model=llama2_13b]\n")
    (sw / "sw_scalar.yaml").write_text("just a sentence\n")
    (sw / "sw_tags.yaml").write_text('cells: !!python/object/apply:os.system ["touch pwned"]\n')
    (sw / "sw_tag_binary.yaml").write_text("cells: [[!!binary aGk=]]\n")
    (sw / "sw_tag_set.yaml").write_text("cells: !!set {a: null}\n")
    (sw / "sw_cells20k.yaml").write_text("cells:\n" + "".join(f"  - [train.seed={i}]\n" for i in range(20_000)))
    (sw / "sw_product.yaml").write_text("cells:\n" + "".join(f"  - [model=llama2_7b, 'train.seed=range({i},{i + 100})']\n"
                                                            for i in range(0, 300, 100)))
    (sw / "sw_cell_range.yaml").write_text("cells:\n  - ['train.seed=range(0,1000000000)']\n")
    (sw / "sw_cells_strings.yaml").write_text("cells: [model=llama2_7b, model=llama2_13b]\n")
    (sw / "sw_cells_mapping.yaml").write_text("cells: {model: llama2_7b}\n")
    (sw / "sw_cells_empty.yaml").write_text("cells: []\n")
    (sw / "sw_cells_nested.yaml").write_text("cells: [[[model=llama2_7b]]]\n")
    (sw / "sw_cells_maps.yaml").write_text("cells: [[{model: llama2_7b}]]\n")
    (sw / "sw_base_mapping.yaml").write_text("base: {model: llama2_7b}\ncells: [[method=lora]]\n")
    (sw / "sw_oversize.yaml").write_text("# padding\n" * 200_000 + "cells: [[method=lora]]\n")
    (sw / "sw_alias_bomb.yaml").write_text(ALIAS_BOMB.replace("j:", "cells:"))
    (sw / "sw_latin1.yaml").write_bytes("cells: [[run.name=caf\xe9]]\n".encode("latin-1") + b"\xff\xfe")
    (sw / "sw_unclosed.yaml").write_text("cells: [[model=llama2_7b\n")
    os.mkfifo(sw / "sw_fifo.yaml")
    (sw / "sw_dir.yaml").mkdir()
    os.symlink(sw / "sw_loop.yaml", sw / "sw_loop.yaml")


def _local_run(ws: Path) -> Path:
    """A run directory rendered for this machine (cluster=local), as `vdkit run` writes it, without training."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    return create_run_dir(make_plan(compose(["engine=reference", "cluster=local", "model=tiny_llama",
                                             "data=synthetic"])), {}, run_dir=ws / "run_local")


def _state(ws: Path, content) -> None:
    path = ws / "run_local" / "job_state.json"
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def _lock(ws: Path, kind: str) -> None:
    path = ws / "run_local" / "run.lock"
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(path, path)  # a loop


# The launchers' other state files (vdkit.run.rundir.STATE_FILES), by the short name a case's `needs` gives.
STATE_FILE_NEEDS = {"jobids": "job_id.txt", "finished": "finished", "faults": "faults.jsonl", "excluded": "excluded_nodes",
                    "cancelled": "cancelled"}


def _state_file(ws: Path, name: str, kind: str) -> None:
    path = ws / "run_local" / name
    path.mkdir() if kind == "dir" else os.mkfifo(path)


def _symfarm(ws: Path, n: int) -> None:
    d = ws / f"links{n}"
    d.mkdir()
    for i in range(n):
        os.symlink(ws / "good.out", d / f"slurm-{i}.out")


# Hand edits of a run directory's recipe.yaml (key -> the value written): each must be refused by every verb and
# rank that reads the run dir, naming the file and the key (cases.yaml's h4-edited-recipe products).
RECIPE_EDITS = {"model.num_layers": -3, "cluster.nodes": 0, "model.hidden_size": "big", "engine.name": "vllm",
                "train.max_steps": -5, "method.lr": -1.0}


def _edited_recipes(ws: Path) -> None:
    """``recipe_edit/<key>/``: a local run dir (with a log, so `validate` reads it) whose recipe.yaml has one
    :data:`RECIPE_EDITS` value."""
    import yaml

    src = _local_run(ws)
    (src / "local-1.out").write_text(nemo1_log([5.0] * 50))
    for key, value in RECIPE_EDITS.items():
        dst = ws / "recipe_edit" / key
        shutil.copytree(src, dst)
        data = yaml.safe_load((dst / "recipe.yaml").read_text())
        section, name = key.split(".")
        data[section][name] = value
        (dst / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _site_files(ws: Path) -> None:
    """--config-dir {ws}/site with one broken cluster file per finding of issue 36 (each otherwise xe9680's)."""
    from vdkit.composition.config import conf_dir

    base = (conf_dir() / "cluster" / "xe9680.yaml").read_text()
    (ws / "site" / "cluster").mkdir(parents=True)
    for name, line in (("s_env", "partition: ${oc.env:HOME}"), ("s_type", "max_restarts: many"),
                       ("s_extra", "nodez: 2"), ("s_unicode", "nødes: 2")):
        (ws / "site" / "cluster" / f"{name}.yaml").write_text(base.replace("name: xe9680", f"name: {name}") + line + "\n")


EXTRAS = {
    "site_files": _site_files,
    "site_out_file": lambda ws: ((ws / "sfile").mkdir(), (ws / "sfile" / "cluster").write_text("x")),
    "site_out_loop": lambda ws: ((ws / "sloop").mkdir(), os.symlink(ws / "sloop" / "cluster", ws / "sloop" / "cluster")),
    "site_existing": lambda ws: ((ws / "sexist" / "cluster").mkdir(parents=True),
                                 (ws / "sexist" / "cluster" / "lab.yaml").write_text("# edited by hand\nname: lab\n")),
    "site_empty": lambda ws: ((ws / "sempty" / "cluster").mkdir(parents=True),  # its own dir: every file is read
                              (ws / "sempty" / "cluster" / "lab.yaml").write_text("# to fill in\n")),
    "symfarm300": lambda ws: _symfarm(ws, 300),
    "symfarm3000": lambda ws: _symfarm(ws, 3000),
    "fifo": lambda ws: os.mkfifo(ws / "fifo.jsonl"),
    "fifolog": lambda ws: os.mkfifo(ws / "fifo.out"),
    "occupied_out": lambda ws: (ws / "out").mkdir(),
    "fifoplan": lambda ws: (shutil.copytree(ws / "run", ws / "run_fifoplan"), (ws / "run_fifoplan" / "plan.json").unlink(),
                            os.mkfifo(ws / "run_fifoplan" / "plan.json")),
    "fiforecipe": lambda ws: (shutil.copytree(ws / "run", ws / "run_fiforecipe"),
                              (ws / "run_fiforecipe" / "recipe.yaml").unlink(), os.mkfifo(ws / "run_fiforecipe" / "recipe.yaml")),
    "fifosecret": lambda ws: os.mkfifo(ws / "secret.fifo"),
    "report_done": lambda ws: ((ws / "rep").mkdir(), (ws / "rep" / "table9.md").write_text("an earlier report\n")),
    "badconf": _badconf,
    "conf_loop": lambda ws: (os.symlink(ws / "conf_loop_b", ws / "conf_loop_a"), os.symlink(ws / "conf_loop_a", ws / "conf_loop_b")),
    "conf_fifo": lambda ws: os.mkfifo(ws / "conf.fifo"),
    "sparse2g": lambda ws: os.truncate(_touch(ws / "sparse.jsonl"), 2 << 30),
    "sparse2g_log": lambda ws: os.truncate(_touch(ws / "sparse.out"), 2 << 30),
    "sample60m": lambda ws: (ws / "sample60m.jsonl").write_text(json.dumps({"input": "q " * 30_000_000, "output": "a"}) + "\n"),
    "sample5m_line3": lambda ws: (ws / "sample5m.jsonl").write_text(
        (json.dumps({"input": "q", "output": "a"}) + "\n") * 2 + json.dumps({"input": "q " * 2_600_000, "output": "a"}) + "\n"),
    "local_run": _local_run,
    **{f"state_{name}": (lambda content: lambda ws: (_local_run(ws), _state(ws, content)))(content)
       for name, content in (("garbage", "{not json"), ("list", "[1, 2]"), ("empty", ""), ("bogus", '{"local": {"state": "BOGUS"}}'),
                             ("nostate", '{"local": {}}'), ("binary", bytes(range(256))), ("dir", "dir"), ("fifo", "fifo"),
                             ("huge", "{" + " " * (1 << 17) + "}"), ("number", "7"), ("otherlauncher", '{"slurm": {"state": "COMPLETED"}}'))},
    **{f"lock_{kind}": (lambda kind: lambda ws: (_local_run(ws), _lock(ws, kind)))(kind) for kind in ("dir", "fifo", "loop")},
    **{f"{stem}_{kind}": (lambda name, kind: lambda ws: (_local_run(ws), _state_file(ws, name, kind)))(name, kind)
       for stem, name in STATE_FILE_NEEDS.items() for kind in ("dir", "fifo")},
    "edited_recipes": _edited_recipes,
    "taken_run": lambda ws: ((ws / "out" / "tiny_llama_lora_1n1g").mkdir(parents=True),
                             (ws / "out" / "tiny_llama_lora_1n1g" / "launch.sbatch").write_text("an earlier run\n")),
}


def _touch(path: Path) -> Path:
    path.touch()
    return path


def workspace(template: Path, ws: Path, needs=()) -> Path:
    """A fresh copy of ``template`` at ``ws`` with the ``needs`` extras added."""
    shutil.copytree(template, ws, symlinks=True)
    for name in needs:
        EXTRAS[name](ws)
    return ws
