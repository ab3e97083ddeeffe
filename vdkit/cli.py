"""The `vdkit` command: one sub-command per verb, each in vdkit/commands/<verb>.py.

Start-up stays fast: verb modules only declare their arguments here; heavy libraries (torch,
transformers, matplotlib, submitit) are imported inside the function that runs the verb.
Imports go one way: cli -> commands -> (vdkit.commands.args, domain modules); no verb imports this module.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from vdkit.errors import UserError, environment_error

# Verb modules, in the order `vdkit --help` lists them. Each defines register(subparsers),
# which adds its parser(s) with set_defaults(func=callable(args) -> exit code).
COMMAND_MODULES = (
    "vdkit.commands.list",
    "vdkit.commands.plan",
    "vdkit.commands.render",
    "vdkit.commands.check",
    "vdkit.commands.submit",
    "vdkit.commands.status",
    "vdkit.commands.runs",
    "vdkit.commands.cluster",
    "vdkit.commands.run",
    "vdkit.commands.validate",
    "vdkit.commands.data",
    "vdkit.commands.demo",
    "vdkit.commands.site",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is the kit's one line (what, fix) and exit 2, like every other error.

    Sub-parsers inherit the class (argparse's add_subparsers uses ``type(self)``).
    """

    def error(self, message: str, fix: str = ""):
        self.exit(2, f"{self.prog}: error: {message} (fix: {fix}see `{self.prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments nobody took are the verb's error (its prog, its help, and where it takes a
        directory positionally, that: `vdkit runs --out DIR`), not the top level's `vdkit --help`."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            verb = self
            while verb._subparsers is not None:  # down to the (sub-)verb that parsed them: vdkit data VERB ...
                action = verb._subparsers._group_actions[0]
                if getattr(ns, action.dest, None) not in action.choices:
                    break
                verb = action.choices[getattr(ns, action.dest)]
            verb.error(f"unrecognized arguments: {' '.join(extras)}", verb._positional_hint(extras))
        return ns

    def _positional_hint(self, extras: List[str]) -> str:
        """For an option the verb lacks: the one it has that is spelt nearly so (``--outt``), else, where the verb
        takes a directory positionally (``vdkit runs --out DIR``), that."""
        import difflib

        unknown = [e.split("=", 1)[0] for e in extras if e.startswith("-")]
        own = [o for a in self._actions for o in a.option_strings]
        near = [m for u in unknown for m in difflib.get_close_matches(u, own, n=1, cutoff=0.8)]
        if near:
            return f"did you mean {' '.join(near)}? "
        dirs = [a for a in self._actions if not a.option_strings and "DIR" in str(a.metavar or a.dest).upper()]
        if not dirs or not unknown:
            return ""
        what = " ".join(str(a.metavar or a.dest) for a in dirs)
        return f"{self.prog} takes {what} positionally, as in `{self.prog} {what}`; "

    def parse_known_args(self, args=None, namespace=None):
        """A verb's own parser reads options and positionals intermixed, so overrides may come anywhere
        (`vdkit plan model=llama2_7b --json method=sft`); the top level (with sub-commands) cannot."""
        if self._subparsers is not None or getattr(self, "_intermixing", False):
            return super().parse_known_args(args, namespace)
        self._refuse_repeated(list(sys.argv[1:] if args is None else args))
        self._intermixing = True
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def _refuse_repeated(self, args: List[str]) -> None:
        """An option that takes one value, given twice (`--out a --out b`, `--sweep x --sweep y`): argparse
        would keep the last and drop the first without a word."""
        single = {opt: a for a in self._actions if isinstance(a, argparse._StoreAction)
                  for opt in a.option_strings}
        seen: dict = {}
        for i, token in enumerate(args):
            if token == "--":
                break
            opt = token.split("=", 1)[0] if token.startswith("--") else token
            action = single.get(opt)
            if action is None:
                continue
            given = token if "=" in token or i + 1 >= len(args) else f"{token} {args[i + 1]}"
            if action.dest in seen:
                self.error(f"{opt} is given twice ({seen[action.dest]} and {given}); one would be silently dropped"
                           f" - give {opt} once")
            seen[action.dest] = given


def printable(line: str) -> str:
    """``line`` safe for any terminal encoding (a lone surrogate from an undecodable argument is escaped)."""
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    """The `vdkit` parser: every verb's sub-parser (vdkit.commands), each failing in one line."""
    parser = OneLineParser(
        prog="vdkit",
        description="Validated-design recipes for Llama 2 on Dell PowerEdge XE9680 clusters: "
                    "plan, render, submit, run, validate, report.",
        epilog="New here? `vdkit list` shows every model, method, cluster, engine, sweep and table; "
               "`vdkit plan --explain KEY` says what a key means; `vdkit demo` runs the whole pipeline on this "
               "machine. `vdkit VERB --help` for a verb's options.")
    from vdkit import __version__

    parser.add_argument("--version", action="version", version=f"vdkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: parse, run the verb, turn a UserError into one line on stderr and exit 2."""
    if sys.stdout is None:  # `vdkit ... >&-`: Python starts without a stdout, and every answer goes there
        if sys.stderr is not None:
            print("vdkit: error: stdout is closed (`>&-`): vdkit writes its answer there (fix: redirect it to a "
                  "file or to /dev/null instead of closing it)", file=sys.stderr)
        return 2
    try:
        parser = build_parser()  # help texts list conf/'s options: a broken VDKIT_CONF_DIR is found here
        args = parser.parse_args(argv)
    except UserError as exc:
        print(printable(f"vdkit: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "config_dir", None):
            from vdkit.composition.config import use_config_dir

            use_config_dir(args.config_dir)
        from vdkit.commands.envcheck import check_environment

        for line in check_environment(args.verb):
            print(printable(f"vdkit {args.verb}: warning: {line}"), file=sys.stderr)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that closed the pipe is answered here, not at exit
        return code
    except BrokenPipeError:  # `vdkit plan --sweep table9 | head -1` (an OSError: caught before the next clause)
        _quiet_stdout()
        return 0
    except UserError as exc:
        print(printable(f"vdkit {args.verb}: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"vdkit {args.verb}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # The machine's answer (a full disk, a read-only or unwritable directory, a quota): one line, no
        # traceback. Writers leave nothing half-written (they write to a temporary name and rename).
        err = environment_error(exc)
        if err is None:
            raise
        print(printable(f"vdkit {args.verb}: error: {err}"), file=sys.stderr)
        return err.exit_code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush at exit would raise BrokenPipeError again
    (Python's documented recipe, library/signal.html "Note on SIGPIPE")."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
