"""vdkit.planner.arch's parameter counts against transformers' own model classes, for every conf/model/*.yaml."""
from __future__ import annotations

import pytest

from vdkit.planner.arch import param_counts
from vdkit.composition.config import compose, group_options

MODELS = [m for m in group_options("model")]


def _model(name):
    """The model group as composed; engine=reference (transformers) builds every RoPE scaling type, whereas the
    default engine=nemo refuses Llama 3.1's llama3 scaling at composition (issue 26: RoPE scaling per engine)."""
    return compose([f"model={name}", "engine=reference"]).model


def _hf_count(m) -> int:
    """Build the model on the meta device with transformers' own class and count its parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if m.arch == "opt":
        cfg = OPTConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, ffn_dim=m.ffn_hidden_size,
                        num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
                        max_position_embeddings=m.max_position_embeddings,
                        word_embed_proj_dim=m.embedding_dim or m.hidden_size, do_layer_norm_before=m.pre_norm,
                        enable_bias=m.bias, tie_word_embeddings=m.tied_embeddings)
        cls = OPTForCausalLM
    else:  # Qwen2 is the Llama block with biases on q, k and v (model.qkv_bias)
        config_cls, cls = (Qwen2Config, Qwen2ForCausalLM) if m.qkv_bias else (LlamaConfig, LlamaForCausalLM)
        cfg = config_cls(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
                         num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
                         num_key_value_heads=m.num_query_groups, tie_word_embeddings=m.tied_embeddings)
    with torch.device("meta"):
        model = cls(cfg)
    # named parameters deduplicate a tied output layer, as the formula does
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_counts_match_transformers(name):
    m = _model(name)
    assert param_counts(m).total == _hf_count(m)


@pytest.mark.parametrize("name,billions", [("opt_125m", 0.125), ("opt_350m", 0.331), ("opt_1_3b", 1.316),
                                           ("opt_2_7b", 2.652), ("opt_6_7b", 6.658), ("opt_13b", 12.853),
                                           ("opt_30b", 29.975), ("llama3_1_8b", 8.030), ("llama3_1_70b", 70.554),
                                           ("qwen2_5_7b", 7.616)])
def test_published_sizes(name, billions):
    # The model cards' sizes (OPT paper Table 1 rounds them; Llama 3.1: 8.03B, 70.6B; Qwen2.5-7B: 7,615,616,512).
    assert param_counts(_model(name)).total / 1e9 == pytest.approx(billions, abs=0.002)
