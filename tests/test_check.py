"""`vdkit check` (vdkit/commands/check.py): planted defects each fail in one line, clean cells pass.

One `vdkit check` process per stack (Bridge, NeMo 1.23): every planted run dir of a stack is checked in
the same call, so each stack is imported once.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

VDKIT = [sys.executable, "-m", "vdkit"]


def _vdkit(*args, env=None):
    return subprocess.run([*VDKIT, *map(str, args)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def _render(out: Path, *overrides) -> Path:
    p = _vdkit("render", *overrides, "--out", out, "--no-check-mounts")
    assert p.returncode == 0, p.stderr
    return Path(p.stdout.strip().splitlines()[-1])


def _copy(src: Path, dst: Path, *extra) -> Path:
    """The run of ``src`` rendered again as run ``dst.name`` beside it (a copied run dir's scripts name the
    original's path: `vdkit check` refuses a copy), with ``extra`` overrides."""
    from vdkit.cli import main

    overrides = [o for o in (src / "overrides.txt").read_text().split() if not o.startswith("run.name=")]
    assert main(["render", *overrides, *extra, f"run.name={dst.name}", "--out", str(src.parent), "--no-check-mounts"]) == 0
    return src.parent / dst.name


def _edit_yaml(path: Path, edit) -> None:
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _errors(stderr: str, run_dir: Path) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith(f"vdkit check: error: {run_dir}:")]


