"""Preemption for every engine the kit runs itself: finish the step, checkpoint, requeue, exit.

The rendered sbatch asks Slurm for ``--signal=USR1@<lead>`` before the time limit and sets
``--requeue`` (``scancel --signal=USR1 JOB`` sends the same signal by hand). Without a handler
USR1 terminates a Python process (exit 138, job FAILED, no checkpoint). With :class:`Preemption`
installed, the signal only raises a flag; the training loop asks :meth:`Preemption.stop_now`
after each optimizer step, so that

1. the step in progress finishes (no half-applied update),
2. every rank agrees to stop at the *same* step (the signal may reach ranks at different steps:
   the flag is summed over ranks with the engine's own all-reduce),
3. the engine saves its checkpoint for that step,
4. rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` (:meth:`Preemption.requeue`) and every rank
   exits; the requeued job (same id, same run dir) resumes from that checkpoint: no step is lost
   and none is repeated.

Engine-neutral (standard library only): the reference engine passes Fabric's all-reduce, the
megatron engine ``torch.distributed.all_reduce`` over the whole world (every TP, PP and DP rank
must stop after the same step, or a pipeline schedule would wait forever for a peer).
NeMo needs none of this: Lightning's SLURMEnvironment arms the same handler on SIGUSR1
(``auto_requeue``), see tests/test_preemption.py.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from typing import Callable, Mapping, Optional

from vdkit.jobspec import PREEMPT_SIGNAL as SIGNAL_NAME  # what the sbatch asks for (the job contract)

REQUEUE_SIGNAL = getattr(signal, f"SIG{SIGNAL_NAME}")
# Exit code of a rank that stopped for preemption but could not requeue (not a Slurm job,
# requeue refused): the checkpoint is there, the job is not finished. EX_TEMPFAIL.
EXIT_NOT_REQUEUED = 75
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def slurm_job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The id ``scontrol requeue`` takes for this job (``ARRAYJOB_TASK`` for an array task), or None."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    else:
        job = env.get("SLURM_JOB_ID", "")
    return job if _JOB_ID.match(job) else None


class Preemption:
    """A flag set by the requeue signal; see the module docstring for the protocol."""

    def __init__(self, signum: int = REQUEUE_SIGNAL):
        self.signum = signum
        self.received = False
        self._previous = None

    def install(self) -> "Preemption":
        """Catch the signal from now on (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._handle)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:  # async-signal context: set the flag, nothing else
        self.received = True

    def stop_now(self, sum_over_ranks: Optional[Callable[[int], float]] = None) -> bool:
        """True on every rank when any rank got the signal. Call it at the same point on every rank
        (after each step): with ``sum_over_ranks`` it is a collective."""
        flag = 1 if self.received else 0
        if sum_over_ranks is not None:
            flag = sum_over_ranks(flag)
        return flag > 0

    def requeue(self, env: Optional[Mapping[str, str]] = None, timeout_s: float = 60) -> tuple:
        """Rank 0: ask Slurm to requeue this job. Returns (ok, one line saying what happened)."""
        job = slurm_job_id(env)
        if job is None:
            return False, "not a Slurm job: nothing to requeue; run the same command again to resume"
        scontrol = shutil.which("scontrol") or "scontrol"
        try:
            proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"scontrol requeue {job} failed ({exc}); resubmit the run dir's launch.sbatch to resume"
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            return False, (f"scontrol requeue {job} failed ({why[-1] if why else 'exit ' + str(proc.returncode)}); "
                           "resubmit the run dir's launch.sbatch to resume")
        return True, f"requeued Slurm job {job}; it resumes from the checkpoint"


class Preempted(Exception):
    """Raised by an engine's loop once it has checkpointed ``step`` and (rank 0) asked for the requeue.

    The rank's entry point returns :attr:`exit_code`: 0 when the job was requeued (Slurm restarts
    it), EXIT_NOT_REQUEUED otherwise (the work is saved, the job must be started again).
    """

    def __init__(self, step: int, requeued: bool):
        self.step = step
        self.requeued = requeued
        self.exit_code = 0 if requeued else EXIT_NOT_REQUEUED
        super().__init__(f"preempted after step {step} ({'requeued' if requeued else 'not requeued'})")


def rank_main(engine: str, train: Callable, argv=None, require: Optional[Callable[[], None]] = None) -> int:
    """``python -m vdkit.recipes.<engine> RUN_DIR`` for every engine the kit runs itself.

    Installs the preemption handler first (a USR1 that arrives while torch loads must not kill the
    rank), runs ``require`` (the engine's runtime check) and ``train(run_dir, preempt=...)``; a
    UserError is one line and its exit code (2), a preemption stop is :attr:`Preempted.exit_code`.
    """
    import sys

    from vdkit.errors import UserError

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: python -m vdkit.recipes.{engine} RUN_DIR", file=sys.stderr)
        return 2
    preempt = Preemption().install()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if require is not None:
            require()
        train(argv[0], preempt=preempt)
    except UserError as exc:
        print(f"vdkit {engine}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a full disk or a lost mount while saving a checkpoint: one line, not a traceback
        from vdkit.errors import environment_error

        err = environment_error(exc)
        if err is None:
            raise
        print(f"vdkit {engine}: error: {err}", file=sys.stderr)
        return err.exit_code
    except Preempted as stop:
        return stop.exit_code
    return 0
