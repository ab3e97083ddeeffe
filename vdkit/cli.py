"""The `vdkit` command: one sub-command per verb, each in vdkit/commands/<verb>.py.

Start-up stays fast: verb modules only declare their arguments here; heavy libraries (torch,
transformers, matplotlib, submitit) are imported inside the function that runs the verb.
Imports go one way: cli -> commands -> (vdkit.args, domain modules); no verb imports this module.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from vdkit.errors import UserError

# Verb modules, in the order `vdkit --help` lists them. Each defines register(subparsers),
# which adds its parser(s) with set_defaults(func=callable(args) -> exit code).
COMMAND_MODULES = (
    "vdkit.commands.plan",
    "vdkit.commands.render",
    "vdkit.commands.submit",
    "vdkit.commands.run",
    "vdkit.commands.validate",
    "vdkit.commands.data",
    "vdkit.commands.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vdkit",
        description="Validated-design recipes for Llama 2 on Dell PowerEdge XE9680 clusters: "
                    "plan, render, submit, run, validate, report.")
    from vdkit import __version__

    parser.add_argument("--version", action="version", version=f"vdkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: parse, run the verb, turn a UserError into one line on stderr and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"vdkit {args.verb}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"vdkit {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `vdkit plan --sweep table9 | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
