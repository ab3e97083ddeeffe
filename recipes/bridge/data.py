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
