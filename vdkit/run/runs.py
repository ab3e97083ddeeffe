"""Run directories as things: found under a results root, each read for its engine, launcher, state, steps
and last job, its ranks' progress watched against the plan (`vdkit runs`, `vdkit status`).

A run directory's own markers answer before its scheduler is asked: ``finished`` (the launcher wrote it
at the last step) and ``cancelled`` (`vdkit cancel` wrote it, :mod:`vdkit.run.runctl`) hold even when the
controller is down or has forgotten the job. Everything else is its launcher's answer
(:mod:`vdkit.launch.launchers`). One unreadable run directory is one line saying why, never the end of the list.
Standard library only at import time.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from vdkit.composition.schema import CPU_GPU_TYPE
from vdkit.errors import UserError
from vdkit.run.faults import HEARTBEAT_S
from vdkit.run.rundir import (CANCELLED_FILE, FINISHED_FILE, HEARTBEAT_DIR, JOB_ID_FILE, LOCK_FILE, PLAN_FILE,
                          RECIPE_FILE)

MAX_DEPTH = 4  # how deep `vdkit runs` looks under a root for run directories (runs/<sweep>/<cell>/ is 2)
# A straggler (docs/cluster-guide.md, "Stragglers"): a rank whose compute time per step (the heartbeat's, vdkit.recipes.common.heartbeat; its
# step time where a rank reports none) is above its peers' median by all three of these ...
STRAGGLER_FACTOR = 1.5  # ... this many times the median (50 % slower) ...
STRAGGLER_MIN_S = 0.05  # ... at least this many seconds longer (a tiny CPU step's jitter is no straggler) ...
STRAGGLER_MAD_K = 5  # ... and this many of its peers' median absolute deviations (robust to one noisy peer)
STRAGGLER_BEHIND = 2  # ... or one this many steps behind the leading rank, beyond the steps a heartbeat's age
#                        explains (HEARTBEAT_S of steps: each rank writes its count at its own moment)
NOT_SUBMITTED = "NOT_SUBMITTED"  # a run directory rendered for a scheduler and never handed to it
CANCELLED = "CANCELLED"  # the state word of a run `vdkit cancel` stopped (Slurm's own spelling too)


def find_runs(root) -> List[Path]:
    """Every run directory (a directory holding recipe.yaml) under ``root``, sorted; ``root`` itself if it is one.

    Symbolic links are not followed (a loop of them would never end) and a run directory's inside is not
    searched (its checkpoints are not runs)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root} is not a directory", "pass the results root (e.g. runs/) or a run directory")
    found = []
    base = len(root.absolute().parts)
    for here, dirs, files in os.walk(root, followlinks=False, onerror=lambda exc: None):
        if RECIPE_FILE in files:
            found.append(Path(here))
            dirs[:] = []
        elif len(Path(here).absolute().parts) - base >= MAX_DEPTH:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def cancel_record(run_dir) -> Optional[dict]:
    """What `vdkit cancel` wrote in the run directory, while it still holds: None when the run was never
    cancelled, or a job started after the cancel (a newer job_id.txt or run.lock) has made it history."""
    path = Path(run_dir) / CANCELLED_FILE
    try:
        if not path.is_file():
            return None
        record = json.loads(path.read_text()[:65536])
        stamp = path.stat().st_mtime
    except (OSError, ValueError):
        return {"at": "?", "jobs": [], "continue": "?"}  # a marker we cannot read still says cancelled
    for name in (JOB_ID_FILE, LOCK_FILE):
        try:
            if (Path(run_dir) / name).stat().st_mtime > stamp + 1:
                return None  # continued since
        except OSError:
            pass
    return record if isinstance(record, dict) else {"at": "?", "jobs": [], "continue": "?"}


