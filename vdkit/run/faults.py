"""What a run does when a rank, a node, a disk or the controller fails: the numbers and records launchers,
engines and `vdkit status` share (standard library only; issue 27).

- **Heartbeat.** Every rank of an engine the kit runs itself (:mod:`vdkit.recipes.common.heartbeat`) rewrites
  ``<run_dir>/heartbeat/rank<R>`` every :data:`HEARTBEAT_S` seconds from a thread (liveness) and after
  every optimizer step (progress). The launcher's watchdog (Slurm: the batch shell,
  :mod:`vdkit.slurm.recovery`) kills the job step when a rank stops beating for :data:`DEAD_AFTER_S`
  (a dead node, a SIGSTOPped or swapped-out process) or when no rank progressed for the hang limit
  (:func:`limits`: :data:`HANG_FACTOR` x the measured step time, never under :data:`HANG_MIN_S`; the
  start-up grace until the first step, the save grace while a checkpoint is written).
- **Collective timeouts** (NCCL / gloo process groups) come from the same limits, exported to the ranks
  as :data:`COLLECTIVE_TIMEOUT_ENV`: longer than the watchdog's (so the watchdog, which can name the
  culprit, acts first), far shorter than torch's default 10 / 30 minutes of an idle allocation.
- **Per-cluster settings.** ``cluster.heartbeat_timeout_s``, ``cluster.kill_grace_s`` and
  ``cluster.restart_delay_s`` replace :data:`DEAD_AFTER_S`, :data:`KILL_GRACE_S` and :data:`RESTART_DELAY_S`
  for one plan (None, the default: these production figures). A small test cluster whose tiny steps take
  well under a second can use short ones (the fault suite, tests/test_faults.py); a real site keeps these.
- **Recovery.** A failed step is recorded as one JSON line in ``faults.jsonl`` (:func:`read_faults`);
  the launcher retries the run from its last good checkpoint up to ``cluster.max_restarts`` times,
  without the node a failure was blamed on (``excluded_nodes``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

HEARTBEAT_S = 2  # a rank rewrites its heartbeat file this often (a thread; cheap even on NFS)
DEAD_AFTER_S = 20  # a rank whose heartbeat is this old is dead or stopped (10 missed beats: GIL-heavy loads pass)
KILL_GRACE_S = 10  # after killing the step, the watchdog waits this long for srun before killing srun itself
RESTART_DELAY_S = 30  # a successor that excludes a node starts this long after the failure (sbatch --begin=now+N):
#                       the failed job may stay COMPLETING until Slurm declares the node down, so no dependency
HANDOVER_FACTOR = 12  # a successor waits up to this many kill graces (120 s by default) for the last processes of
#                       the job it was chained after to release the run dir's lock (vdkit.slurm.recovery.handover_lines)
HANG_FACTOR = 10  # no progress for this many step times is a hang (NVRx's default section timeouts are coarser)
HANG_MIN_S = 60  # ... but never less: a tiny step's 10x would fire on a slow save or a busy file system
COLLECTIVE_MARGIN_S = 60  # the process group's timeout exceeds the watchdog's limits by this much
SUBMIT_TRIES = 6  # sbatch attempts for the successor while the controller is away (back-off 5, 10, 20, 40, 60 s)
EXIT_NO_SPACE = 74  # a rank could not write its checkpoint (full, read-only, quota): EX_IOERR from sysexits.h

# Environment variables the launcher exports to the ranks.
HEARTBEAT_ENV = "VDKIT_HEARTBEAT_DIR"  # where the rank writes rank<R> (unset: no heartbeat)
COLLECTIVE_TIMEOUT_ENV = "VDKIT_COLLECTIVE_TIMEOUT_S"  # the process group's timeout in seconds
DEFAULT_COLLECTIVE_TIMEOUT_S = 600  # without a launcher's figure (`vdkit run`): torch's NCCL default is 600 s


@dataclass(frozen=True)
class Limits:
    """The watchdog's and the process group's seconds for one plan."""

    startup_grace_s: int  # until every rank has finished its first step
    hang_s: int  # no progress for this long after that is a hang (the planned step time's; the watchdog
    #              re-derives it from the measured step time at run time)
    save_grace_s: int  # while a checkpoint is being written or read
    collective_timeout_s: int
    dead_after_s: int = DEAD_AFTER_S  # a rank silent this long is dead or stopped (cluster.heartbeat_timeout_s)
    kill_grace_s: int = KILL_GRACE_S  # srun's time to end after the step's kill (cluster.kill_grace_s)
    restart_delay_s: int = RESTART_DELAY_S  # a node-excluding successor's start delay (cluster.restart_delay_s)

    @property
    def handover_wait_s(self) -> int:
        """How long a successor waits for its predecessor's last processes to release the run dir's lock."""
        return HANDOVER_FACTOR * self.kill_grace_s


def limits(startup_s: float, step_s: Optional[float], checkpoint_write_s: float, dead_after_s=None,
           kill_grace_s=None, restart_delay_s=None) -> Limits:
    """The limits from the plan's time figures (vdkit.planner.timeplan.TimePlan: start-up, step, checkpoint write)
    and the cluster's settings (None: this module's defaults)."""
    hang = hang_limit(step_s)
    save = int(math.ceil(max(HANG_MIN_S, 4 * checkpoint_write_s)))
    grace = int(math.ceil(2 * startup_s + save))
    pick = lambda value, default: default if value is None else int(math.ceil(value))  # noqa: E731
    return Limits(grace, hang, save, max(grace, hang, save) + COLLECTIVE_MARGIN_S, pick(dead_after_s, DEAD_AFTER_S),
                  pick(kill_grace_s, KILL_GRACE_S), pick(restart_delay_s, RESTART_DELAY_S))


def hang_limit(step_s: Optional[float]) -> int:
    """Seconds without progress that count as a hang for a step of ``step_s`` seconds (None: unknown)."""
    return int(math.ceil(max(HANG_MIN_S, HANG_FACTOR * (step_s or 0.0))))


def collective_timeout_s(env=None) -> int:
    """The process group's timeout the launcher chose for this rank, else the default."""
    import os

    env = os.environ if env is None else env
    try:
        value = int(float(env.get(COLLECTIVE_TIMEOUT_ENV, "")))
    except ValueError:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    return value if value > 0 else DEFAULT_COLLECTIVE_TIMEOUT_S


