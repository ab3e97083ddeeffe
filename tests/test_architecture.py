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
from vdkit.config import conf_dir

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
"""


@pytest.fixture
def conf_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped conf/ tree that the kit reads instead (VDKIT_CONF_DIR)."""
    from vdkit import calibration, config

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

    from vdkit.arch import param_counts
    from vdkit.config import compose

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
