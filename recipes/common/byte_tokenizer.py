"""The kit's byte-level tokenizer as HF files (ids: three specials, then the 256 bytes), shared by the Bridge
engine (its staged tokenizer) and NeMo's start-up check (the probe's tokenizer), so neither imports the other."""
from __future__ import annotations

import json
from typing import Dict

SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2
BYTE_OFFSET = len(SPECIALS)


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte -> printable character map (what a ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_tokenizer_files(subdir: str) -> Dict[str, str]:
    """An HF tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) with the kit's byte-level ids."""
    chars = _bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({chars[b]: b + BYTE_OFFSET for b in range(256)})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": SPECIALS[0], "bos_token": SPECIALS[1],
            "eos_token": SPECIALS[2], "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}
    return {f"{subdir}/tokenizer.json": json.dumps(tok, ensure_ascii=False) + "\n",
            f"{subdir}/tokenizer_config.json": json.dumps(conf, indent=1) + "\n"}