def cancelled_note(run_dir) -> Optional[str]:
    """'cancelled by `vdkit cancel` (or `scancel`) at T; continue: CMD' while the run's cancel record holds (:func:`cancel_record`),
    else None: what `vdkit report` and `vdkit validate` say instead of presenting a stopped run as complete."""
    record = cancel_record(run_dir)
    if record is None:
        return None
    return f"cancelled by {_by(record)} at {record.get('at', '?')}; continue: {record.get('continue', '?')}"


def _by(record: dict) -> str:
    """Who cancelled: `vdkit cancel` (its record), or the scheduler's own command the job saw (``by``: scancel)."""
    by = record.get("by")
    return f"`{by}`" if isinstance(by, str) and by.isidentifier() else "`vdkit cancel`"


def marker_state(run_dir) -> Optional[str]:
    """The state the run directory's own markers give (``COMPLETED (finished)``, ``CANCELLED (...)``), or None
    when the launcher must be asked."""
    from vdkit.launch.launchers import COMPLETED

    run_dir = Path(run_dir)
    if (run_dir / FINISHED_FILE).is_file():
        return f"{COMPLETED} (its file {FINISHED_FILE} says so)"
    record = cancel_record(run_dir)
    if record is not None:
        return f"{CANCELLED} ({_by(record).strip('`')} at {record.get('at', '?')}; continue: {record.get('continue', '?')})"
    return None


def state(run_dir, launcher) -> str:
    """The run's state: its markers first, else its launcher's answer."""
    from vdkit.run.runlock import is_held

    found = marker_state(run_dir)
    if found is not None and not (found.startswith(CANCELLED) and is_held(run_dir)):
        return found
    return launcher.status(run_dir)


