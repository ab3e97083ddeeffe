"""The batch shell's recovery functions (vdkit.slurm.recovery), run by bash from a real render with a
stand-in sbatch: the record a failed step leaves, the restart bound, the exclusion, the back-off."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vdkit.cli import main

CELL = ["engine=reference", "model=tiny_llama", "data=synthetic", "method=lora", "cluster.nodes=2",
        "cluster.gpus_per_node=1", "cluster.mpi=none", "cluster.cpus_per_task=1", "train.max_steps=10"]


@pytest.fixture
def rendered(tmp_path, capsys):
    def render(*extra):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        assert main(["render", *CELL, *extra, "--out", str(out)]) == 0
        capsys.readouterr()
        return next(out.iterdir())
    return render


def _functions(run_dir: Path) -> str:
    text = (run_dir / "launch.sbatch").read_text()
    return text[text.index("# Recovery"):text.index("# The run's state files must be regular files")]


def _shell(run_dir, tmp_path, body, sbatch_script='echo "4242;cluster"', env=None):
    """Run ``body`` after the script's recovery functions, with a stand-in sbatch on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch.args\n{sbatch_script}\n")
    (bin_dir / "sbatch").chmod(0o755)
    (bin_dir / "sleep").write_text("#!/bin/bash\necho \"$1\" >> " + str(tmp_path) + "/slept\n")
    (bin_dir / "sleep").chmod(0o755)
    script = (f"set -euo pipefail\nexport SLURM_JOB_ID=77 VDKIT_HEARTBEAT_DIR={run_dir}/heartbeat\n"
              f"mkdir -p $VDKIT_HEARTBEAT_DIR\n{_functions(run_dir)}\n{body}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **(env or {})})


def test_the_script_traps_term_and_usr1_and_is_valid_bash(rendered):
    run_dir = rendered()
    text = (run_dir / "launch.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(run_dir / "launch.sbatch")]).returncode == 0
    assert re.search(r"trap '.*' USR1$", text, re.M) and re.search(r"trap '.*' TERM$", text, re.M)
    assert "vdkit_watchdog 9>&- & WATCH_PID=$!" in text and "export VDKIT_COLLECTIVE_TIMEOUT_S=" in text
    timeout = int(re.search(r"VDKIT_COLLECTIVE_TIMEOUT_S=(\d+)", text).group(1))
    assert 60 < timeout < 1800  # from the plan: above the watchdog's limits, below torch's 30 minutes


def test_a_killed_rank_is_recorded_and_restarted_once_per_allowance(rendered, tmp_path):
    run_dir = rendered("cluster.max_restarts=2")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step=30.ckpt").write_text("x")
    (run_dir / "slurm-77.err").write_text("srun: error: xe9680-2: task 1: Killed\n"
                                          "srun: error: xe9680-1: task 0: Terminated\n")
    for _ in range(3):
        r = _shell(run_dir, tmp_path, 'vdkit_failed 137; echo "next=${NEXT:-}"')
        assert r.returncode == 0, r.stderr
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [f["restart"] for f in faults] == [1, 2, 0]
    first = faults[0]
    assert (first["rank"], first["node"], first["cause"], first["last_step"], first["next"]) == \
        ("1", "xe9680-2", "killed (SIGKILL: out of memory?)", "30", "4242")
    assert faults[2]["why"].startswith("2 restart(s) used") and faults[2]["continue"].startswith("sbatch ")
    assert "not restarted (2 restart(s) used" in r.stderr
    assert (run_dir / "job_id.txt").read_text().split() == ["4242", "4242"]
    assert not (run_dir / "excluded_nodes").exists()  # a killed rank is not its node's fault
    from vdkit.run.faults import summary

    assert "rank 1 on xe9680-2: killed (SIGKILL: out of memory?)" in summary(run_dir)
    assert "continue: sbatch " in summary(run_dir)


def test_the_watchdog_culprit_is_excluded_from_the_next_allocation(rendered, tmp_path):
    run_dir = rendered()
    (run_dir / "heartbeat").mkdir()
    (run_dir / "heartbeat" / ".why").write_text("rank 1 on xe9680-5 stopped responding\n")
    (run_dir / "heartbeat" / ".culprit").write_text("1 xe9680-5\n")
    r = _shell(run_dir, tmp_path, "vdkit_failed 137")
    assert r.returncode == 0, r.stderr
    assert (run_dir / "excluded_nodes").read_text().split() == ["xe9680-5"]
    args = (tmp_path / "sbatch.args").read_text()
    assert "--exclude=xe9680-5" in args and "--begin=now+30" in args and "--dependency" not in args



def test_the_watchdog_and_restart_delays_are_cluster_settings(rendered, tmp_path):
    text = (rendered() / "launch.sbatch").read_text()  # the production defaults (vdkit.run.faults)
    assert "-gt 20 ]; then" in text and "sleep 10; kill -KILL" in text and "--begin=now+30" in text
    run_dir = rendered("cluster.heartbeat_timeout_s=6", "cluster.kill_grace_s=3", "cluster.restart_delay_s=5")
    text = (run_dir / "launch.sbatch").read_text()
    assert "-gt 6 ]; then" in text and "sleep 3; kill -KILL" in text and "-gt 20 ]" not in text
    (run_dir / "heartbeat").mkdir()
    (run_dir / "heartbeat" / ".why").write_text("rank 1 on xe9680-5 stopped responding\n")
    (run_dir / "heartbeat" / ".culprit").write_text("1 xe9680-5\n")
    assert _shell(run_dir, tmp_path, "vdkit_failed 137").returncode == 0
    assert "--begin=now+5" in (tmp_path / "sbatch.args").read_text()


def test_a_watchdog_setting_out_of_range_is_refused_at_the_door(tmp_path, capsys):
    assert main(["render", *CELL, "cluster.heartbeat_timeout_s=0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cluster.heartbeat_timeout_s=0" in err and "between 1 and 86400" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())

def test_the_recipes_fault_is_not_restarted(rendered, tmp_path):
    run_dir = rendered()
    (run_dir / "slurm-77.err").write_text("srun: error: xe9680-1: task 0: Exited with exit code 2\n")
    r = _shell(run_dir, tmp_path, "vdkit_failed 2")
    assert r.returncode == 0, r.stderr
    fault = json.loads((run_dir / "faults.jsonl").read_text())
    assert fault["restart"] == 0 and "recipe" in fault["why"] and not (tmp_path / "sbatch.args").exists()


def test_submitting_retries_with_back_off_while_the_controller_is_away(rendered, tmp_path):
    run_dir = rendered()
    # sbatch fails twice (controller away), then answers
    flaky = (f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n; '
             'if [ "$n" -lt 2 ]; then echo "sbatch: error: Batch job submission failed: Unable to contact slurm '
             'controller (connect failure)" >&2; exit 1; fi; echo 99')
    r = _shell(run_dir, tmp_path, 'vdkit_submit_next; echo "next=${NEXT:-}"', sbatch_script=flaky)
    assert r.returncode == 0 and "next=99" in r.stdout, r.stderr
    assert (tmp_path / "slept").read_text().split() == ["5", "10"]
    assert r.stderr.count("Unable to contact slurm controller") == 2


def test_negative_max_restarts_is_refused_at_the_door(tmp_path, capsys):
    assert main(["render", *CELL, "cluster.max_restarts=-1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cluster.max_restarts=-1" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_term_at_the_time_limit_submits_the_successor_at_once_and_only_once(rendered, tmp_path):
    # Slurm KILLs the batch shell KillWait s after its TERM: the successor is submitted from the trap, before
    # the ranks have stopped; the hand-over after the step then reuses it.
    run_dir = rendered()
    err = run_dir / "slurm-77.err"
    err.write_text("slurmstepd-xe9680-1: error: *** JOB 77 ON xe9680-1 CANCELLED AT 2026-11-26T19:28:31 ***\n")
    r = _shell(run_dir, tmp_path, 'NEXT=; vdkit_on_term; echo "next=${NEXT:-}"')
    assert r.returncode == 0 and "next=\n" in r.stdout + "\n" and not (tmp_path / "sbatch.args").exists()  # a cancel
    err.write_text("slurmstepd-xe9680-1: error: *** JOB 77 ON xe9680-1 CANCELLED AT 2026-11-26T19:28:31 DUE TO "
                   "TIME LIMIT ***\n")
    r = _shell(run_dir, tmp_path, 'NEXT=; vdkit_on_term; vdkit_on_term; vdkit_submit_next; echo "next=${NEXT:-}"')
    assert r.returncode == 0 and "next=4242" in r.stdout, r.stderr
    assert len((tmp_path / "sbatch.args").read_text().splitlines()) == 1 and "job 4242 continues" in r.stderr
    assert (run_dir / "job_id.txt").read_text().split() == ["4242"]


def test_a_successor_submitted_at_the_limit_is_cancelled_when_no_restart_is_allowed(rendered, tmp_path):
    run_dir = rendered("cluster.max_restarts=0")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scancel").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scancel.args\n')
    (tmp_path / "bin" / "scancel").chmod(0o755)
    r = _shell(run_dir, tmp_path, 'NEXT=4242; vdkit_failed 137 "killed at the time limit"; echo "next=${NEXT:-}"')
    assert r.returncode == 0 and "next=\n" in r.stdout + "\n", r.stderr
    assert (tmp_path / "scancel.args").read_text().split() == ["4242"]
    assert json.loads((run_dir / "faults.jsonl").read_text())["restart"] == 0


# (names in the checkpoint dir, the step the record names): each engine's naming, complete or not
LAST_STEP_CASES = {
    "reference/megatron": (["step=30.ckpt", "step=60.ckpt", "step=90.ckpt.sha256", "step=60.ckpt.damaged-x",
                            ".step=90.ckpt.tmp"], "60"),
    "bridge": (["iter_0000030/run_config.yaml", "iter_0000060/run_config.yaml", "iter_0000090/common.pt",
                "latest_checkpointed_iteration.txt", "aside-iter_0000120.damaged-20261126T000000Z/x"], "60"),
    "nemo": (["m--validation_loss=1.234-step=40-consumed_samples=320.0.ckpt",
              "m--validation_loss=1.100-step=80-consumed_samples=640.0-last/common.pt",
              "m--validation_loss=0.9-step=120-consumed_samples=960.0-last/common.pt",
              "m--validation_loss=0.9-step=120-consumed_samples=960.0-last-unfinished"], "80"),
    "none": ([], ""),
}


@pytest.mark.parametrize("engine", sorted(LAST_STEP_CASES))
def test_the_record_names_the_last_complete_checkpoint_in_each_engines_naming(engine, rendered, tmp_path):
    """Bridge's iter_NNNNNNN (complete once run_config.yaml, its save's last file, is there), NeMo's
    ...-step=N-... (without its -unfinished marker), the kit's step=N.ckpt."""
    names, want = LAST_STEP_CASES[engine]
    run_dir = rendered()
    ckpts = run_dir / "checkpoints"
    for name in names:
        (ckpts / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpts / name).write_text("x")
    r = _shell(run_dir, tmp_path, "vdkit_failed 137")
    assert r.returncode == 0, r.stderr
    assert json.loads((run_dir / "faults.jsonl").read_text())["last_step"] == want
    assert f"(step {want or 0})" in r.stderr


# ----------------------------------------------------------------------------- the hand-over (issue 37)
def _hold_lock(run_dir, seconds):
    """A process that holds ``run_dir``'s lock for ``seconds`` (a predecessor's last process); returns once held."""
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(float(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir / "run.lock"), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _successor(run_dir, tmp_path, squeue="", flock_wait_fails=False, jobs="30 77"):
    """Job 77's start (the recovery functions, then the lock lines) after job 30 in the run dir's record, with
    stand-in squeue (printing ``squeue``) and, optionally, a flock whose bounded wait fails at once."""
    from vdkit.run.runlock import lock_lines

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text(f"#!/bin/bash\necho '{squeue}'\n")
    if flock_wait_fails:
        (bin_dir / "flock").write_text(f'#!/bin/bash\n[ "$1" = -w ] && {{ echo "$2" > {tmp_path}/waited; exit 1; }}\n'
                                       'exec /usr/bin/flock "$@"\n')
    for tool in ("squeue", "flock"):
        if (bin_dir / tool).exists():
            (bin_dir / tool).chmod(0o755)
    (run_dir / "job_id.txt").write_text("".join(f"{j}\n" for j in jobs.split()))
    (run_dir / "run.lock").write_text("slurm 30\n")
    body = "\n".join(lock_lines(run_dir, "slurm", "${SLURM_JOB_ID:-?}", on_held="vdkit_handover")) + "\necho started"
    start = time.monotonic()
    res = _shell(run_dir, tmp_path, body)
    return res, time.monotonic() - start


def _restart_record(run_dir, job="30", nxt="77"):
    (run_dir / "faults.jsonl").write_text(json.dumps({"job": job, "rc": 137, "rank": "1", "node": "xe9680-2",
                                                      "cause": "killed", "last_step": "60", "restart": 1,
                                                      "max_restarts": 3, "next": nxt, "why": "",
                                                      "continue": "sbatch x"}) + "\n")


def test_a_successor_waits_for_its_predecessors_last_process_then_starts(rendered, tmp_path):
    """Job 30's straggler still holds the inherited lock when its restart (job 77) starts: 77 waits, then trains."""
    run_dir = rendered("cluster.kill_grace_s=1")  # a wait of 12 s
    _restart_record(run_dir)
    holder = _hold_lock(run_dir, 2)
    try:
        res, took = _successor(run_dir, tmp_path, squeue="COMPLETING")
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 0 and res.stdout.strip() == "started", res.stderr
    assert "job 30 has ended but its last processes still hold the run directory; job 77 waits up to 12 s" \
        in res.stderr
    assert 1 < took < 12 and (run_dir / "run.lock").read_text() == "slurm 77\n"


def test_a_stop_hand_over_waits_too_but_a_second_submit_is_refused_at_once(rendered, tmp_path):
    """Without a restart record the holder must have ended (a stop's successor); a job submitted while it runs,
    or one the run never chained (a plain second sbatch), is refused at once, naming the holder."""
    run_dir = rendered("cluster.kill_grace_s=1")
    holder = _hold_lock(run_dir, 30)
    try:
        res, took = _successor(run_dir, tmp_path, squeue="RUNNING")
        assert res.returncode == 1 and "started" not in res.stdout and took < 5
        assert res.stderr.strip() == ("vdkit: the run directory is held by slurm 30; job 77 did not start: wait for "
                                      "that job or cancel it, or render a new run dir")
        _restart_record(run_dir, nxt="78")  # a record naming another job is not this job's hand-over
        res, took = _successor(run_dir, tmp_path, squeue="RUNNING")
        assert res.returncode == 1 and took < 5
        (run_dir / "faults.jsonl").unlink()
        res, _ = _successor(run_dir, tmp_path, squeue="COMPLETING", flock_wait_fails=True)
        assert "job 30 has ended" in res.stderr  # ended: a stop's successor waits
        _restart_record(run_dir)
        res, took = _successor(run_dir, tmp_path, squeue="COMPLETING", jobs="30")  # never chained: a plain sbatch
        assert res.returncode == 1 and took < 5 and "did not start: wait for that job" in res.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_restart_waits_even_while_slurm_still_lists_its_failed_predecessor(rendered, tmp_path):
    """The fault record names job 77 as job 30's restart: 77 is the chain's successor whatever squeue still says
    of 30 (requeued after a node failure, or not yet ended), so it waits for 30's last processes, never refused."""
    run_dir = rendered("cluster.kill_grace_s=1")
    _restart_record(run_dir)
    holder = _hold_lock(run_dir, 30)
    try:
        res, took = _successor(run_dir, tmp_path, squeue="RUNNING", flock_wait_fails=True)
    finally:
        holder.kill()
        holder.wait()
    assert "waits up to 12 s" in res.stderr and "did not start: wait for that job" not in res.stderr, res.stderr
    assert (tmp_path / "waited").read_text().strip() == "12"


@pytest.mark.parametrize("restarts_left", [True, False])
def test_a_successor_that_cannot_take_the_lock_is_a_fault_the_recovery_handles(restarts_left, rendered, tmp_path):
    """Still held after the bounded wait: job 77 records its own failure to start and is restarted while
    cluster.max_restarts allows; else the record says the run stopped, why, and the command that continues it."""
    run_dir = rendered("cluster.kill_grace_s=1", f"cluster.max_restarts={3 if restarts_left else 1}")
    _restart_record(run_dir)
    holder = _hold_lock(run_dir, 30)
    try:
        res, _ = _successor(run_dir, tmp_path, squeue="", flock_wait_fails=True)
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 1 and "started" not in res.stdout
    assert (tmp_path / "waited").read_text().strip() == "12"
    last = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()][-1]
    assert last["job"] == "77" and last["cause"].startswith("job 77 did not start: the run directory was still held "
                                                            "by processes of job 30 12 s after it ended")
    from vdkit.run.faults import summary

    if restarts_left:
        assert (last["restart"], last["next"]) == (2, "4242") and "--dependency=afterany:77" in \
            (tmp_path / "sbatch.args").read_text()
        assert "restart 2 of 3: job 4242 continues" in res.stderr
    else:
        assert (last["restart"], last["next"]) == (0, "") and not (tmp_path / "sbatch.args").exists()
        line = summary(run_dir, "77", "FAILED exit=1:0")
        assert "job 77 did not start" in line and "not restarted (1 restart(s) used" in line
        assert f"continue: sbatch {run_dir}/launch.sbatch" in line and "continues" not in line


def test_status_says_a_chain_stopped_when_the_named_successor_failed(tmp_path):
    """The record named job 31 as the restart, and job 31 failed without a record of its own: the run has stopped,
    and the line says so with the continue command, never 'job 31 continues'."""
    from vdkit.run.faults import summary

    _restart_record(tmp_path, nxt="31")
    line = summary(tmp_path, "31", "FAILED exit=1:0")
    assert "job 31 continues" not in line
    assert "job 31 ended (FAILED exit=1:0) without continuing the run: the run has stopped; continue: sbatch x" in line
    assert "job 31 continues" in summary(tmp_path, "31", "RUNNING")  # while it runs it does
    assert "job 31 continues" in summary(tmp_path, "31", "PENDING")


def test_a_plain_scancel_leaves_the_cancel_record_that_status_and_report_read(rendered, tmp_path, capsys, monkeypatch):
    """`scancel JOB` (not `vdkit cancel`): the batch shell saw slurmstepd's CANCELLED line and ended the run, but
    left no record, so `vdkit report` turned the run's first steps into a 1000-step figure as if it had finished.
    The shell writes the record `vdkit cancel` writes; status reads CANCELLED with no controller, report 'cancelled'."""
    run_dir = rendered()
    text = (run_dir / "launch.sbatch").read_text()
    start = text.index('if [ -n "$GOT_TERM" ]')
    branch = text[start:text.index("\nfi\n", start) + 4]  # the cancel branch of the script, as rendered
    (run_dir / "job_id.txt").write_text("77\n")  # what sbatch recorded before the job ran
    (run_dir / "slurm-77.err").write_text("slurmstepd-xe9680-1: error: *** JOB 77 ON xe9680-1 CANCELLED AT "
                                          "2026-11-26T19:28:31 ***\n")
    r = subprocess.run(["bash", "-c", f"GOT_TERM=1; rc=143\n{branch}\necho not-cancelled"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "SLURM_JOB_ID": "77"})
    assert r.returncode == 143 and "not-cancelled" not in r.stdout, r.stderr
    record = json.loads((run_dir / "cancelled").read_text())
    assert record["jobs"] == ["77"] and record["continue"] == f"sbatch {run_dir / 'launch.sbatch'}"
    assert not list(run_dir.glob(".cancelled*"))
    from helpers import series, write_nemo1_log

    write_nemo1_log(run_dir / "slurm-77.out", series(0.2, n=20, seed=1))
    assert main(["report", str(run_dir), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    md = capsys.readouterr().out
    assert "| tiny_llama | 2 | cancelled / n/p |" in md and "cancelled by `scancel` at " in md
    (tmp_path / "nobin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no Slurm client: the record answers
    assert main(["status", str(run_dir)]) == 0
    assert "\tCANCELLED (scancel at " in capsys.readouterr().out
