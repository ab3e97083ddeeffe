"""The bridge engine's tokenizer: which one the job's data is tokenized with (a staged path: the job runs offline), its
chat template for an Instruct model, and bridge.yaml's header line on the rows' format (:mod:`.chat`). The kit's
byte-level tokenizer of CPU models is written into the run dir under :data:`TOKENIZER_DIR`."""
from __future__ import annotations

from pathlib import PurePosixPath

TOKENIZER_DIR = "tokenizer"  # in the run dir for the byte-level tokenizer of CPU models


def _kits_own_tokenizer(recipe) -> bool:
    """Whether the data is tokenized with the kit's byte-level tokenizer written into the run dir (no chat template)."""
    from vdkit.recipes.common import staging

    return recipe.model.tokenizer == "byte-level" and not staging.staged_tokenizer(recipe)


def chat_template(recipe, run_dir):
    """bridge.yaml's ``tokenizer.chat_template`` (:mod:`vdkit.recipes.bridge.chat`), None for plain data."""
    from vdkit.recipes.bridge import chat

    return None if _kits_own_tokenizer(recipe) else chat.chat_template(recipe, tokenizer_model(recipe, run_dir))


def data_format(recipe, run_dir) -> str:
    """One line for bridge.yaml's header: how the fine-tuning rows are formatted, and why."""
    from vdkit.recipes.bridge import chat

    if _kits_own_tokenizer(recipe):
        return "plain '{input} {output}': the kit's byte-level tokenizer (no chat template)"
    return chat.status(tokenizer_model(recipe, run_dir))


def tokenizer_model(recipe, run_dir) -> str:
    """The HF tokenizer the data is tokenized with, a staged path (the job runs offline: a hub id cannot resolve):
    the staged one (vdkit.recipes.common.staging: data.tokenizer_model, a local model.hf_path); the kit's
    byte-level tokenizer written into the run dir (CPU models); for fine-tuning, the copy
    AutoBridge.import_ckpt keeps in the base checkpoint (``<model.megatron_path>/iter_0000000/tokenizer``);
    else one line saying what to stage."""
    from vdkit.recipes.common import staging

    staged = staging.staged_tokenizer(recipe)
    if staged:
        return staging.require_staged_tokenizer(recipe, "bridge")
    if recipe.model.tokenizer == "byte-level":
        return str(PurePosixPath(run_dir) / TOKENIZER_DIR)
    if recipe.method.name != "pretrain" and recipe.model.megatron_path:
        return str(PurePosixPath(recipe.model.megatron_path) / "iter_0000000" / "tokenizer")
    return staging.require_staged_tokenizer(recipe, "bridge")
