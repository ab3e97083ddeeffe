"""Runs as things (issue 36): `vdkit runs` lists the run directories under a root, `vdkit logs` prints (and
follows) a run's rank logs failing rank first, `vdkit cancel` stops a run on its launcher (local, the local
Slurm, Kubernetes through a stand-in kubectl) and records how to continue; `vdkit status` answers for every
target and reads the run directory's own markers before the scheduler, and watches a run against its plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import make_run
from helpers import K8S_TINY as TINY, k8s_vols as vols  # fake_kubectl: a conftest fixture
from vdkit.cli import main
from vdkit.commands.status import _watch as status_watch

LOCAL = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=local", "train.max_steps=40"]
SLURM = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=xe9680", "cluster.nodes=1",
         "cluster.gpus_per_node=1", "train.max_steps=40"]


def _holder(run_dir: Path, seconds: float = 60, write: str = "") -> subprocess.Popen:
    """A stand-in `vdkit run`: holds the run dir's lock as the local launcher does (appending ``write`` to
    local-1.out every 0.2 s), until TERM or ``seconds``."""
    code = ("import sys, time\nfrom vdkit.run.runlock import acquire_local\nfd = acquire_local(sys.argv[1])\n"
            "print('held', flush=True)\nend = time.time() + float(sys.argv[2])\n"
            "while time.time() < end:\n"
            "    if sys.argv[3]:\n        open(sys.argv[1] + '/local-1.out', 'a').write(sys.argv[3] + '\\n')\n"
            "    time.sleep(0.2)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir), str(seconds), write], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _lines(capsys):
    return [ln.split("\t") for ln in capsys.readouterr().out.strip().splitlines()]


def test_runs_lists_every_run_dir_and_one_unreadable_does_not_stop_it(tmp_path, capsys):
    local = make_run(tmp_path / "runs", LOCAL)
    slurm = make_run(tmp_path / "runs" / "sweep", SLURM)
    broken = make_run(tmp_path / "runs", LOCAL + ["run.name=broken"])
    (broken / "recipe.yaml").write_text("model: [\n")
    (slurm / "finished").touch()
    assert main(["runs", str(tmp_path / "runs")]) == 1
    rows = {r[0]: r for r in _lines(capsys)}
    assert len(rows) == 3
    assert rows[str(local)][1:] == ["reference", "local", "NOT_STARTED", "?/40", "-"]
    assert rows[str(slurm)][1:4] == ["reference", "slurm", "COMPLETED (its file finished says so)"]
    assert rows[str(broken)][3].startswith("UNREADABLE: ")


def test_cancel_a_local_run_stops_its_job_and_says_how_to_continue(tmp_path, capsys):
    run_dir = make_run(tmp_path, LOCAL)
    proc = _holder(run_dir)
    try:
        assert main(["status", str(run_dir)]) == 0
        assert _lines(capsys)[0][2] == "RUNNING"
        assert main(["cancel", str(run_dir), "--settle", "20"]) == 0
        line = _lines(capsys)[0]
        assert line[1:3] == ["CANCELLED", f"local {proc.pid}"]
        assert line[3] == f"continue: vdkit run --resume {run_dir}"
        assert proc.wait(timeout=10) == -15  # TERM reached the job
    finally:
        proc.kill()
    record = json.loads((run_dir / "cancelled").read_text())
    assert record["jobs"] == [f"local {proc.pid}"] and record["continue"] == f"vdkit run --resume {run_dir}"
    assert main(["status", str(run_dir)]) == 0
    assert _lines(capsys)[0][2].startswith("CANCELLED (vdkit cancel at ")
    assert main(["runs", str(tmp_path)]) == 0
    assert _lines(capsys)[0][3].startswith("CANCELLED")
    time.sleep(1.1)
    again = _holder(run_dir, seconds=30)  # continued (`vdkit run --resume` takes the lock): the record is history
    try:
        assert main(["status", str(run_dir)]) == 0
        assert _lines(capsys)[0][2] == "RUNNING"
    finally:
        again.kill()


def test_logs_put_the_failing_rank_first_and_follow_ends_with_the_run(tmp_path, capsys):
    run_dir = make_run(tmp_path, LOCAL + ["cluster.gpus_per_node=4"])
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "local-1.out").write_text("rank 0 step 1\n")
    (run_dir / "logs" / "rank1.out").write_text("rank 1 step 1\n")
    (run_dir / "logs" / "rank2.out").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert main(["logs", str(run_dir)]) == 0
    out = capsys.readouterr().out
    headers = [ln for ln in out.splitlines() if ln.startswith("==> ")]
    assert headers[0] == f"==> {run_dir / 'logs' / 'rank2.out'} <==" and len(headers) == 3
    assert main(["logs", "-n", "1", str(run_dir)]) == 0
    assert "Traceback" not in capsys.readouterr().out
    # -f on a running job: prints what the log gains, and returns by itself when the job ends
    proc = _holder(run_dir, seconds=3, write="tick")
    started = time.monotonic()
    assert main(["logs", "-f", str(run_dir), "--timeout", "60"]) == 0
    assert time.monotonic() - started < 30 and proc.wait(timeout=10) == 0
    assert "tick" in capsys.readouterr().out


def test_follow_of_a_run_never_started_says_so(tmp_path, capsys):
    """`vdkit logs -f` on a rendered run nobody submitted printed nothing and exited 0 at once."""
    run_dir = make_run(tmp_path, LOCAL)
    capsys.readouterr()
    assert main(["logs", "-f", str(run_dir), "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert "its state is NOT_STARTED, not a job running or queued" in err and f"vdkit status {run_dir}" in err
    assert "Traceback" not in err


def test_status_answers_every_target_and_reads_markers_before_the_scheduler(tmp_path, capsys, monkeypatch):
    """A finished Slurm run reads COMPLETED from its own `finished` when the controller is down (was UNREACHABLE);
    an unreadable target is one stderr line and the others are still answered (it stopped at the first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "squeue", "sacct", "sbatch"):
        (bin_dir / tool).write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\n"
                                    "exit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = make_run(tmp_path / "a", SLURM)
    (done / "job_id.txt").write_text("101\n102\n")
    (done / "finished").touch()
    local = make_run(tmp_path / "b", LOCAL)
    assert main(["status", str(tmp_path / "nowhere"), str(done), str(local)]) == 2
    captured = capsys.readouterr()
    rows = [ln.split("\t") for ln in captured.out.strip().splitlines()]
    assert [r[:3] for r in rows] == [[str(done), "102", "COMPLETED (its file finished says so)"],
                                     [str(local), "-", "NOT_STARTED"]]
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0] and "Traceback" not in captured.err


