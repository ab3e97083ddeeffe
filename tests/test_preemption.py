"""The job contract's stop (vdkit.run.jobspec): USR1 / TERM / the budget -> finish the step, checkpoint, exit 75.

Without Slurm and without any Slurm client on PATH (as inside a container). The Slurm end-to-end
checks (a real one-minute time limit over several allocations, USR1 to the batch shell) are in
tests/test_slurm_continuation.py; `vdkit run --resume` in tests/test_local.py.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vdkit.recipes.common import preemption
from vdkit.recipes.reference import reference_command

from helpers import no_slurm_path

TINY = ["train.seq_length=128", "method.warmup_steps=0"]
STEP = re.compile(r"\| (\d+)/(\d+) \[[^,]*, reduced_train_loss=([^,]+), global_step=([^,]+), ")


def _steps(text: str):
    return [int(m.group(1)) for u in re.split(r"[\r\n]", text) if (m := STEP.search(u))]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _fake_scontrol(tmp_path: Path, rc: int = 0) -> Path:
    """A `scontrol` that appends its arguments to calls.txt (and exits ``rc``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/calls.txt\n'
                      + ('echo "scontrol: error: Requested operation is disabled" >&2\n' if rc else "")
                      + f"exit {rc}\n")
    script.chmod(0o755)
    return bin_dir


# ----------------------------------------------------------------------------- the shared mechanism
def test_flag_is_set_by_a_stop_signal_and_summed_over_ranks():
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        p = preemption.Preemption().install()
        try:
            assert not p.stop_now() and not p.stop_now(lambda f: f + 0)
            assert p.stop_now(lambda f: f + 1)  # another rank got it: this one stops too
            os.kill(os.getpid(), sig)  # would end the process without the handler
            time.sleep(0.05)
            assert p.received == sig.name[3:] and p.stop_now()
        finally:
            p.uninstall()
        assert signal.getsignal(sig) == signal.SIG_DFL


def test_the_budget_stops_by_the_clock():
    assert preemption.stop_at({"VDKIT_STOP_AT": "1700000000"}) == 1700000000.0
    assert preemption.stop_at({}) is None and preemption.stop_at({"VDKIT_STOP_AT": "soon"}) is None
    assert not preemption.Preemption(signums=(), deadline=time.time() + 60).stop_now()
    late = preemption.Preemption(signums=(), deadline=time.time() - 1)
    assert late.stop_now() and late.why() == "time budget"


def test_the_contract_is_one_set_of_constants():
    from vdkit.run import jobspec
    from vdkit.slurm import render

    assert preemption.STOP_SIGNUMS == (signal.SIGUSR1, signal.SIGTERM) and render.SIGNAL_NAME == jobspec.PREEMPT_SIGNAL
    assert preemption.Preempted(3).exit_code == jobspec.EXIT_STOPPED == 75
    code = Path(preemption.__file__).read_text().split('"""', 2)[2]  # the code, not the docstring
    assert "scontrol" not in code and "subprocess" not in code  # nothing asks Slurm from inside a rank


# ----------------------------------------------------------------------------- checkpoint *.tmp (item 2)
def test_save_and_resume_remove_partial_checkpoint_files(tmp_path):
    from vdkit.recipes.common.checkpoint import latest
    from vdkit.recipes.reference import checkpoint as ckpt

    d = tmp_path / "checkpoints"
    d.mkdir()
    stale = [d / ".step=5.ckpt.12345.tmp", d / ".step=10.ckpt.999.tmp"]
    for p in stale:
        p.write_bytes(b"half a checkpoint")
    (d / "notes.txt").write_text("mine")  # not the kit's: left alone
    assert sorted(ckpt.remove_partial(d)) == sorted(stale)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    stale[0].write_bytes(b"again")
    ckpt.save(d, 6, {"step": 6})
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt", "step=6.ckpt", "step=6.ckpt.sha256"]
    assert latest(d).name == "step=6.ckpt"


