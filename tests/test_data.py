"""vdkit.recipes.common.dataprep (`vdkit data prepare`): the three public formats, deterministic disjoint splits, bad
data; and under hostile conditions (issue 12 items 4, 9, 15): racing writers, unreadable files, modes.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vdkit.composition import files
from vdkit.cli import main
from vdkit.composition.files import DirLock
from vdkit.recipes.common import dataprep as data
from vdkit.recipes.common.dataprep import MANIFEST_FILE, PREPARE_LOCK, SPLIT_FILES


def _dolly(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"instruction": f"question {i} " + "word " * 40, "context": "",
                                        "response": f"answer {i}", "category": "open_qa"}) + "\n"
                            for i in range(n)))
    return path


def _unreadable(tmp_path: Path) -> Path:
    """A regular file this process cannot read, even as root (a write-only procfs file)."""
    if os.geteuid() == 0:
        p = Path("/proc/sys/vm/compact_memory")
        if not p.is_file():
            pytest.skip("no write-only procfs file to stand for an unreadable file as root")
        return p
    p = tmp_path / "secret.jsonl"
    p.write_text('{"input": "a", "output": "b"}\n')
    p.chmod(0)
    return p


@pytest.mark.parametrize("argv", [["data", "stats"], ["data", "pack"], ["data", "prepare", "dolly"]])
def test_unreadable_file_is_one_line_not_a_traceback(tmp_path, capsys, argv):
    bad = _unreadable(tmp_path)
    extra = {"stats": [str(bad)], "pack": [str(bad), str(tmp_path / "p.jsonl"), "--tokenizer", str(bad)],
             "prepare": [str(bad), str(tmp_path / "out")]}[argv[1]]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "fix:" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if bad.parent != tmp_path else [bad.name])


def test_prepared_files_follow_the_umask(tmp_path, capsys):
    src = _dolly(tmp_path / "dolly.jsonl", 20)
    old = os.umask(0o022)
    try:
        assert main(["data", "prepare", "dolly", str(src), str(tmp_path / "a")]) == 0
        os.umask(0o002)
        assert main(["data", "prepare", "dolly", str(src), str(tmp_path / "b")]) == 0
    finally:
        os.umask(old)
    for d, mode in (("a", 0o644), ("b", 0o664)):
        for name in [*SPLIT_FILES.values(), MANIFEST_FILE]:
            assert stat.S_IMODE((tmp_path / d / name).stat().st_mode) == mode, (d, name)
        assert not (tmp_path / d / PREPARE_LOCK).exists()


def test_a_second_prepare_while_one_writes_is_refused(tmp_path, capsys):
    src = _dolly(tmp_path / "dolly.jsonl", 20)
    out = tmp_path / "out"
    out.mkdir()
    with DirLock(out, PREPARE_LOCK, "held", "wait"):  # stands for a prepare in progress
        assert main(["data", "prepare", "dolly", str(src), str(out), "--force"]) == 2
        err = capsys.readouterr().err.strip()
        assert "another `vdkit data prepare` is writing there now" in err and len(err.splitlines()) == 1
        assert [p.name for p in out.iterdir()] == [PREPARE_LOCK]
    assert list(out.iterdir()) == []
    assert main(["data", "prepare", "dolly", str(src), str(out)]) == 0


def test_two_racing_prepares_one_wins_whole_the_other_is_refused(tmp_path):
    """Two real processes, different seeds, started together: exactly one exits 0 and its files are
    all there (manifest and splits agree); the other exits 2 with one line."""
    src = _dolly(tmp_path / "dolly.jsonl", 30000)  # about a second of reading: the two overlap
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "vdkit", "data", "prepare", "dolly", str(src), str(out),
                               "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read(), seed) for p, seed in zip(procs, (1, 2))]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    winner = next(seed for rc, _, seed in results if rc == 0)
    loser_err = next(err for rc, err, _ in results if rc == 2).strip()
    assert len(loser_err.splitlines()) == 1 and "Traceback" not in loser_err
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["seed"] == winner
    for name, fname in SPLIT_FILES.items():
        lines = (out / fname).read_text().splitlines()
        assert len(lines) == manifest["written"][name]
    assert sorted(p.name for p in out.iterdir()) == sorted([*SPLIT_FILES.values(), MANIFEST_FILE])


def dolly_records(n=20):
    recs = []
    for i in range(n):
        recs.append({"instruction": f"What is item {i}?", "context": f"Item {i} is a thing." if i % 2 else "",
                     "response": f"It is thing {i}.", "category": "open_qa"})
    return recs


def write_jsonl(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def alpaca_records(n=20):
    return [{"instruction": f"Do task {i}", "input": f"data {i}" if i % 3 == 0 else "", "output": f"done {i}"}
            for i in range(n)]


def pubmedqa_records(n=20):
    decisions = ["yes", "no", "maybe"]
    return {str(10000000 + i): {"QUESTION": f"Does drug {i} work?",
                                "CONTEXTS": [f"Background {i}.", f"Methods {i}."],
                                "LABELS": ["BACKGROUND", "METHODS"], "MESHES": ["Humans"],
                                "YEAR": "2001", "reasoning_required_pred": "yes", "reasoning_free_pred": "yes",
                                "final_decision": decisions[i % 3], "LONG_ANSWER": f"Drug {i} conclusion."}
            for i in range(n)}


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run_cli(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def all_rows(out_dir: Path):
    return {name: read_jsonl(out_dir / fname) for name, fname in data.SPLIT_FILES.items()}


# ------------------------------------------------------------------ formats

def test_dolly_template_drops_and_report(tmp_path, capsys):
    recs = dolly_records(20)
    recs[4]["response"] = "   "          # dropped: empty response
    recs[7]["instruction"] = ""           # dropped: empty instruction
    src = write_jsonl(tmp_path / "databricks-dolly-15k.jsonl", recs)
    out = tmp_path / "out"
    rc, stdout, err = run_cli(["data", "prepare", "dolly", str(src), str(out), "--seed", "7"], capsys)
    assert rc == 0, err
    rows = [r for split in all_rows(out).values() for r in split]
    assert len(rows) == 18
    assert all(set(r) == {"input", "output"} for r in rows)
    by_output = {r["output"]: r["input"] for r in rows}
    assert by_output["It is thing 1."] == "Context: Item 1 is a thing.\n\nQuestion: What is item 1?\n\nAnswer:"
    assert by_output["It is thing 2."] == "Question: What is item 2?\n\nAnswer:"
    assert "It is thing 7." not in by_output
    assert "20 rows read" in stdout
    assert "empty response" in stdout and "empty instruction" in stdout
    manifest = json.loads((out / data.MANIFEST_FILE).read_text())
    assert manifest["dropped"] == {"empty response": 1, "empty instruction": 1}
    assert sum(manifest["written"].values()) == 18 and manifest["rows_read"] == 20
    assert manifest["templates"]["input"] == data.DOLLY_TEMPLATE


def test_alpaca_list_with_and_without_input(tmp_path, capsys):
    recs = alpaca_records(12)
    recs[5]["output"] = ""
    src = tmp_path / "alpaca_data.json"
    src.write_text(json.dumps(recs, indent=4), encoding="utf-8")  # the public file is indented
    rc, stdout, err = run_cli(["data", "prepare", "alpaca", str(src), str(tmp_path / "o")], capsys)
    assert rc == 0, err
    rows = {r["output"]: r["input"] for split in all_rows(tmp_path / "o").values() for r in split}
    assert len(rows) == 11 and "done 5" not in rows
    assert rows["done 3"] == data.ALPACA_TEMPLATE.format(instruction="Do task 3", input="data 3")
    assert rows["done 4"] == data.ALPACA_TEMPLATE_NO_INPUT.format(instruction="Do task 4")
    assert "### Response:" in rows["done 4"] and "### Input:" not in rows["done 4"]
    assert "empty output" in stdout


def test_pubmedqa_dict_keyed_by_pmid(tmp_path, capsys):
    recs = pubmedqa_records(9)
    recs["10000002"]["final_decision"] = "unclear"      # dropped
    src = tmp_path / "ori_pqaa.json"
    src.write_text(json.dumps(recs), encoding="utf-8")
    rc, stdout, err = run_cli(["data", "prepare", "pubmedqa", str(src), str(tmp_path / "o")], capsys)
    assert rc == 0, err
    rows = [r for split in all_rows(tmp_path / "o").values() for r in split]
    assert len(rows) == 8
    row = next(r for r in rows if "drug 1 " in r["input"])
    assert row["input"] == ("QUESTION: Does drug 1 work?\nCONTEXT: Background 1. Methods 1.\n"
                            "TARGET: the answer to the question given the context is (yes|no|maybe):")
    assert row["output"] == "no. Drug 1 conclusion."
    assert "final_decision not yes/no/maybe" in stdout


# ------------------------------------------------------------------ splits

def test_splits_deterministic_disjoint_and_sized(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", dolly_records(101))
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        rc, _, err = run_cli(["data", "prepare", "dolly", str(src), str(tmp_path / name), "--seed", str(seed),
                              "--split", "0.7,0.2,0.1"], capsys)
        assert rc == 0, err
    a, b, c = (all_rows(tmp_path / n) for n in "abc")
    assert a == b                                     # same seed: identical files
    assert a["train"] != c["train"]                   # another seed: another order
    assert [len(a[k]) for k in ("train", "validation", "test")] == [71, 20, 10]
    keys = {k: {r["output"] for r in v} for k, v in a.items()}
    assert not (keys["train"] & keys["validation"]) and not (keys["train"] & keys["test"])
    assert not (keys["validation"] & keys["test"])
    assert len(keys["train"] | keys["validation"] | keys["test"]) == 101
    # the shuffle really shuffles (not file order)
    assert [r["output"] for r in a["train"][:10]] != [f"It is thing {i}." for i in range(10)]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 15011])
def test_split_counts_sum_to_n(n):
    counts = data.split_counts(n, (0.8, 0.1, 0.1))
    assert sum(counts) == n and min(counts) >= 0
    assert abs(counts[0] - 0.8 * n) <= 1


def test_split_file_names_match_conf():
    conf = Path(__file__).resolve().parents[1] / "conf" / "data"
    for name in data.DATASETS:
        cfg = yaml.safe_load((conf / f"{name}.yaml").read_text())
        assert cfg["train_files"] == [data.SPLIT_FILES["train"]]
        assert cfg["validation_files"] == [data.SPLIT_FILES["validation"]]
        assert cfg["test_files"] == [data.SPLIT_FILES["test"]]


@pytest.mark.parametrize("split", ["0.8,0.1", "0.8,0.3,0.1", "a,b,c", "0,0.5,0.5", "1.2,-0.1,-0.1"])
def test_bad_split_is_user_error(tmp_path, capsys, split):
    src = write_jsonl(tmp_path / "d.jsonl", dolly_records(5))
    rc, out, err = run_cli(["data", "prepare", "dolly", str(src), str(tmp_path / "o"), "--split", split], capsys)
    assert rc == 2 and "--split" in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ bad data: file and line, nothing written

def _assert_nothing_written(out: Path, before=()):
    assert not out.exists() or sorted(os.listdir(out)) == sorted(before)


def test_malformed_jsonl_line_names_file_and_line(tmp_path, capsys):
    src = tmp_path / "dolly.jsonl"
    lines = [json.dumps(r) for r in dolly_records(5)]
    lines[2] = lines[2][:-5]  # cut off: line 3 is malformed
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    rc, _, err = run_cli(["data", "prepare", "dolly", str(src), str(out)], capsys)
    assert rc == 2
    assert f"{src}:3:" in err and "malformed JSON" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    _assert_nothing_written(out)


def test_missing_field_names_line_and_keeps_out_dir_clean(tmp_path, capsys):
    recs = dolly_records(6)
    del recs[4]["context"]
    src = write_jsonl(tmp_path / "dolly.jsonl", recs)
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    rc, _, err = run_cli(["data", "prepare", "dolly", str(src), str(out)], capsys)
    assert rc == 2 and f"{src}:5:" in err and "'context'" in err
    _assert_nothing_written(out, before=["keep.txt"])


def test_alpaca_missing_field_names_the_records_line(tmp_path, capsys):
    recs = alpaca_records(4)
    del recs[2]["output"]
    src = tmp_path / "alpaca.json"
    text = json.dumps(recs, indent=4)
    src.write_text(text)
    # independent: the line where the third record's opening brace sits
    third = [i for i, line in enumerate(text.splitlines(), 1) if line.strip() == "{"][2]
    rc, _, err = run_cli(["data", "prepare", "alpaca", str(src), str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{src}:{third}:" in err and "'output'" in err
    _assert_nothing_written(tmp_path / "o")


def test_pubmedqa_wrong_type_and_malformed(tmp_path, capsys):
    recs = pubmedqa_records(3)
    recs["10000001"]["CONTEXTS"] = "not a list"
    src = tmp_path / "p.json"
    text = json.dumps(recs, indent=2)
    src.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if '"10000001"' in ln)
    rc, _, err = run_cli(["data", "prepare", "pubmedqa", str(src), str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{src}:{line}:" in err and "CONTEXTS" in err
    recs["10000001"]["CONTEXTS"] = ["fixed"]
    text = json.dumps(recs, indent=2)
    src.write_text(text.replace('"QUESTION": "Does drug 2 work?",', '"QUESTION": "Does drug 2 work?"', 1))
    line2 = next(i for i, ln in enumerate(text.splitlines(), 1) if "drug 2 work" in ln) + 1
    rc, _, err = run_cli(["data", "prepare", "pubmedqa", str(src), str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{src}:{line2}:" in err and "malformed JSON" in err
    # a list where a dict keyed by PMID belongs
    src.write_text(json.dumps(list(recs.values())))
    rc, _, err = run_cli(["data", "prepare", "pubmedqa", str(src), str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{src}:1:" in err and "keyed by" in err
    _assert_nothing_written(tmp_path / "o")


@pytest.mark.parametrize("dataset,content", [("dolly", ""), ("dolly", "\n\n"), ("alpaca", "[]"), ("pubmedqa", "{}")])
def test_empty_file_is_user_error(tmp_path, capsys, dataset, content):
    src = tmp_path / "in.json"
    src.write_text(content)
    rc, _, err = run_cli(["data", "prepare", dataset, str(src), str(tmp_path / "o")], capsys)
    assert rc == 2 and str(src) in err and ("empty" in err or "no records" in err)
    _assert_nothing_written(tmp_path / "o")


def test_missing_input_and_existing_output(tmp_path, capsys):
    rc, _, err = run_cli(["data", "prepare", "dolly", str(tmp_path / "nope.jsonl"), str(tmp_path / "o")], capsys)
    assert rc == 2 and "no such file" in err
    src = write_jsonl(tmp_path / "d.jsonl", dolly_records(10))
    assert run_cli(["data", "prepare", "dolly", str(src), str(tmp_path / "o")], capsys)[0] == 0
    before = (tmp_path / "o" / "training.jsonl").read_text()
    rc, _, err = run_cli(["data", "prepare", "dolly", str(src), str(tmp_path / "o"), "--seed", "9"], capsys)
    assert rc == 2 and "--force" in err
    assert (tmp_path / "o" / "training.jsonl").read_text() == before
    rc, _, err = run_cli(["data", "prepare", "dolly", str(src), str(tmp_path / "o"), "--seed", "9", "--force"], capsys)
    assert rc == 0 and (tmp_path / "o" / "training.jsonl").read_text() != before


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "d.jsonl", dolly_records(10))
    calls = []
    real_fsync = os.fsync

    def flaky_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:  # the third output file fails (e.g. disk full)
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", flaky_fsync)  # vdkit.composition.files.replace_all writes every output
    out = tmp_path / "new" / "o"
    with pytest.raises(OSError):
        data.prepare("dolly", src, out)
    assert not out.exists()


def test_pubmedqa_blog_fields_prompt_and_80_20_split(tmp_path, capsys):
    recs = pubmedqa_records(10)
    recs["10000003"]["LONG_ANSWER"] = " "  # dropped: no answer to train on
    src = tmp_path / "ori_pqaa.json"
    src.write_text(json.dumps(recs), encoding="utf-8")
    rc, stdout, err = run_cli(["data", "prepare", "pubmedqa_blog", str(src), str(tmp_path / "o")], capsys)
    assert rc == 0, err
    splits = all_rows(tmp_path / "o")
    assert [len(splits[k]) for k in ("train", "validation", "test")] == [7, 0, 2]  # the blog's test_split 0.2 of 9
    row = next(r for split in splits.values() for r in split if "drug 1 " in r["input"])
    assert row == {"input": "Context: Background 1. Methods 1.\n\nQuestion: Does drug 1 work?\n\nAnswer:",
                   "output": "Drug 1 conclusion."}  # the conclusion, not the yes/no decision
    assert "empty LONG_ANSWER" in stdout and "split 0.8,0,0.2" in stdout


def test_a_model_with_its_own_tokenizer_reads_the_staged_hf_path_never_the_byte_level_one(tmp_path):
    """engine=reference / megatron took the tokenizer from data.tokenizer_model or the data directory only: the
    shipped Llama 3.1 MI300X cells (model.tokenizer huggingface, the staged model.hf_path holding it, data prepared
    as docs/reproducing.md says) tokenized every row into the kit's byte ids and trained on them, and `vdkit
    check` said 'tokenizer byte-level (built in) loaded as the job loads it'. The staged directory is read now;
    a byte-level model (tiny_llama) keeps its own tokenizer whatever hf_path holds."""
    from helpers import prepared_dolly, tiny_chat_tokenizer
    from vdkit.composition.config import compose
    from vdkit.recipes.common.data import load_tokenizer

    hf = tiny_chat_tokenizer(tmp_path / "hf", template=None)
    dolly = prepared_dolly(tmp_path, False)
    base = ["engine=reference", "model=tiny_llama", "data=dolly", f"data.data_dir={dolly}", f"model.hf_path={hf}"]
    recipe = compose(base + ["model.tokenizer=huggingface"])
    tok = load_tokenizer(recipe)
    assert str(hf) in tok.name and tok.encode_one("hi") != [ord("h") + 3, ord("i") + 3]  # not the byte ids
    assert load_tokenizer(compose(base)).name == "byte-level (built in)"  # tiny_llama: its own
    from vdkit.recipes.common.data import tokenizer_source

    assert tokenizer_source(recipe) == ("model.hf_path", hf)
    gone = compose(base + ["model.tokenizer=huggingface", f"model.hf_path={tmp_path / 'gone'}"])
    with pytest.raises(Exception, match="model.hf_path: .*no such tokenizer"):
        load_tokenizer(gone)  # one line naming the key, never the byte-level fallback
