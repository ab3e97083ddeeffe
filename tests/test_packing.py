"""Sequence packing: first-fit-decreasing correctness, efficiency, packed rows, `vdkit data pack`."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from vdkit.cli import main
from vdkit.recipes.common.packing import pack_samples, pack_sequences, tokenize_sft, write_packed


def naive_first_fit_decreasing(lengths, max_len):
    """Oracle: the textbook O(n x bins) scan, to check the segment-tree version against."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins, room = [], []
    for i in order:
        for b, r in enumerate(room):
            if r >= lengths[i]:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_len - lengths[i])
    return bins


def test_known_small_case():
    res = pack_samples([3, 5, 1, 5, 2, 4], 10)
    assert [list(b) for b in res.bins] == [[1, 3], [5, 0, 4, 2]]
    assert res.num_bins == 2 and res.tokens == 20 and res.efficiency == 1.0


@pytest.mark.parametrize("seed,n,max_len", [(0, 1, 8), (1, 50, 16), (2, 500, 64), (3, 2000, 4096)])
def test_matches_naive_ffd_and_invariants(seed, n, max_len):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(0, max_len // 8), rng.randint(1, max_len)]) for _ in range(n)]
    res = pack_samples(lengths, max_len)
    assert [list(b) for b in res.bins] == naive_first_fit_decreasing(lengths, max_len)
    flat = [i for b in res.bins for i in b]
    assert sorted(flat) == list(range(n))                                 # every sample exactly once
    assert all(sum(lengths[i] for i in b) <= max_len for b in res.bins)   # no bin over max_len
    assert all(lengths[b[k]] >= lengths[b[k + 1]] for b in res.bins for k in range(len(b) - 1))  # decreasing
    assert res.efficiency == pytest.approx(sum(lengths) / (res.num_bins * max_len))
    # first fit never opens a bin while an earlier one had room: any two bins together overflow
    fills = [sum(lengths[i] for i in b) for b in res.bins]
    assert all(fills[a] + fills[b] > max_len for a in range(len(fills)) for b in range(a + 1, len(fills))
               if fills[b] > 0)


def test_efficiency_beats_one_sample_per_bin():
    rng = random.Random(5)
    lengths = [max(1, int(rng.expovariate(1 / 115))) for _ in range(3000)]  # Dolly-like: mean ~115 tokens
    res = pack_samples(lengths, 4096)
    assert res.efficiency > 0.95
    assert res.num_bins <= -(-sum(lengths) // 4096) + 2          # near the lower bound ceil(tokens / max_len)
    unpacked = sum(lengths) / (len(lengths) * 4096)
    assert unpacked < 0.05 < res.efficiency


def test_oversize_truncate_and_bad_arguments():
    with pytest.raises(ValueError, match="more than max_len"):
        pack_samples([3, 12], 10)
    res = pack_samples([3, 12, 25], 10, truncate=True)
    assert res.truncated == 2 and res.lengths == (3, 10, 10) and res.num_bins == 3
    for bad in ([1], 0), ([1], -4), ([-1], 10), ([1.5], 10):
        with pytest.raises(ValueError):
            pack_samples(*bad)
    empty = pack_samples([], 10)
    assert empty.num_bins == 0 and empty.efficiency == 0.0


def test_pack_sequences_rows():
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    masks = [[0, 1, 1], [0, 1], [0, 0, 1, 1], [1]]
    rows, res = pack_sequences(ids, 6, masks)
    assert sum(len(r["input_ids"]) for r in rows) == 10
    for row, b in zip(rows, res.bins):
        assert len(row["input_ids"]) <= 6 and len(row["loss_mask"]) == len(row["input_ids"])
        starts = row["seq_start_id"] + [len(row["input_ids"])]
        for k, i in enumerate(b):  # each sample reappears intact at its start offset
            assert row["input_ids"][starts[k]:starts[k + 1]] == ids[i]
            assert row["loss_mask"][starts[k]:starts[k + 1]] == masks[i]
    rows, res = pack_sequences([[1] * 9], 4, truncate=True)
    assert rows == [{"input_ids": [1] * 4, "loss_mask": [1] * 4, "seq_start_id": [0]}]


def _word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["a b c d e f g h"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


def test_cli_pack_jsonl_and_npy(tmp_path, capsys):
    rng = random.Random(0)
    rows = [{"input": " ".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 9))),
             "output": " ".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 5)))} for _ in range(80)]
    src = tmp_path / "training.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = _word_tokenizer(tmp_path / "tokenizer.json")
    n_tokens = sum(len(r["input"].split()) + len(r["output"].split()) for r in rows)  # no EOS in this vocab

    assert main(["data", "pack", str(src), str(tmp_path / "p.jsonl"), "--tokenizer", str(tok), "--max-len", "32"]) == 0
    out = capsys.readouterr().out
    packed = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert sum(len(p["input_ids"]) for p in packed) == n_tokens
    assert sum(len(p["seq_start_id"]) for p in packed) == 80
    assert all(len(p["input_ids"]) <= 32 for p in packed)
    assert sum(sum(p["loss_mask"]) for p in packed) == sum(len(r["output"].split()) for r in rows)
    eff = n_tokens / (len(packed) * 32)
    assert f"{len(packed)} bins of 32: packing efficiency {eff:.4f}" in out

    assert main(["data", "pack", str(src), str(tmp_path / "p.npy"), "--tokenizer", str(tok), "--max-len", "32"]) == 0
    arr = np.load(tmp_path / "p.npy", allow_pickle=True)
    assert [dict(x) for x in arr] == packed

    # too long for --max-len without --truncate: one line, exit 2, nothing written
    assert main(["data", "pack", str(src), str(tmp_path / "q.jsonl"), "--tokenizer", str(tok), "--max-len", "5"]) == 2
    err = capsys.readouterr().err
    assert "exceed --max-len 5" in err and "--truncate" in err and not (tmp_path / "q.jsonl").exists()
    assert main(["data", "pack", str(src), str(tmp_path / "p.npy"), "--tokenizer", str(tok)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["data", "pack", str(src), str(tmp_path / "p.txt"), "--tokenizer", str(tok)]) == 2


def test_tokenize_sft_answer_only_mask(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"input": "a b c", "output": "d e"}) + "\n")
    from vdkit.recipes.common.data_stats import load_tokenizer

    ids, masks = tokenize_sft(src, load_tokenizer(_word_tokenizer(tmp_path / "tok.json")))
    assert len(ids[0]) == 5 and masks == [[0, 0, 0, 1, 1]]


def test_write_packed_rejects_unknown_suffix(tmp_path):
    with pytest.raises(ValueError):
        write_packed(tmp_path / "x.bin", [])
