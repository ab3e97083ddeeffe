"""Data preparation: public instruction datasets -> NeMo SFT JSONL splits.

`prepare(dataset, input_path, out_dir, seed, split)` reads a public file in its own format, turns each
record into one NeMo SFT row ``{"input": prompt, "output": answer}`` with a fixed prompt template,
shuffles with a seeded RNG and writes ``training.jsonl`` / ``validation.jsonl`` / ``test.jsonl``
(the names conf/data/*.yaml expect) plus ``prepare.json`` (what was done, for reproducibility).

Formats read (each checked against the public files):

- ``dolly``: databricks-dolly-15k.jsonl, one JSON object per line with
  ``instruction``, ``context``, ``response``, ``category``.
- ``alpaca``: Stanford Alpaca alpaca_data.json, one JSON list of objects with
  ``instruction``, ``input``, ``output``.
- ``pubmedqa``: PubMedQA ori_pqaa.json (pqa_artificial; ori_pqal.json has the same shape), one JSON
  object keyed by PMID whose values have ``QUESTION``, ``CONTEXTS`` (list of str), ``LONG_ANSWER``,
  ``final_decision``.

Bad data (unreadable or malformed JSON, a record without a required field, an empty file) raises
UserError naming the file and line before anything is written. Rows that are well-formed but unusable
(an empty response, ...) are dropped and counted by reason. Output files are written to temporary
files in OUT_DIR first and renamed into place only when all of them are complete.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from vdkit.errors import UserError
from vdkit.recipes.common.chat import MESSAGES_KEY
from vdkit.recipes.common.json_records import field_of, iter_json_container, iter_jsonl, read_text
from vdkit.composition.files import DirLock, replace_all

DATASETS = ("dolly", "alpaca", "pubmedqa", "pubmedqa_blog")

# Split name -> file name. The names must match train_files / validation_files / test_files in
# conf/data/{dolly,alpaca,pubmedqa}.yaml (a test checks this).
SPLIT_FILES: Dict[str, str] = {
    "train": "training.jsonl",
    "validation": "validation.jsonl",
    "test": "test.jsonl",
}
MANIFEST_FILE = "prepare.json"
PREPARE_LOCK = ".vdkit-prepare.lock"  # held while a prepare writes OUT_DIR (vdkit.composition.files.DirLock)
DEFAULT_SPLIT = (0.8, 0.1, 0.1)
DEFAULT_SEED = 1234

# Prompt templates, one per dataset. NeMo's SFT dataset joins a row as "{input} {output}"
# (prompt_template in megatron_gpt_finetuning_config.yaml), so prompts end at the answer cue with no
# trailing space and outputs start with no leading space.
DOLLY_TEMPLATE = "Context: {context}\n\nQuestion: {instruction}\n\nAnswer:"
DOLLY_TEMPLATE_NO_CONTEXT = "Question: {instruction}\n\nAnswer:"
# Stanford Alpaca's own prompt (github.com/tatsu-lab/stanford_alpaca, train.py PROMPT_DICT).
ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
# After NeMo's PubMedQA LoRA tutorial: abstract sections joined, the yes/no/maybe decision as the
# target; the conclusion (LONG_ANSWER) follows the decision so the model also learns to justify it.
PUBMEDQA_TEMPLATE = ("QUESTION: {question}\nCONTEXT: {context}\n"
                     "TARGET: the answer to the question given the context is (yes|no|maybe):")
PUBMEDQA_OUTPUT = "{decision}. {long_answer}"
PUBMEDQA_DECISIONS = ("yes", "no", "maybe")
# The multi-node fine-tuning blog (seed 003) trains on pqa_artificial as {"question", "context",
# "answer"} records - the answer is the abstract's conclusion (LONG_ANSWER), not the yes/no decision -
# and splits off 20 % for test (create_dataset.py --test_split 0.2). Its prompt ("--prompt_type 5")
# is not published; this template puts the blog's three fields in that order.
PUBMEDQA_BLOG_TEMPLATE = "Context: {context}\n\nQuestion: {question}\n\nAnswer:"
PUBMEDQA_BLOG_SPLIT = (0.8, 0.0, 0.2)

Row = Dict[str, str]


@dataclass
class PrepareReport:
    """What `prepare` did: rows read, written per split, dropped per reason."""

    dataset: str
    input_path: str
    out_dir: str
    seed: int
    split: Tuple[float, float, float]
    rows_read: int = 0
    written: Dict[str, int] = field(default_factory=dict)   # split name -> rows
    dropped: Dict[str, int] = field(default_factory=dict)   # reason -> rows
    files: Dict[str, str] = field(default_factory=dict)     # split name -> path

    def to_dict(self) -> dict:
        """Plain data (what prepare.json holds)."""
        return {"dataset": self.dataset, "input": self.input_path, "out_dir": self.out_dir,
                "seed": self.seed, "split": list(self.split), "rows_read": self.rows_read,
                "written": dict(self.written), "dropped": dict(self.dropped), "files": dict(self.files)}

    def lines(self) -> List[str]:
        """Human-readable summary, one fact per line."""
        out = [f"prepared {self.dataset} from {self.input_path}: {self.rows_read} rows read, "
               f"seed {self.seed}, split {','.join(f'{p:g}' for p in self.split)}"]
        for name, n in self.written.items():
            out.append(f"  {name:<10} {n:>8} rows -> {self.files[name]}")
        total_dropped = sum(self.dropped.values())
        out.append(f"  dropped    {total_dropped:>8} rows" + (":" if total_dropped else ""))
        for reason, n in sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"    {n:>8}  {reason}")
        return out


# ---------------------------------------------------------------------------- formats
# Each converter returns (row, None) or (None, reason the row is dropped).

def _instruction_row(path: Path, lineno: int, label: str, rec: object, extra: str, answer: str,
                     template: str, template_without: str) -> Tuple[Optional[Row], Optional[str]]:
    """An instruction record (``instruction``, an optional ``extra`` field, the ``answer`` field) as a row:
    the prompt from ``template`` (``template_without`` when ``extra`` is empty), the answer as output."""
    instruction = field_of(path, lineno, label, rec, "instruction").strip()
    more = field_of(path, lineno, label, rec, extra).strip()
    output = field_of(path, lineno, label, rec, answer).strip()
    if not instruction:
        return None, "empty instruction"
    if not output:
        return None, f"empty {answer}"
    prompt = (template.format(instruction=instruction, **{extra: more}) if more
              else template_without.format(instruction=instruction))
    return {"input": prompt, "output": output}, None


def _dolly(path: Path, lineno: int, label: str, rec: object) -> Tuple[Optional[Row], Optional[str]]:
    return _instruction_row(path, lineno, label, rec, "context", "response", DOLLY_TEMPLATE, DOLLY_TEMPLATE_NO_CONTEXT)


def _alpaca(path: Path, lineno: int, label: str, rec: object) -> Tuple[Optional[Row], Optional[str]]:
    return _instruction_row(path, lineno, label, rec, "input", "output", ALPACA_TEMPLATE, ALPACA_TEMPLATE_NO_INPUT)


def _contexts(path: Path, lineno: int, label: str, rec: object) -> List[str]:
    """A PubMedQA record's CONTEXTS (the abstract's sections): a list of strings, else one UserError."""
    contexts = field_of(path, lineno, label, rec, "CONTEXTS", list)
    if not all(isinstance(c, str) for c in contexts):
        raise UserError(f"{path}:{lineno}: {label} field 'CONTEXTS' holds a non-string",
                        "fix that record or pass the dataset's original file")
    return contexts


def _pubmedqa(path: Path, lineno: int, label: str, rec: object) -> Tuple[Optional[Row], Optional[str]]:
    question = field_of(path, lineno, label, rec, "QUESTION").strip()
    contexts = _contexts(path, lineno, label, rec)
    long_answer = field_of(path, lineno, label, rec, "LONG_ANSWER").strip()
    decision = field_of(path, lineno, label, rec, "final_decision").strip().lower()
    if not question:
        return None, "empty QUESTION"
    if decision not in PUBMEDQA_DECISIONS:
        return None, "final_decision not yes/no/maybe"
    context = " ".join(c.strip() for c in contexts if c.strip())
    if not context:
        return None, "empty CONTEXTS"
    if not long_answer:
        return None, "empty LONG_ANSWER"
    return {"input": PUBMEDQA_TEMPLATE.format(question=question, context=context),
            "output": PUBMEDQA_OUTPUT.format(decision=decision, long_answer=long_answer)}, None


def _pubmedqa_blog(path: Path, lineno: int, label: str, rec: object) -> Tuple[Optional[Row], Optional[str]]:
    """ori_pqaa.json -> the blog's fields: question, context (abstract sections joined), answer (LONG_ANSWER)."""
    question = field_of(path, lineno, label, rec, "QUESTION").strip()
    contexts = _contexts(path, lineno, label, rec)
    answer = field_of(path, lineno, label, rec, "LONG_ANSWER").strip()
    context = " ".join(c.strip() for c in contexts if c.strip())
    if not question:
        return None, "empty QUESTION"
    if not context:
        return None, "empty CONTEXTS"
    if not answer:
        return None, "empty LONG_ANSWER"
    return {"input": PUBMEDQA_BLOG_TEMPLATE.format(context=context, question=question), "output": answer}, None


