"""docs/architecture.md's promise: a model family and a published table are each one YAML.

Each test adds a throwaway one to a copy of the shipped tree (VDKIT_CONF_DIR, or the published folder),
touching no file of the kit, and renders or reports with it. The engine and the launcher: see
tests/test_launchers.py.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.composition.config import conf_dir

TOY_FAMILY = """\
# A made-up family: OPT's building blocks (LayerNorm, ReLU, biases, learned positions) at Llama-like sizes.
name: toy_family
num_layers: 4
hidden_size: 256
ffn_hidden_size: 1024
num_attention_heads: 8
num_query_groups: 8
vocab_size: 1000
max_position_embeddings: 512
pretrain_tp: null
pretrain_pp: null
nemo_path: null
arch: opt
norm: layernorm
norm_eps: 1.0e-5
activation: relu
bias: true
position_embedding: learned
rope_base: 10000.0
rope_scaling: null
tied_embeddings: true
tokenizer: byte-level
pretrained: false  # a throwaway: no published weights to fine-tune from
"""


@pytest.fixture
def conf_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped conf/ tree that the kit reads instead (VDKIT_CONF_DIR)."""
    from vdkit.composition import config
    from vdkit.planner import calibration

    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    monkeypatch.setenv("VDKIT_CONF_DIR", str(copy))
    calibration.load.cache_clear()
    config.nvidia_pretrain_tables.cache_clear()
    yield copy
    calibration.load.cache_clear()
    config.nvidia_pretrain_tables.cache_clear()


def test_a_throwaway_model_family_renders(conf_copy, tmp_path, capsys):
    import json

    from vdkit.planner.arch import param_counts
    from vdkit.composition.config import compose

    (conf_copy / "model" / "toy_family.yaml").write_text(TOY_FAMILY)
    overrides = ["model=toy_family", "engine=reference", "cluster=local", "data=synthetic", "method=lora",
                 "train.seq_length=256"]
    rc = main(["render", *overrides, "--out", str(tmp_path / "runs")])
    assert rc == 0, capsys.readouterr().err
    run_dir = Path(capsys.readouterr().out.strip())
    plan = json.loads((run_dir / "plan.json").read_text())
    m = compose(overrides).model
    h, f, v, L, p = 256, 1024, 1000, 4, 512 + 2  # OPT's learned positions hold 2 extra rows
    per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 2 * 2 * h  # attention, MLP, two LayerNorms
    assert param_counts(m).total == L * per_layer + v * h + p * h + 2 * h  # tied output, final LayerNorm
    assert plan["model"] == "toy_family" and plan["params_b"] == round(param_counts(m).total / 1e9, 3)
    assert plan["trainable_params"] == L * 32 * (4 * h + 2 * h)  # peft: LoRA on q, k and v (A and B each), rank 32


TOY_TABLE = """\
# A made-up published table: the tiny Llama's minutes for 100 steps, arranged as Table 9 is.
table: toy_grid
title: "A throwaway table: tiny Llama, 100 steps (minutes)"
source: "made up by tests/test_architecture.py"
steps: 100
units: minutes
key: [model, gpus, method]
layout: grid
sweep: demo
recipe: {model.name: tiny_llama, engine.name: reference, cluster.gpu_type: cpu}
cited_as: the toy table
figure_unit: min for 100 steps
models: {tiny_llama: "Tiny Llama"}
methods: {lora: LoRA, sft: SFT}
cells:
  - {model: tiny_llama, gpus: 2, method: lora, minutes: 1.5}
"""


def test_a_throwaway_published_table_reports(tmp_path, monkeypatch, capsys):
    import json

    from helpers import make_run, series
    from vdkit.validation import tables

    published = tmp_path / "published"
    shutil.copytree(tables.PUBLISHED_DIR, published)
    (published / "toy_grid.yaml").write_text(TOY_TABLE)
    monkeypatch.setattr(tables, "PUBLISHED_DIR", published)
    assert "toy_grid" in tables.table_names()
    run = make_run(tmp_path / "runs", ["model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic",
                                       "cluster.gpus_per_node=2", "method=lora"], series(0.6))
    out = tmp_path / "report"
    assert main(["report", str(run), "--table", "toy_grid", "--out", str(out), "--no-plots"]) == 0
    md = capsys.readouterr().out
    assert "A throwaway table" in md and "| Tiny Llama | 2 |" in md
    cell = next(c for c in json.loads((out / "toy_grid.json").read_text())["cells"] if c["method"] == "lora")
    assert cell["published_minutes"] == 1.5 and cell["runs"] == [str(run)]
    assert cell["minutes"] == pytest.approx((12.0 + 0.6 * 99) / 60, rel=0.05)  # warm-up once + 99 steady steps
    assert cell["ratio"] == pytest.approx(cell["minutes"] / 1.5, rel=1e-3)
    # and `vdkit plan` of one of its cells cites it (the spec's recipe conditions and key, no code)
    assert main(["plan", "model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic",
                 "cluster.gpus_per_node=2", "method=lora"]) == 0
    assert "  published   the toy table: 1.5 min for 100 steps\n" in capsys.readouterr().out  # (no CPU prediction)


def test_an_unknown_table_is_one_line_and_exit_2(tmp_path, capsys):
    rc = main(["report", "--table", "table99", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--table 'table99': no published table" in err[0] and "table9" in err[0]
    assert not (tmp_path / "r").exists()
