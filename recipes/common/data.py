"""Data for the reference engine: tokenizer, samples, and the deterministic batch order.

Samples follow NeMo's SFT conventions: JSONL rows with ``input`` and ``output``, the text is
``"{input} {output}"`` (NeMo's default prompt_template), BOS first and EOS last, the input is
truncated first when a sample is too long (``truncation_field: input``), and for fine-tuning the
loss covers only the output (``answer_only_loss``). ``method=pretrain`` learns every token.

``data=synthetic`` writes a learnable instruction -> response task (seeded, no download) into the
run directory and then reads it like any prepared dataset.

The batch order is a pure function of the step (like NeMo's MegatronPretrainingSampler, which
starts from ``consumed_samples``): a resumed run continues exactly where the checkpoint left off.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from vdkit.errors import UserError
from vdkit.recipes.common.dataprep import SPLIT_FILES

IGNORE = -100  # label value the loss skips (Hugging Face / PyTorch convention)
SYNTHETIC_ROWS = 2048
SYNTHETIC_DIR = "data/synthetic"  # inside the run directory
TRAIN_FILE = SPLIT_FILES["train"]  # what `vdkit data prepare` writes (vdkit.recipes.common.dataprep)
VALIDATION_FILE = SPLIT_FILES["validation"]


# ----------------------------------------------------------------------------- tokenizers
class ByteTokenizer:
    """Byte-level ids: 0 pad, 1 BOS, 2 EOS, byte b -> b + 3 (needs a vocabulary of >= 259)."""

    pad_id, bos_id, eos_id = 0, 1, 2
    offset = 3
    vocab_size = 256 + offset
    name = "byte-level (built in)"

    def encode_one(self, text: str) -> List[int]:
        return [b + self.offset for b in text.encode("utf-8")]


class _Wrapped:
    """A tokenizer from recipes/common/data_stats.load_tokenizer (SentencePiece or Hugging Face)."""

    def __init__(self, tok, vocab_size: int):
        self.tok, self.name, self.vocab_size = tok, tok.name, vocab_size
        self.bos_id = tok.bos_id
        self.eos_id = tok.eos_id
        self.pad_id = 0

    def encode_one(self, text: str) -> List[int]:
        return list(self.tok.encode([text])[0])


def virtual_tokens(recipe) -> int:
    """Positions the prompt encoder adds in front of every sample (0 unless ptuning)."""
    return recipe.method.ptuning_virtual_tokens if recipe.method.name == "ptuning" else 0


def tokenizer_source(recipe) -> Optional[Tuple[str, Path]]:
    """(the recipe key it comes from, the path) of the job's tokenizer: data.tokenizer_model, else a ``tokenizer/``
    directory, ``tokenizer.model`` or ``tokenizer.json`` in data.data_dir, else - for a model whose tokenizer is
    not the kit's byte-level one - the staged Hugging Face directory model.hf_path (an absolute path: the
    staged weights + tokenizer, :func:`vdkit.recipes.common.staging.staged_tokenizer`; without it a Llama's rows
    were tokenized into byte ids and the model trained on them). None: the byte-level tokenizer."""
    if getattr(recipe.data, "tokenizer_model", None):
        return "data.tokenizer_model", Path(recipe.data.tokenizer_model).expanduser()
    if recipe.data.name != "synthetic" and recipe.data.data_dir:
        base = Path(recipe.data.data_dir).expanduser()
        for cand in (base / "tokenizer", base / "tokenizer.model", base / "tokenizer.json"):
            if cand.exists():
                return "data.data_dir", cand
    hf = recipe.model.hf_path
    if recipe.model.tokenizer != "byte-level" and hf and str(hf).startswith("/"):
        return "model.hf_path", Path(hf)
    return None


def load_tokenizer(recipe):
    """The configured tokenizer (see :func:`tokenizer_source`), else the byte-level fallback.

    Raises UserError when the model's vocabulary cannot hold the tokenizer's ids."""
    vocab = recipe.model.vocab_size
    found = tokenizer_source(recipe)
    if found is None:
        tok = ByteTokenizer()
        need = tok.vocab_size
    else:
        from vdkit.recipes.common.data_stats import load_tokenizer as load_any

        key, path = found
        try:
            tok = _Wrapped(load_any(path), vocab)
        except UserError as exc:  # name the recipe key the path came from
            raise UserError(f"{key}: {exc.what}", exc.fix) from None
        need = _tokenizer_vocab(tok.tok)
    if need > vocab:
        raise UserError(f"tokenizer {tok.name} needs a vocabulary of {need}, model {recipe.model.name} has {vocab}",
                        "use a model with a larger model.vocab_size or a smaller tokenizer")
    return tok


def _tokenizer_vocab(tok) -> int:
    for attr in ("sp", "tok"):
        inner = getattr(tok, attr, None)
        if inner is None:
            continue
        for fn in ("GetPieceSize", "get_vocab_size"):
            if hasattr(inner, fn):
                return int(getattr(inner, fn)())
        if hasattr(inner, "__len__"):
            return len(inner)
    return 0


# ----------------------------------------------------------------------------- files
def synthetic_rows(seed: int, n: int = SYNTHETIC_ROWS) -> List[Dict[str, str]]:
    """A learnable instruction -> response task: upper-case, reverse or repeat a random word."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        task = rng.choice(("upper", "reverse", "repeat"))
        out = {"upper": word.upper(), "reverse": word[::-1], "repeat": f"{word} {word}"}[task]
        rows.append({"input": f"{task}: {word}", "output": out})
    return rows


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # every rank may write the same bytes; the rename keeps readers safe


