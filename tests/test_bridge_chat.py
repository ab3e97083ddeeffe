"""Instruct models on engine=bridge fine-tune on the tokenizer's own chat template (issue 36 item 3), as the
reference and megatron engines do (tests/test_chat_template.py): `vdkit data prepare --chat` writes ``messages``
rows, the render sets Bridge's chat dataset and the tokenizer's template with its assistant turn marked
(vdkit.recipes.bridge.chat), and Bridge's own GPTSFTChatDataset then trains exactly the tokens the reference
path's chat.py trains: the answer and its end-of-turn. The tokenizer is made here (no download)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import prepared_dolly as _prepared
from helpers import tiny_chat_tokenizer as _tiny_chat_tokenizer
from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.errors import UserError


def _render(tmp_path: Path, data_dir: Path, tok: Path) -> Path:
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import render_run

    recipe = compose(["engine=bridge", "model=tiny_llama", "method=sft", "data=dolly", f"data.data_dir={data_dir}",
                      f"data.tokenizer_model={tok}", "model.megatron_path=/shared/tiny-bridge", "train.max_steps=4"])
    return render_run(make_plan(recipe), tmp_path / "runs", check_mounts=False)


def test_prepare_chat_writes_each_rows_conversation(tmp_path):
    plain, chat = _prepared(tmp_path, False), _prepared(tmp_path, True)
    for name in ("training.jsonl", "validation.jsonl", "test.jsonl"):
        rows = [json.loads(x) for x in (chat / name).read_text().splitlines()]
        assert [{"input": r["input"], "output": r["output"]} for r in rows] == \
            [json.loads(x) for x in (plain / name).read_text().splitlines()]  # the same rows, same order
        assert all(r["messages"] == [{"role": "user", "content": r["input"]},
                                     {"role": "assistant", "content": r["output"]}] for r in rows)
    assert json.loads((chat / "prepare.json").read_text())["messages"] is True


def test_a_chat_tokenizer_renders_bridges_chat_dataset(tmp_path):
    tok = _tiny_chat_tokenizer(tmp_path / "tok")
    run_dir = _render(tmp_path, _prepared(tmp_path, True), tok)
    text = (run_dir / "bridge.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["dataset"]["dataset_kwargs"] == {"chat": True, "use_hf_tokenizer_chat_template": True}
    template = cfg["tokenizer"]["chat_template"]
    assert (tok / "chat_template.jinja").read_text() in template and "{%- generation -%}" in template
    assert "# Fine-tuning rows: chat: the tokenizer's own template" in text


def test_chat_data_without_messages_is_refused_in_one_line(tmp_path):
    tok = _tiny_chat_tokenizer(tmp_path / "tok")
    with pytest.raises(UserError) as err:
        _render(tmp_path, _prepared(tmp_path, False), tok)
    assert "has no 'messages' rows" in str(err.value) and "--chat" in str(err.value) and "\n" not in str(err.value)


def test_a_tokenizer_without_a_template_keeps_the_plain_format(tmp_path):
    run_dir = _render(tmp_path, _prepared(tmp_path, False), _tiny_chat_tokenizer(tmp_path / "tok", template=None))
    cfg = yaml.safe_load((run_dir / "bridge.yaml").read_text())
    assert cfg["dataset"]["dataset_kwargs"]["prompt_template"] == "{input} {output}"
    assert "chat_template" not in cfg["tokenizer"]


@pytest.mark.slow  # Bridge imported under the CPU shim and its check (~15-25 s on 2 loaded cores)
def test_bridges_chat_dataset_trains_what_the_reference_path_trains(tmp_path):
    """Bridge's own GPTSFTChatDataset, built from the rendered bridge.yaml on `vdkit data prepare --chat` rows:
    the token ids and the trained positions of every row equal the reference path's (recipes/common/chat.py);
    `vdkit check` of the render passes (its first micro-batch through the same dataset)."""
    pytest.importorskip("megatron.core")
    from vdkit.recipes import engines
    from vdkit.recipes.common import data as rdata

    tok_dir = _tiny_chat_tokenizer(tmp_path / "tok")
    data_dir = _prepared(tmp_path, True)
    run_dir = _render(tmp_path, data_dir, tok_dir)
    (report,) = engines.get("bridge").check_runs([run_dir])
    assert not report.defects and "GPTSFTChatDataset.collate_fn" in report.text(), report.text()

    from vdkit.recipes.bridge.runcheck import _import_bridge, load

    _import_bridge()
    from megatron.bridge.data.datasets.sft import create_sft_dataset
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    cfg = load(run_dir)
    ds = create_sft_dataset(data_dir / "training.jsonl", build_tokenizer(cfg.tokenizer), seq_length=cfg.dataset.seq_length,
                            **cfg.dataset.dataset_kwargs)
    assert type(ds).__name__ == "GPTSFTChatDataset"
    ref_tok = rdata.load_tokenizer(compose(["engine=reference", "model=tiny_llama", "data=synthetic", "method=sft",
                                            f"data.tokenizer_model={tok_dir}"]))
    hf = ref_tok.tok.tok
    rows = [json.loads(x) for x in (data_dir / "training.jsonl").read_text().splitlines()]
    assert len(ds) == len(rows)
    for i, row in enumerate(rows):
        ex = ds[i]
        ref = rdata.encode_sample(ref_tok, row["input"], row["output"], cfg.dataset.seq_length, answer_only=True)
        assert ex["input_ids"].tolist() == list(ref.ids)
        trained = [j for j, m in enumerate(ex["loss_mask"].tolist()) if m]
        assert trained == [j for j, label in enumerate(ref.labels) if label != rdata.IGNORE]
        assert hf.decode([ref.ids[j] for j in trained]) == row["output"] + "<|eot|>"
    # and as the step sees it: the collated labels under the loss are the answer and its end-of-turn
    batch = ds.collate_fn([ds[0]])
    got = [t for t, m in zip(batch["labels"][0].tolist(), batch["loss_mask"][0].tolist()) if m]
    assert hf.decode(got) == rows[0]["output"] + "<|eot|>"


def test_llama31s_own_template_marked_keeps_its_text_and_masks_the_answer(tmp_path):
    """Llama 3.1 Instruct's template (Bridge's copy, training/tokenizers/multimodal_tokenizer.py) wrapped by
    assistant_only: the same ids as the template itself, and transformers' assistant mask - what Bridge's chat
    dataset trains - exactly the answer and <|eot_id|>, the positions chat.py trains."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("megatron.core")  # its location only: importing megatron-core takes seconds
    if spec is None:
        pytest.skip("megatron-core (the bridge extra) is not installed")
    from transformers import AutoTokenizer

    from vdkit.recipes.bridge.chat import assistant_only
    from vdkit.recipes.common.chat import chat_ids, messages

    src = (Path(spec.origin).parents[1] / "bridge" / "training" / "tokenizers" / "multimodal_tokenizer.py").read_text()
    template = next(n.value.value for n in ast.parse(src).body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "llama3p1_chat_template")
    hf = AutoTokenizer.from_pretrained(str(_tiny_chat_tokenizer(tmp_path / "tok", template=template)))
    prompt, full = chat_ids(hf, "What is 2+2?", "It is 4.")
    out = hf.apply_chat_template(messages("What is 2+2?", "It is 4."), chat_template=assistant_only(template),
                                 tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert out["input_ids"] == full
    trained = [i for i, m in enumerate(out["assistant_masks"]) if m]
    assert trained == list(range(len(prompt), len(full)))
    assert hf.decode([full[i] for i in trained]) == "It is 4.<|eot_id|>"
