"""A plan and its engine's launch data -> a Slurm batch script.

Engine-agnostic: the engine's rank command, environment and container arrive as a
:class:`vdkit.run.jobspec.JobSpec` (built by :func:`vdkit.render.prepare.job_spec`); this package never
imports an engine and never branches on an engine's name.

``#SBATCH`` directives come from submitit's (private, pinned 1.5.4) renderer
``submitit.slurm.slurm._make_sbatch_string``; only its defaults that would hurt are overridden
through its own ``additional_parameters`` (no ``--wckey``, ``--signal=B:USR1@<lead>`` instead of
submitit's USR2, ``--requeue`` for node failures, our log paths). ``--time`` and the lead come from
the plan (:mod:`vdkit.planner.timeplan`). The body is ours: strict shell, the run dir's lock, the job's id
recorded, a finished run refused, NCCL/IB environment, rendezvous, secrets read at run time, one
``srun`` of the engine's command and the continuation (:func:`continuation_lines`).

Continuation happens here, in the batch shell, outside any container (the job contract in
:mod:`vdkit.run.jobspec`): Slurm signals the batch shell only (``B:``); the shell passes USR1 to the
step when the engine catches it; the ranks stop cleanly and exit 75; the shell then submits the
next allocation with ``sbatch --dependency=afterany:$SLURM_JOB_ID`` (it starts when this job has
ended, and resumes from the checkpoint). On exit 0 it writes the run dir's ``finished`` file, and
a job that finds that file does nothing. Why this and not ``scontrol requeue`` or an up-front
singleton chain: docs/cluster-guide.md "Runs longer than one allocation".

Every interpolated value is shell-quoted. ``#SBATCH`` values are read by sbatch's own parser,
which treats single quotes like bash but also honours backslash escapes inside them, so values
with a backslash or a control character (a newline would end the comment line) are refused.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List, Union

from vdkit.launch import fabric
from vdkit.errors import UserError
from vdkit.run.jobspec import EXIT_REFUSED, EXIT_STOPPED, PREFLIGHT_PREFIX, PREEMPT_SIGNAL as SIGNAL_NAME, STOP_AT_ENV, JobSpec
from vdkit.slurm import env as slurm_env
from vdkit.slurm.submitit_import import submitit
from vdkit.run.runlock import LOCK_FD, lock_lines

# SIGNAL_NAME goes to the batch shell only (B:): the shell forwards it to engines that catch it
# (vdkit.recipes.common.preemption); NeMo's ranks never get it (Lightning's handler would run scontrol).
OUTPUT_PATTERN = "slurm-%j.out"
ERROR_PATTERN = "slurm-%j.err"


def _directive(what: str, value) -> str:
    """A value for an #SBATCH line: refuse what sbatch's parser would read differently from bash."""
    text = str(value)
    if "\\" in text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise UserError(f"{what} {text!r} contains a backslash or a control character, which an #SBATCH line "
                        "cannot carry", f"choose a {what} without them")
    return text


def fault_limits(plan):
    """The watchdog's and the process group's seconds (vdkit.run.faults.Limits) from the plan's time figures."""
    from vdkit.run.faults import limits

    times, c = plan.time, plan.recipe.cluster
    return limits(times.startup_s, times.step_s, times.checkpoint_write_s, c.heartbeat_timeout_s, c.kill_grace_s,
                  c.restart_delay_s)


def sbatch_parameters(plan, run_dir) -> dict:
    """The keyword arguments for submitit's renderer (resources, names, log paths)."""
    r = plan.recipe
    c = r.cluster
    times = plan.time  # the plan's time figures: --time, the stop's lead, the budget
    run_dir = str(run_dir)
    # sbatch expands %j, %x, %u, ... anywhere in --output: a '%' of the directory name is written '%%'.
    escaped = run_dir.replace("%", "%%")
    extra: Dict[str, object] = {
        "output": _directive("run directory", f"{escaped}/{OUTPUT_PATTERN}"),
        "error": _directive("run directory", f"{escaped}/{ERROR_PATTERN}"),
        # To the batch shell only: it decides what the step gets (continuation_lines).
        "signal": f"B:{SIGNAL_NAME}@{times.lead_s}",
        "requeue": True,  # Slurm requeues on a node failure; the job resumes from its checkpoint
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
        time=times.time_limit_min,
        wckey=None,  # submitit forces --wckey=submitit otherwise; sites that enforce wckeys reject it
        additional_parameters=extra,
    )
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value:
            params[key] = _directive(f"cluster.{key}", value)
    # Optional chaining (cluster.dependency, e.g. "singleton": chained jobs of one name run one at a time).
    dependency = c.dependency
    if dependency:
        params["dependency"] = _directive("cluster.dependency", dependency)
    return params


