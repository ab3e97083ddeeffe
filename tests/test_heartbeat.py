"""A rank's heartbeat file (vdkit.recipes.common.heartbeat) and the limits the watchdog applies (vdkit.run.faults)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from vdkit.run import faults
from vdkit.recipes.common.heartbeat import Heartbeat


def _fields(path):
    beat, prog, step, ms, node, phase = path.read_text().split()[:6]  # the 7th, compute ms: the test below
    return int(beat), int(prog), int(step), int(ms), node, phase


def test_the_beat_carries_the_median_compute_time_of_the_last_steps(tmp_path):
    hb = Heartbeat(tmp_path, 1)
    hb.write()
    assert (tmp_path / "rank1").read_text().split()[6] == "-"  # no compute time reported yet
    for step, compute in enumerate([0.1, 0.1, 0.9, 0.1, 0.3, 0.3, 0.3], start=1):  # one hiccup at step 3
        hb.progress(step, 1.0, compute)
    hb.write()
    assert (tmp_path / "rank1").read_text().split()[2:7] == ["7", "1000", hb.node, "train", "300"]


def test_the_beat_says_what_torch_trains_on(tmp_path):
    """The 8th field: gpu or cpu as this process's torch sees it (`vdkit status` tells a CPU-emulated run by it)."""
    import torch

    hb = Heartbeat(tmp_path, 0)
    hb.write()
    assert (tmp_path / "rank0").read_text().split()[7] == ("gpu" if torch.cuda.is_available() else "cpu")


def test_the_thread_beats_and_steps_are_progress(tmp_path):
    hb = Heartbeat.from_env(3, {faults.HEARTBEAT_ENV: str(tmp_path), "SLURMD_NODENAME": "xe9680-4"})
    hb.interval = 0.1
    try:
        beat, prog, step, ms, node, phase = _fields(tmp_path / "rank3")
        assert (step, node, phase) == (0, "xe9680-4", "start")
        hb.progress(7, 0.25)
        hb.saving(True)
        assert _fields(tmp_path / "rank3")[2:] == (7, 250, "xe9680-4", "save")
        hb.saving(False)
        assert _fields(tmp_path / "rank3")[5] == "train"
    finally:
        hb.stop()
    assert Heartbeat.from_env(0, {}) is None  # no launcher asked: no file, no thread


def test_a_stopped_thread_leaves_an_ageing_beat(tmp_path):
    hb = Heartbeat(tmp_path, 0, interval=0.05).start()
    time.sleep(0.3)
    hb.stop()
    time.sleep(1.2)
    assert int(time.time()) - _fields(tmp_path / "rank0")[0] >= 1


def test_limits_come_from_the_plan_and_exceed_the_watchdog():
    lim = faults.limits(startup_s=120, step_s=9.0, checkpoint_write_s=40)
    assert lim.hang_s == 90 and lim.save_grace_s == 160 and lim.startup_grace_s == 400
    assert lim.collective_timeout_s == 460 < 1800  # torch's default is 30 minutes
    tiny = faults.limits(startup_s=30, step_s=0.05, checkpoint_write_s=0.01)
    assert tiny.hang_s == faults.HANG_MIN_S and tiny.collective_timeout_s > tiny.startup_grace_s
    assert (tiny.dead_after_s, tiny.kill_grace_s, tiny.restart_delay_s) == (
        faults.DEAD_AFTER_S, faults.KILL_GRACE_S, faults.RESTART_DELAY_S)
    short = faults.limits(30, 0.05, 0.01, dead_after_s=6, kill_grace_s=2.5, restart_delay_s=5)
    assert (short.dead_after_s, short.kill_grace_s, short.restart_delay_s) == (6, 3, 5)
    assert faults.collective_timeout_s({faults.COLLECTIVE_TIMEOUT_ENV: "321"}) == 321
    assert faults.collective_timeout_s({faults.COLLECTIVE_TIMEOUT_ENV: "x"}) == faults.DEFAULT_COLLECTIVE_TIMEOUT_S


def test_a_process_that_leaves_python_says_exit_a_killed_one_cannot(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    code = ("import sys, time; from vdkit.recipes.common.heartbeat import Heartbeat; "
            f"Heartbeat({str(tmp_path)!r}, int(sys.argv[1]), interval=0.1).start(); "
            "time.sleep(0.3); sys.exit(1) if sys.argv[1] == '0' else time.sleep(60)")
    failed = subprocess.run([sys.executable, "-c", code, "0"], timeout=60)
    killed = subprocess.Popen([sys.executable, "-c", code, "1"])
    time.sleep(3)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert failed.returncode == 1 and _fields(tmp_path / "rank0")[5] == "exit"
    assert _fields(tmp_path / "rank1")[5] == "start"


def test_the_standalone_copy_runs_without_vdkit_and_writes_the_same_line(tmp_path):
    """The run dir's vdkit_heartbeat.py (Bridge's and NeMo's ranks in NVIDIA's image, no vdkit there) imports
    with the standard library alone and beats in the format the watchdog reads."""
    import subprocess
    import sys

    from vdkit.recipes.common.heartbeat import STANDALONE_NAME, standalone_source

    (tmp_path / f"{STANDALONE_NAME}.py").write_text(standalone_source())
    code = (f"import sys; sys.modules['vdkit'] = None; sys.path.insert(0, '')\nimport {STANDALONE_NAME} as h\n"
            "b = h.Heartbeat.from_env(2); b.progress(5, 0.5); b.write(); b.stop()")
    env = {"PATH": "/usr/bin:/bin", faults.HEARTBEAT_ENV: str(tmp_path / "hb"), "SLURMD_NODENAME": "xe9680-3"}
    res = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _fields(tmp_path / "hb" / "rank2")[2:] == (5, 500, "xe9680-3", "exit")  # atexit: 'exit'


@pytest.mark.parametrize("engine", ["reference", "megatron"])
def test_a_rank_that_ends_with_os_exit_says_exit(engine, tmp_path):
    # The engines' ranks leave with os._exit (no C++ teardown), which skips atexit: the heartbeat must say
    # 'exit' all the same, or a peer slower to leave has the watchdog kill the step and blame this rank.
    code = (f"import runpy, vdkit.recipes.{engine}.train as t\n"
            "from vdkit.recipes.common.heartbeat import Heartbeat\n"
            "def main():\n    Heartbeat.from_env(0)\n    return 75\n"
            f"t.main = main\nrunpy.run_module('vdkit.recipes.{engine}', run_name='__main__')\n")
    env = {**os.environ, faults.HEARTBEAT_ENV: str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 75, res.stderr[-1500:]
    assert (tmp_path / "rank0").read_text().split()[5] == "exit"
