"""Dataset statistics in the design guide's shape, and the tokenizers they are counted with.

The model customization design guide describes its Dolly training set as "12012 samples, 11895
unique, tokens per sample max 8588, min 1, average 114.53571428571429, total 1375803".
`dataset_stats(path, tokenizer)` computes the same block for a NeMo SFT JSONL file.

What a "sample" is: one JSONL row. What is counted (``field``):
- ``both`` (default): the text NeMo trains on, ``"{input} {output}"`` (NeMo's default prompt_template);
- ``input`` or ``output``: that field alone.
Tokens are counted without BOS/EOS. Unique samples are distinct (input, output) pairs.

Tokenizers (`load_tokenizer`): a SentencePiece ``.model`` file, a Hugging Face ``tokenizer.json``
file, or a Hugging Face tokenizer directory (AutoTokenizer, local files only). Without one the
count is whitespace-separated words, and the result says so.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

from vdkit.errors import UserError

FIELDS = ("both", "input", "output")
NEMO_PROMPT_TEMPLATE = "{input} {output}"  # megatron_gpt_finetuning_config.yaml's default
WHITESPACE = "whitespace words (no tokenizer given)"
_BATCH = 1000  # texts per tokenizer call: batching is much faster, and memory stays bounded


class Tokenizer:
    """A loaded tokenizer: ``encode(texts) -> list of token-id lists`` (no BOS/EOS), ``name``
    (what it is, for reports), ``eos_id`` and ``bos_id`` (None where the tokenizer has none)."""

    name: str = ""
    eos_id: Optional[int] = None
    bos_id: Optional[int] = None

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        raise NotImplementedError

    def count(self, texts: Sequence[str]) -> List[int]:
        """Tokens per text."""
        return [len(ids) for ids in self.encode(texts)]


class _SentencePiece(Tokenizer):
    def __init__(self, path: Path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(str(path))
        except (OSError, RuntimeError) as exc:
            raise UserError(f"{path}: not a SentencePiece model ({str(exc).splitlines()[0]})",
                            "pass a tokenizer.model file or a Hugging Face tokenizer directory")
        self.name = f"sentencepiece {path} (vocab {self.sp.GetPieceSize()})"
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None

    def encode(self, texts):
        return self.sp.Encode(list(texts))


class _HFTokenizers(Tokenizer):
    """A bare tokenizer.json (the `tokenizers` library)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tok

        try:
            self.tok = _Tok.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception type
            raise UserError(f"{path}: not a Hugging Face tokenizer.json ({exc})",
                            "pass a tokenizer.json, a tokenizer directory or a SentencePiece .model")
        self.name = f"tokenizers {path} (vocab {self.tok.get_vocab_size()})"

    def encode(self, texts):
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]


class _AutoTokenizer(Tokenizer):
    def __init__(self, path: Path, tok):
        self.tok = tok
        self.name = f"transformers {type(tok).__name__} {path} (vocab {len(tok)})"
        self.eos_id = tok.eos_token_id
        self.bos_id = tok.bos_token_id

    def encode(self, texts):
        return self.tok(list(texts), add_special_tokens=False)["input_ids"]


class _Whitespace(Tokenizer):
    name = WHITESPACE

    def encode(self, texts):  # no ids: this fallback only counts
        raise UserError("whitespace counting has no token ids", "pass --tokenizer PATH")

    def count(self, texts):
        return [len(t.split()) for t in texts]


def load_tokenizer(path=None) -> Tokenizer:
    """The tokenizer at ``path`` (see module docstring), or the whitespace-word counter for None."""
    if path is None:
        return _Whitespace()
    p = Path(path)
    fix = "pass a SentencePiece .model file, a tokenizer.json, or a Hugging Face tokenizer directory"
    if not p.exists():
        raise UserError(f"{p}: no such tokenizer file or directory", fix)
    from vdkit.composition.files import not_a_regular_file

    kind = not_a_regular_file(p)
    if kind and kind != "a directory":  # a FIFO would block, a device never end: name them, never open them
        raise UserError(f"{p}: is {kind}, not a tokenizer", fix)
    if p.is_file():
        if p.suffix == ".json":
            return _HFTokenizers(p)
        return _SentencePiece(p)
    has_hf_config = (p / "tokenizer_config.json").is_file() or (p / "tokenizer.json").is_file()
    if not has_hf_config and (p / "tokenizer.model").is_file():
        # Meta's llama layout (a bare tokenizer.model): read it with SentencePiece itself;
        # AutoTokenizer would have to guess a conversion, which can change the counts.
        return _SentencePiece(p / "tokenizer.model")
    try:
        from transformers import AutoTokenizer

        return _AutoTokenizer(p, AutoTokenizer.from_pretrained(str(p), local_files_only=True))
    except Exception as exc:  # transformers raises OSError / ValueError / others for a bad dir
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{p}: not a tokenizer directory ({first})", fix)


