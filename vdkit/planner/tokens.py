"""Tokens per micro batch: what the collator really hands the model, from the data or a stated default.

An unpacked fine-tuning micro batch of ``b`` rows is padded to its longest row (Stanford Alpaca's
``DataCollatorForSupervisedDataset``, the HF Trainer's ``DataCollatorWithPadding``, vdkit's reference
engine all pad to the longest row of each micro batch) and every row is cut at ``train.seq_length``. So
the model computes on ``b x E[min(longest of b rows, seq_length)]`` tokens per micro batch, more than
``b x`` the average row.

Where the numbers come from, best first:

1. ``vdkit data stats TRAIN.jsonl --tokenizer T --plan`` counts every collated row (prompt template +
   answer + BOS + EOS) and writes the length histogram to ``TRAIN.jsonl.tokens.json`` beside the file;
   the planner reads it for the recipe's first training file (``data.data_dir`` / ``data.train_files``)
   and takes the expected longest of ``b`` rows exactly from the histogram (rows drawn at random, as the
   sampler shuffles them).
2. Else the planner's default for the data set (conf/calibration/hf_step_time.yaml ``data_defaults``):
   an average collated row and a log-normal spread of row lengths; the plan says so.
"""
from __future__ import annotations

import functools
import json
import os
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

STATS_SUFFIX = ".tokens.json"  # beside the training file: TRAIN.jsonl.tokens.json
SPECIAL_TOKENS = 2  # BOS + EOS around every collated row (the counts in data stats exclude them)


@dataclass(frozen=True)
class MicroBatchTokens:
    """What one micro batch puts through the model."""

    rows: int  # micro batch size
    mean_row: float  # average collated row (tokens)
    padded_row: float  # expected padded row length: E[min(longest of `rows` rows, seq_length)]
    source: str  # where the numbers come from (a file, or the planner's default and its source)

    @property
    def tokens(self) -> float:
        """Tokens computed per micro batch (padding included)."""
        return self.rows * self.padded_row

    @property
    def real_tokens(self) -> float:
        """Tokens of real data per micro batch (padding excluded, truncation ignored)."""
        return self.rows * self.mean_row


def stats_path(train_file) -> Path:
    """Where `vdkit data stats --plan` writes the histogram of ``train_file``."""
    p = Path(train_file)
    return p.with_name(p.name + STATS_SUFFIX)


def histogram(lengths: Sequence[int]) -> Dict[int, int]:
    """{row length: rows} of collated rows."""
    out: Dict[int, int] = {}
    for n in lengths:
        out[int(n)] = out.get(int(n), 0) + 1
    return dict(sorted(out.items()))


def write_stats(train_file, lengths: Sequence[int], tokenizer: str) -> Path:
    """Write the collated-row histogram of ``train_file`` beside it (whole, then renamed)."""
    path = stats_path(train_file)
    doc = {"file": Path(train_file).name, "tokenizer": tokenizer, "rows": len(lengths),
           "counted": "BOS + '{input} {output}' + EOS per row", "histogram": histogram(lengths)}
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(doc) + "\n")
        tmp.replace(path)
    except OSError as exc:
        from vdkit.errors import UserError

        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write the token histogram ({exc.strerror})",
                        "make the data directory writable, or copy the file somewhere writable and count it there")
    return path


def expected_longest(hist: Dict[int, int], rows: int, cap: int) -> float:
    """E[min(longest of ``rows`` rows drawn at random, cap)] from a {length: count} histogram."""
    total = sum(hist.values())
    out, below = 0.0, 0
    for length in sorted(hist):
        f_prev = (below / total) ** rows
        below += hist[length]
        out += min(length, cap) * ((below / total) ** rows - f_prev)
    return out


