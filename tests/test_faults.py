"""The fault-injection suite on the local Slurm (issue 27): every fault ends in a finished run, with every
step done once except the redone ones (counted, printed), and status telling what happened.

Each fault for the reference and the megatron engine (one cheap cell each: tiny Llama, 2 ranks; reference
LoRA on 2 emulated nodes, ~50 ms steps; megatron SFT over gloo with pipeline parallelism 2, ~0.1 s steps); the
faults are real where this machine allows: SIGKILL / SIGSTOP of a rank process, a node's slurmd + slurmstepd +
rank killed, bytes of the latest checkpoint cut or flipped (megatron's: the newest step's rank file beside its
.sha256), a tmpfs that fills, Slurm's TERM to every process of the job, slurmctld stopped while the batch shell
hands over. Each test prints one row of the note's table: fault | continued | steps redone | status said.
The SIGKILL comes at three timings (mid-step, during a save, just after one: tests/fault_kill.py), each with a
process of the failed job holding the run dir's lock after its batch shell exited (issue 37: the successor used
to refuse it and the run stopped for good); benchmarks/bench_recovery.py repeats them, idle and loaded.

Speed (CI's budget): the scenarios that leave the cluster alone run at once on the six emulated nodes (one
module fixture starts each in a thread; each test waits for its own and re-raises its failure, so a failure
names its fault and engine; `-k megatron` starts only those). Jobs hold whole nodes (--exclusive), so the
megatron cells of this phase take one node (2 "GPUs", one rank each) and fewer steps (every assertion means
the same: a checkpoint before the fault and one after it). The two scenarios that take the cluster's daemons
down (a dead node, the controller) run after them, alone, each as one fault event for a reference and a
megatron run side by side. The cells use short watchdog settings (cluster.heartbeat_timeout_s, kill_grace_s,
restart_delay_s; vdkit.run.faults holds the production defaults): a tiny step takes well under a second here.

A fault comes after step N of the run's *current* job: a megatron job that fails before any fault (a gloo
"Connection reset by peer" at its first collective among the other cells' start-ups, seen once in three
concurrent runs) is restarted by the launcher like any failure, and the fault then goes to its successor.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Tuple

import pytest

from fault_kill import batch_shell_lock, kill_at, rank_pids as _ranks, release_when_waited
from vdkit.slurm import submit as sub

WATCHDOG = ("cluster.heartbeat_timeout_s=8", "cluster.kill_grace_s=3", "cluster.restart_delay_s=5")
COMMON = (*WATCHDOG, "model=tiny_llama", "data=synthetic", "cluster.mpi=none", "cluster.socket_ifname=lo",
          "cluster.cpus_per_task=1", "train.seq_length=128", "method.warmup_steps=0", "train.global_batch_size=4",
          "cluster.startup_s=30")
HAVE_MEGATRON = importlib.util.find_spec("megatron.core") is not None
DISK_MB = 16  # the full-disk scenario's tmpfs: room for the door's check of a megatron checkpoint (3.5 MB, 3 kept)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One engine's run in this suite: its overrides, steps and checkpoint cadence, where faults strike."""

    engine: str
    overrides: Tuple[str, ...]
    max_steps: int
    every: int  # engine.checkpoint_every_n_steps
    inject_at: int  # a fault comes after this step: past two checkpoints, before the next
    damage_at: int  # the damaged-checkpoint faults: at least two checkpoints exist (the newest damaged)

    def submit(self, out_dir, *extra):
        """(run dir, job id) of a new run of this cell."""
        keys = {e.split("=", 1)[0] for e in extra}  # an extra override replaces the cell's
        mine = [o for o in (*COMMON, *self.overrides) if o.split("=", 1)[0] not in keys]
        out = _cli(["submit", *mine, *extra, f"engine.checkpoint_every_n_steps={self.every}",
                    f"train.max_steps={self.max_steps}", "--out", str(out_dir)])
        run_dir, job_id = out.splitlines()[-1].split("\t")[:2]
        return Path(run_dir), job_id


REFERENCE = Cell("reference", ("engine=reference", "method=lora", "cluster.nodes=2", "cluster.gpus_per_node=1"),
                 max_steps=160, every=30, inject_at=70, damage_at=100)
