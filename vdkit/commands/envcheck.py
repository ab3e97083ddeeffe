"""The environment variables the kit reads, checked as a verb starts (issue 36): a bad one is one line naming the
variable, what is wrong and the fix (exit 2), never a traceback later, a rank that dies or a run that stops
without a word. Standard library only.

What is read where (``grep -rn environ``): ``SLURM_CONF`` by every Slurm client the kit runs (sbatch, squeue,
scontrol, sinfo); ``VDKIT_STOP_AT`` by the ranks (vdkit.recipes.common.preemption: the Slurm batch shell's budget,
exported to them); ``DS_ACCELERATOR`` by DeepSpeed in the ranks; ``VDKIT_CHECK_TIME_LIMIT_S`` by `vdkit check`
(vdkit.run.jobcheck); ``VDKIT_NEMO_VENV`` (vdkit.recipes.nemo.runcheck.venv) and ``VDKIT_SLURM_DIR``
(vdkit.slurm.localcluster) as directories; ``VDKIT_CONF_DIR`` by vdkit.composition.config (checked there). The launcher's
own (``VDKIT_HEARTBEAT_DIR``, ``VDKIT_COLLECTIVE_TIMEOUT_S``) are set for the ranks, never read from a user.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import List, Mapping

from vdkit.errors import UserError
from vdkit.run.jobspec import STOP_AT_ENV

SLURM_VERBS = ("submit", "status", "runs", "logs", "cancel", "demo", "cluster", "site")  # run Slurm's clients
RANK_VERBS = ("run", "demo", "submit")  # start ranks with this environment (sbatch exports it to the job)
DS_ACCELERATORS = ("cuda", "cpu")  # the DeepSpeed accelerators the kit's engines run on (DeepSpeed knows more)
MAX_SLURM_CONF_BYTES = 1 << 20  # a slurm.conf is a few kB; more is not one
MAX_CHECK_LIMIT_S = 86400.0


def check_environment(verb: str, env: Mapping[str, str] = None) -> List[str]:
    """Refuse (UserError) the first variable ``verb`` would read that cannot work; return warning lines."""
    env = os.environ if env is None else env
    warnings: List[str] = []
    if verb in SLURM_VERBS and env.get("SLURM_CONF"):
        _slurm_conf(env["SLURM_CONF"])
    if verb in ("run", "demo") and env.get(STOP_AT_ENV):
        warnings += _stop_at(env[STOP_AT_ENV])
    if verb in RANK_VERBS and env.get("DS_ACCELERATOR", "") not in ("", *DS_ACCELERATORS):
        raise UserError(f"DS_ACCELERATOR={env['DS_ACCELERATOR']!r} is set in the environment: DeepSpeed in the ranks "
                        f"would use it, and the kit's engines run on {' or '.join(DS_ACCELERATORS)} only",
                        "unset DS_ACCELERATOR (the engines choose cuda or cpu themselves)")
    if verb == "check" and env.get("VDKIT_CHECK_TIME_LIMIT_S"):
        _seconds("VDKIT_CHECK_TIME_LIMIT_S", env["VDKIT_CHECK_TIME_LIMIT_S"], MAX_CHECK_LIMIT_S)
    for name, verbs in (("VDKIT_NEMO_VENV", ("check",)), ("VDKIT_SLURM_DIR", ("cluster", "demo"))):
        if verb in verbs and env.get(name) and Path(env[name]).exists() and not Path(env[name]).is_dir():
            raise UserError(f"{name}={env[name]} is not a directory", f"point {name} at a directory, or unset it")
    return warnings


def _slurm_conf(value: str) -> None:
    path = Path(value)
    why = None
    try:
        if not path.is_file():
            why = "does not exist" if not path.exists() else "is not a regular file"
        elif path.stat().st_size > MAX_SLURM_CONF_BYTES:
            why = f"is {path.stat().st_size} bytes, no slurm.conf"
        else:
            data = path.read_bytes()
            if b"\0" in data:
                why = "is a binary file"
            else:
                data.decode("utf-8")
    except UnicodeDecodeError:
        why = "is not UTF-8 text"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror})"
    if why:
        raise UserError(f"SLURM_CONF={value} {why}: Slurm's commands (sbatch, squeue, scontrol) read it",
                        "point SLURM_CONF at the cluster's slurm.conf (what `vdkit cluster up` printed for the local "
                        "Slurm), or unset it")


def _stop_at(value: str) -> List[str]:
    try:
        at = float(value)
    except ValueError:
        at = math.nan
    if not math.isfinite(at) or at <= 0:
        raise UserError(f"{STOP_AT_ENV}={value!r} is set in the environment and is no epoch second: the ranks "
                        "would ignore it", f"unset {STOP_AT_ENV} (the Slurm batch shell sets it for its own ranks)")
    left = at - time.time()
    if left <= 0:
        raise UserError(f"{STOP_AT_ENV}={value} is set in the environment and passed {int(-left)} s ago: the ranks "
                        "would stop after their first step (a time budget left from another job)",
                        f"unset {STOP_AT_ENV} (the Slurm batch shell sets it for its own ranks)")
    return [f"{STOP_AT_ENV} is set in the environment: the ranks stop cleanly (checkpoint, exit 75) in "
            f"{int(left)} s, at {time.strftime('%H:%M:%S', time.localtime(at))}; unset it to train to the end"]


def _seconds(name: str, value: str, most: float) -> None:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= most):
        raise UserError(f"{name}={value!r} is not a number of seconds in (0, {most:g}]",
                        f"set {name} to e.g. 120, or unset it")
