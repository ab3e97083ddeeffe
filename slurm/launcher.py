"""The Slurm launcher (``cluster.launcher=slurm``): launch.sbatch, sbatch through submitit, job state.

The interface is :mod:`vdkit.launch.launchers`'. The script is :mod:`vdkit.slurm.render`'s, submission
and state :mod:`vdkit.slurm.submit`'s; this module is the seam the rest of the kit sees.
Continuation across allocations (the job contract, :mod:`vdkit.run.jobspec`): the script's batch
shell, outside any container, passes Slurm's ``--signal=B:USR1`` to the ranks, and when they stop
cleanly (exit 75) submits the next allocation with ``--dependency=afterany``; a finished run writes
``finished`` and never starts again (:func:`vdkit.slurm.render.continuation_lines`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Optional

from vdkit.errors import UserError
from vdkit.run.jobspec import JobSpec
from vdkit.run.rundir import SBATCH_FILE

# The cluster fields that name Slurm objects -> (whether sbatch takes a comma-separated list of them, the command that
# lists them). sbatch(1): --partition and --reservation "specify their names in a comma separate list"; slurmctld
# splits the list with strtok_r(",") (src/slurmctld/partition_mgr.c get_part_list), so an empty item between names is
# skipped ("gpu,,debug" is gpu and debug), but a list with no name at all ("", ",") is refused ("Invalid partition
# name specified"). A name is one slurm.conf / scontrol token: no whitespace, and no '#' (where slurm.conf's comments
# and an #SBATCH line's start). --account and --qos take one name ("an arbitrary string": sacctmgr reads a comma as
# its list separator, so never one holding a comma). None is no name: the site's default.
SLURM_NAMES = {"partition": (True, "sinfo -s"), "reservation": (True, "scontrol show reservation"),
               "account": (False, "sacctmgr show account"), "qos": (False, "sacctmgr show qos")}
SETTINGS = (*SLURM_NAMES, "dependency")  # read by this launcher alone: vdkit.launch.launchers.refuse_foreign_settings
_LISTED_NAME = re.compile(r"[^\s,#]+")  # one item of --partition / --reservation
_ONE_NAME = re.compile(r"[^,]*[^,\s][^,]*")  # --account / --qos

# sbatch --dependency as slurmctld parses it (src/slurmctld/job_scheduler.c _parse_dependency_str): "singleton", or
# TYPE:JOB[:JOB...] (a job: its id, an array's _TASK or _*, then +MINUTES for after, then a (state)), or a bare job id
# (the old form, afterany); items joined by ',' (all must hold) or '?' (any). Slurm releases differ on mixing the two
# and on a bare id after '?' (22.05 takes "afterok:1,afterany:2?afterok:3"), so those are left to sbatch. What is
# refused here sbatch refuses at submit ("Job dependency problem"); whether the named jobs exist only the cluster says.
_DEP_JOB = r"0*[1-9]\d*(?:_(?:\*|\d+))?"
_DEP_SPEC = _DEP_JOB + r"(?:\+0*[1-9]\d*)?(?:\([^()]*\))?"
_DEP_ITEM = (r"(?:singleton(?:\([^()]*\))?|(?:after|afterany|afterok|afternotok|aftercorr|afterburstbuffer|expand):"
             + _DEP_SPEC + "(?::" + _DEP_SPEC + ")*)")
_DEPENDENCY = re.compile(rf"(?:{_DEP_ITEM}|{_DEP_JOB})(?:[,?](?:{_DEP_ITEM}|{_DEP_JOB}))*", re.IGNORECASE)

RUNS_FIRST = True  # submit() sbatches the run dir's FIRST_FILE jobs first, launch.sbatch with afterok on them


def check_recipe(recipe) -> None:
    """At composition (`vdkit plan` included): cluster.partition / reservation / account / qos hold Slurm names
    (:data:`SLURM_NAMES`), not what sbatch would refuse at submit ("gpu partition", "", ",")."""
    for key, (many, lister) in SLURM_NAMES.items():
        value = getattr(recipe.cluster, key)
        if value is None:
            continue
        text = str(value)
        rule = _LISTED_NAME if many else _ONE_NAME
        items = [n for n in text.split(",") if n] if many else [text]  # Slurm skips an empty list item
        bad = next((n for n in items or [""] if not rule.fullmatch(n)), None)
        if bad is not None:
            what = "an empty name" if not bad.strip() else f"{bad!r}"
            takes = "a comma-separated list of names without spaces or '#'" if many else "one name, without commas"
            raise UserError(f"cluster.{key}={text!r}: {what} is not a Slurm {key} name (sbatch --{key} takes {takes}): "
                            "sbatch would refuse the job at submit",
                            f"write the name as `{lister}` prints it, or cluster.{key}=null for the site's default")
    _check_dependency(recipe)


def _check_dependency(recipe) -> None:
    """cluster.dependency in sbatch's grammar (:data:`_DEPENDENCY`); None or "" is no dependency."""
    text = recipe.cluster.dependency
    if text and not _DEPENDENCY.fullmatch(str(text)):
        raise UserError(f"cluster.dependency={text!r} is not a Slurm dependency (sbatch --dependency takes singleton or "
                        "TYPE:JOBID[:JOBID...], TYPE one of after, afterany, afterok, afternotok, aftercorr, joined by "
                        "',' (all) or '?' (any)): sbatch would refuse the job at submit (\"Job dependency problem\")",
                        "e.g. cluster.dependency=singleton or cluster.dependency=afterok:12345, or cluster.dependency=null")