# dataset -> (how the file is laid out, record converter)
_FORMATS: Dict[str, Tuple[str, Callable]] = {
    "dolly": ("jsonl", _dolly),
    "alpaca": ("list", _alpaca),
    "pubmedqa": ("object", _pubmedqa),
    "pubmedqa_blog": ("object", _pubmedqa_blog),
}


def read_rows(dataset: str, input_path) -> Tuple[List[Row], Counter, int]:
    """Read a public dataset file: (NeMo SFT rows in file order, dropped-row reasons, rows read).

    Raises UserError (naming file and line) for malformed JSON, missing fields and empty files."""
    if dataset not in _FORMATS:
        raise UserError(f"unknown dataset {dataset!r}", f"use one of {', '.join(DATASETS)}")
    path = Path(input_path)
    layout, convert = _FORMATS[dataset]
    text = read_text(path, one_record_a_line=layout == "jsonl")
    records = iter_jsonl(path, text) if layout == "jsonl" else iter_json_container(path, text, layout)
    rows: List[Row] = []
    dropped: Counter = Counter()
    read = 0
    for lineno, label, rec in records:
        read += 1
        row, reason = convert(path, lineno, label, rec)
        if row is None:
            dropped[reason] += 1
        else:
            rows.append(row)
    if read == 0:
        raise UserError(f"{path}:1: no records in the file", "download the dataset file again")
    if not rows:
        raise UserError(f"{path}: all {read} records were dropped ({', '.join(sorted(dropped))})",
                        "check that this is the right dataset file")
    return rows, dropped, read