MEGATRON = Cell("megatron", ("engine=megatron", "engine.container_image=null", "model.num_layers=4", "method=sft",
                             "parallelism.pp=2", "train.micro_batch_size=2", "train.val_every_n_steps=16",
                             "cluster.nodes=1", "cluster.gpus_per_node=2"),
                max_steps=64, every=16, inject_at=40, damage_at=40)
# The dead node's megatron run: its two ranks on two nodes, like the reference run's (one of them dies).
MEGATRON_2N = dataclasses.replace(MEGATRON, overrides=tuple(
    {"cluster.nodes=1": "cluster.nodes=2", "cluster.gpus_per_node=2": "cluster.gpus_per_node=1"}.get(o, o)
    for o in MEGATRON.overrides))
CELLS = {"reference": REFERENCE, "megatron": MEGATRON}
_STARTED: dict = {}  # the concurrent scenarios' futures, once started


def _cli(argv) -> str:
    """`vdkit ARGV`'s output, from its own process: a redirect of sys.stdout in a scenario's thread is undone
    whenever pytest's capture moves between a test's phases in the main thread (the output then went to
    pytest's capture and the line this parses was empty)."""
    res = subprocess.run([sys.executable, "-m", "vdkit.cli", *argv], capture_output=True, text=True)
    assert res.returncode == 0, (argv, res.stderr[-2000:])
    return res.stdout.strip()


def _steps(run_dir, job_id) -> list:
    from vdkit.validation.logs import parse_text_log

    path = Path(run_dir) / f"slurm-{job_id}.out"
    return [r.step + 1 for r in parse_text_log(path).steps] if path.exists() else []


def _wait_for(what, pred, timeout=180, run_dir=None):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tails = [p.name + ": " + p.read_text(errors="replace")[-1500:] for p in sorted(Path(run_dir).glob("slurm-*"))] \
                if run_dir else []
            raise AssertionError(f"waited {timeout} s for {what}: " + "\n".join(tails))
        time.sleep(0.3)


def _current_job(run_dir) -> str:
    return sub.job_ids(run_dir)[-1]


def _trained_past(run_dir, step):
    """True once the run's current job has trained past ``step`` (see the module docstring: a job that failed
    before the fault is followed by its successor)."""
    def done():
        assert not (Path(run_dir) / "finished").exists(), f"the run finished before step {step} of a job"
        return (_steps(run_dir, _current_job(run_dir)) or [0])[-1] >= step
    return done


def _at(run_dir, step, timeout=600) -> str:
    """Wait until the current job trained past ``step``; its id."""
    _wait_for(f"step {step}", _trained_past(run_dir, step), timeout, run_dir)
    return _current_job(run_dir)


def _finish(run_dir, max_steps, timeout=600) -> dict:
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


def _row(fault, cell, figures):
    return (f"\nFAULT ROW | {fault} ({cell.engine}) | continued: yes, jobs {','.join(figures['jobs'])} | steps "
            f"redone: {figures['redone']} | status: {figures['status'].split(chr(9), 2)[-1]}")


def _freeze(run_dir, cell, ckpt_dir) -> dict:
    """SIGSTOP every rank of the run between saves (none in flight: no hidden megatron step directory, which
    rank 0 would publish after the damage once it runs again); the ranks' pids."""
    while True:
        ranks = _ranks(run_dir, cell.engine)
        for pid in ranks.values():
            os.kill(pid, signal.SIGSTOP)
        if not any(p.name.startswith(".") for p in Path(ckpt_dir).iterdir()):
            return ranks
        for pid in ranks.values():
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.2)


