"""Run one bad input through the CLI and classify what happened (issue 21's trial, and the table's runner).

Each case runs ``vdkit.cli.main(argv)`` in a forked child (the parent has imported vdkit once, so a
case costs a fork, not an interpreter start) with a fresh workspace as its working directory,
stdout / stderr captured, and a wall-clock limit: a hang is killed and classified, never waited
for. A few cases (``subprocess: true``) run the installed ``vdkit`` script instead, as a user would.

Outcomes:

- ``clean``: what the row wants. For ``outcome: refuse`` exit 2, exactly one line on stderr with
  ``error:``, ``fix:`` and the row's ``expect`` fragment, no traceback, the workspace unchanged.
  For ``outcome: warn`` exit 0 and a ``warning:`` line on stderr containing ``expect``.
- ``vague``: exit 2 but not that one line (several lines, no fix, the wrong reason) or something
  was left in the workspace;
- ``traceback``: an exception escaped (or a traceback was printed);
- ``accepted``: exit 0 without the refusal or the warning the row wants (silently wrong);
- ``failed-in-rank``: any other exit status (a training rank or a tool failed after the door);
- ``reached-rank``: still running after the limit, with a rank's log written (`vdkit run` / `demo`
  went past the door and trained on the input: checked too late, fate unknown);
- ``hang``: still running after the limit (10 s) otherwise.
"""
from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import yaml

HERE = Path(__file__).resolve().parent
CASES_FILE = HERE / "cases.yaml"
HANG_S = 10.0
SECRET = "hf_never_shown_in_any_output_0123456789"  # HF_TOKEN in every case's environment
OUTCOMES = ("clean", "vague", "traceback", "accepted", "failed-in-rank", "reached-rank", "hang")
CLASSES = {1: "checked too late", 2: "Hydra syntax", 3: "tracebacks", 4: "silently wrong", 5: "hangs",
           6: "secrets", 7: "vague lines", 8: "smaller losses"}
# The verbs that take --out (a refused case must not even create it).
OUT_VERBS = ("render", "submit", "run", "demo")


@dataclass
class Case:
    id: str
    cls: int
    argv: List[str]
    expect: str
    outcome: str = "refuse"  # refuse | warn | accept (exit 0, ``expect`` on stdout: nothing lost, nothing refused)
    needs: List[str] = field(default_factory=list)  # workspace extras (workspace.EXTRAS)
    env: Dict[str, str] = field(default_factory=dict)
    fsize: Optional[int] = None  # RLIMIT_FSIZE bytes in the child: a full disk for the files it writes
    subprocess: bool = False
    entry: Optional[str] = None  # "module:function" called with argv instead of vdkit.cli.main (a rank's entry)
    keeps: bool = False  # a refusal that must keep what it wrote (e.g. a run dir whose job may be queued)
    stdout_closed: bool = False  # ``subprocess`` only: the command starts with its stdout closed (`vdkit ... >&-`)

    @property
    def expects(self) -> List[str]:
        return [e for e in self.expect.split(" && ")]


def _argv(verb_argv: List[str]) -> List[str]:
    argv = [str(a) for a in verb_argv]
    if argv and argv[0] in OUT_VERBS and "--out" not in argv and "--resume" not in argv:  # --resume takes no --out
        argv += ["--out", "{ws}/out"]
    return argv


def load_cases(path: Path = CASES_FILE) -> List[Case]:
    """The rows of cases.yaml: plain ``cases`` and ``grids`` (verbs x key x values)."""
    data = yaml.safe_load(path.read_text())
    out: List[Case] = []
    for grid in data.get("grids", []):
        for verb in grid["verbs"]:
            for key, values in grid["values"].items():
                for value in values:
                    ov = f"{key}={value}"
                    argv = _argv([verb, *grid.get("base", []), *grid.get("base_" + verb, []), ov])
                    out.append(Case(id=f"c{grid['class']}-{verb}-{ov}", cls=int(grid["class"]), argv=argv,
                                    expect=str(grid.get("expect", "{key}")).replace("{key}", key),
                                    outcome=grid.get("outcome", "refuse")))
    for row in data.get("cases", []):
        verbs = row.get("verbs") or [None]
        for verb in verbs:
            argv = ([verb] if verb else []) + [str(a) for a in row["argv"]]
            expect = " && ".join(row["expect"]) if isinstance(row["expect"], list) else str(row["expect"])
            out.append(Case(id=f"c{row['class']}-{(verb + '-') if verb else ''}{row['id']}", cls=int(row["class"]),
                            argv=argv if row.get("entry") else _argv(argv), expect=expect, outcome=row.get("outcome", "refuse"),
                            needs=list(row.get("needs", [])), env=dict(row.get("env", {})),
                            fsize=row.get("fsize"), subprocess=bool(row.get("subprocess", False)),
                            entry=row.get("entry"), keeps=bool(row.get("keeps", False)),
                            stdout_closed=bool(row.get("stdout_closed", False))))
    for prod in data.get("products", []):  # one row per verb x value of ``x`` ({x} in argv / env / expect)
        for x, cls in prod["x"].items():
            for verb in prod["verbs"]:
                sub = lambda v: str(v).replace("{x}", str(x))  # noqa: E731
                expect = prod["expect"] if isinstance(prod["expect"], list) else [prod["expect"]]
                out.append(Case(id=f"c{cls}-{verb}-{prod['id']}-{x}", cls=int(cls),
                                argv=_argv([verb, *[sub(a) for a in prod["argv"]]]),
                                expect=" && ".join(sub(e) for e in expect), outcome=prod.get("outcome", "refuse"),
                                needs=list(prod.get("needs", [])), env={k: sub(v) for k, v in prod.get("env", {}).items()}))
    ids = [c.id for c in out]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"duplicate case ids: {sorted(dupes)[:5]}")
    return out


