"""Submit a rendered run directory's launch.sbatch through submitit, and ask Slurm about the job.

Submission goes through submitit's public pieces: its ``CommandFunction`` runs sbatch (errors carry
sbatch's stderr) and ``SlurmExecutor._get_job_id_from_submission_command`` (a static method of the
pinned 1.5.4) reads the job id, exactly as ``SlurmExecutor`` does for its own scripts; the script
is ours (a rendered run directory), not submitit's pickled function. Every job id is appended to
``job_id.txt`` in the run directory (a resubmission adds a line; the last line is the current job).

State without accounting: submitit only asks ``sacct``, which on sites (and the local cluster)
without slurmdbd answers "accounting storage is disabled". :func:`job_state` asks, in order,
``scontrol show job`` (records last MinJobAge seconds), sacct, ``squeue``, a state this module
saved in the run directory when it last saw the job end, and finally the job's output files
(Slurm's own "CANCELLED" / "TIME LIMIT" / "srun: error" lines).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from vdkit.errors import KeepRunDir, UserError

from vdkit.run.rundir import JOB_ID_FILE, SBATCH_FILE
from vdkit.run.rundir import JOB_STATE_FILE as STATE_CACHE_FILE
from vdkit.slurm.submitit_import import submitit

# Slurm's terminal job states (squeue/scontrol/sacct spellings).
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
})

RunOrJob = Union[str, Path]


@dataclass
class JobState:
    """A job's Slurm state and where it came from (sacct, scontrol, squeue, saved, log, none)."""

    job_id: str
    state: str
    source: str
    exit_code: Optional[str] = None  # "0:0" style, when Slurm said
    reason: Optional[str] = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


@dataclass
class Submission:
    """One sbatch call: the run directory, the job id (None for --test-only) and sbatch's message."""

    run_dir: Path
    job_id: Optional[str]
    message: str = ""
    test_only: bool = False
    extra: Dict[str, str] = field(default_factory=dict)

    def job(self):
        """submitit's handle of this job (cancel(), state via sacct); None for --test-only."""
        SlurmJob = submitit("slurm.slurm").SlurmJob

        return None if self.job_id is None else SlurmJob(folder=self.run_dir, job_id=self.job_id)


def require_sbatch() -> None:
    """Raise a UserError naming the fix when Slurm's client commands are not on PATH."""
    if shutil.which("sbatch") is None:
        raise UserError("sbatch is not on PATH, so jobs cannot be submitted from this machine",
                        "run on the cluster's login node, or start the local Slurm (`vdkit cluster up`, then "
                        "export the SLURM_CONF line it prints)")


def _script(run_dir: Path) -> Path:
    script = run_dir / SBATCH_FILE
    if not script.is_file():
        raise UserError(f"{run_dir} has no {SBATCH_FILE}", "pass a run directory written by `vdkit render`")
    return script


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else "no message"


def submit_run(run_dir: Union[str, Path], test_only: bool = False) -> Submission:
    """sbatch ``run_dir/launch.sbatch`` through submitit; record the job id in ``job_id.txt``.

    ``test_only`` runs ``sbatch --test-only`` (Slurm checks the directives and says when and where
    the job would start; nothing is queued or recorded). sbatch runs in the run directory and
    inherits this process's environment (SLURM_CONF included). Raises UserError with sbatch's
    own error line when sbatch refuses the script.
    """
    run_dir = Path(run_dir).absolute()
    script = _script(run_dir)
    require_sbatch()
    if test_only:
        # --test-only answers on stderr and queues nothing: there is no job for submitit to track.
        proc = subprocess.run(["sbatch", "--test-only", str(script)], cwd=run_dir,
                              capture_output=True, text=True, timeout=60)
        message = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        if proc.returncode != 0:
            _refused(_first_error_line(proc.stderr), f"sbatch --test-only rejected {script}",
                     "fix the resources in the recipe (cluster.*) or the cluster's limits")
        return Submission(run_dir, None, message[-1] if message else "", test_only=True)

    # a job the run needs done first (Bridge's import_hf.sbatch): training starts only if it succeeded
    first = [_sbatch(["sbatch", str(run_dir / name)], run_dir / name, run_dir)[0] for name in first_scripts(run_dir)]
    argv = ["sbatch", *([f"--dependency=afterok:{':'.join(first)}"] if first else []), str(script)]
    job_id, output = _sbatch(argv, script, run_dir)
    if job_id not in job_ids(run_dir):  # the job itself may have started and recorded it already
        with open(run_dir / JOB_ID_FILE, "a") as f:
            f.write(f"{job_id}\n")
    return Submission(run_dir, job_id, output.strip())