# ----------------------------------------------------------------------------- the scenarios
def _sigkilled_rank(tmp_path, cell, timing="step"):
    """A rank SIGKILLed at ``timing`` (tests/fault_kill.py: mid-step, during a save, just after one) while a
    process of the failed job still holds the run dir's lock after its batch shell has exited (issue 37: the
    successor refused it and the run stopped for good): the successor waits for it, and the run finishes."""
    from vdkit.run.rundir import checkpoint_dir, load_recipe

    run_dir, _ = cell.submit(tmp_path)
    _at(run_dir, cell.inject_at if timing == "step" else cell.inject_at - cell.every)
    held = batch_shell_lock(run_dir)
    assert held is not None, "no process holds the run dir's lock"
    failed = _current_job(run_dir)
    try:
        victim = kill_at(run_dir, cell.engine, checkpoint_dir(load_recipe(run_dir), run_dir), timing)
    except BaseException:
        os.close(held)
        raise
    waited = release_when_waited(run_dir, held, failed, sub.job_ids)
    figures = _finish(run_dir, cell.max_steps)
    assert f"rank {victim} on xe9680-" in figures["status"] and "killed (SIGKILL: out of memory?)" in figures["status"]
    from vdkit.run.faults import read_faults

    assert f"restart {len(read_faults(run_dir))} of 3" in figures["status"] and figures["redone"] >= 0
    return _row(f"rank SIGKILLed ({timing}; a straggler held the lock: {waited.split(': ', 1)[-1]})", cell, figures)


def _damaged_checkpoint(tmp_path, cell, damage):
    from vdkit.recipes.common.checkpoint import latest

    run_dir, _ = cell.submit(tmp_path)
    _at(run_dir, cell.damage_at)
    ckpts = run_dir / "checkpoints"
    ranks = _freeze(run_dir, cell, ckpts)  # no save races the damage
    newest = latest(ckpts)
    # The reference engine's checkpoint is one file; megatron's a directory of per-rank files: rank 1's is
    # damaged, so rank 0 finds its own good and must learn the verdict from its peer.
    target = newest / "rank00001.pt" if newest.is_dir() else newest
    data = target.read_bytes()
    if damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    else:
        i = len(data) // 2
        target.write_bytes(data[:i] + bytes(b ^ 0xFF for b in data[i:i + 8]) + data[i + 8:])
    os.kill(ranks[1], signal.SIGKILL)
    os.kill(ranks[0], signal.SIGCONT)
    figures = _finish(run_dir, cell.max_steps)
    aside = [p.name for p in ckpts.iterdir() if ".damaged-" in p.name]
    assert any(n.startswith(newest.name + ".damaged-") for n in aside), aside
    logs = "".join((run_dir / f"slurm-{j}.out").read_text(errors="replace") for j in figures["jobs"])
    assert f"checkpoint {newest.name} is damaged (" in logs and f"{target.name}: SHA-256 " in logs  # named, and why
    assert "set aside as" in logs
    if target != newest:  # megatron: rank 0's own file is good; its line names the rank that found the damage
        assert f"is damaged (rank 1: {target.name}: SHA-256 " in logs
    assert f"set aside as damaged: {newest.name}.damaged-" in figures["status"]
    return _row(f"latest checkpoint {damage}", cell, figures)


def _hung_rank(tmp_path, cell):
    run_dir, _ = cell.submit(tmp_path)
    _at(run_dir, cell.inject_at)
    os.kill(_ranks(run_dir, cell.engine)[1], signal.SIGSTOP)
    t0 = time.monotonic()
    figures = _finish(run_dir, cell.max_steps)
    assert "stopped responding" in figures["status"] and "rank 1 on xe9680-" in figures["status"]
    assert (run_dir / "excluded_nodes").read_text().strip().startswith("xe9680-")
    return _row(f"rank hangs (SIGSTOP; finished {time.monotonic() - t0:.0f} s later)", cell, figures)