@functools.lru_cache(maxsize=256)  # a layout search asks once per candidate; the quadrature is the slow part
def lognormal_longest(mean: float, sigma: float, rows: int, cap: float) -> float:
    """E[min(longest of ``rows`` log-normal row lengths, cap)] for rows of average ``mean`` (quadrature)."""
    mu = math.log(mean) - sigma * sigma / 2
    steps, lo, hi = 4000, -9.0, 9.0
    dz = (hi - lo) / steps
    acc = 0.0
    for i in range(steps + 1):
        z = lo + i * dz
        phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
        density = rows * phi * cdf ** (rows - 1)  # the density of the largest of `rows` standard normals
        acc += min(math.exp(mu + sigma * z), cap) * density * dz * (0.5 if i in (0, steps) else 1.0)
    return acc


def counted_mean(recipe) -> Optional[Tuple[float, str]]:
    """(mean tokens per row, the file) from the data's `vdkit data stats --plan` histogram, or None."""
    path = _stats_file(recipe)
    if path is None:
        return None
    doc, hist = _read_stats(path)
    return sum(k * v for k, v in hist.items()) / sum(hist.values()), str(path)


def _stats_file(recipe) -> Optional[Path]:
    d = recipe.data
    if not d.data_dir or not d.train_files:
        return None
    # plain string paths first: the layout search asks for every candidate, and pathlib is the slow part
    path = os.path.join(d.data_dir, str(d.train_files[0])) + STATS_SUFFIX
    return Path(path) if os.path.isfile(path) else None


def _read_stats(path: Path):
    """(document, {length: rows}) of a histogram file; UserError for anything else."""
    from vdkit.errors import UserError

    try:
        doc = json.loads(path.read_text())
        hist = {int(k): int(v) for k, v in doc["histogram"].items()}
        if not hist or min(hist) < 1 or min(hist.values()) < 1:
            raise ValueError("empty or non-positive counts")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: not a token histogram written by `vdkit data stats --plan` ({exc})",
                        "rerun `vdkit data stats TRAIN.jsonl --tokenizer T --plan`, or delete the file")
    return doc, hist


def full_rows(recipe) -> bool:
    """Whether every micro batch is whole train.seq_length rows: pretraining, or packed fine-tuning data."""
    return recipe.method.name == "pretrain" or recipe.data.kind == "pretrain" or bool(recipe.data.packed)


def micro_batch_tokens(recipe, defaults: Optional[dict] = None, padded_over: Optional[int] = None) -> MicroBatchTokens:
    """Tokens per micro batch of an unpacked fine-tuning recipe (see the module docstring). ``padded_over``: the rows
    whose longest every row is padded to (default: the micro batch's; a collator that pads a whole step to one length
    pads over the global batch)."""
    t = recipe.train
    b, cap = t.micro_batch_size, t.seq_length
    over = padded_over or b
    if full_rows(recipe):
        return MicroBatchTokens(b, float(cap), float(cap), f"full rows: {recipe.method.name} / packed rows fill "
                                f"train.seq_length={cap}")
    path = _stats_file(recipe)
    if path is not None:
        doc, hist = _read_stats(path)
        mean = sum(k * v for k, v in hist.items()) / sum(hist.values())
        return MicroBatchTokens(b, mean, expected_longest(hist, over, cap),
                                f"{path} ({doc.get('rows')} rows, {doc.get('tokenizer')})")
    if defaults is None:
        from vdkit.planner.calibration import load

        defaults = load("hf_step_time")["data_defaults"]
    entry = (defaults.get("datasets") or {}).get(recipe.data.name)
    sigma = float(defaults["length_sigma"])
    if entry:
        mean = float(entry["tokens_per_row"])
        why = (f"planner default for {recipe.data.name}: {mean:g} tokens/row ({entry['source']}), "
               f"log-normal spread {sigma:g}")
    else:
        mean = float(defaults["unknown_fraction_of_seq"]) * cap
        why = f"planner default: no counts for {recipe.data.name}, rows assumed {mean:g} tokens (half the sequence)"
    mean = min(mean, float(cap))
    why += "; count the data with `vdkit data stats TRAIN.jsonl --tokenizer T --plan`"
    return MicroBatchTokens(b, mean, lognormal_longest(mean, sigma, over, cap), why)