# ---------------------------------------------------------------------------- splitting

def default_split(dataset: str) -> Tuple[float, float, float]:
    """The dataset's default train,validation,test fractions (the blog's 80/20 for pubmedqa_blog)."""
    return PUBMEDQA_BLOG_SPLIT if dataset == "pubmedqa_blog" else DEFAULT_SPLIT


def parse_split(text: str) -> Tuple[float, float, float]:
    """'0.8,0.1,0.1' -> (0.8, 0.1, 0.1); three non-negative fractions summing to 1, train > 0."""
    fix = "write three fractions for train,validation,test that sum to 1, e.g. --split 0.8,0.1,0.1"
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 3:
        raise UserError(f"--split {text!r} has {len(parts)} parts, not 3", fix)
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise UserError(f"--split {text!r} is not three numbers", fix)
    if any(not (0.0 <= v <= 1.0) for v in values) or values[0] <= 0.0:
        raise UserError(f"--split {text!r}: fractions must lie in [0, 1] and train must be > 0", fix)
    if abs(sum(values) - 1.0) > 1e-6:
        raise UserError(f"--split {text!r} sums to {sum(values):g}, not 1", fix)
    return values  # type: ignore[return-value]


def split_counts(n: int, split: Sequence[float]) -> Tuple[int, int, int]:
    """Rows per split: boundaries at round(n * cumulative fraction), so the counts always sum to n."""
    b1 = round(n * split[0])
    b2 = round(n * (split[0] + split[1]))
    b2 = max(b1, min(b2, n))
    return b1, b2 - b1, n - b2


