"""What `vdkit check` reports for one run directory: lines of three kinds, and the defects that fail it.

An engine's ``check_runs(run_dirs)`` (:mod:`vdkit.recipes.engines`) returns one :class:`Report` per run
directory. Each line is one of :data:`KINDS`:

- ``checked``: executed by the stack's own code here (a config built and validated, a model on the
  meta device, a dataset's first item), with what it showed;
- ``not checked here``: what only the cluster holds (a file under its storage, a GPU kernel), named
  with the setting that points at it - never a silent pass;
- ``defect``: what the job would fail on or waste its run on: one line (what, which setting, the fix);
- ``could not check``: a probe that did not run here (its stack could not be installed or started): the
  check is not a pass, and `vdkit check` exits :data:`EXIT_NOT_CHECKED`, never 0.

Standard library only (the CLI imports it for every verb's help).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, List, Tuple

CHECKED, NOT_HERE, DEFECT, UNCHECKED = "checked", "not checked here", "defect", "could not check"
KINDS = (CHECKED, NOT_HERE, DEFECT, UNCHECKED)
EXIT_DEFECT = 2  # a defect (the kit's UserError code)
EXIT_NOT_CHECKED = 3  # no defect found, but a stack's probe did not run: not a pass


@dataclass
class Report:
    """The findings of one run directory, in the order they were made."""

    run_dir: Path
    stack: str = ""  # e.g. "Megatron-Bridge 0.3.1, megatron-core 0.16.1"
    lines: List[Tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def checked(self, text: str) -> None:
        self.lines.append((CHECKED, text))

    def not_here(self, text: str) -> None:
        self.lines.append((NOT_HERE, text))

    def defect(self, what: str, setting: str, fix: str) -> None:
        """One defect: what is wrong, the setting that makes it, how to fix it."""
        self.lines.append((DEFECT, f"{what} ({setting}; fix: {fix})"))

    def unchecked(self, text: str) -> None:
        """A probe that did not run here (why, and how to make it run)."""
        self.lines.append((UNCHECKED, text))

    @property
    def not_checked(self) -> List[str]:
        return [text for kind, text in self.lines if kind == UNCHECKED]

    @property
    def defects(self) -> List[str]:
        return [text for kind, text in self.lines if kind == DEFECT]

    def text(self) -> str:
        """The report as the CLI prints it: a header line, then one indented line per finding."""
        head = f"{self.run_dir}" + (f" ({self.stack})" if self.stack else "") + f": {self.seconds:.1f} s"
        return "\n".join([head] + [f"  {kind:<17}{text}" for kind, text in self.lines])


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception from another project's code as one line (its first line, type named, length bounded)."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = f"{type(exc).__name__}: {msg}" if not msg.startswith(type(exc).__name__) else msg
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def check_each(run_dirs: Iterable, stack: str, check_one: Callable[[Path, "Report"], None], who: str,
               setting: str) -> List["Report"]:
    """One timed :class:`Report` per run directory from ``check_one(run_dir, report)``. A stack's refusal the
    check did not foresee is still one defect line naming ``who`` stopped it and ``setting`` — never a pass."""
    import time

    out = []
    for d in run_dirs:
        start = time.perf_counter()
        rep = Report(Path(d), stack)
        try:
            check_one(Path(d), rep)
        except Exception as exc:
            rep.defect(f"{who} stopped the check: {one_line(exc)}", setting, "fix the setting it names, or re-render")
        rep.seconds = time.perf_counter() - start
        out.append(rep)
    return out
