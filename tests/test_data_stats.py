"""`vdkit data stats`: the design guide's block, counted with tokenizers trained here on our own data."""
from __future__ import annotations

import io
import json
import random

import pytest

from vdkit.cli import main
from vdkit.recipes.common.data_stats import WHITESPACE, dataset_stats, load_tokenizer

from helpers import WORDS, make_rows, word_level_tokenizer, write_rows


@pytest.fixture(scope="module")
def rows():
    return make_rows()


@pytest.fixture(scope="module")
def expected(rows):
    """Independent count: words of "{input} {output}" per row, unique rows by their JSON."""
    counts = [len(r["input"].split()) + len(r["output"].split()) for r in rows]
    return {"samples": len(rows), "unique": len({json.dumps(r, sort_keys=True) for r in rows}),
            "max_tokens": max(counts), "min_tokens": min(counts), "total_tokens": sum(counts),
            "mean_tokens": sum(counts) / len(counts)}


def test_stats_with_word_level_tokenizer_json(tmp_path, capsys, rows, expected):
    f = write_rows(tmp_path / "training.jsonl", rows)
    tok = word_level_tokenizer(tmp_path / "tokenizer.json")
    assert main(["data", "stats", str(f), "--tokenizer", str(tok), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    for key, value in expected.items():
        assert got[key] == value, key
    assert expected["unique"] == len(rows) - 3 and expected["min_tokens"] == 2 and expected["max_tokens"] == 12
    assert "tokenizers" in got["tokenizer"]


def test_text_block_in_design_guide_shape(tmp_path, capsys, rows, expected):
    f = write_rows(tmp_path / "training.jsonl", rows)
    tok = word_level_tokenizer(tmp_path / "tokenizer.json")
    assert main(["data", "stats", str(f), "--tokenizer", str(tok)]) == 0
    out = capsys.readouterr().out
    assert f"total samples: {expected['samples']}" in out
    assert f"unique samples: {expected['unique']}" in out
    assert (f"tokens per sample: max {expected['max_tokens']}, min {expected['min_tokens']}, "
            f"average {expected['mean_tokens']!r}") in out
    assert f"total tokens: {expected['total_tokens']}" in out


def test_field_output_only(tmp_path, rows):
    f = write_rows(tmp_path / "t.jsonl", rows)
    stats = dataset_stats(f, load_tokenizer(word_level_tokenizer(tmp_path / "tokenizer.json")), field="output")
    assert stats.total_tokens == sum(len(r["output"].split()) for r in rows)
    assert stats.min_tokens == 1


def test_no_tokenizer_says_whitespace(tmp_path, capsys, rows, expected):
    f = write_rows(tmp_path / "t.jsonl", rows)
    assert main(["data", "stats", str(f)]) == 0
    out = capsys.readouterr().out
    assert f"tokenizer: {WHITESPACE}" in out and "whitespace words" in out
    assert f"total tokens: {expected['total_tokens']}" in out


def test_sentencepiece_model(tmp_path, capsys):
    import sentencepiece as spm

    rng = random.Random(1)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=40,
                                   model_type="bpe", minloglevel=2)
    model = tmp_path / "tokenizer.model"
    model.write_bytes(buf.getvalue())
    rows = [{"input": corpus[i], "output": corpus[i + 1][:30]} for i in range(0, 40, 2)]
    f = write_rows(tmp_path / "t.jsonl", rows)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    counts = [len(sp.encode(f"{r['input']} {r['output']}")) for r in rows]
    assert main(["data", "stats", str(f), "--tokenizer", str(model), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["total_tokens"] == sum(counts) and got["max_tokens"] == max(counts)
    assert got["min_tokens"] == min(counts) and got["samples"] == 20
    # BPE merges words into fewer pieces than characters, more than words: it really tokenized
    assert sum(len(r["input"].split()) + len(r["output"].split()) for r in rows) <= got["total_tokens"]
    assert got["total_tokens"] < sum(len(r["input"]) + len(r["output"]) for r in rows)
    assert got["tokenizer"].startswith("sentencepiece")
    # a directory holding only tokenizer.model (Meta's layout) falls back to SentencePiece
    assert main(["data", "stats", str(f), "--tokenizer", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_tokens"] == sum(counts)


def test_hugging_face_tokenizer_directory(tmp_path, rows, expected):
    from transformers import PreTrainedTokenizerFast

    tok_json = word_level_tokenizer(tmp_path / "src.json")
    hf_dir = tmp_path / "hf"
    PreTrainedTokenizerFast(tokenizer_file=str(tok_json), unk_token="[UNK]", eos_token="</s>").save_pretrained(hf_dir)
    f = write_rows(tmp_path / "t.jsonl", rows)
    tok = load_tokenizer(hf_dir)
    assert tok.name.startswith("transformers") and tok.eos_id == 1
    stats = dataset_stats(f, tok)
    assert stats.total_tokens == expected["total_tokens"] and stats.unique == expected["unique"]


@pytest.mark.parametrize("content,line,needle", [
    ('{"input": "a", "output": "b"}\n{"input": "a", "output": \n', 2, "malformed JSON"),
    ('{"input": "a", "output": "b"}\n\n{"input": "a"}\n', 3, "'output'"),
    ('{"input": "a", "output": 3}\n', 1, "'output'"),
    ('["input", "output"]\n', 1, "not a JSON object"),
])
def test_bad_rows_name_file_and_line(tmp_path, capsys, content, line, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    assert main(["data", "stats", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:{line}:" in err and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_empty_file_missing_file_bad_tokenizer(tmp_path, capsys):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n")
    assert main(["data", "stats", str(f)]) == 2
    assert f"{f}: file is empty" in capsys.readouterr().err
    assert main(["data", "stats", str(tmp_path / "none.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    good = write_rows(tmp_path / "g.jsonl", make_rows(3))
    assert main(["data", "stats", str(good), "--tokenizer", str(tmp_path / "missing.model")]) == 2
    assert "no such tokenizer" in capsys.readouterr().err
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    assert main(["data", "stats", str(good), "--tokenizer", str(junk)]) == 2
    assert "not a SentencePiece model" in capsys.readouterr().err
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    assert main(["data", "stats", str(good), "--tokenizer", str(empty_dir)]) == 2
    assert "not a tokenizer directory" in capsys.readouterr().err


def test_prepare_then_stats_end_to_end(tmp_path, capsys):
    """A prepared Dolly file counts as many rows as prepare wrote."""
    src = tmp_path / "dolly.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"q {i}", "context": "", "response": f"a {i % 4}",
                                       "category": "x"}) + "\n" for i in range(50)))
    assert main(["data", "prepare", "dolly", str(src), str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main(["data", "stats", str(tmp_path / "o" / "training.jsonl"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["samples"] == 40 and got["unique"] == 40
    # "Question: q N\n\nAnswer:" + " " + "a M" -> 6 whitespace words each
    assert got["min_tokens"] == got["max_tokens"] == 6 and got["total_tokens"] == 240