def shuffle_split(rows: Sequence[Row], seed: int, split: Sequence[float]) -> Dict[str, List[Row]]:
    """Deterministic shuffle (random.Random(seed)) then contiguous train / validation / test slices."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_train, n_val, _ = split_counts(len(rows), split)
    cuts = {"train": order[:n_train], "validation": order[n_train:n_train + n_val],
            "test": order[n_train + n_val:]}
    return {name: [rows[i] for i in idx] for name, idx in cuts.items()}


# ---------------------------------------------------------------------------- writing

def write_files_atomically(out_dir: Path, contents: Dict[str, str]) -> None:
    """Write {file name: text} into out_dir (:func:`vdkit.composition.files.replace_all`: all or nothing); a directory
    it created is removed again on failure."""

    created_dir = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        replace_all(out_dir, {name: text.encode("utf-8") for name, text in contents.items()})
    except BaseException:
        if created_dir:
            try:
                out_dir.rmdir()
            except OSError:
                pass
        raise


def _jsonl(rows: Sequence[Row]) -> str:
    # ensure_ascii=False keeps the text readable; NeMo reads UTF-8 JSONL.
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def prepare(dataset: str, input_path, out_dir, seed: int = DEFAULT_SEED,
            split: Sequence[float] = DEFAULT_SPLIT, force: bool = False, chat: bool = False) -> PrepareReport:
    """Convert a public dataset file into NeMo SFT JSONL splits in out_dir; returns the report.

    Everything is read and checked before anything is written; existing split files are only
    replaced with force=True. ``chat``: each row also carries its conversation as ``messages`` (user: the
    input, assistant: the output; :func:`vdkit.recipes.common.chat.with_messages`), what Bridge's chat dataset
    reads for Instruct models; the other engines read ``input`` / ``output`` as before."""
    split = tuple(float(p) for p in split)
    if len(split) != 3:
        raise UserError(f"split {split} needs 3 fractions", "use e.g. 0.8,0.1,0.1")
    parse_split(",".join(repr(p) for p in split))  # same checks as the CLI's --split
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory", "pass a directory for OUT_DIR")
    _refuse_existing(out, force)  # fail fast; checked again under the lock below
    rows, dropped, read = read_rows(dataset, input_path)  # input errors before OUT_DIR is touched
    if chat:
        from vdkit.recipes.common.chat import with_messages

        rows = [with_messages(r) for r in rows]
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output directory ({exc.strerror})",
                        "pass a writable OUT_DIR") from None
    # One writer per OUT_DIR: a second `vdkit data prepare` into it is refused, never interleaved.
    lock = DirLock(out, PREPARE_LOCK, f"{out}: another `vdkit data prepare` is writing there now",
                   "wait for it to finish, or pass another OUT_DIR")
    try:
        with lock:
            return _prepare_locked(dataset, input_path, out, seed, split, force, rows, dropped, read)
    except BaseException:
        if created:
            try:
                out.rmdir()  # only if we made it and left it empty
            except OSError:
                pass
        raise


def _refuse_existing(out: Path, force: bool) -> None:
    targets = list(SPLIT_FILES.values()) + [MANIFEST_FILE]
    existing = [t for t in targets if (out / t).exists()]
    if existing and not force:
        raise UserError(f"{out}: already holds {', '.join(existing)}",
                        "pass an empty OUT_DIR, or --force to replace the prepared files")


def _prepare_locked(dataset, input_path, out: Path, seed, split, force, rows, dropped, read) -> "PrepareReport":
    _refuse_existing(out, force)  # another prepare may have finished while we read the input
    parts = shuffle_split(rows, seed, split)
    report = PrepareReport(dataset=dataset, input_path=str(input_path), out_dir=str(out), seed=seed,
                           split=split, rows_read=read, dropped=dict(dropped))  # type: ignore[arg-type]
    contents: Dict[str, str] = {}
    for name, fname in SPLIT_FILES.items():
        contents[fname] = _jsonl(parts[name])
        report.written[name] = len(parts[name])
        report.files[name] = str(out / fname)
    manifest = report.to_dict()
    manifest["templates"] = _templates(dataset)
    if rows and MESSAGES_KEY in rows[0]:  # `--chat`: the rows carry their conversation too
        manifest[MESSAGES_KEY] = True
    contents[MANIFEST_FILE] = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    write_files_atomically(out, contents)
    return report


def _templates(dataset: str) -> Dict[str, str]:
    """The prompt template constants a dataset uses (recorded in prepare.json)."""
    return {
        "dolly": {"input": DOLLY_TEMPLATE, "input_no_context": DOLLY_TEMPLATE_NO_CONTEXT,
                  "output": "{response}"},
        "alpaca": {"input": ALPACA_TEMPLATE, "input_no_input": ALPACA_TEMPLATE_NO_INPUT,
                   "output": "{output}"},
        "pubmedqa": {"input": PUBMEDQA_TEMPLATE, "output": PUBMEDQA_OUTPUT},
        "pubmedqa_blog": {"input": PUBMEDQA_BLOG_TEMPLATE, "output": "{LONG_ANSWER}"},
    }[dataset]
