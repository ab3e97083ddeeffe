"""Instruct models fine-tune on their tokenizer's own chat template (issue 36): the reference and megatron
engines' data path (recipes/common/data.py) formats a row with transformers' ``apply_chat_template`` when the
tokenizer carries a ``chat_template``, and the loss covers only the assistant's answer. The tokenizer is made
here (byte-level BPE, no merges; a Llama-3-shaped template): no download."""
from __future__ import annotations

import json

import pytest

from helpers import tiny_chat_tokenizer as _tiny_chat_tokenizer
from vdkit.composition.config import compose


def _recipe(tok_dir):
    return compose(["engine=reference", "model=tiny_llama", "data=synthetic", "method=sft",
                    f"data.tokenizer_model={tok_dir}"])


def test_a_chat_template_formats_the_sample_and_masks_the_prompt(tmp_path):
    from transformers import AutoTokenizer

    from vdkit.recipes.common import data as rdata

    tok_dir = _tiny_chat_tokenizer(tmp_path / "tok")
    tok = rdata.load_tokenizer(_recipe(tok_dir))
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    user = [{"role": "user", "content": "What is 2+2?"}]
    want = hf.apply_chat_template(user + [{"role": "assistant", "content": "4"}], tokenize=True, return_dict=False)
    prompt = hf.apply_chat_template(user, tokenize=True, add_generation_prompt=True, return_dict=False)
    s = rdata.encode_sample(tok, "What is 2+2?", "4", 256, answer_only=True)
    assert list(s.ids) == list(want)  # today: BOS + "What is 2+2? 4" + EOS, no template
    trained = [i for i, label in enumerate(s.labels) if label != rdata.IGNORE]
    assert trained == list(range(len(prompt), len(want)))  # the answer ("4<|eot|>") and nothing else
    assert hf.decode([s.ids[i] for i in trained]) == "4<|eot|>"


def test_a_long_input_is_cut_first_and_the_answer_kept(tmp_path):
    from vdkit.recipes.common import data as rdata

    tok = rdata.load_tokenizer(_recipe(_tiny_chat_tokenizer(tmp_path / "tok")))
    s = rdata.encode_sample(tok, "x" * 500, "the answer", 80, answer_only=True)
    hf = tok.tok.tok
    assert len(s.ids) <= 80 and hf.decode([i for i, l in zip(s.ids, s.labels) if l != rdata.IGNORE]) == "the answer<|eot|>"
    assert hf.decode(list(s.ids)).startswith("<s><|start|>user\n\nxxx")


def test_a_tokenizer_without_a_template_keeps_the_plain_format(tmp_path):
    from vdkit.recipes.common import data as rdata

    tok = rdata.load_tokenizer(_recipe(_tiny_chat_tokenizer(tmp_path / "tok", template=None)))
    s = rdata.encode_sample(tok, "hi", "there", 64, answer_only=True)
    assert tok.tok.tok.decode(list(s.ids)) == "<s>hi there<|eot|>"
