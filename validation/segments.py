"""A text log as a stream of short segments: read in 1 MiB chunks, split on ``\\r`` (TQDM's in-place
updates, also a literal ``^M`` pasted into a log) and ``\\n``, so no regex ever runs over a whole file
and a 10 GB log costs a chunk of memory, not the file."""
from __future__ import annotations

import codecs
from pathlib import Path
from typing import Iterator, List, Tuple, Union

CHUNK_BYTES = 1 << 20
# A segment longer than this without a '\r' or '\n' is not a progress update (binary junk,
# a corrupted file): it is dropped with a warning instead of growing memory without bound.
MAX_SEGMENT_CHARS = 1 << 20

PathLike = Union[str, Path]


def iter_segments(path: PathLike, warnings: List[str]) -> Iterator[Tuple[str, str]]:
    """Yield ``(segment, line_head)`` for a text file split on ``\\n`` and ``\\r``, read in chunks.

    ``line_head`` is the first segment of the line the segment belongs to (where srun labels
    and other launcher prefixes sit; TQDM updates after a ``\\r`` carry none of their own).
    A literal ``^M`` counts as ``\\r``. Undecodable bytes are replaced (and counted in a
    warning); an over-long segment is dropped with a warning. The last segment is yielded even
    without a final newline (a truncated log).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    carry_starts_line = True
    head = ""
    dropped = 0
    bad_chars = 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.read(CHUNK_BYTES)
            text = decoder.decode(raw, final=not raw)
            if "\ufffd" in text or "\x00" in text:
                bad_chars += text.count("\ufffd") + text.count("\x00")
            if not raw and not text and not carry:
                break
            text = carry + text
            if "^M" in text:
                text = text.replace("^M", "\r")
            if "\r\n" in text:
                text = text.replace("\r\n", "\n")
            lines = text.split("\n")
            last = lines.pop() if raw else None  # at EOF the last line is complete
            starts = carry_starts_line
            for line in lines:
                if "\r" in line:
                    segs = line.split("\r")
                    if starts:
                        head = segs[0]
                    for seg in segs:
                        if seg:
                            yield seg, head
                elif line:
                    if starts:
                        head = line
                    yield line, head
                starts = True
            if last is None:
                carry = ""
                break
            if "\r" in last:
                segs = last.split("\r")
                if starts:
                    head = segs[0]
                for seg in segs[:-1]:
                    if seg:
                        yield seg, head
                carry, carry_starts_line = segs[-1], False
            else:
                carry, carry_starts_line = last, starts
            if len(carry) > MAX_SEGMENT_CHARS:
                dropped += 1
                carry, carry_starts_line = "", False
    if bad_chars:
        warnings.append(f"{path}: {bad_chars} undecodable or NUL characters (corrupt bytes?) were skipped")
    if dropped:
        warnings.append(f"{path}: {dropped} over-long segment(s) without a line break were skipped")
