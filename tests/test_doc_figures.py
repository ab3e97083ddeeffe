"""Every figure the docs quote from the tool is the tool's figure today (issue 36: docs/reproducing.md said
OPT-30B needs 94 GB, short by 14 GB, while `vdkit plan` said 154.1 and 74.1; docs/cluster-guide.md said bridge
and NeMo ranks write no heartbeat, while every engine's ranks beat).

Where docs (README.md, docs/*.md) quote the tool, they say which command printed it, in one of three ways:

- a ``bash`` block line ``vdkit plan|list ...  # comment``: the figures in the comment are that command's;
- an HTML comment ``<!-- vdkit-output: ARGS -->`` on its own line before a paragraph: the figures in that
  paragraph are ``vdkit ARGS``'s;
- a ``console`` block: ``$ vdkit ARGS`` then lines of its output, each a whole line of what it prints today
  (spacing aside).

A figure is a number standing alone (``154.1``, ``11,064``, ``1.43x``; not the ``30`` of ``OPT-30B`` nor a name's
number, ``Table 9``, ``Llama 3.1``); it must
be one the command prints, exactly as written, or (written ``~94``) one that rounds to it. Only cheap verbs are
re-run (``plan``, ``list``), in this process through the CLI's ``main`` (one run per command for the file).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHEAP_VERBS = ("plan", "list")  # what a doc's quote may re-run here in seconds (never render, run, submit ...)
MARKER = re.compile(r"^\s*<!--\s*vdkit-output:\s*(.+?)\s*-->\s*$")  # a line of its own
COMMAND = re.compile(r"^(?:\.venv/bin/)?vdkit\s+(.*)$")
# a figure: digits (thousands commas, decimals) not glued to a word or a path (30B, 1n8g, v0.3.1, nemo:26.02)
FIGURE = re.compile(r"(?<![\w.:/\-])(~?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?=x?(?![\w]|\.\d))")
NAMES = re.compile(r"(?:Table|table|Figure|Llama|issue)\s$")  # "Table 9", "Llama 3.1": a name, not a figure


class Quote(NamedTuple):
    where: str  # doc:line
    argv: tuple  # vdkit's arguments
    kind: str  # "figures" (numbers in text) | "lines" (whole output lines)
    text: str


def quotes(path: Path) -> List[Quote]:
    """The doc's quotes of the tool (the three forms in this module's docstring)."""
    text = path.read_text()
    lines = text.splitlines()
    name = path.relative_to(ROOT).as_posix()
    out, fence, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = None if fence is not None else (line[3:].strip() or "text")
            if fence == "console":  # "$ vdkit ARGS" then its output lines, up to the next "$" or the fence's end
                j = i + 1
                while j < len(lines) and not lines[j].startswith("```"):
                    m = re.match(r"^\$\s+(?:\.venv/bin/)?vdkit\s+(.*)$", lines[j])
                    k = j + 1
                    while k < len(lines) and not lines[k].startswith(("```", "$ ")):
                        k += 1
                    if m:
                        out.append(Quote(f"{name}:{j + 1}", tuple(shlex.split(m.group(1))), "lines",
                                         "\n".join(lines[j + 1:k])))
                    j = k
                i, fence = j + 1, None
                continue
        elif fence == "bash":
            m = COMMAND.match(line.strip())
            if m and re.search(r"\s#\s", m.group(1)):
                args, comment = re.split(r"\s+#\s", m.group(1), maxsplit=1)
                argv = tuple(shlex.split(args))
                if argv and argv[0] in CHEAP_VERBS and figures(comment):
                    out.append(Quote(f"{name}:{i + 1}", argv, "figures", comment))
        elif fence is None and MARKER.match(line):
            j = i + 1
            while j < len(lines) and lines[j].strip():
                j += 1
            argv = tuple(shlex.split(MARKER.match(line).group(1)))
            out.append(Quote(f"{name}:{i + 1}", argv, "figures", "\n".join(lines[i + 1:j])))
            i = j
            continue
        i += 1
    return out


def figures(text: str) -> List[str]:
    """The figures in ``text`` as written (``~`` kept: a rounded quote)."""
    return [m.group(1) + m.group(2) + (m.group(3) or "") for m in FIGURE.finditer(text)
            if not NAMES.search(text[max(0, m.start() - 8):m.start()])]


def missing(quoted: str, output: str) -> List[str]:
    """The figures of ``quoted`` that ``output`` does not print (exactly, or rounded for a ``~`` figure)."""
    printed = {f.lstrip("~").replace(",", "") for f in figures(output)}  # the tool prints "~36" too
    values = [float(f) for f in printed]
    gone = []
    for fig in figures(quoted):
        plain = fig.lstrip("~").replace(",", "")
        if plain in printed:
            continue
        if fig.startswith("~"):
            places = len(plain.partition(".")[2])
            if any(round(v, places) == float(plain) for v in values):
                continue
        gone.append(fig)
    return gone


def _squash(line: str) -> str:
    return " ".join(line.split())


ALL = [q for doc in DOCS for q in quotes(doc)]
_OUTPUTS: Dict[tuple, str] = {}


def tool_output(argv: tuple, capsys, tmp_path, monkeypatch) -> str:
    """What ``vdkit ARGV`` prints (stdout and stderr), run once per command in this process."""
    if argv not in _OUTPUTS:
        from vdkit.cli import main

        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        rc = main(list(argv))
        out = capsys.readouterr()
        assert rc == 0, f"vdkit {' '.join(argv)}: exit {rc}\n{out.err[-2000:]}"
        _OUTPUTS[argv] = out.out + "\n" + out.err
    return _OUTPUTS[argv]


def test_the_scan_finds_the_docs_quotes():
    """The three forms are found where the docs use them (a changed convention would silently check nothing)."""
    where = {q.where.split(":")[0] + ":" + q.kind + ":" + " ".join(q.argv) for q in ALL}
    assert {"docs/reproducing.md:figures:plan --sweep alpaca_opt", "docs/reproducing.md:figures:plan --sweep training",
            "docs/cluster-guide.md:lines:list engines"} <= where, sorted(where)
    assert sum(q.text.count("\n") + 1 for q in ALL if q.kind == "figures") >= 4
    # a marker indented inside a list item is found too (docs/prediction.md's "where it misses" bullets)
    indented = [q for q in ALL if q.kind == "figures" and q.text.startswith("  ")]
    assert any(q.where.startswith("docs/prediction.md:") for q in indented), sorted(q.where for q in ALL)


def test_a_drifted_figure_is_caught():
    """Issue 36's drift, against what the tool prints: the old 94 / 14 GB are not the plan's figures; a rounded
    ``~94`` of a printed 94.3 and a thousands-comma figure are."""
    output = "opt_30b  sft  154.1  NO\n* needs 154.1 GB per GPU, short by 74.1 GB\nllama2_7b 94.3 11,064 1.43x"
    assert missing("OPT-30B needs 94 GB per GPU: short by 14 GB", output) == ["94", "14"]
    assert missing("OPT-30B needs 154.1 GB per GPU: short by 74.1 GB", output) == []
    assert missing("~94 GB (7B), 11,064 tokens/s, 1.43x", output) == []
    assert missing("36 tokens", output + "\n~36 for the prompt") == []  # a "~" the tool prints
    assert figures("OPT-30B on 1n8g, nemo:26.02.01, v0.3.1, Llama 3.1, Table 9: 102 min") == ["102"]


@pytest.mark.parametrize("quote", ALL, ids=[q.where for q in ALL])
def test_each_quoted_figure_is_what_the_tool_prints(quote, capsys, tmp_path, monkeypatch):
    assert quote.argv and quote.argv[0] in CHEAP_VERBS, (
        f"{quote.where}: `vdkit {' '.join(quote.argv)}` is not re-run by the docs test (only {', '.join(CHEAP_VERBS)})")
    output = tool_output(quote.argv, capsys, tmp_path, monkeypatch)
    if quote.kind == "lines":
        printed = {_squash(line) for line in output.splitlines()}
        drifted = [line for line in quote.text.splitlines() if line.strip() and _squash(line) not in printed]
        assert not drifted, f"{quote.where}: `vdkit {' '.join(quote.argv)}` no longer prints: {drifted}"
    else:
        gone = missing(quote.text, output)
        assert not gone, (f"{quote.where}: {gone} are not figures `vdkit {' '.join(quote.argv)}` prints today; "
                          f"quoted: {quote.text!r}")


def test_the_watchdog_figures_are_the_faults_modules():
    """docs/cluster-guide.md's hang watchdog quotes vdkit/run/faults.py's constants (the defaults a render writes),
    which no cheap command prints: each sentence is rebuilt here from the constants and must be in the doc."""
    from vdkit.run import faults

    doc = " ".join((ROOT / "docs" / "cluster-guide.md").read_text().split())
    for sentence in (f"rewrites `heartbeat/rank<R>` every {faults.HEARTBEAT_S} s",
                     f"heartbeat is {faults.DEAD_AFTER_S} s old",
                     f"{faults.HANG_FACTOR} x the slowest measured step (at least {faults.HANG_MIN_S} s",
                     f"gives srun {faults.KILL_GRACE_S} s before",
                     f"starts {faults.RESTART_DELAY_S} s later (`sbatch --begin=now+{faults.RESTART_DELAY_S}`",
                     f"`vdkit/run/faults.py`'s {faults.DEAD_AFTER_S}, {faults.KILL_GRACE_S} and {faults.RESTART_DELAY_S} s"):
        assert sentence in doc, sentence
