"""A plan and its engine's launch data -> a Slurm batch script.

Engine-agnostic: the engine's rank command, environment and container arrive as a
:class:`vdkit.jobspec.JobSpec` (built by :func:`vdkit.prepare.job_spec`); this package never
imports an engine and never branches on an engine's name.

``#SBATCH`` directives come from submitit's (private, pinned 1.5.4) renderer
``submitit.slurm.slurm._make_sbatch_string``; only its defaults that would hurt are overridden
through its own ``additional_parameters`` (no ``--wckey``, ``--signal=USR1`` instead of
submitit's USR2, ``--requeue``, our log paths). The body is ours: strict shell, NCCL/IB
environment, rendezvous, secrets read at run time, one ``srun`` of the engine's command.

Every interpolated value is shell-quoted. ``#SBATCH`` values are read by sbatch's own parser,
which treats single quotes like bash but also honours backslash escapes inside them, so values
with a backslash or a control character (a newline would end the comment line) are refused.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List, Union

from vdkit import fabric
from vdkit.errors import UserError
from vdkit.jobspec import PREEMPT_SIGNAL as SIGNAL_NAME, JobSpec
from vdkit.slurm import env as slurm_env

# SIGNAL_NAME: Lightning's SLURM requeue signal (NeMo trains with Lightning; USR2 would kill it), and
# what the kit's own engines catch to checkpoint and requeue (vdkit.recipes.preemption).
SIGNAL_LEAD_S = 300  # seconds before the time limit: enough for a checkpoint save
OUTPUT_PATTERN = "slurm-%j.out"
ERROR_PATTERN = "slurm-%j.err"


def _directive(what: str, value) -> str:
    """A value for an #SBATCH line: refuse what sbatch's parser would read differently from bash."""
    text = str(value)
    if "\\" in text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise UserError(f"{what} {text!r} contains a backslash or a control character, which an #SBATCH line "
                        "cannot carry", f"choose a {what} without them")
    return text


def signal_lead_s(time_limit_min: int) -> int:
    """Seconds before the time limit at which the job's steps get the requeue signal."""
    return max(1, min(SIGNAL_LEAD_S, time_limit_min * 60 // 4))


def sbatch_parameters(plan, run_dir) -> dict:
    """The keyword arguments for submitit's renderer (resources, names, log paths)."""
    r = plan.recipe
    c = r.cluster
    run_dir = str(run_dir)
    # sbatch expands %j, %x, %u, ... anywhere in --output: a '%' of the directory name is written '%%'.
    escaped = run_dir.replace("%", "%%")
    extra: Dict[str, object] = {
        "output": _directive("run directory", f"{escaped}/{OUTPUT_PATTERN}"),
        "error": _directive("run directory", f"{escaped}/{ERROR_PATTERN}"),
        "signal": f"{SIGNAL_NAME}@{signal_lead_s(c.time_limit_min)}",
        "requeue": True,
    }
    if c.reservation:
        extra["reservation"] = _directive("cluster.reservation", c.reservation)
    params = dict(
        job_name=_directive("job name (run.name)", r.run_name),
        nodes=c.nodes,
        # Lightning wants one task per GPU (ntasks-per-node == trainer.devices); no --gpus-per-task:
        # it confines each rank to one GPU and blocks CUDA IPC over NVLink.
        ntasks_per_node=c.gpus_per_node,
        gpus_per_node=c.gpus_per_node,
        cpus_per_task=c.cpus_per_task,
        exclusive=True,
        mem="0",  # all of each node's memory; submitit's mem_gb=0 would render "0GB"
        time=c.time_limit_min,
        wckey=None,  # submitit forces --wckey=submitit otherwise; sites that enforce wckeys reject it
        additional_parameters=extra,
    )
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value:
            params[key] = _directive(f"cluster.{key}", value)
    # Optional chaining (e.g. "singleton" with exp_manager.resume_if_exists); read defensively so
    # that a ClusterCfg without the field renders as before.
    dependency = c.dependency
    if dependency:
        params["dependency"] = _directive("cluster.dependency", dependency)
    return params


def body_lines(plan, run_dir, job: JobSpec) -> List[str]:
    """The script's setup lines (everything before srun)."""
    r = plan.recipe
    q = shlex.quote
    from vdkit.runlock import lock_lines

    lines = ["set -euo pipefail", ""] + lock_lines(run_dir, "slurm", f"${{{slurm_env.JOB_ID_VAR}:-?}}") + [""]
    lines.append(fabric.fabric_comment(r.cluster))
    lines += [slurm_env.export_line(k, v) for k, v in slurm_env.job_env(plan, job.env).items()]
    lines += ["", "# Rendezvous at the first node"] + slurm_env.rendezvous_lines()
    if r.run.secrets_file:
        from vdkit.slurm.secrets import secrets_lines

        lines += [""] + secrets_lines(str(r.run.secrets_file))
    lines += [""]
    if r.run.results_dir:
        lines.append(f"mkdir -p {q(str(r.run.results_dir))}")
    lines.append(f"cd {q(str(run_dir))}")
    return lines


# One dead rank ends the step (and the job) instead of leaving the others in a collective until NCCL's
# timeout; the rest get 60 s to exit after the first task ends (NeMo-Run's srun practice).
SRUN_FLAGS = ("--kill-on-bad-exit=1", "--wait=60")


def srun_argv(plan, run_dir, job: JobSpec) -> List[str]:
    """The whole srun command line as argv: srun flags, pyxis flags (when the job has a container), the rank command.

    ``--mpi=<cluster.mpi>`` only where the engine's ranks bootstrap through PMI (``job.pmi``, the engine's
    ``NEEDS_PMI``: NeMo's userbuffers TP overlap would; no engine enables it today), never for ranks that
    read Slurm's variables."""
    r = plan.recipe
    argv = ["srun", *SRUN_FLAGS]
    if job.pmi and r.cluster.mpi != "none":
        argv.append(f"--mpi={r.cluster.mpi}")
    if job.container is not None:
        names = list(slurm_env.job_env(plan, job.env)) + list(slurm_env.RENDEZVOUS_VARS)
        argv += slurm_env.pyxis_args(job.container, str(run_dir), names)
    return argv + [str(a) for a in job.argv]


def _srun_text(argv: List[str]) -> str:
    """srun's flags one per line (readable diffs), the engine command on the last line."""
    n = 1
    while n < len(argv) and argv[n].startswith("--"):
        n += 1
    head, tail = argv[:n], argv[n:]
    parts = [shlex.quote(head[0])] + ["  " + shlex.quote(a) for a in head[1:]] + ["  " + shlex.join(tail)]
    return " \\\n".join(parts)


def sbatch_text(plan, run_dir: Union[str, Path], job: JobSpec) -> str:
    """The launch.sbatch text for ``plan`` running ``job`` in ``run_dir`` (a pure function of the three)."""
    from submitit.slurm.slurm import _make_sbatch_string

    run_dir = str(run_dir)
    params = sbatch_parameters(plan, run_dir)
    return _make_sbatch_string(command=_srun_text(srun_argv(plan, run_dir, job)), folder=run_dir,
                               setup=body_lines(plan, run_dir, job), use_srun=False, **params)