def check(plan, job: JobSpec) -> None:
    """Refuse a container image pyxis cannot read (before anything is rendered)."""
    if job.container is not None:
        from vdkit.slurm.env import check_image

        check_image(job.container.image, job.container.image_key)


def files(plan, job: JobSpec, run_dir: Path) -> Dict[str, str]:
    """``launch.sbatch`` for ``plan`` running ``job`` in ``run_dir`` (UserError for a value it cannot carry)."""
    from vdkit.slurm.render import sbatch_text

    return {SBATCH_FILE: sbatch_text(plan, run_dir, job)}


def next_command(files) -> str:
    """``sbatch {}/launch.sbatch``; with jobs that must run first (:data:`vdkit.run.rundir.FIRST_FILE`: Bridge's
    import_hf.sbatch) the one line that submits them and training after them (afterok), as `vdkit submit` does."""
    from vdkit.run.rundir import FIRST_FILE

    first = [ln.strip() for ln in str(files.get(FIRST_FILE, "")).splitlines() if ln.strip()]
    if not first:
        return "sbatch {}/" + SBATCH_FILE
    subs = " && ".join(f"j{i}=$(sbatch --parsable {{0}}/{name})" for i, name in enumerate(first))
    deps = ":".join(f"$j{i}" for i in range(len(first)))
    return f"{subs} && sbatch --dependency=afterok:{deps} {{0}}/{SBATCH_FILE}   (or: vdkit submit ...)"


def require() -> None:
    """One line naming the fix when sbatch is not on PATH (checked before anything is written)."""
    from vdkit.slurm import submit as slurm_submit

    slurm_submit.require_sbatch()


def submit(run_dir: Path) -> str:
    """sbatch the run directory's launch.sbatch; the job id (recorded in job_id.txt)."""
    from vdkit.slurm import submit as slurm_submit

    return str(slurm_submit.submit_run(run_dir).job_id)


def test(run_dir: Path) -> str:
    """``sbatch --test-only``: Slurm's one-line answer (where and when it would start); nothing is queued."""
    from vdkit.slurm import submit as slurm_submit

    return slurm_submit.submit_run(run_dir, test_only=True).message


def describe(st) -> str:
    """A job state as one status word plus Slurm's details: ``COMPLETED exit=0:0``, ``PENDING (Resources)``."""
    text = st.state
    if st.exit_code and st.done:
        text += f" exit={st.exit_code}"
    if st.reason and not st.done:
        text += f" ({st.reason})"
    return text


def status(run_dir: Path) -> str:
    """The Slurm state of the run directory's latest job, or of a bare job id (works without accounting),
    with its details. One-line UserError for a job id Slurm does not know."""
    from vdkit.slurm.submit import job_state

    st = job_state(run_dir)
    if st.source == "unreachable" and not Path(run_dir).is_dir():
        raise UserError(f"cannot ask Slurm about job {st.job_id}: {st.reason.split(';')[0]}",
                        "run on a login node of the cluster (or point SLURM_CONF at its slurm.conf), or ask again "
                        "when the controller is back")
    if st.source == "none" and not Path(run_dir).is_dir():
        raise UserError(f"Slurm does not know about job {st.job_id} (not queued, running or recently ended; "
                        "accounting is off or has no record)",
                        "pass a job id that `squeue` or `scontrol show job` lists, or a run directory "
                        "written by `vdkit submit`")
    return describe(st)


def job(run_dir: Path) -> str:
    """The Slurm job id of the run directory's latest job: job_id.txt's last line, else the job that holds
    its lock or that squeue lists running its launch.sbatch (a plain ``sbatch``); the id itself for a job id."""
    from vdkit.slurm.submit import resolve

    return resolve(run_dir)[1]


def wait(run_dir: Path, timeout: Optional[float] = None) -> str:
    """Poll Slurm until the run directory's latest job ends (or ``timeout`` s pass); :func:`status`'s words."""
    from vdkit.slurm.submit import wait as wait_job

    return describe(wait_job(run_dir, timeout=timeout))


def job_alive(job_id: str) -> bool:
    """Whether Slurm still runs (or queues) job ``job_id``."""
    from vdkit.slurm.submit import job_state

    st = job_state(job_id)
    return not st.done and st.source not in ("none", "unreachable")  # unreachable: the lock file's flock decides


def cancel(run_dir: Path, settle_s: float = 60.0):
    """scancel every job of the run (job_id.txt's and any queued job running its launch.sbatch: a successor)."""
    from vdkit.slurm.submit import cancel_run

    return cancel_run(run_dir, settle_s)


def continue_command(run_dir: Path) -> str:
    """``sbatch RUN_DIR/launch.sbatch``: the next allocation resumes from the latest checkpoint."""
    import shlex

    return f"sbatch {shlex.quote(str(Path(run_dir) / SBATCH_FILE))}"
