"""`vdkit check` for engine=bridge: the fine-tuning data on this machine through Bridge's own dataset and collate_fn.

Moved out of :mod:`.runcheck` (the house's module size). Where the job's tokenizer lives only on cluster storage the
data was not read at all (rows without the template's keys passed green, and Bridge's dataset raised KeyError on the
first batch of every rank): the kit's byte-level tokenizer (:mod:`vdkit.recipes.common.byte_tokenizer`) stands in.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from unittest import mock
from pathlib import Path

from vdkit.run.jobcheck import Report, one_line


@contextlib.contextmanager
def _stand_in(cfg):
    """Bridge's build_tokenizer on the kit's byte-level HF tokenizer files (a temporary directory)."""
    import copy

    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files

    with tempfile.TemporaryDirectory(prefix="vdkit-bridge-tok-") as tmp:
        for name, text in byte_tokenizer_files("").items():
            (Path(tmp) / Path(name).name).write_text(text)
        tcfg = copy.deepcopy(cfg.tokenizer)
        tcfg.tokenizer_type, tcfg.tokenizer_model, tcfg.chat_template = "HuggingFaceTokenizer", tmp, None
        yield build_tokenizer(tcfg)


def first_batch(cfg, plan, tok, rep: Report) -> None:
    """Fine-tuning data here: Bridge's dataset and collate_fn on the first micro-batch, with the job's tokenizer
    (``tok``) or, where that is the cluster's (None), the kit's byte-level tokenizer standing in, said on the line:
    the rows' keys and the prompt template are what Bridge's dataset reads, whatever the tokenizer."""
    from megatron.bridge.training.config import FinetuningDatasetConfig

    ds_cfg = cfg.dataset
    if not isinstance(ds_cfg, FinetuningDatasetConfig):
        what = getattr(ds_cfg, "blend", None) or type(ds_cfg).__name__
        if type(ds_cfg).__name__.startswith("Mock"):
            rep.checked(f"dataset {type(ds_cfg).__name__}: Bridge's mock data (no files)")
        else:
            rep.not_here(f"pretraining data {what} (dataset.blend): indexed files on cluster storage")
        return
    from vdkit.recipes.bridge.data import TRAIN_FILE

    root = Path(str(ds_cfg.dataset_root))
    if not (root / TRAIN_FILE).is_file():
        rep.not_here(f"{root / TRAIN_FILE} (dataset.dataset_root): cluster storage")
        template(ds_cfg, rep)
        return
    if ds_cfg.packed_sequence_specs is not None and (ds_cfg.packed_sequence_specs.packed_sequence_size or 0) > 0:
        rep.not_here("packed sequences: Bridge packs training.jsonl into .npy with the tokenizer at start-up; "
                     "megatron-core's attention without TE cannot run THD batches (the first batch is the GPU's)")
        return
    from megatron.bridge.data.utils import get_dataset_provider

    mbs = cfg.train.micro_batch_size
    stand_in = tok is None
    if stand_in and getattr(cfg.tokenizer, "chat_template", None):
        rep.not_here(f"{root / TRAIN_FILE} with the chat template of tokenizer {cfg.tokenizer.tokenizer_model}: "
                     "cluster storage")
        return
    try:
        with mock.patch.dict(os.environ, {"TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}), \
                (_stand_in(cfg) if stand_in else contextlib.nullcontext(tok)) as tok:
            train, _valid, _test = get_dataset_provider(ds_cfg)([mbs * 2, 0, 0], ds_cfg, tok)
            samples = [train[i] for i in range(mbs)]
            batch = train.collate_fn(samples)
    except Exception as exc:  # e.g. rows without the template's keys: Bridge's dataset raises on the first batch
        rep.defect(f"Bridge's fine-tuning dataset cannot give the first micro-batch of {root / TRAIN_FILE}: "
                   f"{one_line(exc)}" + (" (read with the kit's byte-level tokenizer standing in "
                   "for the cluster's)" if stand_in else ""), "dataset.dataset_root / dataset.dataset_kwargs",
                   "JSONL rows with the keys of the prompt template (vdkit data prepare writes them), or re-render")
        return
    if getattr(train, "use_hf_tokenizer_chat_template", False) and all(bool(s["loss_mask"].all()) for s in samples):
        rep.defect("Bridge's chat dataset trains every token of the first micro-batch, the prompt included: the chat "
                   "template has no {% generation %} marker, so its assistant mask is all ones (data/datasets/utils.py "
                   "_chat_preprocess)", "tokenizer.chat_template",
                   "keep the rendered chat_template (the tokenizer's own, its assistant turn marked) or re-render")
        return
    tokens = batch["tokens"]
    mask = batch.get("loss_mask")
    real = int((tokens != getattr(tok, "pad", -1)).sum()) if hasattr(tok, "pad") else tokens.numel()
    rep.checked(f"first micro-batch (Bridge's {type(train).__name__}.collate_fn on {root / TRAIN_FILE}"
                + (", the kit's byte-level tokenizer standing in for the cluster's" if stand_in else "") + "): "
                f"tokens {list(tokens.shape)} = {tokens.numel()} positions, {real} not padding"
                + (f", {int(mask.sum())} in the loss" if mask is not None else "")
                + f"; the plan assumes {mbs} x {plan.recipe.train.seq_length} = {mbs * plan.recipe.train.seq_length} positions")


def template(ds_cfg, rep: Report) -> None:
    """The prompt template, label key and truncation fields through Bridge's own ``GPTSFTDataset.
    _maybe_validate_prompt_template`` (``data/datasets/sft.py:344-366``), which every rank's dataset runs right after
    reading its JSONL: with the data on the cluster, ``label_key: response`` under ``{input} {output}`` passed green
    and every rank stopped at the dataset build. The rows are not needed; the arguments are ``create_sft_dataset``'s
    as the job passes ``dataset_kwargs`` (its defaults where a key is not set). Chat datasets use no template."""
    import inspect
    import types

    from megatron.bridge.data.datasets.sft import GPTSFTDataset, create_sft_dataset

    kwargs = dict(getattr(ds_cfg, "dataset_kwargs", None) or {})
    if kwargs.get("chat"):
        return
    defaults = {k: p.default for k, p in inspect.signature(create_sft_dataset).parameters.items()}
    arg = {k: kwargs.get(k, defaults.get(k)) for k in ("prompt_template", "label_key", "truncation_field")}
    stand_in = types.SimpleNamespace(label_key=arg["label_key"], prompt_template=arg["prompt_template"],
                                     truncation_fields=arg["truncation_field"].split(",")
                                     if arg["truncation_field"] is not None else [])
    try:
        GPTSFTDataset._maybe_validate_prompt_template(stand_in)
    except Exception as exc:  # noqa: BLE001 - Bridge's own assert, on every rank at the dataset build
        rep.defect(f"Bridge's fine-tuning dataset refuses its prompt template (prompt_template "
                   f"{arg['prompt_template']!r}, label_key {arg['label_key']!r}, truncation_field "
                   f"{arg['truncation_field']!r}): {one_line(exc)} (data/datasets/sft.py:344, every rank at start-up)",
                   "dataset.dataset_kwargs", "end prompt_template with {label_key}, truncate a field of the template, "
                   "or re-render")
        return
    rep.checked(f"prompt template {arg['prompt_template']!r} with label_key {arg['label_key']!r} and truncation_field "
                f"{arg['truncation_field']!r} through Bridge's own _maybe_validate_prompt_template (no rows read)")