def body_lines(plan, run_dir, job: JobSpec) -> List[str]:
    """The script's setup lines (everything before srun)."""
    r = plan.recipe
    q = shlex.quote

    run = q(str(run_dir))
    from vdkit.run.rundir import FINISHED_FILE, JOB_ID_FILE

    times = plan.time
    # The recovery functions come first: a successor that cannot take the lock records that as a fault
    lines = ["set -euo pipefail", ""] + recovery_functions(plan, run_dir, job) + lock_lines(
        run_dir, "slurm", f"${{{slurm_env.JOB_ID_VAR}:-?}}", on_held="vdkit_handover") + [
        f"export {STOP_AT_ENV}=$(( $(date +%s) + {times.stop_after_s} ))  # the ranks' own budget: stop cleanly by then",
        "# This job in the run's record (`vdkit status RUN_DIR` after a plain sbatch too)",
        f'grep -qx "$SLURM_JOB_ID" {run}/{JOB_ID_FILE} 2>/dev/null || echo "$SLURM_JOB_ID" >> {run}/{JOB_ID_FILE}',
        "# A finished run never starts again",
        f"if [ -e {run}/{FINISHED_FILE} ]; then",
        f'  echo "vdkit: the run in {_echo(run_dir)} has finished (its file {FINISHED_FILE} says so); job $SLURM_JOB_ID '
        'has nothing to do"',
        "  exit 0",
        "fi",
        ""]
    lines.append(fabric.fabric_comment(r.cluster))
    lines += [slurm_env.export_line(k, v) for k, v in slurm_env.job_env(plan, job.env).items()]
    from vdkit.slurm import recovery

    lines += [""] + recovery.env_lines(run_dir, fault_limits(plan))
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
    spec's ``needs_pmi``: NeMo's userbuffers TP overlap would; no engine enables it today), never for ranks that
    read Slurm's variables."""
    r = plan.recipe
    argv = ["srun", *SRUN_FLAGS]
    if job.pmi and r.cluster.mpi != "none":
        argv.append(f"--mpi={r.cluster.mpi}")
    if job.container is not None:
        from vdkit.run.faults import COLLECTIVE_TIMEOUT_ENV, HEARTBEAT_ENV

        names = list(slurm_env.job_env(plan, job.env)) + list(slurm_env.RENDEZVOUS_VARS) + [
            STOP_AT_ENV, HEARTBEAT_ENV, COLLECTIVE_TIMEOUT_ENV]
        argv += slurm_env.pyxis_args(job.container, str(run_dir), names, r.cluster.container_writable)
    return argv + [str(a) for a in job.argv]


def _srun_text(argv: List[str]) -> str:
    """srun's flags one per line (readable diffs), the engine command on the last line."""
    n = 1
    while n < len(argv) and argv[n].startswith("--"):
        n += 1
    head, tail = argv[:n], argv[n:]
    parts = [shlex.quote(head[0])] + ["  " + shlex.quote(a) for a in head[1:]] + ["  " + shlex.join(tail)]
    return " \\\n".join(parts)


def _echo(text) -> str:
    """Text for inside a double-quoted echo (the run dir in messages): no $, `, \\ or " expansion."""
    return "".join("\\" + ch if ch in '$`"\\' else ch for ch in str(text))


def _on_signal(plan, job: JobSpec, name: str = SIGNAL_NAME) -> str:
    """The batch shell's trap for Slurm's USR1 (the lead) or TERM (the limit itself, a cancel): pass it to the
    step when the engine catches it; either way the shell lives on to hand over to the next allocation."""
    lead = plan.time.lead_s
    when = f"{lead} s before the time limit" if name == SIGNAL_NAME else "at the time limit or a cancel"
    if job.stop_signal:
        # srun itself takes a TERM as "kill the tasks now" (job_force_termination): the step gets USR1, which
        # the ranks treat as TERM (vdkit.run.jobspec.STOP_SIGNALS); Slurm's own TERM reaches them directly.
        return (f'echo "vdkit: {name} from Slurm ({when}): the ranks stop after their '
                f'step and checkpoint" >&2; kill -{job.stop_signal} "$STEP_PID" 2>/dev/null || true')
    return f'echo "vdkit: {name} from Slurm ({when}): the engine stops by its own max_time" >&2'


