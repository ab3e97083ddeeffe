"""The batch shell's recovery functions (vdkit.slurm.recovery), run by bash from a real render with a
stand-in sbatch: the record a failed step leaves, the restart bound, the exclusion, the back-off."""
from __future__ import annotations

import json
import os
import re
import subprocess
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
    return text[text.index("# Recovery"):text.index("# The step runs in the background")]


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
    assert "vdkit_watchdog & WATCH_PID=$!" in text and "export VDKIT_COLLECTIVE_TIMEOUT_S=" in text
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
    from vdkit.faults import summary

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
    text = (rendered() / "launch.sbatch").read_text()  # the production defaults (vdkit.faults)
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
