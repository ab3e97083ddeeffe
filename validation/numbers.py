"""Numbers as training logs print them: ``9.050``, ``2e+3``, ``1.010E-06``, ``0.1903 (slow)``."""
from __future__ import annotations

import math
import re
from typing import Optional

_LEAD = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


def number(text: Optional[str]) -> Optional[float]:
    """The number a value starts with (anything after it, such as a user's note, is ignored);
    None for empty or non-numeric text and for inf / nan."""
    if not text:
        return None
    try:
        value = float(text)  # the common case, fast
    except ValueError:
        m = _LEAD.match(text)
        if not m:
            return None
        value = float(m.group(1))
    return value if math.isfinite(value) else None


def loss(text: Optional[str]) -> Optional[float]:
    """A logged loss: like :func:`number`, but ``nan`` / ``inf`` are kept (a diverged run logs them, and a
    diverged run must be said, not read as one without losses)."""
    if text and text.strip().lower().lstrip("+-").startswith(("nan", "inf")):
        return float(text.strip().split()[0].rstrip(",|"))
    return number(text)


def timing(text: Optional[str]) -> Optional[float]:
    """A logged step time: like :func:`loss`, ``nan`` / ``inf`` kept, in Lightning's padded forms too (its
    TQDM bar prints ``inf.0`` and ``nan.0``): the screen (vdkit.validation.logs.screen_steps) says how many
    there were and leaves them out, never a step dropped without a word."""
    if text and text.strip().lower().lstrip("+-").startswith(("nan", "inf")):
        word = text.strip().split()[0].rstrip(",|")
        sign = "-" if word.startswith("-") else ""
        return float(sign + ("nan" if "nan" in word.lower() else "inf"))
    return number(text)


def exact_int(text: Optional[str]) -> Optional[int]:
    """The integer a value shows exactly (``49.00``, ``1664``), None for short forms (``2e+3``)."""
    if not text or "e" in text or "E" in text:
        return None
    m = re.fullmatch(r"\s*(-?\d+)(?:\.0*)?\s*", text)
    if m:  # exact, however long (a float would turn a 400-digit step into inf, hiding a corrupt line)
        digits = m.group(1).lstrip("-")
        if len(digits) > 100:  # past Python's int() limit (4300 digits) too: any such step is a corrupt line
            return -(10 ** 100) if m.group(1).startswith("-") else 10 ** 100
        return int(m.group(1))
    value = number(text)
    if value is None or value != int(value):
        return None
    return int(value)


def short_form_matches(step: int, value: float) -> bool:
    """Whether TQDM's 3-significant-figure form of ``step`` is ``value`` (a sanity check)."""
    return float(f"{float(step):.3g}") == value