def _term_at_the_limit(tmp_path, cell):
    # Slurm enforces a limit on its next periodic check (up to ~30 s later), which a tiny run could outlive:
    # the ranks are held (SIGSTOP) until it comes, and slurmd sends SIGCONT before its TERM ("Tasks might be
    # stopped ... so send SIGCONT first", slurmd's terminate request), so they meet the TERM mid-run. The
    # hold is no hang: this cell's heartbeat timeout outlasts it.
    run_dir, _ = cell.submit(tmp_path, "cluster.heartbeat_timeout_s=120")
    job = _at(run_dir, cell.inject_at)
    for pid in _ranks(run_dir, cell.engine).values():
        os.kill(pid, signal.SIGSTOP)
    # The time limit, now: Slurm sends every process of the job TERM (KILL after KillWait), its log line says
    # "DUE TO TIME LIMIT" (a plain `scancel` is a cancel: test_a_cancelled_job_is_not_continued).
    subprocess.run(["scontrol", "update", f"jobid={job}", "EndTime=now"], check=True)
    before = sub.job_ids(run_dir).index(job)
    figures = _finish(run_dir, cell.max_steps)
    err = (run_dir / f"slurm-{job}.err").read_text()
    assert "DUE TO TIME LIMIT" in err and "TERM from Slurm" in err and sub.job_state(job).state == "TIMEOUT"
    assert len(figures["jobs"]) == before + 2 and max(_steps(run_dir, job)) < cell.max_steps, \
        "the limit did not stop the run"
    # The ranks stop on TERM, but srun answers its own TERM by killing the tasks: either a clean stop
    # (no fault) or a kill the batch shell outlives and hands over from the last checkpoint.
    from vdkit.run.faults import read_faults

    mine = [f for f in read_faults(run_dir) if f.get("job") == job]
    assert not mine or "killed at the time limit (TERM, then KILL)" in figures["status"]
    return _row("TERM at the limit", cell, figures)


def _cancelled(tmp_path, cell):
    run_dir, job = cell.submit(tmp_path)
    _wait_for("step 20", _trained_past(run_dir, 20), 300, run_dir)
    assert _current_job(run_dir) == job, "the job was restarted before it was cancelled"
    subprocess.run(["scancel", job], check=True)
    _wait_for("the job to end", lambda: sub.job_state(job).done, 120, run_dir)
    time.sleep(2)
    assert sub.job_ids(run_dir) == [job] and not (run_dir / "finished").exists()
    assert "was cancelled: the run does not continue by itself" in (run_dir / f"slurm-{job}.err").read_text()
    from vdkit.run.runs import marker_state

    assert json.loads((run_dir / "cancelled").read_text())["jobs"] == [job]  # the plain scancel's record
    assert marker_state(run_dir).startswith("CANCELLED (scancel at ")  # status, runs, report: cancelled


def _full_disk(tmp_path, cell):
    import shutil

    from vdkit.run.faults import read_faults

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        run_dir, job = cell.submit(tmp_path / "runs", f"run.results_dir={mount}")
        ckpts = mount / run_dir.name / "checkpoints"
        filler = mount / "filler"
        # Another user's file takes all but ~100 kB (a checkpoint is 260 kB, megatron's 3.5 MB) as soon as the job's
        # pre-flight has found room (issue 34: a disk full before the job starts is its refusal, exit 2): in place
        # seconds before the ranks start, so the first save's room check sees it. (Filling at step 65 left a window
        # of ~25 steps, about a second, that a loaded machine missed: the save then passed its check, met the full
        # disk mid-write, and the refusal this scenario is about never happened.)
        _wait_for("the job's pre-flight", lambda: any("vdkit pre-flight: every input is in place" in p.read_text(
            errors="replace") for p in run_dir.glob("slurm-*.out")), 300, run_dir)
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, shutil.disk_usage(mount).free - 100_000))
        assert not _steps(run_dir, job), "the job trained before the disk was full"
        _wait_for("the refused save", lambda: any("exit 74" in f.get("cause", "") for f in read_faults(run_dir)),
                  600, run_dir)
        refused = next(f["job"] for f in read_faults(run_dir) if "exit 74" in f.get("cause", ""))
        filler.unlink()  # the space comes back
        figures = _finish(run_dir, cell.max_steps)
        err = (run_dir / f"slurm-{refused}.err").read_text()
        assert f"no room for the next checkpoint in {ckpts}" in err
        assert "could not write its checkpoint (exit 74" in figures["status"]
        assert not [p for p in ckpts.iterdir() if p.name.endswith(".tmp")]
        assert max(_steps(run_dir, refused)) == cell.every, f"the first save ({cell.every}) was not the refused one"
        return _row("disk full at a save", cell, figures)
    finally:
        subprocess.run(["umount", "-l", str(mount)])


SCENARIOS = {"sigkill": _sigkilled_rank, "truncated": lambda t, c: _damaged_checkpoint(t, c, "truncated"),
             "bit-flipped": lambda t, c: _damaged_checkpoint(t, c, "bit-flipped"), "hang": _hung_rank,
             "term": _term_at_the_limit, "disk": _full_disk}