# ----------------------------------------------------------------------------- the reference engine
def _run_until_step(cmd, env, cwd, at_step: int, timeout: float = 150):
    """Start the engine, wait until ``at_step`` is logged; returns (process, output chunks, reader)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    chunks: list = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(proc.stdout.fileno(), 4096), b"")))
    reader.start()
    deadline = time.monotonic() + timeout
    while not (_steps(b"".join(chunks).decode()) and _steps(b"".join(chunks).decode())[-1] >= at_step):
        assert proc.poll() is None, b"".join(chunks).decode()[-2000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)
    return proc, chunks, reader


@pytest.mark.slow  # real ranks or a Bridge import in a child: minutes under load, CI runs it
def test_usr1_checkpoints_the_step_exits_75_and_the_rerun_loses_and_repeats_nothing(tmp_path):
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.common.checkpoint import latest
    from vdkit.run.create import create_run_dir

    max_steps = 400  # far more than the test lets it run before the signal
    recipe = compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic", "method=lora",
                      f"train.max_steps={max_steps}", "train.global_batch_size=2", *TINY])
    run_dir = create_run_dir(make_plan(recipe), {}, tmp_path / "runs")
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / ".step=1.ckpt.1.tmp").write_bytes(b"left by a kill mid-save")
    # A Slurm job inside a container: SLURM_JOB_ID set, no scontrol anywhere on PATH.
    env = _env(SLURM_JOB_ID="4242", PATH=no_slurm_path(tmp_path))

    proc, chunks, reader = _run_until_step(reference_command(run_dir), env, run_dir, at_step=3)
    proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=60)
    reader.join()
    out = b"".join(chunks).decode()
    first = _steps(out)
    stopped = first[-1]
    assert rc == preemption.EXIT_STOPPED, out[-2000:]  # the launcher, outside, decides what comes next
    assert stopped < max_steps and first == list(range(1, stopped + 1))
    assert f"USR1: stopped after global_step {stopped}" in out and "Traceback" not in out
    assert latest(ckpts).name == f"step={stopped}.ckpt"  # the checkpoint of the very step it stopped at
    assert not list(ckpts.glob("*.tmp"))

    # Started again: resumes at stopped + 1; this time TERM (Slurm at the limit, `kill`) stops it the same way.
    proc, chunks, reader = _run_until_step(reference_command(run_dir), _env(), run_dir, at_step=stopped + 2)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    reader.join()
    out = b"".join(chunks).decode()
    second = _steps(out)
    assert f"resuming from {ckpts / f'step={stopped}.ckpt'}" in out
    assert second == list(range(stopped + 1, second[-1] + 1))
    assert rc == preemption.EXIT_STOPPED and f"TERM: stopped after global_step {second[-1]}" in out
    assert latest(ckpts).name == f"step={second[-1]}.ckpt"


def test_the_budget_stops_a_rank_without_any_signal(tmp_path):
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    recipe = compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic", "method=lora",
                      "train.max_steps=100000", "train.global_batch_size=2", *TINY])
    run_dir = create_run_dir(make_plan(recipe), {}, tmp_path / "runs")
    env = _env(VDKIT_STOP_AT=str(int(time.time()) + 20))  # torch loads in ~5-10 s here; then ~10 s of steps
    proc = subprocess.run(reference_command(run_dir), env=env, cwd=run_dir, capture_output=True, text=True,
                          timeout=240)
    stops = re.findall(r"time budget: stopped after global_step (\d+)", proc.stdout)
    assert proc.returncode == preemption.EXIT_STOPPED and len(stops) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (run_dir / "checkpoints" / f"step={stops[0]}.ckpt").is_file()


def test_usr1_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Two ranks (gloo); only rank 1 gets the signal: both stop after the same step, rank 0 saves it."""
    from vdkit.recipes.common.checkpoint import latest

    cmd = [sys.executable, "-m", "vdkit", "run", "method=lora", "cluster.gpus_per_node=2", "train.max_steps=400",
           "train.global_batch_size=4", *TINY, "--out", str(tmp_path)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env())
    chunks: list = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(launcher.stdout.fileno(), 4096), b"")))
    reader.start()
    deadline = time.monotonic() + 150
    while not (_steps(b"".join(chunks).decode()) and _steps(b"".join(chunks).decode())[-1] >= 3):
        assert launcher.poll() is None and time.monotonic() < deadline, b"".join(chunks).decode()[-2000:]
        time.sleep(0.02)
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    ranks = {}
    for pid in children:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        ranks[int(next(e for e in env if e.startswith(b"RANK=")).split(b"=")[1])] = int(pid)
    os.kill(ranks[1], signal.SIGUSR1)
    assert launcher.wait(timeout=60) == preemption.EXIT_STOPPED
    reader.join()
    out = b"".join(chunks).decode()
    run_dir = tmp_path / "tiny_llama_lora_1n2g"
    steps = _steps((run_dir / "local-1.out").read_text())
    stopped = steps[-1]
    assert f"stopped after global_step {stopped}" in out and stopped < 400
    assert latest(run_dir / "checkpoints").name == f"step={stopped}.ckpt"
    assert "Traceback" not in out and "Traceback" not in (run_dir / "logs" / "rank1.out").read_text()