def first_scripts(run_dir: Path) -> List[str]:
    """The run dir's job scripts that run before launch.sbatch (:data:`vdkit.run.rundir.FIRST_FILE`: e.g. Bridge's
    import_hf.sbatch when the render converts the base model); [] when none."""
    from vdkit.run.rundir import FIRST_FILE

    path = run_dir / FIRST_FILE
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []


def _refused(line: str, what: str, fix: str) -> None:
    """Raise sbatch's refusal ``line`` as one UserError: a controller that does not answer says so (its fix is
    where to run, not the recipe's resources), anything else ``what: line`` with ``fix``."""
    if any(s in line for s in UNREACHABLE):
        raise UserError(f"Slurm's controller cannot be reached from this machine ({line})",
                        "run on a login node of the cluster, or point SLURM_CONF at its slurm.conf "
                        "(`vdkit cluster up` starts a local one)") from None
    raise UserError(f"{what}: {line}", fix) from None


def _sbatch(argv: List[str], script: Path, run_dir: Path) -> Tuple[str, str]:
    """Run ``argv`` (an sbatch call) through submitit; (job id, sbatch's output), or one line for its refusal."""
    utils, SlurmExecutor = submitit("core.utils"), submitit("slurm.slurm").SlurmExecutor

    # CommandFunction prints sbatch's stderr itself on failure; we report it in one line instead.
    sink = io.StringIO()
    try:
        with contextlib.redirect_stderr(sink):
            output = utils.CommandFunction(argv, verbose=False, cwd=run_dir)()
    except utils.FailedJobError as exc:
        _refused(_first_error_line(str(exc) or sink.getvalue()), f"sbatch rejected {script}",
                 "fix the resources in the recipe (cluster.*) or check with `vdkit submit --test-only`")
    try:
        job_id = SlurmExecutor._get_job_id_from_submission_command(output)
    except Exception:  # noqa: BLE001 - submitit's FailedSubmissionError: sbatch said nothing we can read
        raise NoJobId(f"sbatch exited 0 but printed no job id for {script} (output: {output.strip()[:80]!r}); "
                      f"the job may be queued, so {run_dir} is kept",
                      f"look for it with `squeue --me`; if it is queued, write its id into {run_dir / JOB_ID_FILE}") \
            from None
    return job_id, output


# What sbatch / squeue print when no controller answers (a laptop, a compute node without slurm.conf).
UNREACHABLE = ("Unable to contact slurm controller", "resolve_ctls_from_dns_srv", "Could not establish a configuration",
               "Unable to establish controller")


class NoJobId(KeepRunDir):
    """sbatch succeeded without a job id: the job may be queued, so its run directory must be kept."""


def job_ids(run_dir: Union[str, Path]) -> List[str]:
    """Every job id submitted from ``run_dir``, oldest first ([] when none)."""
    path = Path(run_dir) / JOB_ID_FILE
    if not path.is_file():
        return []
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]


def _found_job(run_dir: Path) -> Optional[str]:
    """A job of ``run_dir`` that no job_id.txt line names yet (a plain ``sbatch launch.sbatch``).

    The job script records its id when it starts, and holds the run dir's lock (run.lock names it);
    a job still pending is found in ``squeue`` by its command, the run dir's launch.sbatch."""
    from vdkit.run.runlock import read_holder

    held = read_holder(run_dir)
    if held is not None and held[0] == "slurm" and re.fullmatch(r"\d+(_\d+)?", held[1]):
        return held[1]
    try:
        proc = _run(["squeue", "-h", "-o", "%i|%o"])
    except _Unreachable:
        return None
    if proc is None or proc.returncode != 0:
        return None
    script = str((run_dir / SBATCH_FILE).absolute())
    found = [line.split("|", 1)[0] for line in proc.stdout.splitlines() if line.partition("|")[2].strip() == script]
    return found[-1] if found else None


def resolve(target: RunOrJob) -> tuple:
    """(run_dir or None, job id) for a run directory (its latest job) or a bare job id."""
    path = Path(target)
    if path.is_dir():
        ids = job_ids(path)
        if not ids:
            found = _found_job(path)
            if found is None:
                raise UserError(f"no job was submitted from {path} ({JOB_ID_FILE} is missing, no job holds "
                                "its run.lock and squeue lists none running its launch.sbatch)",
                                "submit it with `vdkit submit` or `sbatch launch.sbatch`")
            return path.absolute(), found
        return path.absolute(), ids[-1]
    text = str(target).strip()
    if re.fullmatch(r"[0-9]{1,12}(_[0-9]{1,9})?", text):
        return None, text
    shown = target if str(target).isprintable() else ascii(str(target))  # control bytes: shown escaped
    raise UserError(f"{shown} is neither a run directory nor a Slurm job id",
                    "pass a run directory written by `vdkit submit`, or a numeric job id")