AT_ONCE = {**{f"{name}-{engine}": (fn, cell) for name, fn in SCENARIOS.items() for engine, cell in CELLS.items()},
           "cancel-reference": (_cancelled, REFERENCE),
           # The other kill timings (issue 37), one short run each: the rank killed during a save, just after one
           **{f"sigkill-{timing}-{engine}": (lambda t, c, timing=timing: _sigkilled_rank(t, c, timing), cell)
              for timing in ("save", "after-save") for engine, cell in CELLS.items()}}
NEEDS_MEGATRON = pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed")


def _each_engine(fault):
    """The parameters of a concurrent fault's test: one per engine."""
    return [pytest.param(f"{fault}-{engine}", id=f"{fault}-{engine}",
                         marks=[NEEDS_MEGATRON] if engine == "megatron" else []) for engine in CELLS]


@pytest.fixture(scope="module")
def scenarios(local_slurm, tmp_path_factory, request):
    """The AT_ONCE scenarios this session's tests ask for, each started in its own thread: {name: Future of its
    table row}."""
    wanted = {item.callspec.params.get("scenario") for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the job's ranks (sbatch exports this environment) share the cores
    names = [n for n in AT_ONCE if n in wanted and (HAVE_MEGATRON or not n.endswith("-megatron"))]
    pool = ThreadPoolExecutor(max(1, len(names)), thread_name_prefix="fault")
    started = {n: pool.submit(AT_ONCE[n][0], tmp_path_factory.mktemp(n), AT_ONCE[n][1]) for n in names}
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
    row = scenarios[name].result(timeout=1800)
    if row:
        print(row)


@pytest.mark.parametrize("scenario", _each_engine("sigkill") + _each_engine("sigkill-save")
                         + _each_engine("sigkill-after-save"))
def test_a_sigkilled_rank_is_restarted_from_the_last_checkpoint(scenario, scenarios):
    _result(scenarios, scenario)


@pytest.mark.parametrize("scenario", _each_engine("truncated") + _each_engine("bit-flipped"))
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_used(scenario, scenarios):
    _result(scenarios, scenario)


@pytest.mark.parametrize("scenario", _each_engine("hang"))
def test_a_hung_rank_is_killed_by_the_watchdog_and_restarted(scenario, scenarios):
    _result(scenarios, scenario)


@pytest.mark.parametrize("scenario", _each_engine("term"))
def test_term_at_the_limit_hands_over(scenario, scenarios):
    _result(scenarios, scenario)


@pytest.mark.parametrize("scenario", ["cancel-reference"])
def test_a_cancelled_job_is_not_continued(scenario, scenarios):
    _result(scenarios, scenario)


@pytest.mark.parametrize("scenario", _each_engine("disk"))
def test_a_full_disk_at_a_save_is_refused_cleanly_and_the_run_continues_once_freed(scenario, scenarios):
    _result(scenarios, scenario)


# ----------------------------------------------------------------------------- alone: the cluster's daemons down
def _side_by_side(tmp_path, megatron_cell):
    """[(cell, run dir)] of the runs one daemon fault strikes at once, each trained past its fault's step: the
    reference one, and megatron's where it is installed.

    Both must be mid-run at one moment, whatever their start-ups (they differed by 11 s: tiny runs train for
    10-20 s): a run past its step while the other is not yet trains slowly meanwhile - its ranks stopped
    (SIGSTOP) 1.5 s of every 1.8 s, short enough that they still beat well within the watchdog's limits."""
    cells = [dataclasses.replace(REFERENCE, max_steps=240)] + \
        ([dataclasses.replace(megatron_cell, max_steps=160)] if HAVE_MEGATRON else [])
    runs = [(cell, cell.submit(tmp_path / cell.engine)[0]) for cell in cells]
    deadline = time.monotonic() + 300
    while True:
        ready = [_trained_past(run_dir, cell.inject_at)() for cell, run_dir in runs]
        if all(ready):
            return runs
        assert time.monotonic() < deadline, f"waited 300 s for every run past its step: {ready}"
        held = [pid for (cell, run_dir), past in zip(runs, ready) if past
                for pid in _ranks(run_dir, cell.engine).values()]
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(1.5)
        for pid in held:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)


