"""Instruct models fine-tune on their own chat template, as they were instruction-tuned.

A tokenizer that carries a ``chat_template`` (Hugging Face's ``tokenizer_config.json``: every Llama 3.x
Instruct tokenizer does; base Llama 2 / OPT tokenizers do not) formats a sample with transformers' own
``apply_chat_template``: the row's ``input`` as the user turn, its ``output`` as the assistant's. The prompt
is the conversation up to the assistant header (``add_generation_prompt=True``), the answer the rest (its
content and end-of-turn token), so the loss mask covers only what the assistant says. Without a template a
sample stays NeMo's plain ``"{input} {output}"`` (:func:`vdkit.recipes.common.data.encode_sample`).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from vdkit.errors import UserError


def chat_tokenizer(tok):
    """The transformers tokenizer inside the kit's wrapper ``tok`` when it has a chat template, else None."""
    inner = getattr(getattr(tok, "tok", None), "tok", None)  # common.data._Wrapped -> data_stats._AutoTokenizer
    return inner if getattr(inner, "chat_template", None) and hasattr(inner, "apply_chat_template") else None


MESSAGES_KEY = "messages"  # a row's conversation (Hugging Face's name; Bridge's chat dataset reads it)


def messages(inp: str, out: str) -> List[dict]:
    """One row as a conversation (Hugging Face's ``messages``): ``input`` the user's turn, ``output`` the
    assistant's. The one home of this shape: the reference / megatron data path, ``vdkit data prepare --chat``'s
    ``messages`` rows and Bridge's chat dataset (:mod:`vdkit.recipes.bridge.chat`) all read it."""
    return [{"role": "user", "content": inp}, {"role": "assistant", "content": out}]


def with_messages(row: dict) -> dict:
    """``row`` (``input`` / ``output``) with its conversation beside them as :data:`MESSAGES_KEY`."""
    return {**row, MESSAGES_KEY: messages(row["input"], row["output"])}


def _ids(hf, conversation, generation_prompt: bool) -> List[int]:
    return list(hf.apply_chat_template(conversation, tokenize=True, add_generation_prompt=generation_prompt,
                                       return_dict=False))


def chat_ids(hf, inp: str, out: str) -> Tuple[List[int], List[int]]:
    """(prompt ids, whole conversation ids) of one row under ``hf``'s chat template; UserError when the
    template's conversation does not start with its own generation prompt (no clean answer to mask)."""
    conversation = messages(inp, out)
    prompt = _ids(hf, conversation[:1], True)
    full = _ids(hf, conversation, False)
    if full[:len(prompt)] != prompt:
        raise UserError("the tokenizer's chat template renders the assistant's turn differently from its generation "
                        "prompt, so the answer cannot be told from the prompt for the loss mask",
                        "use a tokenizer whose template ends the prompt at the assistant header (Llama 3.x's do)")
    return prompt, full


def encode_chat(hf, inp: str, out: str, max_len: int) -> Tuple[List[int], int]:
    """(ids, prompt length) of one row under the chat template, at most ``max_len`` ids: the input is cut
    first (as NeMo's truncation_field: input), then the conversation's tail."""
    prompt, full = chat_ids(hf, inp, out)
    inp_ids: Optional[List[int]] = None
    while len(full) > max_len and inp:
        if inp_ids is None:
            inp_ids = list(hf.encode(inp, add_special_tokens=False))
        inp_ids = inp_ids[:max(0, len(inp_ids) - (len(full) - max_len))]
        inp = hf.decode(inp_ids)
        prompt, full = chat_ids(hf, inp, out)
    return full[:max_len], min(len(prompt), max_len)