def continuation_lines(plan, run_dir, job: JobSpec) -> List[str]:
    """The batch shell after starting the step (``srun ... &``): wait, then finish or continue the run.

    USR1 (``--signal=B:USR1@lead``) interrupts ``wait``: the shell forwards it to the step when the
    engine catches it (``job.stop_signal``) and waits again. Exit 0 (and, for engines that exit 0 on
    a stop too, ``job.finished_line`` in this job's output) finishes the run; exit 75 submits the next
    allocation; anything else is the job's failure.
    """
    q = shlex.quote
    run = q(str(run_dir))
    import json

    from vdkit.run.rundir import CANCELLED_FILE, FINISHED_FILE, SBATCH_FILE

    lines = ["STEP_PID=$!"]
    if job.heartbeat:
        lines += [f"vdkit_watchdog {LOCK_FD}>&- & WATCH_PID=$!  # without the run dir's lock (its sleep may outlive us)"]
    lines += [
        "rc=0",
        "while :; do  # a trapped signal interrupts `wait`: wait for the step again",
        "  TRAPPED=0",
        '  wait "$STEP_PID" && rc=0 || rc=$?',
        '  [ "$TRAPPED" = 1 ] && [ "$rc" -gt 128 ] || break',
        "done",
    ]
    if job.heartbeat:
        lines += ['kill "$WATCH_PID" 2>/dev/null || true; wait "$WATCH_PID" 2>/dev/null || true']
    out = " ".join(f'{run}/{pattern.replace("%j", chr(34) + "$SLURM_JOB_ID" + chr(34))}'
                   for pattern in (OUTPUT_PATTERN, ERROR_PATTERN))
    if job.finished_line:
        out = " ".join(f'{run}/{pattern.replace("%j", chr(34) + "$SLURM_JOB_ID" + chr(34))}'
                       for pattern in (OUTPUT_PATTERN, ERROR_PATTERN))
        lines += [f"# Exit 0 is a stop too unless rank 0 said the run is finished:",
                  f"if [ \"$rc\" = 0 ] && ! grep -qsF -- {q(job.finished_line)} {out}; then rc={EXIT_STOPPED}; fi"]
    lines += [
        "# A TERM that was a cancel (scancel) ends the run here; one at the time limit hands over like a stop.",
        "# (slurmstepd writes '*** JOB N ON NODE CANCELLED AT TIME ***' for a cancel, '... DUE TO TIME LIMIT ***' "
        "at the limit; both are COMPLETING to scontrol)",
        rf'if [ -n "$GOT_TERM" ] && [ "$rc" != 0 ] && grep -qsE "\*\*\* JOB $SLURM_JOB_ID ON [^ ]+ CANCELLED AT '
        rf'[^ ]+ \*\*\*" {out}; then',
        f'  echo "vdkit: job $SLURM_JOB_ID was cancelled: the run does not continue by itself; continue by hand: '
        f'sbatch {_echo(run_dir)}/{SBATCH_FILE}" >&2',
        "  # the record `vdkit cancel` writes, for a plain scancel too: status, runs and report read the run as cancelled",
        "  printf '{\"at\": \"%s\", \"by\": \"scancel\", \"launcher\": \"slurm\", \"jobs\": [\"%s\"], \"continue\": %s}\\n' "
        f'"$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SLURM_JOB_ID" '
        f'{q(json.dumps(f"sbatch {run_dir}/{SBATCH_FILE}"))} > {run}/."{CANCELLED_FILE}.$SLURM_JOB_ID.tmp" '
        f'&& mv -f {run}/."{CANCELLED_FILE}.$SLURM_JOB_ID.tmp" {run}/{CANCELLED_FILE} || true',
        '  exit "$rc"',
        "fi",
        'case "$rc" in',
        "  0)",
        f"    touch {run}/{FINISHED_FILE}",
        '    echo "vdkit: the run has finished (job $SLURM_JOB_ID)" ;;',
        f"  {EXIT_STOPPED})",
        "    # Stopped cleanly with a checkpoint before the limit: the next allocation resumes from it.",
        "    if vdkit_submit_next; then",
        '      echo "vdkit: stopped before the time limit; job $NEXT continues the run after job $SLURM_JOB_ID"',
        "    else",
        f'      echo "vdkit: stopped before the time limit, but the next allocation could not be submitted; '
        f'continue by hand: sbatch {_echo(run_dir)}/{SBATCH_FILE}" >&2',
        f"      exit {EXIT_STOPPED}",
        "    fi ;;",
        "  *)  # a dead rank or node, a hang, a failed save: recorded, restarted while restarts are left",
        '    vdkit_failed "$rc" "${GOT_TERM:+killed at the time limit (TERM, then KILL)}"',
        '    exit "$rc" ;;',
        "esac",
    ]
    return lines