def test_status_watches_the_run_against_its_plan_and_names_a_straggler(tmp_path, capsys):
    run_dir = make_run(tmp_path, LOCAL + ["cluster.gpus_per_node=4"])
    beats = run_dir / "heartbeat"
    beats.mkdir()
    now = int(time.time())
    for rank, (steps, ms) in enumerate([(10, 200), (10, 210), (10, 190), (9, 900)]):
        (beats / f"rank{rank}").write_text(f"{now} {now} {steps} {ms} node{rank // 2} train\n")
    assert main(["status", str(run_dir)]) == 0
    line = capsys.readouterr().out
    assert "step 9/40, 0.205 s/step" in line and "ETA 6 s" in line
    assert "straggler: rank 3 on node1: 0.9 s/step vs its peers' 0.2" in line
    (beats / "rank3").write_text(f"{now} {now} 10 205 node1 train\n")
    assert main(["status", str(run_dir)]) == 0
    assert "straggler" not in capsys.readouterr().out


def test_status_says_the_plan_is_for_the_clusters_gpus_and_a_cpu_run_is_not_comparable(tmp_path):
    """A run planned for the XE9680's H100s that trains on CPU (the local emulated Slurm: the heartbeat's device is
    cpu): the line says which GPU the plan is for and that this run is CPU emulation, not a 100x miss."""
    run_dir = make_run(tmp_path, SLURM)
    lo, hi = json.loads((run_dir / "plan.json").read_text())["prediction"]["interval_s"]
    beats = run_dir / "heartbeat"
    beats.mkdir()
    now = int(time.time())
    (beats / "rank0").write_text(f"{now} {now} 9 54900 xe9680-1 train - cpu\n")
    line = status_watch(run_dir, "RUNNING")  # the run's part of the status line (no scheduler asked here)
    assert f"54.9 s/step (plan {lo:.3g}-{hi:.3g} on H100-SXM5-80GB; this run trains on CPU" in line
    (beats / "rank0").write_text(f"{now} {now} 9 500 xe9680-1 train - gpu\n")
    line = status_watch(run_dir, "RUNNING")
    assert f"0.5 s/step (plan {lo:.3g}-{hi:.3g} on H100-SXM5-80GB)" in line and "CPU" not in line


