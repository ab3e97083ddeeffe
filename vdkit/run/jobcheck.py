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
    unreadable: bool = False  # its recipe.yaml could not be read: its one defect is the CLI's own line, whole

    def cannot_read(self, exc) -> None:
        """The run dir's recipe could not be read (a UserError): its one defect, as `vdkit run` would say it."""
        self.lines.append((DEFECT, str(exc)))
        self.unreadable = True

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

    def summary(self) -> str:
        """The report as one line (a checked sweep's): the run dir, its verdict and the count of each kind."""
        n = {kind: sum(1 for k, _ in self.lines if k == kind) for kind in KINDS}
        verdict = f"{n[DEFECT]} defect(s)" if n[DEFECT] else "ok"
        return f"{self.run_dir}: {verdict} ({n[CHECKED]} checked, {n[NOT_HERE]} not checked here, {self.seconds:.1f} s)"

    def text(self) -> str:
        """The report as the CLI prints it: a header line, then one indented line per finding."""
        head = f"{self.run_dir}" + (f" ({self.stack})" if self.stack else "") + f": {self.seconds:.1f} s"
        return "\n".join([head] + [f"  {kind:<17}{text}" for kind, text in self.lines])


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception from another project's code as one line (its first line, type named, length bounded)."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = f"{type(exc).__name__}: {msg}" if not msg.startswith(type(exc).__name__) else msg
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# Seconds one run directory's check may take (its own process: a hung one is stopped and refused, the others go
# on). The slowest measured here is a Bridge fine-tuning cell with its data (dataset + first batch): ~10 s.
TIME_LIMIT_S = 300.0
TIME_LIMIT_ENV = "VDKIT_CHECK_TIME_LIMIT_S"  # a smaller limit (the tests' hung run dir)


def time_limit() -> float:
    """:data:`TIME_LIMIT_S`, or ``$VDKIT_CHECK_TIME_LIMIT_S`` where set."""
    import os

    try:
        return float(os.environ.get(TIME_LIMIT_ENV) or TIME_LIMIT_S)
    except ValueError:
        return TIME_LIMIT_S


def isolated(run_dir: Path, stack: str, check_one: Callable[[Path, "Report"], None], who: str, setting: str,
             limit_s: float) -> "Report":
    """``check_one(run_dir, report)`` in a forked child (the stack already imported by the parent: no import cost)
    with a time limit, its lines sent back as JSON: a run dir's code that exits (``raise SystemExit(0)``), hangs
    (``while True: pass``) or crashes the interpreter is this run dir's defect, never the others' silence."""
    import json
    import os
    import select
    import signal
    import time

    rep = Report(Path(run_dir), stack)
    start = time.perf_counter()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller (os._exit), whatever check_one does
        os.close(r)
        try:
            check_one(Path(run_dir), rep)
        except BaseException as exc:  # noqa: BLE001 - SystemExit / KeyboardInterrupt from a run dir's code too
            rep.defect(f"{who} stopped the check: {one_line(exc)}", setting, "fix the setting it names, or re-render")
        try:
            with os.fdopen(w, "w") as fh:
                fh.write(json.dumps(rep.lines))
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline, timed_out = [], time.monotonic() + limit_s, False
    with os.fdopen(r, "rb") as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([fh], [], [], left)
            if ready:
                data = os.read(fh.fileno(), 1 << 16)
                if not data:
                    break
                chunks.append(data)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    rep.seconds = time.perf_counter() - start
    try:
        rep.lines = [tuple(x) for x in json.loads(b"".join(chunks) or b"null") or []]
        complete = bool(chunks)
    except ValueError:
        complete = False
    if timed_out:
        rep.lines.append((DEFECT, f"the check of this run directory did not finish in {limit_s:.0f} s (its code hung: "
                                  f"stopped) ({setting}; fix: re-render the run with `vdkit render`)"))
    elif not complete:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
        rep.lines.append((DEFECT, f"the check of this run directory ended without a report ({how}: its code exited or "
                                  f"crashed the interpreter) ({setting}; fix: re-render the run with `vdkit render`)"))
    return rep


def check_each(run_dirs: Iterable, stack: str, check_one: Callable[[Path, "Report"], None], who: str,
               setting: str) -> List["Report"]:
    """One timed :class:`Report` per run directory from ``check_one(run_dir, report)``, each in its own process with
    :func:`time_limit` (:func:`isolated`). A stack's refusal the check did not foresee is still one defect line
    naming ``who`` stopped it and ``setting`` - never a pass."""
    limit = time_limit()
    return [isolated(Path(d), stack, check_one, who, setting, limit) for d in run_dirs]