# ----------------------------------------------------------------------------- state sources
# A status question gets its answer within seconds: a controller that does not answer in this time is
# reported as unreachable (Slurm's own MessageTimeout is 10 s, and clients retry past it).
QUERY_TIMEOUT_S = 5


class _Unreachable(Exception):
    """The controller did not answer a status question (timed out, or the client said it cannot reach it)."""


_LAST_UNREACHABLE: Dict[str, float] = {}  # why -> when: one timed-out question is enough for one command


def _run(cmd: List[str], timeout: float = QUERY_TIMEOUT_S) -> Optional[subprocess.CompletedProcess]:
    if shutil.which(cmd[0]) is None:
        return None
    for why, when in _LAST_UNREACHABLE.items():
        if time.monotonic() - when < 2 * QUERY_TIMEOUT_S:
            raise _Unreachable(why)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"{cmd[0]} had no answer within {timeout:.0f} s"
        _LAST_UNREACHABLE.clear()
        _LAST_UNREACHABLE[why] = time.monotonic()
        raise _Unreachable(why) from None
    except OSError:
        return None
    if proc.returncode != 0 and any(s in proc.stderr for s in UNREACHABLE):
        raise _Unreachable(_first_error_line(proc.stderr))
    return proc


def _state_word(raw: str) -> str:
    # sacct says "CANCELLED by 0"; squeue/scontrol may add "+"; keep the state itself.
    return raw.split()[0].rstrip("+").upper() if raw and raw.split() else "UNKNOWN"


def _from_sacct(job_id: str) -> Optional[JobState]:
    proc = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", job_id])
    if proc is None or proc.returncode != 0 or "disabled" in (proc.stdout + proc.stderr):
        return None
    SlurmInfoWatcher = submitit("slurm.slurm").SlurmInfoWatcher

    # submitit's own sacct parser (it wants the header line that -n suppressed).
    info = SlurmInfoWatcher().read_info("JobID|State|ExitCode\n" + proc.stdout)
    row = info.get(job_id)
    if not row or not row.get("State"):
        return None
    return JobState(job_id, _state_word(row["State"]), "sacct", row.get("ExitCode") or None)


def _scontrol_fields(job_id: str) -> Optional[Dict[str, str]]:
    proc = _run(["scontrol", "-o", "show", "job", job_id])
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        return None
    fields = {}
    for token in proc.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def _from_scontrol(job_id: str) -> Optional[JobState]:
    f = _scontrol_fields(job_id)
    if not f or "JobState" not in f:
        return None
    reason = f.get("Reason")
    return JobState(job_id, _state_word(f["JobState"]), "scontrol", f.get("ExitCode"),
                    None if reason in (None, "None") else reason)


def _from_squeue(job_id: str) -> Optional[JobState]:
    proc = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"])
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        return None
    state, _, reason = proc.stdout.strip().splitlines()[0].partition("|")
    return JobState(job_id, _state_word(state), "squeue", None, None if reason in ("", "None") else reason)