def test_status_of_a_cancelled_run_gives_no_eta(tmp_path, capsys):
    """`vdkit cancel` then `vdkit status`: 'CANCELLED (vdkit cancel at ...) ... step 6/60, 20.2 s/step, ETA 18 min' -
    an arrival time for a run that will not arrive. Ended runs keep their step and pace, without the ETA."""
    from vdkit.run.rundir import CANCELLED_FILE
    from vdkit.run.runs import CANCELLED

    run_dir = make_run(tmp_path, LOCAL + ["cluster.gpus_per_node=2"])
    beats = run_dir / "heartbeat"
    beats.mkdir()
    now = int(time.time())
    for rank in range(2):
        (beats / f"rank{rank}").write_text(f"{now} {now} 9 200 node0 train\n")
    assert main(["status", str(run_dir)]) == 0
    assert "ETA 6 s" in capsys.readouterr().out
    (run_dir / CANCELLED_FILE).write_text(json.dumps({"at": "2026-11-29T02:49:35Z", "launcher": "local", "jobs": [],
                                                      "continue": "vdkit run --resume x"}) + "\n")  # vdkit cancel's record
    assert main(["status", str(run_dir)]) == 0
    line = capsys.readouterr().out
    assert f"\t{CANCELLED} (vdkit cancel at" in line and "step 9/40, 0.2 s/step" in line and "ETA" not in line


def test_status_names_the_rank_whose_compute_runs_behind_though_step_times_are_equal(tmp_path, capsys):
    """Data parallelism: every rank leaves the gradient all-reduce together, so step times are equal; the
    heartbeat's compute field (time before the reduction) tells the slow rank (issue 36)."""
    run_dir = make_run(tmp_path, LOCAL + ["cluster.gpus_per_node=4"])
    beats = run_dir / "heartbeat"
    beats.mkdir()
    now = int(time.time())

    def beat(computes):
        for rank, ms in enumerate(computes):
            (beats / f"rank{rank}").write_text(f"{now} {now} 10 400 node{rank // 2} train {ms}\n")
        assert main(["status", str(run_dir)]) == 0
        return capsys.readouterr().out

    line = beat([100, 110, 320, 95])
    assert "straggler: rank 2 on node1: 0.32 s of compute per step (before the gradient reduction) " \
           "vs its peers' 0.1" in line and "rank 0" not in line and "rank 1" not in line
    assert "straggler" not in beat([100, 110, 130, 95])  # 30 % slower: inside the rule
    assert "straggler" not in beat([10, 11, 40, 9])  # 4x but 30 ms: a tiny step's jitter
    (beats / "rank3").write_text(f"{now} {now} 10 400 node1 train -\n")  # one rank reports none: step times
    assert "straggler" not in beat([100, 110, 320])


def test_fast_steps_heartbeats_written_apart_are_no_straggler(tmp_path, capsys):
    """Each rank writes its step count at its own moment (every HEARTBEAT_S): at 0.158 s a step, counts 4 apart
    are the beats' ages, not a rank behind (CI named healthy rank 0 '4 step(s) behind'); far more is one."""
    run_dir = make_run(tmp_path, LOCAL + ["cluster.gpus_per_node=2"])
    beats = run_dir / "heartbeat"
    beats.mkdir()
    now = int(time.time())

    def beat(steps):
        for rank, n in enumerate(steps):
            (beats / f"rank{rank}").write_text(f"{now} {now} {n} 158 node{rank} train 5\n")
        assert main(["status", str(run_dir)]) == 0
        return capsys.readouterr().out

    assert "straggler" not in beat([110, 114])
    assert "straggler: rank 0 on node0" in beat([60, 114])  # 54 steps: more than 2 s of beats explain


@pytest.mark.parametrize("value, peers, slow", [
    (0.32, [0.10, 0.11, 0.095], True),
    (0.28, [0.10, 0.18, 0.14, 0.06], False),  # noisy peers: 0.16 above their median is under 5 MADs (0.2)
    (0.16, [0.10], True), (0.14, [0.10], False), (0.3, [], False)])
def test_the_straggler_rule(value, peers, slow):
    from vdkit.run.runs import is_slow

    assert is_slow(value, peers) is slow


