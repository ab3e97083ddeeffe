"""What an engine hands the launcher for one run directory: the rank command, its env, its container.

Plain data (standard library only), so that a launcher (:mod:`vdkit.launchers`) can consume it
without importing any engine: the layer above (:mod:`vdkit.prepare`) asks the engine
(:mod:`vdkit.recipes.engines`) and passes the result on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# The job contract's pre-timeout signal: the launcher asks for it (Slurm: --signal=USR1@lead) and every
# engine the kit runs handles it (vdkit.recipes.preemption); Lightning's SLURM requeue default too.
PREEMPT_SIGNAL = "USR1"


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

    ``pmi``: the ranks bootstrap through PMI (the engine's ``NEEDS_PMI``; Slurm then passes
    ``srun --mpi=<cluster.mpi>``), otherwise they read the launcher's variables.
    ``runs_locally``: the engine's ranks can run as processes on this machine (its ``RUNS_LOCALLY``).
    """

    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    container: Optional[Container] = None
    pmi: bool = False
    runs_locally: bool = False