# ----------------------------------------------------------------------------- NeMo: by contract
def test_nemo_stops_by_its_own_clock_and_never_gets_the_signal(tmp_path):
    """NeMo is not signalled (Lightning's SLURM handler would run `scontrol requeue` inside the container):
    its exp_manager.max_time_per_run ends fit below the allocation less the stop's lead; resume is on;
    checkpoints come at the plan's cadence; exit 0 counts as finished only with Lightning's max_steps line."""
    import yaml

    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import prepare
    from vdkit.planner.timeplan import time_plan

    plan = make_plan(compose(["model=llama2_70b", "method=lora", "train.max_steps=1000",
                              "engine.container_image='nvcr.io#nvidia/nemo:24.01'"]))
    cell = prepare(plan, tmp_path, check_mounts=False)
    sbatch, cfg = cell.files["launch.sbatch"], yaml.safe_load(cell.files["nemo.yaml"])
    times = time_plan(plan)
    limit = int(re.search(r"^#SBATCH --time=(\d+)$", sbatch, re.M).group(1))
    sig = re.search(r"^#SBATCH --signal=(\S+)$", sbatch, re.M).group(1)
    assert sig == f"B:USR1@{times.lead_s}"  # B: the batch shell only, never the ranks
    assert "kill -USR1" not in sbatch and "scontrol requeue" not in sbatch
    d, h, m, s_ = (int(x) for x in cfg["exp_manager"]["max_time_per_run"].split(":"))
    per_run = ((d * 24 + h) * 60 + m) * 60 + s_
    assert 0 < per_run < limit * 60 - times.lead_s, (per_run, limit, times.lead_s)
    em = cfg["exp_manager"]
    assert em["resume_if_exists"] and em["resume_ignore_no_checkpoint"]
    every = em["checkpoint_callback_params"]["every_n_train_steps"]
    assert every == times.every_n_steps > 0 and em["checkpoint_callback_params"]["save_last"] is True
    assert "`Trainer.fit` stopped: `max_steps=1000` reached." in sbatch  # how exit 0 is told from a stop
    # Lightning really logs that line (and another one for a max_time stop) in the version installed here.
    import lightning.pytorch.loops.fit_loop as fit_loop

    assert "`Trainer.fit` stopped: `max_steps={self.max_steps!r}` reached." in Path(fit_loop.__file__).read_text()
    assert "cluster_type" not in cfg and "plugins" not in cfg["trainer"]