def test_runs_logs_cancel_on_a_kubernetes_run(tmp_path, capsys, monkeypatch, fake_kubectl):  # noqa: F811
    assert main(["submit", *TINY, vols(tmp_path), "--out", str(tmp_path / "runs")]) == 0
    run_dir = Path(capsys.readouterr().out.split("\t")[0])
    monkeypatch.setenv("FAKE_STATE", "RUNNING")
    assert main(["runs", str(tmp_path / "runs")]) == 0
    row = _lines(capsys)[0]
    assert row[1:4] == ["reference", "kubernetes", "RUNNING (RayJob RUNNING)"]
    assert row[5] == "default/RayJob/tiny-llama-lora-2n1g"
    assert main(["logs", str(run_dir)]) == 0
    assert fake_kubectl()[-1] == ["logs", "-n", "default", "-l", "job-name=tiny-llama-lora-2n1g", "--prefix",
                                  "--all-containers", "--tail=-1"]
    assert main(["cancel", str(run_dir)]) == 0
    assert fake_kubectl()[-1] == ["delete", "--ignore-not-found", "-f", str(run_dir / "rayjob.yaml")]
    line = _lines(capsys)[0]
    assert line[1:3] == ["CANCELLED", "default/RayJob/tiny-llama-lora-2n1g"]
    assert line[3] == f"continue: rm {run_dir / 'cancelled'} && kubectl apply -f {run_dir / 'rayjob.yaml'}"
    asked = len(fake_kubectl())
    assert main(["status", str(run_dir)]) == 0
    assert _lines(capsys)[0][2].startswith("CANCELLED (vdkit cancel at ")
    assert len(fake_kubectl()) == asked  # the marker answered: the API server was not asked


def test_cancel_on_the_local_slurm_stops_the_job_and_its_queued_successor(local_slurm, tmp_path, capsys):
    run_dir = make_run(tmp_path, SLURM)
    script = run_dir / "launch.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --time=5\nsleep 300\n")

    def sbatch(*extra):
        out = local_slurm.run("sbatch", "--parsable", *extra, str(script), check=True).stdout
        return out.strip().split(";")[0]

    first = sbatch()
    (run_dir / "job_id.txt").write_text(f"{first}\n")
    successor = sbatch("--hold", f"--dependency=afterany:{first}")  # what the batch shell queues at a stop
    assert main(["cancel", str(run_dir), "--settle", "30"]) == 0
    line = _lines(capsys)[0]
    assert line[1] == "CANCELLED" and set(line[2].split(", ")) == {first, successor}
    assert line[3] == f"continue: sbatch {script}"
    queued = local_slurm.run("squeue", "-h", "-o", "%i %T").stdout.split()
    assert first not in queued[::2] or "CANCELLED" in queued
    assert successor not in queued[::2] or "CANCELLED" in queued
    assert main(["status", str(run_dir)]) == 0
    assert _lines(capsys)[0][2].startswith("CANCELLED (vdkit cancel at ")
    assert main(["runs", str(tmp_path)]) == 0
    assert _lines(capsys)[0][3].startswith("CANCELLED")


def test_a_long_wait_shows_a_step_counter_and_an_eta(tmp_path):
    """`vdkit demo`'s `training 50 steps ...` sat silent for minutes: the ticker prints the step and the ETA."""
    import io

    from helpers import write_nemo1_log
    from vdkit.run.runs import Ticker

    run_dir = make_run(tmp_path, LOCAL)
    sink = io.StringIO()
    with Ticker(run_dir, 40, prefix="demo:   ", every_s=0.05, stream=sink) as ticker:
        write_nemo1_log(run_dir / "local-1.out", [0.5] * 10)
        deadline = time.monotonic() + 20
        while not ticker.shown and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sink.getvalue().splitlines()[0] == "demo:   step 10/40, 0.5 s/step, ETA 15 s"


def test_runs_under_a_root_holding_no_run_says_so(tmp_path, capsys):
    """`vdkit runs results/` on a mistyped (existing, empty) root printed nothing at all, exit 0: no list and no
    word on why. It still exits 0 (an empty list is an answer) and says on stderr where it looked."""
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    assert main(["runs", str(tmp_path / "empty")]) == 0
    out = capsys.readouterr()
    assert out.out == "" and f"no run directory (a directory holding recipe.yaml) under {tmp_path / 'empty'}" in out.err
