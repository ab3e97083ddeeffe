"""Instruct models on Bridge: the tokenizer's own chat template, the loss on the assistant's turn only.

The kit's other engines format an Instruct sample with the tokenizer's ``chat_template``
(:mod:`vdkit.recipes.common.chat`). Bridge 0.3.1 does so in its chat dataset: ``dataset_kwargs`` ``chat: true``
and ``use_hf_tokenizer_chat_template: true`` make ``create_sft_dataset`` build ``GPTSFTChatDataset``
(``data/datasets/sft.py``), which reads each row's ``messages`` (``vdkit data prepare --chat`` writes them beside
``input`` / ``output``) and formats it with ``apply_chat_template`` (``data/datasets/utils.py`` ``_chat_preprocess``).
Its loss mask is transformers' ``assistant_masks`` - but only where the template marks the assistant's text with
``{% generation %}`` (``GENERATION_REGEX``); without the marker every token is trained, prompt included, and no
stock Llama 3.x or Qwen2.5 template has it. So bridge.yaml's ``tokenizer.chat_template`` (Bridge's TokenizerConfig
field, set on the tokenizer after loading) is the tokenizer's own template wrapped by :func:`assistant_only`: the
same text, rendered by the same template, with the part after the generation prompt marked - the answer and its
end-of-turn, as the other engines' loss covers.

The render reads the template from the staged tokenizer (``chat_template.jinja``, else ``tokenizer_config.json``'s
``chat_template``; standard library only). Where that directory is not on the render's machine the data stays
NeMo's plain ``"{input} {output}"`` and bridge.yaml's header says so: render where the staged tokenizer is readable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

from vdkit.errors import UserError
from vdkit.recipes.common.chat import MESSAGES_KEY  # the row key Bridge's chat dataset reads (_convert_to_openai_messages)

TEMPLATE_FILE = "chat_template.jinja"  # transformers' own file for a tokenizer's template (read first, as it does)
TOKENIZER_CONFIG = "tokenizer_config.json"
DATASET_KWARGS = {"chat": True, "use_hf_tokenizer_chat_template": True}  # create_sft_dataset's switches
_OWN = "vdkit_own_template"  # the wrapped template's macro name (unlikely to clash with a template's own names)


def own_template(tokenizer_dir) -> Tuple[Optional[str], str]:
    """(the chat template of the HF tokenizer in ``tokenizer_dir`` or None, what was found): None with "unreadable"
    where the directory is not on this machine, with "none" where the tokenizer carries no template."""
    d = Path(str(tokenizer_dir))
    try:
        if (d / TEMPLATE_FILE).is_file():
            return (d / TEMPLATE_FILE).read_text(encoding="utf-8"), str(d / TEMPLATE_FILE)
        if not (d / TOKENIZER_CONFIG).is_file():
            return None, "unreadable"
        template = json.loads((d / TOKENIZER_CONFIG).read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None, "unreadable"
    if isinstance(template, list):  # several named templates: transformers' "default" one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return (template, str(d / TOKENIZER_CONFIG)) if isinstance(template, str) and template.strip() else (None, "none")


def assistant_only(template: str) -> str:
    """``template`` with the last assistant turn marked ``{% generation %}``: the conversation before it rendered
    with the generation prompt, then the rest of the whole conversation (the answer and the template's end of
    turn) inside the marker. Text and tokens are the template's own; a conversation that does not end with the
    assistant, or a generation prompt, renders as the template does; a template whose conversation does not
    start with its own generation prompt raises (the answer cannot be told from the prompt, as the kit's other
    engines refuse: :func:`vdkit.recipes.common.chat.chat_ids`)."""
    return (
        # no whitespace control at the template's edges: its text is rendered as it would be on its own
        f"{{% macro {_OWN}(messages, add_generation_prompt) %}}{template}{{% endmacro %}}"
        "{%- if add_generation_prompt or not messages or messages[-1]['role'] != 'assistant' -%}"
        f"{{{{- {_OWN}(messages, add_generation_prompt) -}}}}"
        "{%- else -%}"
        f"{{%- set vdkit_prompt = {_OWN}(messages[:-1], true) -%}}"
        f"{{%- set vdkit_full = {_OWN}(messages, false) -%}}"
        "{%- if not vdkit_full.startswith(vdkit_prompt) -%}"
        "{{- raise_exception(\"the chat template renders the assistant's turn differently from its generation prompt\") -}}"
        "{%- endif -%}"
        "{{- vdkit_prompt -}}{%- generation -%}{{- vdkit_full[vdkit_prompt|length:] -}}{%- endgeneration -%}"
        "{%- endif -%}")


def chat_template(recipe, tokenizer_path: str) -> Optional[str]:
    """bridge.yaml's ``tokenizer.chat_template`` for a fine-tuning ``recipe`` whose tokenizer (``tokenizer_path``)
    carries a chat template: :func:`assistant_only` of it; None for plain ``"{input} {output}"`` data
    (pretraining, a tokenizer without a template or not readable here)."""
    if recipe.method.name == "pretrain":
        return None
    template, _where = own_template(tokenizer_path)
    return assistant_only(template) if template else None


def status(tokenizer_path: str) -> str:
    """One line for bridge.yaml's header: how the fine-tuning data is formatted, and why."""
    template, where = own_template(tokenizer_path)
    if template:
        return (f"chat: the tokenizer's own template ({where}), loss on the assistant's turn only "
                "(dataset_kwargs chat / use_hf_tokenizer_chat_template, tokenizer.chat_template)")
    if where == "none":
        return "plain '{input} {output}': the tokenizer carries no chat template"
    return (f"plain '{{input}} {{output}}': the tokenizer {tokenizer_path} is not readable where this was rendered, so "
            "whether it carries a chat template (Instruct models' do) is not known; render where it is readable to "
            "fine-tune on its template")


def require_messages(recipe, root) -> None:
    """Bridge's chat dataset reads ``messages`` rows: refuse (one line) prepared data whose first training row has
    none, where the file is on this machine (the job's pre-flight cannot tell a row's keys)."""
    from vdkit.recipes.bridge.data import TRAIN_FILE

    path = Path(str(root)) / TRAIN_FILE
    try:
        with path.open(encoding="utf-8") as fh:
            first = json.loads(fh.readline() or "{}")
    except (OSError, ValueError):
        return  # not here (cluster storage) or not JSON: the pre-flight and Bridge's reader say so
    if isinstance(first, dict) and not first.get(MESSAGES_KEY):
        raise UserError(f"{path} has no '{MESSAGES_KEY}' rows, and {recipe.model.name}'s tokenizer carries a chat "
                        f"template: Bridge's chat dataset reads each row's '{MESSAGES_KEY}'",
                        "prepare the data again with them: vdkit data prepare NAME SOURCE DATA_DIR --chat --force")