# ----------------------------------------------------------------------------- one job per run dir (item 3)
def test_rendered_script_takes_the_run_dir_lock_first(tmp_path):
    """The lock lines, run by bash: the first holder wins, a second is refused naming it, release frees it."""
    from vdkit.run.runlock import holder_note, is_held, lock_lines

    script = "set -euo pipefail\n" + "\n".join(lock_lines(tmp_path, "slurm", "${SLURM_JOB_ID:-?}")) + "\necho started\n"
    first = subprocess.Popen(["bash", "-c", script + "sleep 30\n"], env={**_env(), "SLURM_JOB_ID": "111"},
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "started"
    try:
        assert is_held(tmp_path) and (tmp_path / "run.lock").read_text() == "slurm 111\n"
        second = subprocess.run(["bash", "-c", script], env={**_env(), "SLURM_JOB_ID": "222"},
                                capture_output=True, text=True)
        assert second.returncode == 1 and "started" not in second.stdout
        assert second.stderr.strip() == ("vdkit: the run directory is held by slurm 111; job 222 did not start: "
                                          "wait for that job or cancel it, or render a new run dir")
        assert holder_note(tmp_path) == "held by slurm job 111"  # no Slurm here: the lock itself says so
    finally:
        first.kill()
        first.wait()
    assert not is_held(tmp_path) and holder_note(tmp_path) is None


def test_vdkit_run_launcher_holds_the_lock_too(tmp_path):
    from vdkit.errors import UserError
    from vdkit.run.runlock import acquire_local

    fd = acquire_local(tmp_path)
    try:
        with pytest.raises(UserError, match=f"held by local {os.getpid()}"):
            acquire_local(tmp_path)
    finally:
        os.close(fd)
    os.close(acquire_local(tmp_path))


@pytest.mark.parametrize("kind", ["fifo", "directory", "loop"])
def test_rendered_script_refuses_a_lock_that_is_not_a_file(kind, tmp_path):
    """A run.lock that is a FIFO (opening it blocked the batch shell for ever), a directory or a symlink loop:
    the lock lines stop at once with one line naming the file and the fix, before anything starts."""
    from vdkit.run.runlock import lock_lines

    lock = tmp_path / "run.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(lock)
    script = "set -euo pipefail\n" + "\n".join(lock_lines(tmp_path, "slurm", "${SLURM_JOB_ID:-?}")) + "\necho started\n"
    res = subprocess.run(["bash", "-c", script], env={**_env(), "SLURM_JOB_ID": "333"}, capture_output=True,
                         text=True, timeout=20)
    assert res.returncode == 1 and "started" not in res.stdout
    line = res.stderr.strip()
    assert "\n" not in line and f"{lock} is not a regular file" in line and f"rm -r {lock}" in line, line
    assert "job 333" in line


# ----------------------------------------------------------------------------- the run's state files (issue 27 item 5)
# Every file in the run dir the batch script reads or appends, as the script names it; a new one must be added
# to vdkit.run.rundir.SHELL_STATE_FILES (test_the_batch_script_keeps_its_state_only_in_the_checked_files says so).
SCRIPT_STATE = ("run.lock", "job_id.txt", "finished", "faults.jsonl", "excluded_nodes")
# What the batch script calls outside bash, as a failed two-node step on a dead node sees them.
_STUBS = {
    "srun": 'echo "srun: error: node2: task 1: Killed" >&2; echo "srun: error: Node failure on node2" >&2; exit 1',
    "scontrol": 'case "$1" in show) echo node1 ;; -o) echo "NodeName=node1 NodeAddr=127.0.0.1" ;; esac',
    "sbatch": "echo 444", "squeue": "exit 0", "scancel": "exit 0",
}


@pytest.fixture(scope="module")
def batch_script(tmp_path_factory):
    """The reference engine's rendered launch.sbatch (two nodes, the watchdog, the recovery functions) with its
    run dir as ``@RUN_DIR@``, and a bin dir of Slurm stand-ins: rendered once for the module."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import render_run

    root = tmp_path_factory.mktemp("batch")
    run_dir = render_run(make_plan(compose(["model=tiny_llama", "method=lora", "engine=reference", "data=synthetic",
                                            "cluster.nodes=2", "cluster.mpi=none"])), root, check_mounts=False)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, body in _STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return (run_dir / "launch.sbatch").read_text().replace(str(run_dir), "@RUN_DIR@"), bin_dir


def _run_batch(batch_script, run_dir: Path, timeout: float = 15):
    """bash runs the script as the batch shell of job 333 (output in slurm-333.out / .err, as sbatch opens them);
    (exit code, stderr lines). A hang is killed with its whole process group (the watchdog too) and reported."""
    text, bin_dir = batch_script
    (run_dir / "launch.sbatch").write_text(text.replace("@RUN_DIR@", str(run_dir)))
    env = {**_env(), "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "333", "SLURM_JOB_NODELIST": "node[1-2]"}
    with open(run_dir / "slurm-333.out", "ab") as out, open(run_dir / "slurm-333.err", "ab") as err:
        proc = subprocess.Popen(["bash", str(run_dir / "launch.sbatch")], cwd=run_dir, env=env, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"the batch script hung (killed after {timeout} s)")
    return rc, [ln for ln in (run_dir / "slurm-333.err").read_text().splitlines() if ln.strip()]


def test_the_batch_script_keeps_its_state_only_in_the_checked_files(batch_script, tmp_path):
    """The control for the test below: a step that fails on a dead node drives the script through every state
    file (job ids, finished, the fault record with its restart count, the excluded node), and every file it
    leaves in the run dir besides its own output and the heartbeat dir is one the script checks at its start."""
    from vdkit.run.rundir import SHELL_STATE_FILES

    rc, err = _run_batch(batch_script, tmp_path)
    assert rc == 1 and any("restart 1 of 3: job 444" in ln for ln in err), err
    assert (tmp_path / "job_id.txt").read_text().split() == ["333", "444"]
    assert '"restart": 1' in (tmp_path / "faults.jsonl").read_text()
    assert (tmp_path / "excluded_nodes").read_text().split() == ["node2"]
    left = {p.name for p in tmp_path.iterdir()} - {"launch.sbatch", "slurm-333.out", "slurm-333.err", "heartbeat"}
    assert left <= set(SHELL_STATE_FILES) and set(SCRIPT_STATE) == set(SHELL_STATE_FILES), (left, SHELL_STATE_FILES)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize("name", SCRIPT_STATE[1:])  # run.lock: test_rendered_script_refuses_a_lock_that_is_not_a_file
def test_the_batch_script_refuses_a_state_file_that_is_not_a_file(batch_script, name, kind, tmp_path):
    """A state file that is a FIFO blocked the batch shell for ever at its first grep / echo >> (the allocation
    wasted); one that is a directory made `finished` stop the run, `grep -c` reset the restart count (restarts
    unbounded) or an append fail obscurely. The script now stops at its start: one line naming the file, what it
    is and the fix, exit 1, nothing started or written."""
    path = tmp_path / name
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    start = time.monotonic()
    rc, err = _run_batch(batch_script, tmp_path)
    assert time.monotonic() - start < 10
    assert rc == 1 and len(err) == 1, err
    assert f"{path} is not a regular file ({kind})" in err[0] and f"rm -r {path}" in err[0] and "job 333" in err[0], err
    assert not (tmp_path / "run.lock").exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [name, "launch.sbatch", "slurm-333.out", "slurm-333.err"])


@pytest.fixture(scope="module")
def door_runs(tmp_path_factory):
    """A Slurm run dir (one job recorded) and a local one, rendered once for the module; each test copies one."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    root = tmp_path_factory.mktemp("door")
    slurm = create_run_dir(make_plan(compose(["engine=reference", "model=tiny_llama", "data=synthetic"])), {},
                           run_dir=root / "slurm")
    (slurm / "job_id.txt").write_text("333\n")
    local = create_run_dir(make_plan(compose(["engine=reference", "cluster=local", "model=tiny_llama", "data=synthetic"])),
                           {}, run_dir=root / "local")
    return {"status": slurm, "resume": local}


def _unblock(fifo: Path, stop: threading.Event, after: float = 3.0) -> threading.Thread:
    """Should a reader block on ``fifo`` (the defect), open and close its other end after ``after`` s: the reader
    gets EOF and the test fails on what it printed instead of hanging."""
    def run():
        if stop.wait(after):
            return
        while not stop.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet (ENXIO)
                time.sleep(0.05)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("verb,name,kind", [("status", n, k) for n in SCRIPT_STATE[1:] for k in ("fifo", "directory")]
                         + [("resume", "finished", k) for k in ("fifo", "directory")])
def test_the_door_refuses_a_state_file_that_is_not_a_file(door_runs, verb, name, kind, tmp_path, capsys, monkeypatch):
    """`vdkit status` read a FIFO faults.jsonl for ever and a directory as no record (no job, no fault);
    `vdkit run --resume` took a FIFO or directory named finished for a finished run. Both now refuse any state
    file that is not a regular file before reading one: one line naming it and the fix, exit 2, at once."""
    import shutil

    from vdkit.cli import main

    run_dir = Path(shutil.copytree(door_runs[verb], tmp_path / "run"))
    path = run_dir / name
    path.unlink(missing_ok=True)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm client: nothing here may ask a controller
    stop = threading.Event()
    if kind == "fifo":
        _unblock(path, stop)
    start = time.monotonic()
    try:
        rc = main(["status", str(run_dir)] if verb == "status" else ["run", "--resume", str(run_dir)])
    finally:
        stop.set()
    took = time.monotonic() - start
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert f"{path} is a {'FIFO' if kind == 'fifo' else 'directory'}" in err[0] and f"rm -r {path}" in err[0], err
    assert took < 2, took
