"""Reading a public data file's JSON records, each with the line it starts on: JSON Lines or one JSON
list / object, refused in one line naming the file and line (malformed JSON, nesting too deep, a
number too long, a lone UTF-16 surrogate, a record over the sample limit, a missing or mistyped field).

Used by data preparation (:mod:`.data`) and the statistics block (:mod:`.data_stats`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, Tuple

from vdkit.errors import UserError


# A JSON \\u escape of half a surrogate pair: json.loads accepts it, but the string cannot be written as
# UTF-8 (the prepared files would fail to write after every row was read).
LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                            r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def refuse_lone_surrogates(path, text: str, first_line: int = 1) -> None:
    """UserError naming the line of the first ``\\udXXX`` escape that is not half of a valid pair."""
    m = LONE_SURROGATE.search(text)
    if m:
        line = first_line + text.count("\n", 0, m.start())
        raise UserError(f"{path}:{line}: JSON escape {m.group(0)} is half a UTF-16 surrogate pair, not a character",
                        "fix or remove that record; the text cannot be written as UTF-8")


def json_line(path, lineno: int, line: str):
    """One JSON value from one line; UserError (never a RecursionError) naming the file and line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{lineno}: malformed JSON line ({exc.msg}, column {exc.colno})",
                        "fix or remove that line; every line must be one JSON object") from None
    except RecursionError:
        raise UserError(f"{path}:{lineno}: JSON nested too deeply to be a record",
                        "fix or remove that line; every line must be one flat JSON object") from None
    except ValueError as exc:  # Python's integer limit: a 5000-digit number is no field of any record
        raise UserError(f"{path}:{lineno}: {number_too_long(exc)}", "fix or remove that line") from None


def number_too_long(exc: ValueError) -> str:
    """The line for json's ValueError on a number Python refuses to convert (over 4300 digits)."""
    return "a number with more digits than any record field holds (" + str(exc).split(":")[0].lower() + ")"


def check_sample_size(path, lineno: int, size: int) -> None:
    """UserError for one record of more than MAX_SAMPLE_BYTES, before it is decoded or tokenized."""
    from vdkit.composition.limits import MAX_SAMPLE_BYTES

    if size > MAX_SAMPLE_BYTES:
        raise UserError(f"{path}:{lineno}: one record of {size / 2 ** 20:,.1f}+ MB, more than the "
                        f"{MAX_SAMPLE_BYTES // 2 ** 20} MB any sample can be (a 128k-token context is about 1 MB "
                        "of text)", "split or remove that record; a file of many records needs one per line")


def read_text(path: Path, one_record_a_line: bool = False) -> str:
    """The file's text; UserError when missing, too large, unreadable, not UTF-8 or empty (or, with
    ``one_record_a_line``, when a line is longer than any record)."""
    from vdkit.composition.files import not_a_regular_file

    from vdkit.composition.limits import MAX_DATASET_BYTES, check_size

    kind = not_a_regular_file(path)
    if kind:
        raise UserError(f"{path}: " + ("no such file" if kind == "missing" else f"is {kind}, not a dataset file"),
                        "pass the path of the downloaded dataset file")
    check_size(path, MAX_DATASET_BYTES, "dataset file", "pass the downloaded dataset file (or split a larger one)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})", "pass the dataset's original JSON file")
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})", "check the path and its permissions")
    if not text.strip():
        raise UserError(f"{path}: file is empty", "download the dataset file again")
    if one_record_a_line:  # the longest line first: a 60 MB record is refused before it is scanned or decoded
        lengths = [len(line) for line in text.split("\n")]
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        check_sample_size(path, longest + 1, lengths[longest])
    refuse_lone_surrogates(path, text)
    return text


def iter_jsonl(path: Path, text: str) -> Iterator[Tuple[int, str, object]]:
    """(line number, label, value) for every non-blank line of a JSONL file."""
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters that
    # splitlines() treats as line breaks.
    for lineno, line in enumerate(text.split("\n"), start=1):
        check_sample_size(path, lineno, len(line))
        if not line.strip():
            continue
        yield lineno, f"line {lineno}", json_line(path, lineno, line)