def recovery_functions(plan, run_dir, job: JobSpec) -> List[str]:
    """The shell functions of :mod:`vdkit.slurm.recovery` this job uses (watchdog, successor, failure)."""
    from vdkit.run.rundir import checkpoint_dir
    from vdkit.slurm import recovery

    r = plan.recipe
    if r.cluster.max_restarts < 0:
        raise UserError(f"cluster.max_restarts={r.cluster.max_restarts} is negative",
                        "give 0 (a failed step is not restarted) or a small count such as 3")
    lines = ["# Recovery (vdkit.slurm.recovery): the successor's submission, the failed step's record and restart"]
    if job.heartbeat:
        lines += recovery.watchdog_lines(r.world_size, fault_limits(plan))
    lines += recovery.submit_lines(run_dir, fault_limits(plan)) + recovery.term_lines(run_dir)
    lines += recovery.handover_lines(run_dir, fault_limits(plan))
    lines += recovery.failure_lines(run_dir, checkpoint_dir(r, run_dir), r.cluster.max_restarts, _echo)
    return lines + [""]


def preflight_lines(job: JobSpec) -> List[str]:
    """The job's pre-flight (``job.preflight``, :mod:`vdkit.recipes.common.preflight`) in the batch shell, on the first node,
    before srun starts any rank: its one line goes to the job's log; exit :data:`EXIT_REFUSED` is recorded as the
    recipe's fault and never restarted (``vdkit_failed ... recipe``; `vdkit status` shows it). Outside the container,
    so the image itself can be checked, with the node's own ``python3`` (standard library only): the container
    mounts the same paths at the same place. A node without a Python gets a warning, and the job starts."""
    if not job.preflight:
        return []
    argv, q = shlex.join(job.preflight), shlex.quote
    return [
        "# Pre-flight (vdkit.recipes.common.preflight): every path the job reads is there and of the kind its stack needs, "
        "and the checkpoints have room",
        f"PREFLIGHT_RC=0; PREFLIGHT=$({argv} 2>&1) || PREFLIGHT_RC=$?",
        "# its refusal is one line with its prefix and exit 2 (a Python that cannot start it exits 2 too: not a refusal)",
        'case "$PREFLIGHT_RC:$PREFLIGHT" in',
        '  0:*) echo "$PREFLIGHT" ;;',
        f'  {q(f"{EXIT_REFUSED}:{PREFLIGHT_PREFIX}")}*) echo "$PREFLIGHT" >&2',
        f'     vdkit_failed {EXIT_REFUSED} "$PREFLIGHT" recipe',
        f"     exit {EXIT_REFUSED} ;;",
        '  *) echo "vdkit: the pre-flight did not run on $(hostname) (exit $PREFLIGHT_RC: $(echo "$PREFLIGHT" | tail -n1)); '
        'the job starts without it" >&2 ;;',
        "esac",
    ]


def sbatch_text(plan, run_dir: Union[str, Path], job: JobSpec) -> str:
    """The launch.sbatch text for ``plan`` running ``job`` in ``run_dir`` (a pure function of the three)."""
    _make_sbatch_string = submitit("slurm.slurm")._make_sbatch_string

    run_dir = str(run_dir)
    params = sbatch_parameters(plan, run_dir)
    command = "\n".join(preflight_lines(job) + [
        "# The step runs in the background so that this shell can take Slurm's signals; srun does not inherit the",
        "# run dir's lock (a process that outlived this shell would hold it from the successor: vdkit.run.runlock)",
        f"STEP_PID=; NEXT=; trap 'TRAPPED=1; {_on_signal(plan, job)}' {SIGNAL_NAME}",
        f"GOT_TERM=; trap 'TRAPPED=1; GOT_TERM=1; {_on_signal(plan, job, 'TERM')}; vdkit_on_term' TERM",
        _srun_text(srun_argv(plan, run_dir, job)) + f" {LOCK_FD}>&- &"] + continuation_lines(plan, run_dir, job))
    return _make_sbatch_string(command=command, folder=run_dir,
                               setup=body_lines(plan, run_dir, job), use_srun=False, **params)
