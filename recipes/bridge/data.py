"""What the bridge engine's data needs beyond Bridge itself: where the JSONL is, the byte-level tokenizer.

Bridge's ``FinetuningDatasetConfig`` reads ``<dataset_root>/training.jsonl`` (``input`` / ``output``
rows: what ``vdkit data prepare`` writes). ``data=synthetic`` is written into the run directory at
render time (the kit's learnable instruction -> response task), so every rank reads the same file.
CPU models use the kit's byte-level tokenizer (pad 0, BOS 1, EOS 2, byte b -> b + 3); Bridge reads
tokenizers through Hugging Face, so it is written as an HF ``tokenizer.json`` (a byte-level BPE
with no merges: one token per byte) - the same ids as the other engines' built-in tokenizer.
Standard library only (render runs without Bridge).
"""
from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Dict

from vdkit.errors import UserError
from vdkit.recipes.common.chat import with_messages
from vdkit.recipes.common.data import synthetic_rows, synthetic_validation_rows  # the kit's synthetic task

TRAIN_FILE = "training.jsonl"  # Bridge's name (data/builders/finetuning_dataset.py:229), the kit's too
VALIDATION_FILE = "validation.jsonl"  # Bridge's name (finetuning_dataset.py validation_path), the kit's too
SYNTHETIC_DIR = "data/synthetic"  # in the run dir
SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2
BYTE_OFFSET = len(SPECIALS)


def dataset_root(recipe, run_dir) -> PurePosixPath:
    """The directory Bridge reads ``training.jsonl`` from (UserError when the data is not laid out so)."""
    d = recipe.data
    if d.name == "synthetic":
        return PurePosixPath(run_dir) / SYNTHETIC_DIR
    if d.kind != "sft":
        raise UserError(f"engine=bridge fine-tunes on JSONL input/output data; data={d.name} is {d.kind} data",
                        "use a prepared SFT dataset (vdkit data prepare) or data=synthetic")
    if list(d.train_files) != [TRAIN_FILE]:
        raise UserError(f"Megatron-Bridge reads {TRAIN_FILE} from a dataset directory; data.train_files="
                        f"{list(d.train_files)}", f"prepare the data with `vdkit data prepare` (it writes {TRAIN_FILE})")
    return PurePosixPath(d.data_dir)


def synthetic_files(recipe, chat: bool = False) -> Dict[str, str]:
    """Run-dir files of ``data=synthetic`` (name -> text); ``chat``: each row also as ``messages`` (what Bridge's
    chat dataset reads, :mod:`.chat`)."""
    rows = [with_messages(r) for r in synthetic_rows(recipe.train.seed)] if chat else synthetic_rows(recipe.train.seed)
    out = {f"{SYNTHETIC_DIR}/{TRAIN_FILE}": "".join(json.dumps(r) + "\n" for r in rows)}
    if not recipe.timing:  # run.mode=train validates on held-out rows: another seed's draw of the same task
        held_out = synthetic_validation_rows(recipe.train.seed)
        held_out = [with_messages(r) for r in held_out] if chat else held_out
        out[f"{SYNTHETIC_DIR}/{VALIDATION_FILE}"] = "".join(json.dumps(r) + "\n" for r in held_out)
    return out


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