def test_not_a_run_dir_is_one_line(tmp_path):
    p = _vdkit("check", tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not a run directory" in p.stderr


def test_bridge_planted_defects_one_line_each(tmp_path):
    """A local Bridge LoRA cell passes, and with Bridge's bf16 optimizer state; planted: a hub-id tokenizer, a model
    config Bridge refuses, FP8 parameter gather without the distributed optimizer, TP overlap with the frozen base's
    default bulk overlaps - each one line, exit 2."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "latest_checkpointed_iteration.txt").write_text("0")
    (base / "iter_0000000").mkdir()  # the layout the render's base check reads (vdkit.recipes.common.preflight)
    (base / "iter_0000000" / "metadata.json").write_text("{}")
    clean = _render(tmp_path / "r", "model=tiny_llama", "engine=bridge", "cluster=local", "method=lora",
                    "data=synthetic", f"model.megatron_path={base}", "train.max_steps=4", "train.seq_length=64",
                    "cluster.gpus_per_node=2")
    hub = _copy(clean, tmp_path / "hub")
    _edit_yaml(hub / "bridge.yaml", lambda d: d["tokenizer"].update(tokenizer_model="meta-llama/Llama-2-7b-hf"))
    heads = _copy(clean, tmp_path / "heads")
    _edit_yaml(heads / "bridge.yaml", lambda d: d["model"].update(num_attention_heads=3, tensor_model_parallel_size=2,
                                                                   pipeline_model_parallel_size=1))
    fp8 = _copy(clean, tmp_path / "fp8")

    def fp8_no_do(d):
        d["mixed_precision"] = "bf16_with_fp8_delayed_scaling_mixed"
        d["optimizer"]["use_distributed_optimizer"] = False
        d["ddp"]["use_distributed_optimizer"] = False
    _edit_yaml(fp8 / "bridge.yaml", fp8_no_do)
    bf16 = _copy(clean, tmp_path / "bf16opt")  # train.optimizer_dtype=bf16 as Bridge renders it (a GPU run: edited in)

    def bf16_state(d):
        from vdkit.recipes.bridge.config import _bf16_optimizer_state

        d["optimizer"].update(use_distributed_optimizer=True, **_bf16_optimizer_state())
        d["ddp"]["use_distributed_optimizer"] = True
    _edit_yaml(bf16 / "bridge.yaml", bf16_state)

    # train.swiglu_input_dtype=fp8 as rendered (megatron-core's activation_func_fp8_input_store): Bridge's own
    # runtime_config_update runs TransformerConfig's check of it and passes a SwiGLU model
    swiglu = _copy(clean, tmp_path / "swiglu8")
    _edit_yaml(swiglu / "bridge.yaml", lambda d: d["model"].update(_swiglu_fp8_render()))

    # TP 2 with sequence parallelism and Bridge's TP overlap as a cluster render turns it on, without the PEFT
    # render's tp_comm_bulk_wgrad / _dgrad false: TE 2.12 would leave the frozen QKV / fc1 input gradients un-reduced
    overlap = _copy(clean, tmp_path / "overlap", "parallelism.tp=2")
    _edit_yaml(overlap / "bridge.yaml", lambda d: d.update(comm_overlap={
        "_target_": "megatron.bridge.training.comm_overlap.CommOverlapConfig", "tp_comm_overlap": True}))

    p = _vdkit("check", clean, hub, heads, fp8, bf16, swiglu, overlap)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert _errors(p.stderr, clean) == [], p.stderr
    out = p.stdout
    assert "parameters, plan" in out and "first micro-batch" in out and "validate()" in out
    (line,) = _errors(p.stderr, hub)
    assert "meta-llama/Llama-2-7b-hf is a hub id" in line and "fix:" in line
    (line,) = _errors(p.stderr, heads)
    assert "refuses bridge.yaml" in line and "num_attention_heads" in line
    (line,) = _errors(p.stderr, fp8)
    assert "FP8 parameter gather without the distributed optimizer" in line
    # megatron-core's own checks of the precision-aware optimizer ran (against the image TE's FusedAdam)
    assert _errors(p.stderr, bf16) == [], p.stderr
    assert "FusedAdam (use_precision_aware_optimizer: checked against TE 2.12" in out
    assert _errors(p.stderr, swiglu) == [], p.stderr
    (line,) = _errors(p.stderr, overlap)
    assert "frozen base (LoRA)" in line and "qkv / fc1 input gradient" in line and "tp_comm_bulk_wgrad: false" in line


def _swiglu_fp8_render() -> dict:
    """What the render adds to bridge.yaml's model for train.swiglu_input_dtype=fp8 (beside its bf16 render)."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.bridge.config import _model

    cell = ["model=tiny_llama", "engine=bridge", "method=lora", "data=synthetic"]
    fp8, bf16 = (_model(make_plan(compose(cell + [f"train.swiglu_input_dtype={d}"]))) for d in ("fp8", "bf16"))
    added = {k: v for k, v in fp8.items() if bf16.get(k) != v}
    assert added == {"activation_func_fp8_input_store": True}
    return added


def test_nemo_planted_defects_one_line_each(tmp_path, nemo_venv):
    """NeMo 1.23 in its venv: a table9 LoRA cell passes (with its data here: GPTSFTDataset's first item);
    planted: an optimizer NeMo 1.23 lacks, a packed file that is JSONL - each one line, exit 2."""
    data = tmp_path / "dolly"
    data.mkdir()
    rows = [{"input": f"question {i}?", "output": f"answer {i}."} for i in range(8)]
    (data / "training.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))  # NeMo builds test_ds too
    clean = _render(tmp_path / "r", "model=llama2_7b", "method=lora", "cluster.nodes=1", f"data.data_dir={data}")
    optim = _copy(clean, tmp_path / "optim")
    _edit_yaml(optim / "nemo.yaml", lambda d: d["model"]["optim"].update(name="mcore_distributed_optim"))
    packed = _copy(clean, tmp_path / "packed")
    fake = data / "packed_training.npy"  # named as the packed file, holding the JSONL
    fake.write_text((data / "training.jsonl").read_text())

    def pack(d):
        d["model"]["data"]["train_ds"].update(packed_sequence=True, file_names=[str(fake)])
    _edit_yaml(packed / "nemo.yaml", pack)
    damaged = tmp_path / "llama2-7b.nemo"  # a base zeroed on this machine's storage (an empty tar to tarfile)
    damaged.write_bytes(b"\x00" * 1000)
    base = _render(tmp_path / "b", "model=llama2_7b", "method=lora", "cluster.nodes=1", f"data.data_dir={data}",
                   f"model.nemo_path={damaged}")

    other = tmp_path / "llama2-13b.nemo"  # a 13B base given to a 7B SFT: NeMo builds the .nemo's model, check said ok
    with tarfile.open(other, "w") as tar:
        conf = yaml.safe_dump({"num_layers": 40, "hidden_size": 5120, "ffn_hidden_size": 13824,
                               "num_attention_heads": 40, "num_query_groups": None, "max_position_embeddings": 4096,
                               "encoder_seq_length": 4096, "position_embedding_type": "rope"}).encode()
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = len(conf)
        tar.addfile(info, io.BytesIO(conf))
    wrong = _render(tmp_path / "w", "model=llama2_7b", "method=sft", "cluster.nodes=1", f"data.data_dir={data}",
                    f"model.nemo_path={other}")

    p = _vdkit("check", clean, optim, packed, base, wrong, env={"VDKIT_NEMO_VENV": str(Path(nemo_venv).parent.parent)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert _errors(p.stderr, clean) == [], p.stderr
    assert "GPTSFTDataset (MegatronGPTSFTModel._build_dataset" in p.stdout and "8 rows" in p.stdout
    (line,) = _errors(p.stderr, optim)
    assert "cannot resolve model.optim.name=mcore_distributed_optim" in line and "fix:" in line
    (line,) = _errors(p.stderr, packed)
    assert "GPTSFTPackedDataset cannot read" in line and str(fake) in line
    (line,) = _errors(p.stderr, base)  # the pre-flight's line, not NeMo's tarfile error naming no key
    assert f"model.nemo_path={damaged}: the archive holds no model_config.yaml" in line and "import_hf.sbatch" in line
    (line,) = _errors(p.stderr, wrong)
    assert f"{other} holds another model than the plan's: num_layers=40 (plan 32), hidden_size=5120 (plan 4096)" in line


def test_the_jobs_preflight_runs_on_the_inputs_on_this_machine(tmp_path):
    """The job's pre-flight refuses an empty data directory and a damaged base after the queue wait; where they are
    on this machine `vdkit check` says so first (one line each, the pre-flight's), and a clean cell passes it."""
    from vdkit.commands.check import preflight_here
    from vdkit.run.jobcheck import Report

    empty, data = tmp_path / "empty", tmp_path / "dolly"
    empty.mkdir()
    data.mkdir()
    for name in ("training.jsonl", "validation.jsonl", "test.jsonl"):
        (data / name).write_text('{"input": "q?", "output": "a."}\n')
    (tmp_path / "broken.nemo").write_text("not a tar")
    bad = _render(tmp_path / "r", "model=llama2_7b", "method=lora", f"data.data_dir={empty}",
                  f"model.nemo_path={tmp_path}/broken.nemo")
    good = _render(tmp_path / "g", "model=llama2_7b", "method=lora", f"data.data_dir={data}")
    rep = Report(bad)
    preflight_here(rep)
    assert [d.split(":")[0] for d in rep.defects] == [f"data.data_dir={empty}", f"model.nemo_path={tmp_path}/broken.nemo"]
    assert "holds no non-empty file" in rep.defects[0] and "import_hf.sbatch" in rep.defects[1]
    rep = Report(good)
    preflight_here(rep)  # the .nemo and the image are under /models and /shared: the cluster's, not checked here
    assert rep.defects == [] and "the job's pre-flight on its 4 input(s) on this machine" in rep.text()


def test_nemo_preflight_wants_the_test_split_nemo_reads_at_start_up(tmp_path):
    """The rendered test_ds is built by MegatronGPTSFTModel at fit's start-up (megatron_gpt_sft_model.py:773): a data
    directory without data.test_files passed the pre-flight and `vdkit check`, then NeMo could not open the file."""
    from vdkit.commands.check import preflight_here
    from vdkit.run.jobcheck import Report

    data = tmp_path / "dolly"
    data.mkdir()
    for name in ("training.jsonl", "validation.jsonl"):
        (data / name).write_text('{"input": "q?", "output": "a."}\n')
    run = _render(tmp_path / "r", "model=llama2_7b", "method=lora", f"data.data_dir={data}")
    rep = Report(run)
    preflight_here(rep)
    (line,) = rep.defects
    assert line.startswith(f"data.test_files={data / 'test.jsonl'} does not exist"), line


# ----------------------------------------------------------------------------- a hand-edited nemo.yaml
NEMO_CELL = ["model=llama2_7b", "method=lora", "cluster.nodes=1"]
# name -> (the edit of nemo.yaml, fragments of its one line). No NeMo venv: the comparison with the kit's own
# render refuses these before NeMo's probe (which took 27-39 s and passed them all).
NEMO_EDITS = {
    "unknown-key": (lambda d: d["trainer"].update(max_stpes=100),
                    ["unknown key trainer.max_stpes", "NeMo 1.23 ignores it silently; did you mean trainer.max_steps?",
                     "fix: rename it trainer.max_steps"]),
    "unknown-section": (lambda d: d["model"].update(bogus_section={"x": 1}),
                        ["unknown key model.bogus_section", "fix: remove it"]),
    "str-for-int": (lambda d: d["model"].update(micro_batch_size="one"),
                    ["model.micro_batch_size is 'one', a str", "NeMo 1.23 reads an int there", "the kit rendered 1"]),
    "int-for-bool": (lambda d: d["model"].update(sequence_parallel=1),
                     ["model.sequence_parallel is 1, an int", "reads a bool there"]),
    "scalar-for-mapping": (lambda d: d["model"].update(optim=5), ["model.optim is 5, an int", "reads a mapping there"]),
    "max-steps-neg": (lambda d: d["trainer"].update(max_steps=-3), ["trainer.max_steps=-3", "needs it > 0"]),
    "max-steps-unlimited": (lambda d: d["trainer"].update(max_steps=-1),
                            ["trainer.max_steps=-1", "Lightning's -1, no limit, fails there"]),
    "tp-neg": (lambda d: d["model"].update(tensor_model_parallel_size=-3),
               ["model.tensor_model_parallel_size=-3", "needs it > 0", "the kit rendered 1"]),
    "devices-0": (lambda d: d["trainer"].update(devices=0), ["trainer.devices=0", "needs it > 0"]),
    # a count rendered null (open to any type there) is still a count; NaN is not > 0 either
    "vp-0": (lambda d: d["model"].update(virtual_pipeline_model_parallel_size=0),
             ["model.virtual_pipeline_model_parallel_size=0", "needs it > 0"]),
    "mbs-nan": (lambda d: d["model"].update(micro_batch_size=float("nan")), ["model.micro_batch_size=nan", "needs it > 0"]),
    "no-model": (lambda d: d.pop("model"), ["has no model section: NeMo 1.23's script reads it"]),
}


def test_nemo_yaml_hand_edits_refused_before_nemo(tmp_path, monkeypatch, capsys):
    """A nemo.yaml edited by hand is compared with the kit's render of the run's own recipe: an unknown key, a
    changed type or a count <= 0 is one line each, exit 2, in about a second and without NeMo's venv; a new lr
    is accepted and listed; an untouched render lists no edits."""
    from vdkit.cli import main

    blocker = tmp_path / "a-file"  # NeMo's venv cannot be made under a file: its probe never runs here
    blocker.write_text("")
    monkeypatch.setenv("VDKIT_NEMO_VENV", str(blocker / "venv"))
    dirs = {}
    for name in ["clean", "new-lr", *NEMO_EDITS]:
        assert main(["render", *NEMO_CELL, f"run.name={name}", "--out", str(tmp_path), "--no-check-mounts"]) == 0
        dirs[name] = tmp_path / name
        if name in NEMO_EDITS:
            _edit_yaml(dirs[name] / "nemo.yaml", NEMO_EDITS[name][0])
    _edit_yaml(dirs["new-lr"] / "nemo.yaml", lambda d: d["model"]["optim"].update(lr=2e-4))
    assert main(["render", *NEMO_CELL, "run.name=fifo", "--out", str(tmp_path), "--no-check-mounts"]) == 0
    dirs["fifo"] = tmp_path / "fifo"
    (dirs["fifo"] / "nemo.yaml").unlink()
    os.mkfifo(dirs["fifo"] / "nemo.yaml")  # NeMo's probe would block on it for ever
    capsys.readouterr()
    import time

    start = time.perf_counter()
    assert main(["check", *map(str, dirs.values())]) == 2
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert "Traceback" not in err and seconds < 5 * len(dirs), seconds
    for name, (_edit, fragments) in NEMO_EDITS.items():
        (line,) = _errors(err, dirs[name])
        assert all(f in line for f in fragments) and "fix:" in line, line
    assert _errors(err, dirs["clean"]) == [] and _errors(err, dirs["new-lr"]) == []
    (line,) = _errors(err, dirs["fifo"])
    assert "nemo.yaml is a FIFO" in line
    assert "nemo.yaml differs from the kit's render of recipe.yaml at 1 key(s) (each known to NeMo 1.23, of the " \
           "rendered type): model.optim.lr\n" in out
    assert "nemo.yaml is the kit's render of recipe.yaml and plan.json (no hand edits)" in out