def iter_json_container(path: Path, text: str, kind: str) -> Iterator[Tuple[int, str, object]]:
    """(line number, label, value) for each element of a top-level JSON list (kind "list") or each
    value of a top-level JSON object (kind "object"), decoded one element at a time so errors can
    name the line the element starts on (json.load only knows the line of a syntax error)."""
    decoder = json.JSONDecoder()
    opener, closer = ("[", "]") if kind == "list" else ("{", "}")
    n = len(text)
    pos = 0
    line = 1

    def skip_ws(p: int) -> int:
        nonlocal line
        while p < n and text[p] in " \t\r\n\ufeff":
            if text[p] == "\n":
                line += 1
            p += 1
        return p

    def advance(start: int, end: int) -> None:
        nonlocal line
        line += text.count("\n", start, end)

    def fail(msg: str) -> UserError:
        return UserError(f"{path}:{line}: malformed JSON ({msg})",
                         "fix or re-download the file; it must be the dataset's original format")

    def decode(p: int) -> Tuple[object, int]:
        try:
            value, end = decoder.raw_decode(text, p)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg}, column {exc.colno})",
                            "fix or re-download the file; it must be the dataset's original format")
        except RecursionError:
            raise UserError(f"{path}:{line}: JSON nested too deeply to be a record",
                            "fix or re-download the file; it must be the dataset's original format") from None
        except ValueError as exc:
            raise UserError(f"{path}:{line}: {number_too_long(exc)}",
                            "fix or re-download the file; it must be the dataset's original format") from None
        check_sample_size(path, line, end - p)
        return value, end

    pos = skip_ws(pos)
    if pos >= n or text[pos] != opener:
        want = "a JSON list of records" if kind == "list" else "a JSON object keyed by record id"
        raise UserError(f"{path}:{line}: expected {want}, found {text[pos:pos + 20]!r}",
                        "pass the dataset's original file, not a converted one")
    pos = skip_ws(pos + 1)
    index = 0
    if pos < n and text[pos] == closer:
        pos = skip_ws(pos + 1)
    else:
        while True:
            start_line = line
            if kind == "object":
                if pos >= n or text[pos] != '"':
                    raise fail("expected a quoted key")
                key, end = decode(pos)
                advance(pos, end)
                pos = skip_ws(end)
                if pos >= n or text[pos] != ":":
                    raise fail("expected ':' after a key")
                pos = skip_ws(pos + 1)
                label = f"record {key}"
            else:
                label = f"record {index}"
            value, end = decode(pos)
            advance(pos, end)
            yield start_line, label, value
            index += 1
            pos = skip_ws(end)
            if pos < n and text[pos] == ",":
                pos = skip_ws(pos + 1)
                continue
            if pos < n and text[pos] == closer:
                pos = skip_ws(pos + 1)
                break
            raise fail(f"expected ',' or '{closer}'")
    if pos < n:
        raise fail("extra data after the top-level value")


def field_of(path: Path, lineno: int, label: str, rec: object, name: str, kind=str):
    """rec[name], checked to exist and have the right type; UserError naming file and line."""
    if not isinstance(rec, dict):
        raise UserError(f"{path}:{lineno}: {label} is a {type(rec).__name__}, not a JSON object",
                        "pass the dataset's original file")
    if name not in rec:
        raise UserError(f"{path}:{lineno}: {label} has no field {name!r}",
                        "add the field or pass the dataset's original file")
    value = rec[name]
    if not isinstance(value, kind):
        want = "a string" if kind is str else "a list of strings"
        raise UserError(f"{path}:{lineno}: {label} field {name!r} is {type(value).__name__}, not {want}",
                        "fix that record or pass the dataset's original file")
    return value
