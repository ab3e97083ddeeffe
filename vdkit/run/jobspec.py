"""What an engine hands a launcher for one run directory, and the job contract between them.

Plain data (standard library only), so that a launcher (:mod:`vdkit.launch.launchers`) can consume
it without importing any engine: the layer above (:mod:`vdkit.render.prepare`) asks the engine
(:mod:`vdkit.recipes.engines`) and passes the result on.

The job contract (every engine, every launcher; docs/cluster-guide.md "Runs longer than one
allocation"). Engines know nothing of the scheduler; launchers know nothing of an engine's loop.

1. **Stop cleanly when asked.** A training process that receives one of :data:`STOP_SIGNALS`
   (USR1 from the launcher before the time limit; TERM from Slurm at the limit, ``kill``, the
   local launcher), or whose clock passes the epoch second in the environment variable
   :data:`STOP_AT_ENV` (the launcher's max-time budget for this allocation), finishes the
   optimizer step it is on (every rank stops after the same step), writes the checkpoint of that
   step, removes any partial checkpoint files, and exits with :data:`EXIT_STOPPED`.
2. **Exit 0 only when the run is finished** (every step of ``train.max_steps`` done and
   checkpointed). An engine that cannot choose its exit code (NeMo: Lightning's ``max_time``
   stop exits 0) names the line its rank 0 prints when the run is finished in
   :attr:`JobSpec.finished_line`; exit 0 without that line in the job's output is a stop.
3. **Resume by itself.** Started again in the same run directory, the process continues from
   its latest complete checkpoint (ignoring and removing partial ones): no step lost, none repeated.
4. **The launcher decides whether the run continues**, outside the container: on a stop it starts
   the next allocation (Slurm: the batch shell submits a successor with
   ``--dependency=afterany:<this job>``; local: ``vdkit run --resume RUN_DIR``); on a finish it
   writes :data:`vdkit.run.rundir.FINISHED_FILE`, after which the run never starts again.

Engines that do not catch the signals themselves say so with ``JobSpec.stop_signal=None``
(the launcher then never sends them USR1: Lightning's SLURM handler would try ``scontrol
requeue`` from inside the container, where there is no ``scontrol``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# The launcher's "time limit near" signal, and every signal that asks a rank to stop cleanly.
PREEMPT_SIGNAL = "USR1"
STOP_SIGNALS = ("USR1", "TERM")
# A rank that stopped cleanly before the end of the run (checkpoint written): continue it.
# EX_TEMPFAIL from sysexits.h: "try again later".
EXIT_STOPPED = 75
# A rank or the pre-flight refused the recipe (a missing or wrong input, a file the stack refuses): the
# recipe's fault, never restarted or retried (vdkit's UserError exit; vdkit.recipes.common.preflight.EXIT_REFUSED).
EXIT_REFUSED = 2
PREFLIGHT_PREFIX = "vdkit pre-flight: "  # how the pre-flight's one line starts (vdkit.recipes.common.preflight.PREFIX)
# Seconds since the epoch after which a rank stops cleanly by itself (the launcher's budget for
# this allocation: the time limit less the lead its stop needs). Unset: no budget.
STOP_AT_ENV = "VDKIT_STOP_AT"


@dataclass(frozen=True)
class Container:
    """A container every rank runs in (pyxis / enroot on Slurm).

    ``image``: what ``--container-image`` gets (a squashfs path starting with / or ./, or an enroot
    URI ``[USER@][REGISTRY#]IMAGE[:TAG]``; None or empty is refused at render time).
    ``mounts``: (what, host path) pairs, mounted at the same path inside, first occurrence wins;
    ``what`` names the recipe key in error messages. ``workdir``: the directory ranks start in.
    """

    image: Optional[str]
    mounts: Tuple[Tuple[str, str], ...]
    workdir: str
    image_key: str = "engine.container_image"  # the recipe key the image comes from (for messages)


@dataclass(frozen=True)
class JobSpec:
    """One run's launch: the argv every rank runs, the engine's environment, its container (or None).

    ``stop_signal``: the signal the ranks catch to stop cleanly (the job contract above), or None
    when the engine stops by its own clock (NeMo's ``max_time_per_run``) and must not be signalled.
    ``finished_line``: for engines whose ranks exit 0 on a clean stop too, the text rank 0 prints
    when every step is done (None: exit 0 means finished).
    ``pmi``: the ranks bootstrap through PMI (the engine spec's ``needs_pmi``; Slurm then passes
    ``srun --mpi=<cluster.mpi>``), otherwise they read the launcher's variables.
    ``runs_locally``: the engine's ranks can run as processes on this machine (its spec's ``runs_locally``).
    ``heartbeat``: the ranks write the heartbeat the launcher's hang watchdog reads (the spec's ``writes_heartbeat``).
    ``preflight``: the argv the launcher runs once before the ranks (``python3 RUN/vdkit_preflight.py
    RUN/preflight.json``, :mod:`vdkit.recipes.common.preflight`): exit :data:`EXIT_REFUSED` is the recipe's fault
    (one line in the job's log; never restarted, never retried); empty: none.
    """

    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    container: Optional[Container] = None
    pmi: bool = False  # the ranks bootstrap through PMI (the engine spec's needs_pmi); the launcher's variables otherwise
    runs_locally: bool = False
    stop_signal: Optional[str] = PREEMPT_SIGNAL
    finished_line: Optional[str] = None
    heartbeat: bool = False  # the ranks write vdkit.run.faults' heartbeat files (the launcher may watch them)
    preflight: Tuple[str, ...] = ()  # run once before the ranks: every input in place, room for the checkpoints