def iter_sft_rows(path) -> Iterator[Tuple[int, str, str]]:
    """(line number, input, output) for each row of a NeMo SFT JSONL file.

    UserError naming file and line for a missing/empty file, malformed JSON or a missing field."""
    from vdkit.composition.files import not_a_regular_file
    from vdkit.composition.limits import MAX_SAMPLE_BYTES
    from vdkit.recipes.common.json_records import check_sample_size, json_line, refuse_lone_surrogates

    p = Path(path)
    kind = not_a_regular_file(p)
    if kind:
        raise UserError(f"{p}: " + ("no such file" if kind == "missing" else f"is {kind}, not a JSONL file"),
                        "pass a JSONL file written by `vdkit data prepare`")
    fix = "every line must be a JSON object with string fields 'input' and 'output'"
    seen = False
    try:
        fh = p.open("r", encoding="utf-8", errors="strict", newline="\n")
    except OSError as exc:
        raise UserError(f"{p}: cannot read ({exc.strerror})", "check the path and its permissions") from None
    with fh:
        try:
            lineno = 0
            while True:  # a line at a time, each read at most one sample's bound (a 2 GB file of one line)
                line = fh.readline(MAX_SAMPLE_BYTES + 1)
                if not line:
                    break
                lineno += 1
                check_sample_size(p, lineno, len(line.rstrip("\n")))
                if not line.strip():
                    continue
                refuse_lone_surrogates(p, line, lineno)
                rec = json_line(p, lineno, line)
                if not isinstance(rec, dict):
                    raise UserError(f"{p}:{lineno}: a {type(rec).__name__}, not a JSON object", fix)
                for key in ("input", "output"):
                    if not isinstance(rec.get(key), str):
                        what = "has no field" if key not in rec else "has a non-string field"
                        raise UserError(f"{p}:{lineno}: {what} {key!r}", fix)
                seen = True
                yield lineno, rec["input"], rec["output"]
        except UnicodeDecodeError as exc:
            raise UserError(f"{p}: not UTF-8 text (byte {exc.start} of a block)", fix)
        except OSError as exc:  # an I/O error part-way (a file on failing storage)
            raise UserError(f"{p}: cannot read ({exc.strerror})", "check the path and its storage") from None
    if not seen:
        raise UserError(f"{p}: file is empty (no rows)", "pass a prepared training/validation/test JSONL file")


def sample_text(inp: str, out: str, field: str = "both") -> str:
    """The text of one sample that `dataset_stats` counts (see module docstring)."""
    if field == "both":
        return NEMO_PROMPT_TEMPLATE.format(input=inp, output=out)
    if field == "input":
        return inp
    if field == "output":
        return out
    raise UserError(f"unknown field {field!r}", f"use one of {', '.join(FIELDS)}")


@dataclass(frozen=True)
class DataStats:
    """The design guide's block for one file."""

    file: str
    tokenizer: str      # what counted the tokens (name of the fallback when none was given)
    field: str          # what text of a sample was counted
    samples: int
    unique: int
    max_tokens: int
    min_tokens: int
    mean_tokens: float
    total_tokens: int

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> List[str]:
        """The human-readable block."""
        counted = 'input + " " + output' if self.field == "both" else self.field
        return [
            f"file: {self.file}",
            f"tokenizer: {self.tokenizer}",
            f"counted: {counted} per sample",
            f"total samples: {self.samples}",
            f"unique samples: {self.unique}",
            f"tokens per sample: max {self.max_tokens}, min {self.min_tokens}, average {self.mean_tokens!r}",
            f"total tokens: {self.total_tokens}",
        ]


def token_counts(path, tokenizer: Tokenizer, field: str = "both") -> Tuple[List[int], int]:
    """(tokens per sample in file order, number of unique (input, output) pairs)."""
    if field not in FIELDS:
        raise UserError(f"unknown field {field!r}", f"use one of {', '.join(FIELDS)}")
    counts: List[int] = []
    seen = set()
    batch: List[str] = []
    for _, inp, out in iter_sft_rows(path):
        seen.add((inp, out))
        batch.append(sample_text(inp, out, field))
        if len(batch) >= _BATCH:
            counts.extend(tokenizer.count(batch))
            batch = []
    if batch:
        counts.extend(tokenizer.count(batch))
    return counts, len(seen)


def dataset_stats(path, tokenizer: Optional[Tokenizer] = None, field: str = "both") -> DataStats:
    """Samples, unique samples, max / min / average tokens per sample and total tokens of a file."""
    tok = tokenizer or load_tokenizer(None)
    counts, unique = token_counts(path, tok, field)
    total = sum(counts)
    return DataStats(file=str(path), tokenizer=tok.name, field=field, samples=len(counts),
                     unique=unique, max_tokens=max(counts), min_tokens=min(counts),
                     mean_tokens=total / len(counts), total_tokens=total)