# ----------------------------------------------------------------------------- progress
@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat line (vdkit.recipes.common.heartbeat): liveness, steps done, its last step."""

    rank: int
    beat_at: float
    progress_at: float
    steps: int
    step_s: float
    node: str
    phase: str
    compute_s: Optional[float] = None  # the median of its last steps' time before the gradient reduction
    device: Optional[str] = None  # what its torch trains on: gpu | cpu (None: not said)


def heartbeats(run_dir) -> Dict[int, Beat]:
    """rank -> its heartbeat, for every readable ``heartbeat/rank<R>`` (a damaged one is left out)."""
    out = {}
    folder = Path(run_dir) / HEARTBEAT_DIR
    try:
        paths = sorted(folder.glob("rank*")) if folder.is_dir() else []
    except OSError:
        return {}
    for path in paths:
        try:
            rank = int(path.name[4:])
            if not path.is_file() or path.stat().st_size > 4096:
                continue
            fields = path.read_text().split()
            beat, prog, steps, ms, node, phase = fields[:6]
            compute = int(fields[6]) / 1000.0 if len(fields) > 6 and fields[6].isdigit() else None
            device = fields[7] if len(fields) > 7 and fields[7] in ("gpu", "cpu") else None
            out[rank] = Beat(rank, float(beat), float(prog), int(steps), int(ms) / 1000.0, node, phase, compute, device)
        except (OSError, ValueError):
            continue
    return out


def is_slow(value: float, peers: List[float]) -> bool:
    """Whether ``value`` runs well behind ``peers`` (another rank's figures): above their median by
    STRAGGLER_FACTOR x, by STRAGGLER_MIN_S seconds and by STRAGGLER_MAD_K median absolute deviations."""
    if not peers:
        return False
    median = statistics.median(peers)
    mad = statistics.median(abs(p - median) for p in peers)
    return value > STRAGGLER_FACTOR * median and value - median > max(STRAGGLER_MIN_S, STRAGGLER_MAD_K * mad)


def straggler(beats: Dict[int, Beat]) -> Optional[str]:
    """'rank 3 on node-2: 0.9 s/step vs its peers' 0.2' for a rank whose steps run well behind its peers'
    (:func:`is_slow`; compute times when every rank reports one, else step times), or STRAGGLER_BEHIND steps
    behind the leader; the slowest such rank, else None."""
    live = [b for b in beats.values() if b.steps > 0]
    if len(live) < 2:
        return None
    compute = all(b.compute_s is not None for b in live)
    time_of = (lambda b: b.compute_s) if compute else (lambda b: b.step_s)  # noqa: E731
    lead = max(b.steps for b in live)
    fastest = min((b.step_s for b in live if b.step_s > 0), default=0.0)
    # in lock-step training a rank is never really behind; fast steps make heartbeats written a moment apart
    # differ by many steps (a 0.16 s step, 2 s between beats: up to 13), which is no straggler
    allowed = STRAGGLER_BEHIND + (math.ceil(HEARTBEAT_S / fastest) if fastest else 0)
    worst = None
    for b in live:
        peers = [time_of(p) for p in live if p.rank != b.rank]
        behind = lead - b.steps >= allowed
        gap = time_of(b) - statistics.median(peers)
        if (is_slow(time_of(b), peers) or behind) and (worst is None or gap > worst[1]):
            worst = (b, gap, statistics.median(peers))
    if worst is None:
        return None
    b, _, median = worst
    gap = f"; {lead - b.steps} step(s) behind" if lead - b.steps else ""
    what = "s of compute per step (before the gradient reduction)" if compute else "s/step"
    return f"straggler: rank {b.rank} on {b.node}: {time_of(b):.3g} {what} vs its peers' {median:.3g}{gap}"


@dataclass
class Progress:
    """Steps done and planned, the measured step time, the plan's range and what remains."""

    done: Optional[int] = None
    planned: Optional[int] = None
    step_s: Optional[float] = None  # measured (the heartbeats' median, else the log's recent mean)
    plan_s: Optional[tuple] = None  # (low, high) seconds per step from plan.json, or (predicted, predicted)
    plan_for: Optional[str] = None  # the GPU the plan predicts for (the recipe's cluster.gpu_type)
    on_cpu: bool = False  # every rank that trained says its torch saw no accelerator (heartbeat's device)
    notes: List[str] = field(default_factory=list)

    def eta_s(self) -> Optional[float]:
        if None in (self.done, self.planned, self.step_s) or self.done >= self.planned:
            return None
        return (self.planned - self.done) * self.step_s

    def text(self, eta: bool = True) -> str:
        """'step 30/50, 0.21 s/step (plan 0.18-0.25), ETA 4 s' with what is known (no ETA with ``eta`` False: the run
        has ended)."""
        parts = [f"step {'?' if self.done is None else self.done}/{'?' if self.planned is None else self.planned}"]
        if self.step_s is not None:
            measured = f"{self.step_s:.3g} s/step"
            if self.plan_s:
                lo, hi = self.plan_s
                plan = f"plan {lo:.3g}" if lo == hi else f"plan {lo:.3g}-{hi:.3g}"
                if self.plan_for:
                    plan += f" on {self.plan_for}"
                if self.on_cpu and self.plan_for != CPU_GPU_TYPE:  # the local emulated Slurm: no comparison to make
                    plan += "; this run trains on CPU (emulated nodes): not comparable"
                measured += f" ({plan})"
            parts.append(measured)
        eta = self.eta_s() if eta else None
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        return ", ".join(parts + self.notes)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def _plan_range(run_dir) -> Optional[tuple]:
    try:
        pred = json.loads((Path(run_dir) / PLAN_FILE).read_text()[:4 << 20]).get("prediction") or {}
        if pred.get("interval_s"):
            lo, hi = (float(x) for x in pred["interval_s"])
            return lo, hi
        total = sum(float(v) for k, v in pred["step"].items() if k.endswith("_s"))
        return total, total
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def progress(run_dir, planned: Optional[int], plan_for: Optional[str] = None) -> Progress:
    """The run's progress: the ranks' heartbeats when they write them, else its logs (steps parsed). ``plan_for``:
    the GPU type the plan's step time is for (the recipe's cluster.gpu_type), said beside it."""
    out = Progress(planned=planned, plan_s=_plan_range(run_dir), plan_for=plan_for)
    beats = heartbeats(run_dir)
    trained = [b for b in beats.values() if b.steps > 0]
    if trained:
        out.on_cpu = all(b.device == "cpu" for b in trained)
        out.done = min(b.steps for b in trained)
        out.step_s = statistics.median(b.step_s for b in trained)
        lagging = straggler(beats)
        if lagging:
            out.notes.append(lagging)
        return out
    try:
        from vdkit.validation.logs import read_source

        log = read_source(run_dir, require_timing=False)
    except (UserError, OSError, ValueError):
        return out
    out.done = log.steps[-1].step + 1
    recent = [t for t in log.timings[-10:] if t and t > 0]
    out.step_s = statistics.mean(recent) if recent else None
    return out


# ----------------------------------------------------------------------------- one line per run
@dataclass
class RunInfo:
    """What `vdkit runs` prints for one run directory."""

    path: Path
    engine: str = "?"
    launcher: str = "?"
    state: str = "?"
    steps: str = "?"
    job: str = "-"


def describe(run_dir) -> RunInfo:
    """Engine, launcher, state, steps done / planned and last job of one run directory; a field that cannot
    be read says why instead (UNREADABLE: ...), and the others are still given."""
    from vdkit.launch import launchers
    from vdkit.run.rundir import load_recipe
    from vdkit.run.runlock import check_state_files

    info = RunInfo(Path(run_dir))
    try:
        check_state_files(run_dir)
        recipe = load_recipe(run_dir)
    except (UserError, OSError) as exc:
        info.state = f"UNREADABLE: {getattr(exc, 'what', exc)}"
        return info
    info.engine, info.launcher = recipe.engine.name, recipe.cluster.launcher
    done = progress(run_dir, recipe.train.max_steps).done
    info.steps = f"{'?' if done is None else done}/{recipe.train.max_steps}"
    try:
        launcher = launchers.get(recipe.cluster.launcher)
    except UserError as exc:
        info.state = f"UNREADABLE: {exc.what}"
        return info
    run_dir = Path(run_dir)
    if not launcher.executes_here and not any((run_dir / n).exists() for n in (JOB_ID_FILE, LOCK_FILE)) \
            and marker_state(run_dir) is None:
        info.state = NOT_SUBMITTED  # rendered only: no scheduler to ask
        return info
    try:
        info.job = launcher.job(run_dir)
    except (UserError, OSError):
        info.job = "-"
    try:
        info.state = state(run_dir, launcher)
    except (UserError, OSError) as exc:
        info.state = f"UNREADABLE: {getattr(exc, 'what', exc)}"
    return info


def now_text() -> str:
    """This moment as the run-dir records write it (UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Ticker:
    """A progress line for a long wait on a run (`vdkit demo`'s training): every ``every_s`` seconds, when the run
    moved, ``prefix`` + :class:`Progress` text ('step 20/50, 0.41 s/step, ETA 12 s'), from a daemon thread.
    A context manager: the thread ends with the block."""

    def __init__(self, run_dir, planned: Optional[int], prefix: str = "", every_s: float = 15.0, stream=None):
        import sys
        import threading

        self.run_dir, self.planned, self.prefix, self.every_s = Path(run_dir), planned, prefix, every_s
        self.stream = stream if stream is not None else sys.stdout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vdkit-ticker", daemon=True)
        self.shown: List[str] = []

    def _run(self) -> None:
        last = None
        while not self._stop.wait(self.every_s):
            try:
                p = progress(self.run_dir, self.planned)
            except Exception:  # noqa: BLE001 - a progress line is a courtesy: a half-written log must not end the run
                continue
            if p.done is None or p.done == last:
                continue
            last = p.done
            line = self.prefix + p.text()
            self.shown.append(line)
            try:
                print(line, file=self.stream, flush=True)
            except (OSError, ValueError):
                return

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join(timeout=5)
        return False
