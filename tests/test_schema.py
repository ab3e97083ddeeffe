"""ModelCfg's architecture fields: defaults, validation, and every engine reading them (no private copies)."""
from __future__ import annotations

from pathlib import Path

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan

RUN_DIR = Path("/cluster/runs/x")
PRETRAIN = ["method=pretrain", "data.data_dir=/data/pile"]


@pytest.mark.parametrize("model", ["llama2_7b", "llama2_13b", "llama2_70b", "tiny_llama"])
def test_llama_models_declare_their_architecture(model):
    m = compose([f"model={model}"]).model
    assert (m.arch, m.norm, m.activation, m.position_embedding, m.bias, m.tied_embeddings) == \
        ("llama", "rmsnorm", "swiglu", "rope", False, False)
    assert m.norm_eps == 1e-5 and m.rope_base == 10000.0 and m.rope_scaling is None
    assert m.tokenizer == ("byte-level" if model == "tiny_llama" else "sentencepiece")


@pytest.mark.parametrize("override,message", [
    ("model.arch=gpt9", "model.arch='gpt9' is not supported"),
    ("model.norm=batchnorm", "model.norm='batchnorm'"),
    ("model.activation=tanh", "model.activation='tanh'"),
    ("model.position_embedding=alibi", "model.position_embedding='alibi'"),
    ("model.tokenizer=wordpiece", "model.tokenizer='wordpiece'"),
    ("model.norm_eps=0", "model.norm_eps=0"),
    ("model.num_query_groups=3", "do not divide evenly"),
])
def test_bad_architecture_fields_are_refused(override, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        compose([override])


def test_rope_scaling_is_a_mapping():
    m = compose(["model.rope_scaling={rope_type:linear,factor:8.0}"]).model
    assert m.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    with pytest.raises(UserError, match="is not a mapping"):
        compose(["model.rope_scaling=5"])


def test_nemo_pretrain_config_reads_the_model_fields():
    from vdkit.recipes.nemo.config import build_config

    plan = make_plan(compose(PRETRAIN + ["model.norm_eps=1e-6", "model.rope_base=500000",
                                          "model.tied_embeddings=true", "model.tokenizer=huggingface"]))
    m = build_config(plan, RUN_DIR)["model"]
    assert m["layernorm_epsilon"] == 1e-6 and m["rotary_base"] == 500000
    assert m["share_embeddings_and_output_weights"] is True and m["tokenizer"]["library"] == "huggingface"
    default = build_config(make_plan(compose(PRETRAIN)), RUN_DIR)["model"]
    assert "rotary_base" not in default  # NeMo's own default: the Llama 2 YAML stays as NeMo ships it
    assert (default["normalization"], default["activation"], default["position_embedding_type"]) == \
        ("rmsnorm", "fast-swiglu", "rope")


def test_nemo_refuses_what_it_cannot_express():
    from vdkit.recipes.nemo.config import build_config

    with pytest.raises(UserError, match="model.activation='relu' does not exist in the llama architecture"):
        compose(PRETRAIN + ["model.activation=relu"])  # the door (vdkit.rules) refuses it first
    import dataclasses

    plan = make_plan(compose(PRETRAIN))
    relu = dataclasses.replace(plan, recipe=dataclasses.replace(
        plan.recipe, model=dataclasses.replace(plan.recipe.model, activation="relu")))
    with pytest.raises(UserError, match="activation=relu"):  # and the engine still would
        build_config(relu, RUN_DIR)


def test_reference_llama_config_reads_the_model_fields():
    from vdkit.recipes.common.data import ByteTokenizer
    from vdkit.recipes.reference.model import llama_config

    m = compose(["model=tiny_llama", "model.norm_eps=1e-6", "model.rope_base=500000",
                 "model.tied_embeddings=true"]).model
    cfg = llama_config(m, ByteTokenizer())
    assert cfg.rms_norm_eps == 1e-6 and cfg.tie_word_embeddings is True
    assert getattr(cfg, "rope_theta", None) == 500000 or cfg.rope_parameters["rope_theta"] == 500000
    import dataclasses

    with pytest.raises(UserError, match="Llama-architecture"):  # the engine's own guard (the door refuses it first)
        llama_config(dataclasses.replace(m, arch="opt", norm="layernorm"), ByteTokenizer())


def test_param_counts_follow_the_architecture_fields():
    from vdkit.planner.arch import param_counts

    llama = compose(["model=tiny_llama"]).model
    base = param_counts(llama)
    h, f, v, layers = llama.hidden_size, llama.ffn_hidden_size, llama.vocab_size, llama.num_layers
    import dataclasses

    tied = param_counts(dataclasses.replace(llama, tied_embeddings=True))
    assert base.total - tied.total == v * h
    plain = param_counts(dataclasses.replace(llama, activation="relu"))
    assert base.total - plain.total == layers * h * f
    opt_like = param_counts(dataclasses.replace(llama, norm="layernorm", bias=True, activation="relu",
                                                position_embedding="learned"))
    kv = llama.num_query_groups * (h // llama.num_attention_heads)
    biases = layers * ((2 * h + 2 * kv) + (f + h))
    norms = (2 * layers + 1) * h  # layernorm adds a bias to each norm
    assert opt_like.total == plain.total + biases + norms + llama.max_position_embeddings * h


def test_param_counts_match_transformers_llama():
    import torch  # noqa: F401  (transformers builds on it)

    from vdkit.planner.arch import param_counts
    from vdkit.recipes.common.data import ByteTokenizer
    from vdkit.recipes.reference.model import llama_config
    from transformers import LlamaForCausalLM

    for extra in ([], ["model.tied_embeddings=true"]):
        m = compose(["model=tiny_llama", *extra]).model
        model = LlamaForCausalLM(llama_config(m, ByteTokenizer()))
        assert sum(p.numel() for p in model.parameters()) == param_counts(m).total