def train_files(recipe, run_dir: Path) -> List[Path]:
    """The training JSONL files: data.data_dir/train_files, or the synthetic set in the run dir."""
    d = recipe.data
    if d.name == "synthetic":
        path = Path(run_dir) / SYNTHETIC_DIR / TRAIN_FILE
        if not path.is_file():
            rows = synthetic_rows(recipe.train.seed)
            _write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
        return [path]
    return [Path(d.data_dir).expanduser() / f for f in d.train_files]


def synthetic_validation_rows(seed: int) -> List[Dict[str, str]]:
    """The synthetic task's validation split: held-out rows (another seed's draw), a tenth of the training set."""
    return synthetic_rows(seed + 1, n=max(64, SYNTHETIC_ROWS // 10))


def validation_files(recipe, run_dir: Path) -> List[Path]:
    """run.mode=train: the validation JSONL files (data.validation_files, or the synthetic held-out rows)."""
    d = recipe.data
    if d.name == "synthetic":
        path = Path(run_dir) / SYNTHETIC_DIR / VALIDATION_FILE
        if not path.is_file():
            _write_atomic(path, "".join(json.dumps(r) + "\n" for r in synthetic_validation_rows(recipe.train.seed)))
        return [path]
    return [Path(d.data_dir).expanduser() / f for f in d.validation_files]


def check_inputs(recipe) -> None:
    """Pre-flight checks the engine would fail on, done before a run directory is written."""
    d = recipe.data
    if d.packed and recipe.method.name == "ptuning":  # the engine that asks (megatron reads its data here too)
        raise UserError(f"engine={recipe.engine.name} cannot pack sequences for P-tuning (virtual tokens "
                        "would cross sample boundaries)", "set data.packed=false for method=ptuning")
    if d.name == "synthetic":
        load_tokenizer(recipe)
        return
    if d.kind != "sft":
        raise UserError(f"the reference engine reads NeMo SFT JSONL; data={d.name} is {d.kind} data "
                        "(Megatron indexed files)", "use data=synthetic (or engine=nemo on the cluster)")
    if not d.data_dir or not d.train_files:
        raise UserError(f"data={d.name} names no training files (data.data_dir / data.train_files)",
                        f"prepare it with `vdkit data prepare {d.name} INPUT DIR` and set data.data_dir=DIR")
    for f in train_files(recipe, Path(".")):
        if not f.is_file():
            raise UserError(f"training file {f} does not exist",
                            f"prepare it with `vdkit data prepare {d.name} INPUT {f.parent}` or set data.data_dir")
    load_tokenizer(recipe)


def preflight_needs(recipe) -> List[Tuple[str, str, str]]:
    """(what, path, "file") for each training JSONL file the kit's engines read, for the job's pre-flight
    (vdkit.recipes.common.preflight); none for synthetic data (the run dir holds it)."""
    d = recipe.data
    if d.name == "synthetic" or d.kind != "sft" or not d.data_dir:
        return []
    from pathlib import PurePosixPath

    return [("data.train_files", str(PurePosixPath(d.data_dir) / n), "file") for n in d.train_files]


# ----------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class Sample:
    """Token ids and labels (IGNORE where no loss); ``positions`` restart per sample when packed."""

    ids: Tuple[int, ...]
    labels: Tuple[int, ...]
    positions: Optional[Tuple[int, ...]] = None


def encode_sample(tok, inp: str, out: str, max_len: int, answer_only: bool) -> Sample:
    """One training sample: BOS + "{input} " + output + EOS, input truncated first to fit max_len; with a
    tokenizer that carries a chat template (Instruct models), that template's conversation (:mod:`.chat`)."""
    from vdkit.recipes.common.chat import chat_tokenizer, encode_chat

    hf = chat_tokenizer(tok)
    if hf is not None:
        ids, n_prompt = encode_chat(hf, inp, out, max_len)
        return Sample(tuple(ids), tuple(([IGNORE] * n_prompt + ids[n_prompt:]) if answer_only else ids))
    prompt = tok.encode_one(f"{inp} ")
    answer = tok.encode_one(out)
    head = [tok.bos_id] if tok.bos_id is not None else []
    tail = [tok.eos_id] if tok.eos_id is not None else []
    room = max_len - len(head) - len(tail)
    if room < 1:
        raise UserError(f"train.seq_length={max_len} leaves no room for a sample",
                        "use a longer train.seq_length")
    answer = answer[:room]  # only when the output alone is too long
    prompt = prompt[: room - len(answer)]
    ids = head + prompt + answer + tail
    n_prompt = len(head) + len(prompt)
    labels = ([IGNORE] * n_prompt + ids[n_prompt:]) if answer_only else list(ids)
    return Sample(tuple(ids), tuple(labels))


def load_samples(recipe, run_dir: Path, tok, max_len: int, split: str = "train") -> List[Sample]:
    """Every row of the recipe's training (or ``split="validation"``) data, tokenized (files concatenated
    in order), packed into sequences of max_len when data.packed is true."""
    from vdkit.recipes.common.data_stats import iter_sft_rows

    answer_only = recipe.method.name != "pretrain"
    samples = []
    for path in (train_files if split == "train" else validation_files)(recipe, run_dir):
        for _, inp, out in iter_sft_rows(path):
            samples.append(encode_sample(tok, inp, out, max_len, answer_only))
    if recipe.data.packed:
        if recipe.method.name == "ptuning":
            raise UserError("the reference engine cannot pack sequences for P-tuning (virtual tokens "
                            "would cross sample boundaries)", "set data.packed=false for method=ptuning")
        samples = pack(samples, max_len)
    return samples


def pack(samples: Sequence[Sample], max_len: int) -> List[Sample]:
    """Pack samples first-fit-decreasing (recipes/common/packing.py) into sequences of at most max_len.

    Position ids restart at every sample, which makes transformers' attention keep samples apart;
    each sample's first token gets no label, so nothing is predicted across a boundary."""
    from vdkit.recipes.common.packing import pack_samples

    result = pack_samples([len(s.ids) for s in samples], max_len)
    packed = []
    for b in result.bins:
        ids, labels, pos = [], [], []
        for i in b:
            s = samples[i]
            ids.extend(s.ids)
            labels.extend((IGNORE,) + s.labels[1:])
            pos.extend(range(len(s.ids)))
        packed.append(Sample(tuple(ids), tuple(labels), tuple(pos)))
    return packed


# ----------------------------------------------------------------------------- batch order
class BatchOrder:
    """Which samples each rank's micro batches hold at each optimizer step.

    Global step s takes sample positions [s*GBS, (s+1)*GBS) of an endless stream that walks a
    fresh seeded permutation of the dataset each epoch. DP rank r takes the r-th contiguous
    GBS/DP slice and splits it into grad_accum micro batches of MBS.
    """

    def __init__(self, n: int, seed: int, mbs: int, dp: int, grad_accum: int):
        if n < 1:
            raise UserError("the training data has no samples", "check data.data_dir / data.train_files")
        self.n, self.seed, self.mbs, self.dp, self.grad_accum = n, seed, mbs, dp, grad_accum
        self.gbs = mbs * dp * grad_accum
        self._perms: Dict[int, List[int]] = {}

    def _perm(self, epoch: int) -> List[int]:
        if epoch not in self._perms:
            order = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._perms = {epoch: order}  # keep one epoch: memory stays O(n)
        return self._perms[epoch]

    def epoch(self, step: int) -> int:
        return step * self.gbs // self.n

    def micro_batches(self, step: int, rank: int) -> List[List[int]]:
        """Dataset indices of rank ``rank``'s micro batches for global step ``step`` (0-based)."""
        per_rank = self.gbs // self.dp
        start = step * self.gbs + rank * per_rank
        idx = []
        for pos in range(start, start + per_rank):
            idx.append(self._perm(pos // self.n)[pos % self.n])
        return [idx[i:i + self.mbs] for i in range(0, per_rank, self.mbs)]


def collate(samples: Sequence[Sample], pad_id: int):
    """Right-padded tensors ``input_ids``, ``attention_mask``, ``labels`` for one micro batch.

    Packed samples (micro batch 1, no padding) get ``position_ids`` instead of an attention mask:
    transformers derives the per-sample causal mask from positions that restart."""
    import torch

    if samples[0].positions is not None:
        if len(samples) != 1:
            raise UserError("packed sequences need train.micro_batch_size=1", "set train.micro_batch_size=1")
        s = samples[0]
        return {"input_ids": torch.tensor([s.ids]), "labels": torch.tensor([s.labels]),
                "position_ids": torch.tensor([s.positions])}

    width = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    labels = torch.full((len(samples), width), IGNORE, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :len(s.ids)] = torch.tensor(s.ids)
        mask[i, :len(s.ids)] = 1
        labels[i, :len(s.labels)] = torch.tensor(s.labels)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def validation_split(recipe, plan, run_dir: Path, tok, max_len: int):
    """run.mode=train's validation rows and their batch order (the training order's shape), or a one-line
    UserError when the data has no validation split."""
    from vdkit.errors import UserError

    t = recipe.train
    samples = load_samples(recipe, run_dir, tok, max_len, split="validation")
    if not samples:
        raise UserError("run.mode=train validates on the validation split, and it has no rows",
                        "prepare the data with a validation split (vdkit data prepare), or run.mode=timing")
    return samples, BatchOrder(len(samples), t.seed, t.micro_batch_size, plan.dp, plan.grad_accum)
