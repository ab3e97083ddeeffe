"""The fault-injection suite on the local Slurm (issue 27): every fault ends in a finished run, with every
step done once except the redone ones (counted, printed), and status telling what happened.

One cheap cell (tiny Llama, LoRA, 2 ranks on 2 emulated nodes, ~50 ms steps) per fault; the faults are
real where this machine allows: SIGKILL / SIGSTOP of a rank process, a node's slurmd + slurmstepd + rank
killed, bytes of the latest checkpoint cut or flipped, a tmpfs that fills, Slurm's TERM to every process
of the job, slurmctld stopped while the batch shell hands over. Each test prints one row of the note's
table: fault | continued | steps redone | status said.

Speed (CI's budget): the scenarios that leave the cluster alone run at once on the six emulated nodes (one
module fixture starts each in a thread; each test waits for its own and re-raises its failure, so a failure
names its fault); the two that take the cluster's daemons down (a dead node, the controller) and the megatron
cell run after them, alone. The cells use short watchdog settings (cluster.heartbeat_timeout_s, kill_grace_s, restart_delay_s;
vdkit.faults holds the production defaults): a tiny step takes well under a second here.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest

from vdkit.slurm import submit as sub

WATCHDOG = ["cluster.heartbeat_timeout_s=8", "cluster.kill_grace_s=3", "cluster.restart_delay_s=5"]
CELL = [*WATCHDOG, "engine=reference", "model=tiny_llama", "data=synthetic", "method=lora", "cluster.nodes=2",
        "cluster.gpus_per_node=1", "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1",
        "train.seq_length=128", "method.warmup_steps=0", "train.global_batch_size=4", "cluster.startup_s=30",
        "engine.checkpoint_every_n_steps=30"]
MEGATRON_CELL = [*WATCHDOG, "engine=megatron", "engine.container_image=null", "model=tiny_llama",
                 "model.num_layers=4", "data=synthetic", "method=sft", "cluster.nodes=2", "cluster.gpus_per_node=1",
                 "parallelism.pp=2", "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1", "train.seq_length=128",
                 "train.micro_batch_size=2", "train.global_batch_size=4", "method.warmup_steps=0",
                 "cluster.startup_s=30", "engine.checkpoint_every_n_steps=30"]
MAX_STEPS = 160
_STARTED: dict = {}  # the concurrent scenarios' futures, once started


def _cli(argv) -> str:
    """`vdkit ARGV`'s output, from its own process: a redirect of sys.stdout in a scenario's thread is undone
    whenever pytest's capture moves between a test's phases in the main thread (the output then went to
    pytest's capture and the line this parses was empty)."""
    res = subprocess.run([sys.executable, "-m", "vdkit.cli", *argv], capture_output=True, text=True)
    assert res.returncode == 0, (argv, res.stderr[-2000:])
    return res.stdout.strip()


def _submit(out_dir, *overrides, max_steps=MAX_STEPS):
    out = _cli(["submit", *overrides, f"train.max_steps={max_steps}", "--out", str(out_dir)])
    run_dir, job_id = out.splitlines()[-1].split("\t")[:2]
    return Path(run_dir), job_id


def _steps(run_dir, job_id) -> list:
    from vdkit.validation.logs import parse_text_log

    path = Path(run_dir) / f"slurm-{job_id}.out"
    return [r.step + 1 for r in parse_text_log(path).steps] if path.exists() else []


def _ranks(run_dir, engine="reference"):
    """{SLURM_PROCID: pid} of the run's rank processes on this machine."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"vdkit.recipes.{engine}".encode() in cmd and str(run_dir).encode() in cmd:
            for item in env:
                if item.startswith(b"SLURM_PROCID="):
                    found[int(item.split(b"=")[1])] = int(pid)
    return found


def _wait_for(what, pred, timeout=180, run_dir=None):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tails = [p.name + ": " + p.read_text(errors="replace")[-1500:] for p in sorted(Path(run_dir).glob("slurm-*"))] \
                if run_dir else []
            raise AssertionError(f"waited {timeout} s for {what}: " + "\n".join(tails))
        time.sleep(0.3)


def _trained_past(run_dir, job_id, step):
    def done():
        assert not sub.job_state(job_id).done, f"job {job_id} ended before step {step}"
        return (_steps(run_dir, job_id) or [0])[-1] >= step
    return done


def _finish(run_dir, timeout=400, max_steps=MAX_STEPS) -> dict:
    """Wait until the run finished; steps per job, redone steps, the status line."""
    _wait_for("the run to finish", lambda: (run_dir / "finished").exists(), timeout, run_dir)
    ids = sub.job_ids(run_dir)
    _wait_for("the last job to end", lambda: sub.job_state(ids[-1]).done, 60)
    by_job = [_steps(run_dir, j) for j in ids]
    done = [s for steps in by_job for s in steps]
    assert sorted(set(done)) == list(range(1, max_steps + 1)), "a step is missing"
    for steps in by_job:  # each job trains consecutive steps
        assert steps == list(range(steps[0], steps[0] + len(steps))) if steps else True
    status = _status(run_dir)
    return {"jobs": ids, "redone": len(done) - max_steps, "status": status,
            "faults": (run_dir / "faults.jsonl").read_text() if (run_dir / "faults.jsonl").exists() else ""}


def _status(run_dir) -> str:
    return _cli(["status", str(run_dir)])


def _row(fault, figures):
    return (f"\nFAULT ROW | {fault} | continued: yes, jobs {','.join(figures['jobs'])} | steps redone: "
          f"{figures['redone']} | status: {figures['status'].split(chr(9), 2)[-1]}")


# ----------------------------------------------------------------------------- the scenarios
def _sigkilled_rank(tmp_path):
    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 70", _trained_past(run_dir, job, 70), 300, run_dir)
    os.kill(_ranks(run_dir)[1], signal.SIGKILL)
    figures = _finish(run_dir)
    assert "rank 1 on xe9680-" in figures["status"] and "killed (SIGKILL: out of memory?)" in figures["status"]
    assert "restart 1 of 3" in figures["status"] and figures["redone"] >= 0
    return _row("rank SIGKILLed (reference)", figures)


def _megatron_sigkilled_rank(tmp_path):
    pytest.importorskip("megatron.core")
    run_dir, job = _submit(tmp_path, *MEGATRON_CELL)
    _wait_for("step 60", _trained_past(run_dir, job, 60), 400, run_dir)
    os.kill(_ranks(run_dir, "megatron")[1], signal.SIGKILL)
    figures = _finish(run_dir, 600)
    assert "rank 1 on xe9680-" in figures["status"] and "killed (SIGKILL" in figures["status"]
    return _row("rank SIGKILLed (megatron)", figures)


def _damaged_checkpoint(tmp_path, damage):
    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 100", _trained_past(run_dir, job, 100), 300, run_dir)
    ranks = _ranks(run_dir)
    for pid in ranks.values():  # freeze the job so that no save races the damage
        os.kill(pid, signal.SIGSTOP)
    from vdkit.recipes.common.checkpoint import latest

    newest = latest(run_dir / "checkpoints")
    data = newest.read_bytes()
    if damage == "truncated":
        newest.write_bytes(data[: len(data) // 2])
    else:
        i = len(data) // 2
        newest.write_bytes(data[:i] + bytes(b ^ 0xFF for b in data[i:i + 8]) + data[i + 8:])
    os.kill(ranks[1], signal.SIGKILL)
    os.kill(ranks[0], signal.SIGCONT)
    figures = _finish(run_dir)
    aside = [p.name for p in (run_dir / "checkpoints").iterdir() if ".damaged-" in p.name]
    assert any(n.startswith(newest.name + ".damaged-") for n in aside), aside
    logs = "".join((run_dir / f"slurm-{j}.out").read_text(errors="replace") for j in figures["jobs"])
    assert f"checkpoint {newest.name} is damaged" in logs and "set aside as" in logs
    assert f"set aside as damaged: {newest.name}.damaged-" in figures["status"]
    return _row(f"latest checkpoint {damage}", figures)


def _hung_rank(tmp_path):
    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 70", _trained_past(run_dir, job, 70), 300, run_dir)
    os.kill(_ranks(run_dir)[1], signal.SIGSTOP)
    t0 = time.monotonic()
    figures = _finish(run_dir)
    assert "stopped responding" in figures["status"] and "rank 1 on xe9680-" in figures["status"]
    assert (run_dir / "excluded_nodes").read_text().strip().startswith("xe9680-")
    return _row(f"rank hangs (SIGSTOP; finished {time.monotonic() - t0:.0f} s later)", figures)


def _term_at_the_limit(tmp_path):
    # Slurm enforces a limit on its next periodic check (up to ~30 s later), which a tiny run could outlive:
    # the ranks are held (SIGSTOP) until it comes, and slurmd sends SIGCONT before its TERM ("Tasks might be
    # stopped ... so send SIGCONT first", slurmd's terminate request), so they meet the TERM mid-run. The
    # hold is no hang: this cell's heartbeat timeout outlasts it.
    cell = [o for o in CELL if not o.startswith("cluster.heartbeat_timeout_s=")]
    run_dir, job = _submit(tmp_path, *cell, "cluster.heartbeat_timeout_s=120")
    _wait_for("step 70", _trained_past(run_dir, job, 70), 300, run_dir)
    for pid in _ranks(run_dir).values():
        os.kill(pid, signal.SIGSTOP)
    # The time limit, now: Slurm sends every process of the job TERM (KILL after KillWait), its log line says
    # "DUE TO TIME LIMIT" (a plain `scancel` is a cancel: test_a_cancelled_job_is_not_continued).
    subprocess.run(["scontrol", "update", f"jobid={job}", "EndTime=now"], check=True)
    figures = _finish(run_dir)
    err = (run_dir / f"slurm-{job}.err").read_text()
    assert "DUE TO TIME LIMIT" in err and "TERM from Slurm" in err and sub.job_state(job).state == "TIMEOUT"
    assert len(figures["jobs"]) == 2 and max(_steps(run_dir, job)) < MAX_STEPS, "the limit did not stop the run"
    # The ranks stop on TERM, but srun answers its own TERM by killing the tasks: either a clean stop
    # (no fault) or a kill the batch shell outlives and hands over from the last checkpoint.
    assert not figures["faults"] or "killed at the time limit (TERM, then KILL)" in figures["status"]
    return _row("TERM at the limit", figures)


def _cancelled(tmp_path):
    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 20", _trained_past(run_dir, job, 20), 300, run_dir)
    subprocess.run(["scancel", job], check=True)
    _wait_for("the job to end", lambda: sub.job_state(job).done, 120, run_dir)
    time.sleep(2)
    assert sub.job_ids(run_dir) == [job] and not (run_dir / "finished").exists()
    assert "was cancelled: the run does not continue by itself" in (run_dir / f"slurm-{job}.err").read_text()


def _full_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        run_dir, job = _submit(tmp_path / "runs", *CELL, f"run.results_dir={mount}")
        ckpts = mount / run_dir.name / "checkpoints"
        filler = mount / "filler"
        import shutil

        # Another user's file takes all but ~100 kB (a checkpoint is ~260 kB) as soon as the job is queued: in
        # place seconds before the ranks start, so the first save's room check sees it. (Filling at step 65
        # left a window of ~25 steps, about a second, that a loaded machine missed: the save then passed its
        # check, met the full disk mid-write, and the refusal this scenario is about never happened.)
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, shutil.disk_usage(mount).free - 100_000))
        assert not _steps(run_dir, job), "the job trained before the disk was full"
        _wait_for("the refused save", lambda: (run_dir / "faults.jsonl").exists(), 300, run_dir)
        filler.unlink()  # the space comes back
        figures = _finish(run_dir)
        err = (run_dir / f"slurm-{job}.err").read_text()
        assert f"no room for the next checkpoint in {ckpts}" in err
        assert "could not write its checkpoint (exit 74" in figures["faults"]
        assert not [p for p in ckpts.iterdir() if p.name.endswith(".tmp")]
        assert max(_steps(run_dir, job)) == 30, "the first save (step 30) was not the refused one"
        return _row("disk full at a save", figures)
    finally:
        subprocess.run(["umount", "-l", str(mount)])


AT_ONCE = {"sigkill": _sigkilled_rank, "truncated": lambda t: _damaged_checkpoint(t, "truncated"),
           "bit-flipped": lambda t: _damaged_checkpoint(t, "bit-flipped"), "hang": _hung_rank,
           "term": _term_at_the_limit, "cancel": _cancelled, "disk": _full_disk}


@pytest.fixture(scope="module")
def scenarios(local_slurm, tmp_path_factory):
    """Every scenario of AT_ONCE started, each in its own thread: {name: Future of its table row}."""
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the job's ranks (sbatch exports this environment) share the cores
    pool = ThreadPoolExecutor(len(AT_ONCE), thread_name_prefix="fault")
    started = {name: pool.submit(fn, tmp_path_factory.mktemp(name)) for name, fn in AT_ONCE.items()}
    _STARTED.update(started)
    try:
        yield started
    finally:
        pool.shutdown(wait=True)
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


@pytest.fixture
def alone(monkeypatch):
    """For a scenario that takes a daemon down: the concurrent ones (if started) have ended first."""
    wait(_STARTED.values())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _result(scenarios, name):
    row = scenarios[name].result(timeout=1200)
    if row:
        print(row)


def test_a_sigkilled_rank_is_restarted_from_the_last_checkpoint(scenarios):
    _result(scenarios, "sigkill")


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped"])
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_used(damage, scenarios):
    _result(scenarios, damage)


def test_a_hung_rank_is_killed_by_the_watchdog_and_restarted(scenarios):
    _result(scenarios, "hang")


def test_term_at_the_limit_hands_over(scenarios):
    _result(scenarios, "term")


def test_a_cancelled_job_is_not_continued(scenarios):
    _result(scenarios, "cancel")


def test_a_full_disk_at_a_save_is_refused_cleanly_and_the_run_continues_once_freed(scenarios):
    _result(scenarios, "disk")


def test_a_dead_node_is_excluded_and_the_run_continues_elsewhere(alone, local_slurm, tmp_path):
    from vdkit.slurm.localcluster import _which

    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 70", _trained_past(run_dir, job, 70), run_dir=run_dir)
    rank = _ranks(run_dir)[1]
    node = (run_dir / "heartbeat" / "rank1").read_text().split()[4]
    stepd = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the rank's slurmstepd
    slurmd_pid = local_slurm.root / "run" / f"slurmd-{node}.pid"
    try:
        for pid in (int(slurmd_pid.read_text().split()[0]), stepd, rank):  # the node dies: daemon, step, rank
            os.kill(pid, signal.SIGKILL)
        figures = _finish(run_dir)
    finally:  # the node comes back for the next test
        subprocess.run([_which("slurmd"), "-f", str(local_slurm.conf), "-N", node], env=local_slurm.env())
    assert (run_dir / "excluded_nodes").read_text().split() == [node]
    assert f"rank 1 on {node}: " in figures["status"] and "stopped responding" in figures["status"]
    print(_row("node killed (slurmd + slurmstepd + rank)", figures))


def test_megatron_sigkilled_rank_is_restarted(alone, tmp_path):
    # Alone: in one of three concurrent runs of this suite, its two ranks' first gloo collective (megatron's
    # optimizer set-up) failed with "Connection closed/reset by peer" among the other cells' start-ups,
    # before any fault was injected (the launcher restarted it; the step-60 precondition failed).
    print(_megatron_sigkilled_rank(tmp_path))


def test_controller_outage_at_hand_over(alone, local_slurm, tmp_path):
    from vdkit.slurm.localcluster import _which

    run_dir, job = _submit(tmp_path, *CELL)
    _wait_for("step 70", _trained_past(run_dir, job, 70), run_dir=run_dir)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    pid_file = local_slurm.root / "run" / "slurmctld.pid"
    os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
    try:
        t0 = time.monotonic()
        said = _status(run_dir)
        asked = time.monotonic() - t0
        assert "UNREACHABLE (controller unreachable" in said and asked < 12, (said, asked)
        time.sleep(15)  # the ranks stop meanwhile; srun or the successor's sbatch waits for the controller
    finally:
        subprocess.run([_which("slurmctld"), "-f", str(local_slurm.conf)], check=True, env=local_slurm.env())
    figures = _finish(run_dir)
    assert figures["redone"] == 0 and len(figures["jobs"]) == 2 and not figures["faults"]
    tries = (run_dir / f"slurm-{job}.err").read_text().count("submitting the next allocation failed")
    print(_row(f"slurmctld down 15 s at hand-over (status during it in {asked:.1f} s: UNREACHABLE; {tries} failed "
               "sbatch tries)", figures))