# ----------------------------------------------------------------------------- the record
SIGNAL_WORDS = {9: "killed (SIGKILL: out of memory?)", 15: "terminated (SIGTERM)", 6: "aborted (SIGABRT)",
                11: "crashed (SIGSEGV)", 7: "crashed (SIGBUS)", 19: "stopped (SIGSTOP)"}


def cause_text(fault: dict) -> str:
    """One fault as words: 'rank 1 on xe9680-2: killed (SIGKILL: out of memory?)'."""
    who = []
    if fault.get("rank") not in (None, ""):
        who.append(f"rank {fault['rank']}")
    if fault.get("node"):
        who.append(f"on {fault['node']}")
    what = fault.get("cause") or f"exit {fault.get('rc')}"
    return f"{' '.join(who)}: {what}" if who else what


def read_faults(run_dir) -> List[dict]:
    """Every fault the launcher recorded in the run directory, oldest first (unreadable lines skipped)."""
    from vdkit.run.rundir import FAULTS_FILE

    try:
        lines = (Path(run_dir) / FAULTS_FILE).read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def append_fault(run_dir, **fields) -> None:
    """Add one fault to the run directory's record (the keys :func:`cause_text` and :func:`summary` read; the Slurm
    batch shell writes the same line from its ``vdkit_failed``)."""
    from vdkit.run.rundir import FAULTS_FILE

    with open(Path(run_dir) / FAULTS_FILE, "a") as fh:
        fh.write(json.dumps(fields) + "\n")


def _set_aside(run_dir) -> List[str]:
    """Names of the checkpoints a resume found damaged and renamed (vdkit.recipes.common.trust)."""
    try:
        from vdkit.run.rundir import checkpoint_dir, load_recipe

        ckpts = checkpoint_dir(load_recipe(Path(run_dir)), run_dir)
        return sorted(p.name for p in ckpts.iterdir() if ".damaged-" in p.name and not p.name.endswith(".sha256"))
    except Exception:  # noqa: BLE001 - status must answer even for a run dir it cannot read
        return []


# A scheduler's words for a job that has not ended (Slurm's spelling; `vdkit status` passes the latest job's).
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "STAGE_OUT", "SIGNALING", "UNKNOWN")


def _next_failed(last: dict, job, state) -> bool:
    """Whether the successor the record names is the run's latest job and ended without success (it did not
    start, or failed before a record of its own): the chain stopped there."""
    word = str(state or "").split(" ", 1)[0].upper()
    return bool(word) and str(job) == str(last.get("next")) and word != "COMPLETED" and word not in ACTIVE_STATES


def summary(run_dir, job=None, state=None) -> Optional[str]:
    """The last fault and what followed, for `vdkit status`: None when the run had none.

    ``job`` and ``state``: the run's latest job and its state as the launcher words it. When that job is the
    successor the record named and it ended without success, the run has stopped: the line says so, why, and
    the command that continues it (never that the failed job continues)."""
    faults = read_faults(run_dir)
    if not faults:
        return None
    last = faults[-1]
    text = f"{len(faults)} fault(s); last: job {last.get('job')} {cause_text(last)}"
    if last.get("last_step") not in (None, ""):
        text += f"; latest checkpoint step {last['last_step']}"
    aside = _set_aside(run_dir)
    if aside:
        text += f"; set aside as damaged: {', '.join(aside)}"
    if last.get("next") and _next_failed(last, job, state):
        text += (f"; restart {last.get('restart')} of {last.get('max_restarts')}: job {last['next']} ended "
                 f"({state}) without continuing the run: the run has stopped; continue: {last.get('continue')}")
    elif last.get("next"):
        text += f"; restart {last.get('restart')} of {last.get('max_restarts')}: job {last['next']} continues"
    elif last.get("continue"):
        text += f"; not restarted ({last.get('why', 'no restarts left')}); continue: {last['continue']}"
    return text
