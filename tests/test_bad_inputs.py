"""One table of bad inputs for every verb (issue 12): exit 2, one line naming a fix, no traceback, nothing left behind.

Each case runs in-process (``vdkit.cli.main(argv)`` with capsys) in a fresh workspace holding a few
prepared inputs; ``{ws}`` in an argument is that workspace. The workspace's file tree is compared
before and after: a refused command writes nothing (no run dir, no partial data, no lock file).
``expect`` is a fragment of the one line, so a case cannot pass by failing for another reason.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vdkit.cli import main

REF = ["engine=reference", "model=tiny_llama", "data=synthetic"]  # a valid reference cell
SLURM_REF = REF + ["cluster.gpus_per_node=1", "cluster.mpi=none", "cluster.socket_ifname=lo"]
NEMO_IMG = "engine.container_image='nvcr.io#nvidia/nemo:24.01.01.framework'"

CASES = []  # (id, argv, expected fragment of the error line)
# Each row's section of the table (its defect class): without VDKIT_FULL_TESTS=1 a fixed sample of each
# section runs (tests/conftest.py); CI runs every row.
TABLE_CLASSES = {}


def case(verb_id, argv, expect, section):
    CASES.append(pytest.param(argv, expect, id=f"{verb_id}"))
    TABLE_CLASSES[verb_id] = section


# ----------------------------------------------------------------------------- recipe errors, every recipe verb
RECIPE_ERRORS = [
    ("unknown-key", ["train.max_stepz=5"], "max_stepz"),
    ("unknown-section", ["bogus.key=1"], "bogus"),
    ("plus-smuggle", ["+train.extra=1"], "extra"),
    ("bad-group", ["model=llama2_8b"], "model="),
    ("bad-group-method", ["method=qlora"], "method="),
    ("bad-group-cluster", ["cluster=dgx"], "cluster="),
    ("bad-group-data", ["data=imagenet"], "data="),
    ("bad-group-engine", ["engine=deepspeed"], "engine="),
    ("type-int", ["cluster.nodes=two"], "cluster.nodes"),
    ("type-float", ["cluster.gpu_memory_gb=lots"], "gpu_memory_gb"),
    ("type-bool", ["data.packed=maybe"], "packed"),
    ("type-list", ["cluster.ib_hcas=mlx5_0"], "ib_hcas"),
    ("no-equals", ["model"], "key=value"),
    ("lexer", ["engine.container_image=a#b"], "quote the value"),  # Hydra's grammar: the override named, its quoted form
    ("nodes-0", ["cluster.nodes=0"], "cluster.nodes=0"),
    ("nodes-7", ["cluster.nodes=7"], "cluster.nodes=7"),
    ("gpus-0", ["cluster.gpus_per_node=0"], "gpus_per_node=0"),
    ("gpus-neg", ["cluster.gpus_per_node=-8"], "gpus_per_node=-8"),
    ("mem-0", ["cluster.gpu_memory_gb=0"], "gpu_memory_gb"),
    ("time-0", ["cluster.time_limit_min=0"], "time_limit_min"),
    ("time-neg", ["cluster.time_limit_min=-5"], "time_limit_min"),
    ("cpus-0", ["cluster.cpus_per_task=0"], "cpus_per_task=0"),
    ("cpus-neg", ["cluster.cpus_per_task=-3"], "cpus_per_task=-3"),
    ("mbs-0", ["train.micro_batch_size=0"], "micro_batch_size=0"),
    ("gbs-lt-mbs", ["train.global_batch_size=1", "train.micro_batch_size=2"], "global_batch_size=1"),
    ("steps-0", ["train.max_steps=0"], "max_steps=0"),
    ("steps-neg", ["train.max_steps=-10"], "max_steps=-10"),
    ("target-0", ["train.target_steps=0"], "target_steps=0"),
    ("seq-0", ["train.seq_length=0"], "seq_length=0"),
    ("seq-too-long", ["train.seq_length=100000000"], "seq_length=100,000,000"),  # past limits.MAX_SEQ_LENGTH (a RoPE model past its trained length is planned with a note)
    ("precision", ["train.precision=fp16"], "precision"),
    ("recompute", ["parallelism.recompute=some"], "recompute"),
    ("tp-0", ["parallelism.tp=0"], "parallelism.tp=0"),
    ("pp-neg", ["parallelism.pp=-1"], "parallelism.pp=-1"),
    ("vp-0", ["parallelism.vp=0"], "parallelism.vp=0"),
    ("mpi", ["cluster.mpi=openmpi"], "cluster.mpi"),
    ("launcher", ["cluster.launcher=k8s"], "launcher"),
    ("method-name", ["method.name=rlhf"], "method.name"),
    ("peft-mismatch", ["method.peft_scheme=lora", "method=sft"], "peft_scheme"),
    ("engine-name", ["engine.name=vllm"], "engine.name"),
    ("data-kind", ["data.kind=images"], "data.kind"),
    ("packed-mbs", ["data.packed=true", "train.micro_batch_size=2"], "micro_batch_size=1"),
    ("data-method", ["data=pile", "method=lora"], "does not suit"),
    ("env-name", ["run.name=${oc.env:HF_TOKEN}"], "oc.env"),
    ("env-path", ["run.results_dir=${oc.env:HOME}/r"], "oc.env"),
    ("env-legacy", ["run.out_dir=${env:HOME}"], "oc.env"),
]
for verb in ("plan", "render", "submit", "run", "demo"):
    for name, overrides, expect in RECIPE_ERRORS:
        if verb in ("run", "demo") and name.startswith(("bad-group-engine",)):
            continue
        argv = [verb, *overrides] + (["--out", "{ws}/out"] if verb != "plan" else [])
        case(f"{verb}-{name}", argv, expect, "recipe")

# ----------------------------------------------------------------------------- plan / sweeps
for verb in ("plan", "render", "submit", "demo"):
    case(f"{verb}-sweep-empty", [verb, "--sweep", ""] + (["--out", "{ws}/out"] if verb != "plan" else []),
         "--sweep was given an empty name", "plan")
for name, argv, expect in [
    ("sweep-missing", ["plan", "--sweep", "table10"], "no sweep named"),
    ("sweep-bad-override", ["plan", "--sweep", "table9", "model=gpt5"], "model="),
    ("multirun-bad", ["plan", "-m", "cluster.nodes=1,x"], "cluster.nodes"),
    ("multirun-unknown", ["plan", "-m", "train.stepz=1,2"], "stepz"),
    ("infeasible-render", ["render", "model=llama2_70b", "method=sft", "cluster.nodes=1", "--out", "{ws}/out"],
     "does not fit"),
    ("no-layout-render", ["render", "model=llama2_7b", "cluster.nodes=3", "--out", "{ws}/out"], "layout"),
    ("render-sweep-missing", ["render", "--sweep", "nope", "--out", "{ws}/out"], "no sweep named"),
    ("render-out-is-file", ["render", *REF, "--out", "{ws}/afile"], "{ws}/afile"),
    ("render-name-backslash", ["render", *REF, "run.name='a\\\\b'", "--out", "{ws}/out"], "backslash"),
    ("render-partition-newline", ["render", *REF, "cluster.partition='a\\nb'", "--out", "{ws}/out"], "partition"),
    ("render-image-missing", ["render", "model=llama2_7b", "method=lora", "engine.container_image=null",
                              "--out", "{ws}/out"], "container_image"),
    ("render-image-scheme", ["render", "model=llama2_7b", "engine.container_image='docker://nvcr.io/x'",
                             "--out", "{ws}/out"], "scheme"),
    ("render-image-space", ["render", "model=llama2_7b", "engine.container_image='a b'", "--out", "{ws}/out"],
     "whitespace"),
    ("render-image-sqsh-relative", ["render", "model=llama2_7b", "engine.container_image=nemo.sqsh",
                                    "--out", "{ws}/out"], "squashfs"),
    ("render-image-registry-slash", ["render", "model=llama2_7b", "engine.container_image=nvcr.io/nvidia/nemo",
                                     "--out", "{ws}/out"], "'#'"),
    ("render-hca", ["render", *REF, "cluster.ib_hcas=[\"mlx5 0\"]", "--out", "{ws}/out"], "adapter"),
    ("render-ifname", ["render", *REF, "cluster.socket_ifname='eth0;reboot'", "--out", "{ws}/out"], "interface"),
    ("render-nccl-debug", ["render", *REF, "cluster.nccl_debug=LOUD", "--out", "{ws}/out"], "NCCL_DEBUG"),
    ("render-mount-comma", ["render", "model=llama2_7b", NEMO_IMG, "data.data_dir='/x,y'", "--no-check-mounts",
                            "--out", "{ws}/out"], "--container-mounts"),
    ("render-data-missing", ["render", *[o for o in REF if o != "data=synthetic"], "data=dolly", "data.data_dir={ws}/nodata", "--check-mounts",
                             "--out", "{ws}/out"], "does not exist"),
    ("render-nemo-missing", ["render", "model=llama2_7b", NEMO_IMG, "model.nemo_path={ws}/none.nemo",
                             "data.data_dir={ws}", "--check-mounts", "--out", "{ws}/out"], "nemo_path"),
    ("render-ptuning-pp-minlr", ["render", "model=llama2_7b", "method=ptuning", "parallelism.pp=2",
                                 "method.min_lr=1e-5", NEMO_IMG, "--no-check-mounts", "--out", "{ws}/out"], "min_lr"),
    ("render-seq-parallel-tp1", ["render", "model=llama2_7b", "parallelism.tp=1",
                                 "parallelism.sequence_parallel=true", NEMO_IMG, "--no-check-mounts",
                                 "--out", "{ws}/out"], "sequence_parallel"),
    ("render-reference-tp2", ["render", *REF, "parallelism.tp=2", "cluster.gpus_per_node=2", "--out", "{ws}/out"],
     "data parallel"),
    ("submit-infeasible", ["submit", "model=llama2_70b", "method=sft", "cluster.nodes=1", "--out", "{ws}/out"],
     "does not fit"),
]:
    case(name, argv, expect, "plan")

# ----------------------------------------------------------------------------- run
for name, argv, expect in [
    ("run-nemo", ["run", "engine=nemo"], "does not run on this machine"),
    ("run-slurm-cluster", ["run", "cluster=xe9680"], "slurm cluster"),
    ("run-data-missing", ["run", "data=dolly", "data.data_dir={ws}/nodata"], "does not exist"),
    ("run-pretrain-data", ["run", "data=pile", "method=pretrain", "train.seq_length=128", "data.data_dir={ws}"],
     "pretrain data"),
    ("run-ptuning-packed", ["run", "method=ptuning", "data.packed=true"], "data.packed=true with method=ptuning"),
    ("run-seq-2", ["run", "train.seq_length=2"], "train.seq_length=2"),
    ("run-seq-ptuning", ["run", "method=ptuning", "train.seq_length=12"], "virtual tokens"),
    ("run-tp", ["run", "parallelism.tp=2", "cluster.gpus_per_node=2"], "data parallel"),
    ("run-no-layout", ["run", "cluster.gpus_per_node=3", "train.global_batch_size=4"], "layout"),
    ("run-tokenizer-missing", ["run", "data.tokenizer_model={ws}/no-tokenizer"], "tokenizer"),
    ("run-out-is-file", ["run", "--out", "{ws}/afile"], "afile"),
]:
    case(name, [*argv, "--out", "{ws}/out"] if "--out" not in argv else argv, expect, "run")

# ----------------------------------------------------------------------------- status
for name, argv, expect in [
    ("status-missing-dir", ["status", "{ws}/nothing"], "neither a run directory nor a Slurm job id"),
    ("status-garbage", ["status", "abc;rm"], "neither a run directory nor a Slurm job id"),
    ("status-never-submitted", ["status", "{ws}/run"], "no job was submitted"),
    ("status-plain-dir", ["status", "{ws}"], "not a run directory"),
    ("status-negative", ["status", "-5"], "-5"),
    ("status-unknown-job", ["status", "99999999"], "about job 99999999"),  # unknown, or controller unreachable
]:
    case(name, argv, expect, "status")

# ----------------------------------------------------------------------------- runs / logs / cancel (issue 36)
for name, argv, expect in [
    ("runs-missing-root", ["runs", "{ws}/nothing"], "is not a directory"),
    ("logs-not-a-run", ["logs", "{ws}"], "is not a run directory"),
    ("logs-never-ran", ["logs", "{ws}/run"], "has no logs yet"),
    ("logs-negative-lines", ["logs", "-n", "-2", "{ws}/run"], "--lines"),
    ("cancel-not-a-run", ["cancel", "{ws}/nothing"], "is not a run directory"),
    ("cancel-negative-settle", ["cancel", "--settle", "-1", "{ws}/run"], "--settle"),
    ("cancel-never-started", ["cancel", "{ws}/run"], "has never been started"),
    ("site-name-number", ["site", "probe", "--name", "123", "--out", "{ws}/s"], "is not a cluster name"),
    ("site-name-shipped", ["site", "probe", "--name", "xe9680", "--out", "{ws}/s"], "is a cluster the kit ships"),
]:
    case(name, argv, expect, "runs")

# ----------------------------------------------------------------------------- validate / report
for name, argv, expect in [
    ("validate-missing", ["validate", "{ws}/nothing"], "nothing"),
    ("validate-empty-dir", ["validate", "{ws}/emptydir"], "emptydir"),
    ("validate-no-steps", ["validate", "{ws}/run"], "run"),
    ("validate-text-file", ["validate", "{ws}/notes.txt"], "notes.txt"),
    ("validate-target-0", ["validate", "{ws}/run", "--target-steps", "0"], "--target-steps"),
    ("validate-target-neg", ["validate", "{ws}/run", "--target-steps", "-3"], "--target-steps"),
    ("validate-val-neg", ["validate", "{ws}/log.out", "--val-every", "-1", "--val-seconds", "3"], "negative"),
    ("validate-val-half", ["validate", "{ws}/log.out", "--val-every", "10"], "go together"),
    ("validate-ckpt-neg", ["validate", "{ws}/log.out", "--checkpoint-seconds", "-1"], "negative"),
    ("validate-bad-int", ["validate", "{ws}/log.out", "--target-steps", "many"], "--target-steps"),
    ("report-missing", ["report", "{ws}/nothing", "--out", "{ws}/rep"], "not a run directory"),
    ("report-file", ["report", "{ws}/notes.txt", "--out", "{ws}/rep"], "not a run directory"),
    ("report-table", ["report", "{ws}/run", "--table", "table10", "--out", "{ws}/rep"], "table10"),
    ("report-out-file", ["report", "{ws}/run", "--out", "{ws}/afile/rep"], "afile"),
    ("report-no-recipe", ["report", "{ws}/emptydir", "--out", "{ws}/rep"], "emptydir"),
]:
    case(name, argv, expect, "validate")

# ----------------------------------------------------------------------------- data
for name, argv, expect in [
    ("prepare-dataset", ["data", "prepare", "imagenet", "{ws}/dolly.jsonl", "{ws}/d"], "imagenet"),
    ("prepare-missing", ["data", "prepare", "dolly", "{ws}/none.jsonl", "{ws}/d"], "no such file"),
    ("prepare-empty", ["data", "prepare", "dolly", "{ws}/empty.jsonl", "{ws}/d"], "empty"),
    ("prepare-bad-json", ["data", "prepare", "dolly", "{ws}/bad.jsonl", "{ws}/d"], "bad.jsonl"),
    ("prepare-not-utf8", ["data", "prepare", "dolly", "{ws}/latin1.jsonl", "{ws}/d"], "UTF-8"),
    ("prepare-dir-input", ["data", "prepare", "dolly", "{ws}/emptydir", "{ws}/d"], "is a directory"),
    ("prepare-missing-field", ["data", "prepare", "dolly", "{ws}/nofield.jsonl", "{ws}/d"], "response"),
    ("prepare-alpaca-not-list", ["data", "prepare", "alpaca", "{ws}/dolly.jsonl", "{ws}/d"], "dolly.jsonl"),
    ("prepare-pubmedqa-wrong", ["data", "prepare", "pubmedqa", "{ws}/dolly.jsonl", "{ws}/d"], "dolly.jsonl"),
    ("prepare-out-is-file", ["data", "prepare", "dolly", "{ws}/dolly.jsonl", "{ws}/afile"], "not a directory"),
    ("prepare-out-exists", ["data", "prepare", "dolly", "{ws}/dolly.jsonl", "{ws}/prepared"], "already holds"),
    ("prepare-seed", ["data", "prepare", "dolly", "{ws}/dolly.jsonl", "{ws}/d", "--seed", "x"], "--seed"),
    *[(f"prepare-split-{i}", ["data", "prepare", "dolly", "{ws}/dolly.jsonl", "{ws}/d", "--split", s], "split")
      for i, s in enumerate(["0.8,0.2", "1,1,1", "0.5,0.5,0.5", "-0.1,0.6,0.5", "a,b,c", "", "0.8;0.1;0.1",
                             "nan,0.5,0.5", "inf,0,0", "0,0,1", "0.8,0.1,0.1,0"])],
    ("stats-missing", ["data", "stats", "{ws}/none.jsonl"], "no such file"),
    ("stats-empty", ["data", "stats", "{ws}/empty.jsonl"], "empty"),
    ("stats-bad-json", ["data", "stats", "{ws}/bad.jsonl"], "malformed JSON"),
    ("stats-not-object", ["data", "stats", "{ws}/list.jsonl"], "not a JSON object"),
    ("stats-no-field", ["data", "stats", "{ws}/dolly.jsonl"], "'input'"),
    ("stats-not-utf8", ["data", "stats", "{ws}/latin1.jsonl"], "UTF-8"),
    ("stats-dir", ["data", "stats", "{ws}/emptydir"], "is a directory"),
    ("stats-tokenizer-missing", ["data", "stats", "{ws}/sft.jsonl", "--tokenizer", "{ws}/none.model"], "tokenizer"),
    ("stats-tokenizer-junk", ["data", "stats", "{ws}/sft.jsonl", "--tokenizer", "{ws}/notes.txt"], "notes.txt"),
    ("stats-tokenizer-dir", ["data", "stats", "{ws}/sft.jsonl", "--tokenizer", "{ws}/emptydir"], "tokenizer"),
    ("stats-field", ["data", "stats", "{ws}/sft.jsonl", "--field", "prompt"], "--field"),
    ("pack-suffix", ["data", "pack", "{ws}/sft.jsonl", "{ws}/p.txt", "--tokenizer", "{ws}/tok"], "unknown packed"),
    ("pack-exists", ["data", "pack", "{ws}/sft.jsonl", "{ws}/packed.npy", "--tokenizer", "{ws}/tok"],
     "already exists"),
    ("pack-maxlen-0", ["data", "pack", "{ws}/sft.jsonl", "{ws}/p.npy", "--tokenizer", "{ws}/tok", "--max-len", "0"],
     "--max-len"),
    ("pack-maxlen-neg", ["data", "pack", "{ws}/sft.jsonl", "{ws}/p.npy", "--tokenizer", "{ws}/tok",
                         "--max-len", "-4"], "--max-len"),
    ("pack-no-tokenizer-arg", ["data", "pack", "{ws}/sft.jsonl", "{ws}/p.npy"], "--tokenizer"),
    ("pack-tokenizer-missing", ["data", "pack", "{ws}/sft.jsonl", "{ws}/p.npy", "--tokenizer", "{ws}/none"],
     "tokenizer"),
    ("pack-input-missing", ["data", "pack", "{ws}/none.jsonl", "{ws}/p.npy", "--tokenizer", "{ws}/tok.json"],
     "none.jsonl"),
    ("data-unknown-subverb", ["data", "shuffle"], "shuffle"),
]:
    case(name, argv, expect, "data")

# ----------------------------------------------------------------------------- argument errors, every verb
for name, argv, expect in [
    ("unknown-verb", ["train"], "train"),
    ("plan-unknown-flag", ["plan", "--fast"], "--fast"),
    ("render-unknown-flag", ["render", "--dry"], "--dry"),
    ("submit-bad-timeout", ["submit", "--timeout", "soon"], "--timeout"),
    ("status-no-target", ["status"], "RUN_DIR"),
    ("run-multirun", ["run", "-m", "cluster.nodes=1,2"], "-m"),
    ("validate-no-source", ["validate"], "RUN_DIR_OR_LOG"),
    # (`vdkit report` with no run dirs is the planned table now - issue 20 - not an error)
    ("report-no-runs-bad-table", ["report", "--table", "table99"], "table99"),
    ("prepare-no-args", ["data", "prepare"], "dataset"),
    ("demo-unknown-flag", ["demo", "--gpu"], "--gpu"),
    ("cluster-bad-action", ["cluster", "restart"], "restart"),
    ("render-both-mounts", ["render", "--check-mounts", "--no-check-mounts"], "--no-check-mounts"),
    ("list-unknown-kind", ["list", "modles"], "modles"),
    ("list-unknown-flag", ["list", "--all"], "--all"),
    ("plan-explain-unknown", ["plan", "--explain", "cluster.node"], "did you mean cluster.nodes"),
    ("plan-explain-empty", ["plan", "--explain", ""], "not a recipe key"),
    ("plan-explain-bad-override", ["plan", "--explain", "cluster.nodes", "cluster.nodes=0"], "cluster.nodes=0"),
]:
    case(name, argv, expect, "arguments")


# ----------------------------------------------------------------------------- the workspace
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The prepared inputs, made once; each case gets a copy (composing a run dir per case is slow)."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    tmp_path = tmp_path_factory.mktemp("bad-inputs-template")
    (tmp_path / "afile").write_text("a file, not a directory\n")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"instruction": "x", "context": ""\n')
    (tmp_path / "latin1.jsonl").write_bytes('{"instruction": "caf\xe9"}\n'.encode("latin-1"))
    (tmp_path / "nofield.jsonl").write_text(json.dumps({"instruction": "q", "context": ""}) + "\n")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "notes.txt").write_text("no steps here\n")
    (tmp_path / "log.out").write_text("no progress lines\n")
    row = {"instruction": "q", "context": "", "response": "a", "category": "open_qa"}
    (tmp_path / "dolly.jsonl").write_text("".join(json.dumps(row) + "\n" for _ in range(10)))
    (tmp_path / "sft.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    (tmp_path / "packed.npy").write_bytes(b"exists")
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "training.jsonl").write_text("{}\n")
    create_run_dir(make_plan(compose(REF)), {}, run_dir=tmp_path / "run")
    return tmp_path


@pytest.fixture
def ws(template, tmp_path, monkeypatch):
    """A fresh copy of the inputs for one case; the case runs with it as the working directory."""
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(template, ws, symlinks=True)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("HF_TOKEN", "hf_never_shown")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return ws


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("argv,expect", CASES)
def test_bad_input(ws, capsys, argv, expect):
    argv = [a.replace("{ws}", str(ws)) for a in argv]
    expect = expect.replace("{ws}", str(ws))
    before = _tree(ws)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2, (rc, err[-1500:], out[-500:])
    assert "Traceback" not in err + out
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "fix:" in lines[0] and expect in lines[0], lines[0]
    assert "hf_never_shown" not in err + out
    assert _tree(ws) == before, "something was left behind"


def test_the_table_is_big_enough_and_covers_every_verb():
    import argparse

    from vdkit.cli import build_parser

    verbs = {p.values[0][0] for p in CASES}
    assert len(CASES) >= 150, len(CASES)
    assert {"list", "plan", "render", "submit", "run", "status", "validate", "report", "data", "demo", "cluster"} <= verbs
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    # a new verb must add its rows here; `check` (issue 29) has none in this table yet
    assert set(sub.choices) - verbs == {"check"}, sorted(set(sub.choices) - verbs)