def _load_cache(run_dir: Path) -> Dict[str, dict]:
    try:
        return json.loads((run_dir / STATE_CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(run_dir: Path, st: JobState) -> None:
    """Remember a finished job's state: without accounting, Slurm forgets it after MinJobAge."""
    cache = _load_cache(run_dir)
    cache[st.job_id] = {"state": st.state, "exit_code": st.exit_code, "source": st.source}
    tmp = run_dir / f".{STATE_CACHE_FILE}.tmp"
    try:
        tmp.write_text(json.dumps(cache, indent=1) + "\n")
        tmp.replace(run_dir / STATE_CACHE_FILE)
    except OSError:
        pass  # a read-only run dir only loses the cache


_LOG_PATTERNS = (  # Slurm's own lines in a job's output, most specific first
    (re.compile(r"DUE TO TIME LIMIT"), "TIMEOUT"),
    (re.compile(r"DUE TO PREEMPTION"), "PREEMPTED"),
    (re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT"), "CANCELLED"),
    (re.compile(r"oom[-_ ]kill", re.I), "OUT_OF_MEMORY"),
    (re.compile(r"srun: error: .*(Exited with exit code|Killed|Terminated)"), "FAILED"),
)


def _from_logs(run_dir: Path, job_id: str) -> Optional[JobState]:
    """A state read from the job's own output files when Slurm no longer knows the job."""
    files = sorted(p for p in run_dir.rglob(f"*{job_id}*") if p.is_file() and p.suffix in (".out", ".err", ".log"))
    if not files:
        return None
    text = "\n".join(p.read_text(errors="replace")[-200_000:] for p in files)
    for pattern, state in _LOG_PATTERNS:
        if pattern.search(text):
            return JobState(job_id, state, "log", None, f"from {files[0].name}")
    # Output exists and holds no failure Slurm would have written: the job ran, its end is unknown.
    return JobState(job_id, "UNKNOWN", "log", None, "Slurm no longer knows the job and accounting is off; "
                    f"no failure found in {', '.join(p.name for p in files)}")


def job_state(target: RunOrJob) -> JobState:
    """The Slurm state of a run directory's latest job (or of a job id), without needing accounting."""
    run_dir, job_id = resolve(target)
    try:
        st = _from_scontrol(job_id) or _from_sacct(job_id) or _from_squeue(job_id)
    except _Unreachable as exc:
        return JobState(job_id, "UNREACHABLE", "unreachable", None,
                        f"controller unreachable: {exc}; the job's own state is unknown until it answers")
    if st is not None:
        if run_dir is not None and st.done:
            _save_cache(run_dir, st)
        return st
    if run_dir is not None:
        saved = _load_cache(run_dir).get(job_id)
        if saved:
            return JobState(job_id, saved["state"], "saved", saved.get("exit_code"))
        st = _from_logs(run_dir, job_id)
        if st is not None:
            return st
    return JobState(job_id, "UNKNOWN", "none", None, "Slurm does not know the job (and accounting is off)")


def wait(target: RunOrJob, timeout: Optional[float] = None, poll_s: float = 2.0) -> JobState:
    """Poll :func:`job_state` until the job ends (or ``timeout`` seconds pass); returns the last state.

    For a run directory this follows the run: when its job ends having submitted the next allocation
    (a new last line in job_id.txt, vdkit.slurm.render's continuation), the wait goes on with that one."""
    deadline = None if timeout is None else time.time() + timeout
    lost = 0  # consecutive answers from outside Slurm: a busy controller must not end the wait early
    is_run = Path(target).is_dir()
    while True:
        st = job_state(target)
        lost = lost + 1 if st.source in ("log", "none", "saved") else 0
        if st.done or lost >= 3:
            if is_run and job_ids(target) and job_ids(target)[-1] != st.job_id:
                lost = 0  # the next allocation of the same run
                continue
            return st
        if deadline is not None and time.time() >= deadline:
            return st
        time.sleep(poll_s)


def cancel(target: RunOrJob) -> None:
    """scancel a run directory's latest job (or a job id) through submitit's job handle."""
    SlurmJob = submitit("slurm.slurm").SlurmJob

    run_dir, job_id = resolve(target)
    SlurmJob(folder=run_dir or Path.cwd(), job_id=job_id).cancel(check=True)


def run_jobs(run_dir: Path) -> List[str]:
    """The run's jobs Slurm still queues or runs: job_id.txt's, and any job whose script is its launch.sbatch
    (a successor the batch shell submitted, or a plain ``sbatch``). One-line UserError when Slurm is unreachable."""
    try:
        proc = _run(["squeue", "-h", "-o", "%i|%o|%T"])
    except _Unreachable as exc:
        raise UserError(f"cannot reach Slurm to cancel the run in {run_dir}: {exc}",
                        "run on a login node of the cluster (or point SLURM_CONF at its slurm.conf)") from None
    if proc is None:
        raise UserError("squeue is not on PATH, so the run's jobs cannot be found", "run on a login node of the cluster")
    known, script = set(job_ids(run_dir)), str((Path(run_dir) / SBATCH_FILE).absolute())
    out = []
    for line in proc.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        command, _, state = rest.rpartition("|")
        if (job in known or command.strip() == script) and _state_word(state) not in TERMINAL_STATES:
            out.append(job)
    return out


def cancel_run(run_dir: Path, settle_s: float = 60.0) -> List[str]:
    """scancel the run's jobs (:func:`run_jobs`), wait up to ``settle_s`` for them to leave the queue, and cancel
    any successor one of them submitted meanwhile; every job cancelled."""
    cancelled: List[str] = []
    deadline = time.monotonic() + settle_s
    while True:
        jobs = [j for j in run_jobs(run_dir) if j not in cancelled]
        if jobs:
            proc = subprocess.run(["scancel", *jobs], capture_output=True, text=True, timeout=60)
            if proc.returncode != 0 and any(s in proc.stderr for s in UNREACHABLE):
                raise UserError(f"Slurm's controller cannot be reached to cancel {', '.join(jobs)}",
                                "run on a login node of the cluster, then `vdkit cancel` again")
            cancelled += jobs
        alive = run_jobs(run_dir)
        if not alive and not jobs:
            return cancelled
        if time.monotonic() >= deadline:  # every job still listed was cancelled: Slurm is ending it (COMPLETING)
            return cancelled
        time.sleep(1.0)
