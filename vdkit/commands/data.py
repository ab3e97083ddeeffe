"""`vdkit data`: prepare public datasets as NeMo SFT JSONL, count their tokens, pack them.

  vdkit data prepare {dolly,alpaca,pubmedqa} INPUT OUT_DIR [--seed S] [--split 0.8,0.1,0.1] [--force] [--chat]
  vdkit data stats FILE [--tokenizer PATH] [--field both|input|output] [--json]
  vdkit data pack FILE OUT(.npy|.jsonl) --tokenizer PATH [--max-len 4096] [--truncate]

The work lives in vdkit.recipes.common.dataprep / data_stats / packing, imported only when a sub-verb runs
(tokenizer libraries load only inside those), so `vdkit --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys

from vdkit.commands.args import out_path
from vdkit.errors import UserError
# Light (standard library only): the dataset names and defaults have one home.
from vdkit.recipes.common.dataprep import DATASETS, DEFAULT_SEED, DEFAULT_SPLIT

DEFAULT_MAX_LEN = 4096  # Llama 2's context length (published.md), NeMo's packed-sequence length


def register(subparsers) -> None:
    """Add `data` and its sub-verbs."""
    p = subparsers.add_parser("data", help="prepare, count and pack fine-tuning data",
                              description="Prepare public datasets as NeMo SFT JSONL, print their "
                                          "token statistics, pack them into max-length sequences.")
    sub = p.add_subparsers(dest="data_verb", metavar="SUBVERB")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    pr = sub.add_parser("prepare", help="public dataset file -> training/validation/test.jsonl",
                        description="Read a public dataset in its own format and write NeMo SFT JSONL "
                                    "(input, output) splits with a fixed prompt template.")
    pr.add_argument("dataset", choices=DATASETS)
    pr.add_argument("input", metavar="INPUT", help="databricks-dolly-15k.jsonl, alpaca_data.json or ori_pqaa.json (pubmedqa, pubmedqa_blog)")
    pr.add_argument("out_dir", metavar="OUT_DIR", type=out_path, help="where training.jsonl, validation.jsonl, test.jsonl go")
    default_split = ",".join(f"{p:g}" for p in DEFAULT_SPLIT)
    pr.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"shuffle seed (default {DEFAULT_SEED})")
    pr.add_argument("--split", default=None,
                    help=f"train,validation,test fractions (default {default_split}; pubmedqa_blog: the blog's "
                         "0.8,0,0.2)")
    pr.add_argument("--force", action="store_true", help="replace split files already in OUT_DIR")
    pr.add_argument("--chat", action="store_true",
                    help="each row also as a conversation ('messages': user = input, assistant = output), what "
                         "engine=bridge reads to fine-tune an Instruct model on its tokenizer's chat template")
    pr.set_defaults(func=_prepare)

    st = sub.add_parser("stats", help="samples, unique samples, tokens per sample, total tokens",
                        description="The design guide's dataset block for a NeMo SFT JSONL file.")
    st.add_argument("file", metavar="FILE")
    st.add_argument("--tokenizer", metavar="PATH",
                    help="SentencePiece .model, tokenizer.json, or Hugging Face tokenizer directory "
                         "(default: count whitespace words, and say so)")
    st.add_argument("--field", choices=("both", "input", "output"), default="both",
                    help="what to count per sample: the trained text '{input} {output}' (default) or one field")
    st.add_argument("--json", action="store_true", help="print JSON instead of the text block")
    st.add_argument("--plan", action="store_true",
                    help="also write FILE.tokens.json beside FILE: the histogram of collated rows (BOS + "
                         "'{input} {output}' + EOS) that `vdkit plan` reads to count tokens per micro batch "
                         "(padding to the longest row, truncation at train.seq_length); needs --tokenizer")
    st.set_defaults(func=_stats)

    pk = sub.add_parser("pack", help="first-fit-decreasing packing into max-length sequences",
                        description="Tokenize a NeMo SFT JSONL file and pack it (first-fit-decreasing) "
                                    "into sequences of at most --max-len tokens; prints the packing efficiency.")
    pk.add_argument("file", metavar="FILE")
    pk.add_argument("out", metavar="OUT", type=out_path, help="packed output: .npy (NeMo's layout) or .jsonl")
    pk.add_argument("--tokenizer", metavar="PATH", required=True)
    pk.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN, help=f"default {DEFAULT_MAX_LEN}")
    pk.add_argument("--truncate", action="store_true", help="cut samples longer than --max-len instead of failing")
    pk.add_argument("--force", action="store_true", help="replace OUT if it exists")
    pk.set_defaults(func=_pack)


def _prepare(args: argparse.Namespace) -> int:
    from vdkit.recipes.common import dataprep as data

    split = data.parse_split(args.split) if args.split is not None else data.default_split(args.dataset)
    report = data.prepare(args.dataset, args.input, args.out_dir, seed=args.seed, split=split, force=args.force,
                          chat=args.chat)
    print("\n".join(report.lines()))
    return 0


def _stats(args: argparse.Namespace) -> int:
    from vdkit.recipes.common.data_stats import dataset_stats, load_tokenizer

    if args.plan and (args.tokenizer is None or args.field != "both"):
        raise UserError("--plan counts the collated rows with the model's tokenizer",
                        "pass --tokenizer PATH (and keep --field both)")
    tok = load_tokenizer(args.tokenizer)
    stats = dataset_stats(args.file, tok, field=args.field)
    print(json.dumps(stats.to_dict(), indent=2) if args.json else "\n".join(stats.lines()))
    if args.plan:
        from vdkit.recipes.common.data_stats import token_counts
        from vdkit.planner.tokens import SPECIAL_TOKENS, write_stats

        counts, _ = token_counts(args.file, tok, "both")
        path = write_stats(args.file, [c + SPECIAL_TOKENS for c in counts], tok.name)
        print(f"wrote {path} (vdkit plan reads it for data sets whose first training file is {args.file})",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _pack(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vdkit.recipes.common.data_stats import load_tokenizer
    from vdkit.recipes.common.packing import pack_sequences, tokenize_sft, write_packed

    out = Path(args.out)
    if out.suffix not in (".npy", ".jsonl"):
        raise UserError(f"{out}: unknown packed format {out.suffix or '(no suffix)'!r}",
                        "name the output .npy (NeMo's packed layout) or .jsonl")
    if out.exists() and not args.force:
        raise UserError(f"{out}: already exists", "pass another path, or --force to replace it")
    if args.max_len < 1:
        raise UserError(f"--max-len {args.max_len} is not a positive number of tokens", "use e.g. --max-len 4096")
    from vdkit.composition.files import not_a_regular_file

    kind = not_a_regular_file(args.file)  # before loading a tokenizer (seconds) for nothing
    if kind:
        raise UserError(f"{args.file}: " + ("no such file" if kind == "missing" else f"is {kind}, not a JSONL file"),
                        "pass a JSONL file written by `vdkit data prepare`")
    tok = load_tokenizer(args.tokenizer)
    ids, masks = tokenize_sft(args.file, tok)
    if not args.truncate:
        longest = max(range(len(ids)), key=lambda i: len(ids[i]))
        if len(ids[longest]) > args.max_len:
            over = sum(len(x) > args.max_len for x in ids)
            raise UserError(f"{args.file}: {over} samples exceed --max-len {args.max_len} "
                            f"(longest {len(ids[longest])} tokens)",
                            "raise --max-len or pass --truncate to cut them")
    rows, result = pack_sequences(ids, args.max_len, masks, truncate=args.truncate)
    write_packed(out, rows)
    print(f"tokenizer: {tok.name}")
    print(result.summary())
    print(f"wrote {out}")
    return 0
