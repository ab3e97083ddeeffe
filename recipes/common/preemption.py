"""The job contract's stop, for every engine the kit runs itself: finish the step, checkpoint, exit.

What the contract asks (:mod:`vdkit.run.jobspec`): on USR1 (the launcher's "time limit near"), TERM
(Slurm at the limit, ``kill``) or once the clock passes ``$VDKIT_STOP_AT`` (the launcher's budget
for this allocation), a rank stops cleanly and exits with :data:`EXIT_STOPPED`; whether the run
continues is the launcher's decision, taken outside the container (inside a pyxis container there
is no ``scontrol`` to ask Slurm with, NVIDIA/pyxis#129).

Without a handler USR1 and TERM end a Python process at once (no checkpoint). With
:class:`Preemption` installed, a signal only raises a flag; the training loop asks
:meth:`Preemption.stop_now` after each optimizer step, so that

1. the step in progress finishes (no half-applied update),
2. every rank agrees to stop at the *same* step (the signal may reach ranks at different steps:
   the flag is summed over ranks with the engine's own all-reduce),
3. the engine saves its checkpoint for that step (partial files of an earlier killed save removed),
4. every rank raises :class:`Preempted`; :func:`rank_main` turns it into exit code
   :data:`EXIT_STOPPED`. Started again in the same run dir, the engine resumes at the next step:
   no step is lost and none is repeated.

Engine-neutral (standard library only): the reference engine passes Fabric's all-reduce, the
megatron engine ``torch.distributed.all_reduce`` over the whole world (every TP, PP and DP rank
must stop after the same step, or a pipeline schedule would wait forever for a peer).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Mapping, Optional

from vdkit.run.jobspec import EXIT_STOPPED, PREEMPT_SIGNAL as SIGNAL_NAME, STOP_AT_ENV, STOP_SIGNALS

STOP_SIGNUMS = tuple(getattr(signal, f"SIG{name}") for name in STOP_SIGNALS)


def stop_at(env: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """The launcher's budget: the epoch second ``$VDKIT_STOP_AT`` names, or None (unset or unreadable)."""
    env = os.environ if env is None else env
    try:
        value = float(env.get(STOP_AT_ENV, ""))
    except ValueError:
        return None
    return value if value > 0 else None


class Preemption:
    """A flag set by a stop signal or by the budget's clock; see the module docstring for the protocol."""

    def __init__(self, signums=STOP_SIGNUMS, deadline: Optional[float] = None):
        self.signums = tuple(signums)
        self.deadline = deadline  # epoch seconds (time.time()), or None
        self.received: Optional[str] = None  # what asked for the stop (a signal name, "time budget")
        self._previous = {}

    def install(self) -> "Preemption":
        """Catch the signals from now on (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for signum in self.signums:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:  # async-signal context: set the flag, nothing else
        self.received = self.received or signal.Signals(signum).name[3:]

    def _local_flag(self) -> bool:
        if self.received is None and self.deadline is not None and time.time() >= self.deadline:
            self.received = "time budget"
        return self.received is not None

    def stop_now(self, sum_over_ranks: Optional[Callable[[int], float]] = None) -> bool:
        """True on every rank when any rank was asked to stop. Call it at the same point on every rank
        (after each step): with ``sum_over_ranks`` it is a collective."""
        flag = 1 if self._local_flag() else 0
        if sum_over_ranks is not None:
            flag = sum_over_ranks(flag)
        return flag > 0

    def why(self) -> str:
        """What asked for the stop, for the log line ('USR1', 'TERM', 'time budget', or another rank)."""
        return self.received or "another rank's signal"


class Preempted(Exception):
    """Raised by an engine's loop once it has checkpointed ``step``; the rank exits with EXIT_STOPPED."""

    exit_code = EXIT_STOPPED

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"stopped cleanly after step {step}")


def stop_message(preempt: "Preemption", step: int, ckpt_dir) -> str:
    """Rank 0's line when it stops (validation and the tests read 'stopped after global_step N')."""
    return (f"[vdkit I] {preempt.why()}: stopped after global_step {step}, checkpoint in {ckpt_dir}; "
            f"exit {EXIT_STOPPED} (the launcher continues the run)")


def rank_main(engine: str, train: Callable, argv=None, require: Optional[Callable[[], None]] = None) -> int:
    """``python -m vdkit.recipes.<engine> RUN_DIR`` for every engine the kit runs itself.

    Installs the stop handler first (a USR1 that arrives while torch loads must not kill the rank),
    runs ``require`` (the engine's runtime check) and ``train(run_dir, preempt=...)``; a UserError
    is one line and its exit code (2), a clean stop is :data:`EXIT_STOPPED`.
    """
    import sys

    from vdkit.errors import UserError

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: python -m vdkit.recipes.{engine} RUN_DIR", file=sys.stderr)
        return 2
    preempt = Preemption(deadline=stop_at()).install()
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
        import errno

        from vdkit.run.faults import EXIT_NO_SPACE

        # A full or read-only disk is the site's, not the recipe's: the launcher may restart (vdkit.run.faults).
        return EXIT_NO_SPACE if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG) else err.exit_code
    except Preempted as stop:
        return stop.exit_code
    return 0