def test_a_dead_node_is_excluded_and_the_run_continues_elsewhere(alone, local_slurm, tmp_path):
    # Jobs hold whole nodes, so the two runs cannot share one: the node of each run's rank 1 dies at once.
    from vdkit.slurm.localcluster import _which

    runs = _side_by_side(tmp_path, MEGATRON_2N)
    victims = []
    for cell, run_dir in runs:
        rank = _ranks(run_dir, cell.engine)[1]
        node = (run_dir / "heartbeat" / "rank1").read_text().split()[4]
        stepd = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the rank's slurmstepd
        slurmd = int((local_slurm.root / "run" / f"slurmd-{node}.pid").read_text().split()[0])
        victims.append((run_dir, node, (slurmd, stepd, rank)))
    back = set()

    def revive(node):  # the node comes back (a real one reboots): for its run's successor, and the next test
        subprocess.run([_which("slurmd"), "-f", str(local_slurm.conf), "-N", node], env=local_slurm.env())
        back.add(node)
    try:
        for _, _, pids in victims:  # the nodes die: daemon, step, rank
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        # Each node stays dead until its run's watchdog has blamed it (excluded_nodes, written before the
        # successor is submitted): Slurm cannot give a dead node to another job meanwhile, its failed job holds it.
        deadline = time.monotonic() + 180
        while len(back) < len(victims) and time.monotonic() < deadline:
            for run_dir, node, _ in victims:
                if node not in back and (run_dir / "excluded_nodes").exists():
                    revive(node)
            time.sleep(0.3)
    finally:
        for _, node, _ in victims:
            if node not in back:
                revive(node)
    for cell, run_dir in runs:
        node = next(n for r, n, _ in victims if r == run_dir)
        figures = _finish(run_dir, cell.max_steps)
        assert (run_dir / "excluded_nodes").read_text().split() == [node]
        assert f"rank 1 on {node}: " in figures["status"] and "stopped responding" in figures["status"]
        print(_row("node killed (slurmd + slurmstepd + rank)", cell, figures))


def test_controller_outage_at_hand_over(alone, local_slurm, tmp_path):
    # One outage for both runs: each batch shell is told to hand over (USR1), then slurmctld stops.
    from vdkit.run.faults import read_faults
    from vdkit.slurm.localcluster import _which

    runs = _side_by_side(tmp_path, MEGATRON)
    at = {run_dir: (_current_job(run_dir), len(sub.job_ids(run_dir)), len(read_faults(run_dir))) for _, run_dir in runs}
    for _, run_dir in runs:
        subprocess.run(["scancel", "--batch", "--signal=USR1", at[run_dir][0]], check=True)
    for _, run_dir in runs:  # the controller passes the signal on: stopped at once, it lost one (seen once)
        err = run_dir / f"slurm-{at[run_dir][0]}.err"
        _wait_for("the batch shell's USR1", lambda: "USR1 from Slurm" in err.read_text(errors="replace"), 60, run_dir)
    pid_file = local_slurm.root / "run" / "slurmctld.pid"
    os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
    asked = []
    try:
        for _, run_dir in runs:
            t0 = time.monotonic()
            said = _status(run_dir)
            asked.append(time.monotonic() - t0)
            assert "UNREACHABLE (controller unreachable" in said and asked[-1] < 12, (said, asked[-1])
        time.sleep(15)  # the ranks stop meanwhile; srun or the successor's sbatch waits for the controller
    finally:
        subprocess.run([_which("slurmctld"), "-f", str(local_slurm.conf)], check=True, env=local_slurm.env())
    for (cell, run_dir), took in zip(runs, asked):
        job, jobs, faults = at[run_dir]
        figures = _finish(run_dir, cell.max_steps)
        assert figures["redone"] == 0 and len(figures["jobs"]) == jobs + 1, figures
        assert len(read_faults(run_dir)) == faults, figures["faults"]
        tries = (run_dir / f"slurm-{job}.err").read_text().count("submitting the next allocation failed")
        print(_row(f"slurmctld down 15 s at hand-over (status during it in {took:.1f} s: UNREACHABLE; {tries} "
                   "failed sbatch tries)", cell, figures))