# ----------------------------------------------------------------------------- running one case
@dataclass
class Result:
    rc: object  # int, or "hang" / "exception"
    out: str
    err: str
    seconds: float
    exception: str = ""
    changed: List[str] = field(default_factory=list)


def tree(root: Path) -> dict:
    """Every path under ``root`` with its size (None for directories): what 'unchanged' compares."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            try:
                out[rel] = None if p.is_dir() and not p.is_symlink() else p.lstat().st_size
            except OSError:
                out[rel] = -1
    return out


def _subst(s: str, ws: Path) -> str:
    return s.replace("{ws}", str(ws)).replace("{python}", sys.executable)


def _child(case: Case, ws: Path, wfd: int, cap_dir: Path) -> None:
    """In the forked child: run the CLI, write the Result as JSON to ``wfd``, never return."""
    payload = {}
    try:
        os.setpgid(0, 0)
        os.chdir(ws)
        os.environ["HF_TOKEN"] = SECRET
        os.environ.pop("SLURM_CONF", None)
        for k, v in case.env.items():
            os.environ[k] = _subst(v, ws)
        # fd-level capture for what child processes (ranks, sbatch) print
        for fd, name in ((1, "fd1"), (2, "fd2")):
            f = os.open(cap_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        if case.fsize is not None:
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like ENOSPC
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize, case.fsize))
        # text streams with a .buffer, as a terminal's (some verbs write bytes to sys.stdout.buffer)
        out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)
                    for _ in range(2))
        sys.stdout, sys.stderr = out, err
        argv = [_subst(a, ws) for a in case.argv]
        t0 = time.monotonic()
        exc_text = ""
        try:
            if case.entry:
                import importlib

                mod, func = case.entry.split(":")
                rc = getattr(importlib.import_module(mod), func)(argv)
            else:
                from vdkit.cli import main

                rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                err.write(str(exc.code) + "\n")
        except BaseException:  # noqa: BLE001 - the point is to see it
            rc, exc_text = "exception", traceback.format_exc()
        text = [s.buffer.getvalue().decode("utf-8", "replace") for s in (out, err)]
        payload = {"rc": rc, "out": text[0], "err": text[1], "seconds": time.monotonic() - t0,
                   "exception": exc_text}
    except BaseException:  # noqa: BLE001
        payload = {"rc": "exception", "out": "", "err": "", "seconds": 0.0, "exception": traceback.format_exc()}
    finally:
        try:
            data = json.dumps(payload, default=str).encode("utf-8", "replace")
            while data:
                n = os.write(wfd, data)
                data = data[n:]
        finally:
            os._exit(0)


def _run_forked(case: Case, ws: Path, limit: float, cap_dir: Path) -> Result:
    rfd, wfd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(case, ws, wfd, cap_dir)
    os.close(wfd)
    chunks, deadline, t0 = [], time.monotonic() + limit, time.monotonic()
    hung = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            hung = True
            break
        ready, _, _ = select.select([rfd], [], [], left)
        if ready:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(rfd)
    if hung:
        for sig in (signal.SIGKILL,):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
    os.waitpid(pid, 0)
    fd_text = "".join((cap_dir / n).read_text(errors="replace") for n in ("fd1", "fd2") if (cap_dir / n).exists())
    if hung:
        return Result("hang", "", fd_text, time.monotonic() - t0)
    p = json.loads(b"".join(chunks).decode("utf-8", "replace") or '{"rc": "exception", "out": "", "err": "", '
                   '"seconds": 0, "exception": "child died without a result"}')
    return Result(p["rc"], p["out"], p["err"] + fd_text, p["seconds"], p.get("exception", ""))


def _run_subprocess(case: Case, ws: Path, limit: float) -> Result:
    env = {**os.environ, "HF_TOKEN": SECRET, **{k: _subst(v, ws) for k, v in case.env.items()}}
    env.pop("SLURM_CONF", None)
    exe = str(Path(sys.executable).with_name("vdkit"))
    cmd = ([exe] if os.path.exists(exe) else [sys.executable, "-m", "vdkit.cli"]) + [_subst(a, ws) for a in case.argv]
    t0 = time.monotonic()
    try:
        streams = ({"stdout": None, "stderr": subprocess.PIPE, "preexec_fn": lambda: os.close(1)}
                   if case.stdout_closed else {"capture_output": True})
        p = subprocess.run(cmd, cwd=ws, env=env, text=True, timeout=limit, errors="replace", start_new_session=True,
                           **streams)
    except subprocess.TimeoutExpired as exc:
        return Result("hang", "", str(exc.stderr or ""), time.monotonic() - t0)
    return Result(p.returncode, p.stdout or "", p.stderr, time.monotonic() - t0)


def warm_up(template: Path) -> float:
    """Run a report, a plan and a render once in this process before any case is forked, so every forked
    case inherits the imports and caches they fill (the published tables, the planned sweep cells): a
    report case then costs under a second instead of ~10 s of first-time work. Returns the seconds it took."""
    import contextlib
    import tempfile

    from vdkit.cli import main

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vdkit-warm-") as tmp, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for argv in (["report", str(template / "run_logs"), "--out", f"{tmp}/rep", "--no-plots"],
                     ["plan", "--sweep", "table9"], ["validate", str(template / "good.out")],
                     ["render", "engine=reference", "model=tiny_llama", "data=synthetic", "cluster.gpus_per_node=1",
                      "--out", f"{tmp}/out"]):
            try:
                main(argv)
            except SystemExit:
                pass
    return time.monotonic() - t0


def run_case(case: Case, ws: Path, limit: float = HANG_S) -> Result:
    """Run ``case`` with ``ws`` (a prepared workspace) as the working directory; returns its Result."""
    cap_dir = ws.parent / (ws.name + ".capture")
    cap_dir.mkdir(exist_ok=True)
    before = tree(ws)
    res = _run_subprocess(case, ws, limit) if case.subprocess else _run_forked(case, ws, limit, cap_dir)
    after = tree(ws)
    res.changed = sorted(set(after.items()) ^ set(before.items()))
    res.changed = sorted({k for k, _ in res.changed})
    return res


def classify(case: Case, res: Result, ws: Optional[Path] = None) -> str:
    """One of OUTCOMES for ``res`` (see the module docstring)."""
    text = res.out + res.err
    expects = [_subst(e, ws) if ws else e for e in case.expects]
    if res.rc == "hang":
        ranks = any(c.endswith(".out") and ("local-" in c or "/rank" in c or "slurm-" in c) for c in res.changed)
        return "reached-rank" if ranks else "hang"
    if res.rc == "exception" or "Traceback (most recent call last)" in text:
        return "traceback"
    lines = [ln for ln in res.err.strip().splitlines() if ln.strip()]
    if case.outcome == "accept":
        if res.rc == 0:
            return "clean" if all(e in res.out for e in expects) else "accepted"
        return "vague" if res.rc == 2 else "failed-in-rank"
    if case.outcome == "warn":  # a warning line on stderr, or in the report block a verb prints (validate)
        shown = lines + [ln for ln in res.out.splitlines() if ln.strip()]
        warned = any("warning" in ln and all(e in ln for e in expects) for ln in shown)
        if res.rc == 0:
            return "clean" if warned else "accepted"
        return "vague" if res.rc == 2 else "failed-in-rank"
    if res.rc == 2:
        one = (len(lines) == 1 and "error:" in lines[0] and "fix:" in lines[0] and all(e in lines[0] for e in expects))
        return "clean" if one and (case.keeps or not res.changed) and SECRET not in text else "vague"
    if res.rc == 0:
        return "accepted"
    return "failed-in-rank"


def why(case: Case, res: Result) -> str:
    """A short account of a result, for failure messages and the trial's listing."""
    tail = (res.exception or res.err or res.out).strip().splitlines()[-3:]
    return f"rc={res.rc} {res.seconds:.1f}s changed={res.changed[:3]} :: " + " | ".join(tail)[:600]
