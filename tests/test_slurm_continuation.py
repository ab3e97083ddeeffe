"""Runs that outlive their allocation, on the local Slurm with the container stand-in (issue 17).

Job steps here see no Slurm client command (vdkit.slurm.localcluster's TaskProlog, as under pyxis),
so continuation can only come from the batch shell: the ranks stop cleanly before the limit and
exit 75, the batch shell submits the next allocation (``--dependency=afterany``), the next job
resumes from the checkpoint; a finished run never starts again.

- A real two-minute time limit (the reference engine): Slurm's own ``--signal=B:USR1@lead``, the batch shell's
  trap and the resubmission (engine-independent) over several allocations: every step 1..N done, none lost or
  repeated, and the losses equal an uninterrupted run's.
- ``scancel --batch --signal=USR1`` at a chosen step, for the reference, megatron and bridge (Megatron-Bridge's own
  loop) engines: what Slurm does at the limit (USR1 to the batch shell), on demand; what is engine-specific - each
  engine's ranks stopping at USR1 and resuming exactly - is proved the same way (steps 1..N once across two
  allocations, losses equal to an uninterrupted run's) without waiting for a limit. Steps and losses are read by
  the kit's own parser (:mod:`vdkit.validation.logs` and its readers), which knows each engine's log lines and
  TensorBoard tags.
- ``sbatch launch.sbatch`` twice: the second job stops at the run dir's lock; `vdkit status` names
  the holder, and finds a plainly sbatch'ed job.
- A ``%`` in the out dir reaches neither Slurm's pattern expansion nor a lost log (the reference USR1 run's out dir,
  both allocations).

Each test prints its figures for the note.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.slurm import submit as sub

CELL = ["engine=reference", "model=tiny_llama", "data=synthetic", "method=lora", "cluster.gpus_per_node=1",
        "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1", "train.seq_length=128",
        "method.warmup_steps=0", "train.global_batch_size=4"]
MEGATRON_CELL = ["engine=megatron", "engine.container_image=null", "model=tiny_llama", "model.num_layers=4",
                 "data=synthetic", "method=sft", "cluster.nodes=2", "cluster.gpus_per_node=1", "parallelism.pp=2",
                 "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1", "train.seq_length=128",
                 "train.micro_batch_size=2", "train.global_batch_size=4", "method.warmup_steps=0", "method.lr=1e-3"]
# The time-limit cell: heavier than CELL so that ~200 s of steps stays a few thousand even on an idle
# machine (tiny CELL steps take ~12 ms there: the step cap, not the limit, would end the run in one allocation).
TIME_LIMIT_CELL = [*(o for o in CELL if not o.startswith(("train.seq_length=", "train.global_batch_size="))),
                   "model.hidden_size=256", "model.ffn_hidden_size=688", "model.num_layers=4",
                   "train.seq_length=256", "train.global_batch_size=8"]
# Megatron-Bridge pretraining on its mock data, one rank. Its resumed losses equal the uninterrupted run's only
# with the job's GPTDataset loss-mask cache fix (job.LOSS_MASK_CACHE_BUG: megatron-core gpt_dataset.py:272 wrote
# the first sample's pad positions into the cached mask, so a resumed process masked other positions; found by
# this file's resume against an uninterrupted run).
BRIDGE_CELL = ["engine=bridge", "engine.container_image=null", "model=tiny_llama", "model.num_layers=4",
               "model.hidden_size=256", "model.ffn_hidden_size=688", "method=pretrain", "data=synthetic",
               "cluster.nodes=1", "cluster.gpus_per_node=1", "parallelism.distributed_optimizer=false",
               "cluster.mpi=none", "cluster.socket_ifname=lo", "cluster.cpus_per_task=1", "train.seq_length=256",
               "train.micro_batch_size=2", "train.global_batch_size=8", "method.warmup_steps=0", "method.lr=1e-3"]
# Seconds of calibrated training for the real two-minute limit: an allocation trains for at most ~75 s (the
# budget ends 90 s in, start-up included), so at least two allocations, with margin for a machine faster than
# at calibration (1.7x). CI's budget: each allocation beyond two costs ~100 s.
TIME_LIMIT_WORK_S = 130
# USR1 to the batch shell (what Slurm's --signal=B:USR1@lead does at the limit) once the job has logged this
# step: {engine: (cell, train.max_steps, the step)}. The steps left after it outlast the stop's latency (the poll,
# the batch shell's trap, the step in flight: megatron 0.04 s, bridge 0.7 s per step at load 10) so the
# stop always comes mid-run; the signal steps are off multiples of 10 (Bridge 0.3.1 at PP2 resumed exactly at 10
# and 20 only: a stop at a round step can hide a resume bug).
# The reference run's out dir holds Slurm's filename patterns (%j, %x) and a lone %: the kit escapes them (%%) so
# neither allocation's log goes elsewhere (engine-independent: the batch script's directives).
PERCENT_OUT = "100%_done %j %x"
USR1_RUNS = {"reference": (CELL, 120, 11), "megatron": (MEGATRON_CELL, 240, 23), "bridge": (BRIDGE_CELL, 40, 13)}
STOPPED_LINE = "vdkit: stopped before the time limit; job "  # the batch shell's, for every engine


def _submit(out_dir, capsys, *overrides) -> tuple:
    assert main(["submit", *overrides, "--out", str(out_dir)]) == 0
    run_dir, job_id = capsys.readouterr().out.strip().splitlines()[-1].split("\t")[:2]
    return Path(run_dir), job_id


def _log(run_dir, job_id) -> str:
    path = Path(run_dir) / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _steps(run_dir, job_id) -> list:
    """The 1-based steps job ``job_id`` trained, in order, as the kit's log parser reads its output (the
    NeMo-style bars of the reference / megatron engines, Bridge's Megatron ``iteration N/M`` lines)."""
    from vdkit.validation.text_log import parse_text_log

    path = Path(run_dir) / f"slurm-{job_id}.out"
    if not path.exists():
        return []
    log = parse_text_log(path)
    assert not [w for w in log.warnings if "restarts inside the file" in w], log.warnings  # a step done twice
    return [r.step + 1 for r in log.steps]


def wait_run(run_dir: Path, timeout: float) -> list:
    """Wait until the run's latest job has ended and no successor is pending; the run's job ids."""
    deadline = time.monotonic() + timeout
    while True:
        ids = sub.job_ids(run_dir)
        if ids and sub.job_state(ids[-1]).done:
            time.sleep(1)
            if sub.job_ids(run_dir) == ids:  # no successor was submitted meanwhile
                return ids
        assert time.monotonic() < deadline, (ids, [_log(run_dir, j)[-1500:] for j in ids[-2:]])
        time.sleep(1)


def check_unbroken(run_dir: Path, max_steps: int) -> dict:
    """Across the run's jobs: steps 1..max_steps once each; each job resumed where the last stopped."""
    ids = sub.job_ids(run_dir)
    by_job = [_steps(run_dir, j) for j in ids]
    steps = [s for done in by_job for s in done]
    assert steps == list(range(1, max_steps + 1)), [s for i, s in enumerate(steps) if i and s != steps[i - 1] + 1]
    trained = [(j, done) for j, done in zip(ids, by_job) if done]
    # Each allocation but the last stopped cleanly (the batch shell submitted the next) and the next one
    # resumed right after its last step: from the stop's own checkpoint.
    stops = [done[-1] for _, done in trained[:-1]]
    resumes = [done[0] - 1 for _, done in trained[1:]]
    assert resumes == stops, (stops, resumes)
    assert [j for j, _ in trained[:-1]] == [j for j in ids if STOPPED_LINE in _log(run_dir, j)]
    assert (run_dir / "finished").is_file() and sub.job_state(ids[-1]).state == "COMPLETED"
    assert not [p for p in (run_dir / "checkpoints").rglob("*") if ".tmp" in p.name]
    errors = "".join((run_dir / f"slurm-{j}.err").read_text(errors="replace") for j in ids
                     if (run_dir / f"slurm-{j}.err").exists())
    assert "Traceback" not in errors and "scontrol" not in errors, errors[-2000:]
    return {"jobs": ids, "allocations": len(trained), "stops": stops, "restarts": len(resumes)}


def tb_losses(run_dir: Path) -> dict:
    """0-based step -> loss from the run's TensorBoard events, as the kit's parser reads them (NeMo's
    reduced_train_loss or Megatron's ``lm loss``; a later segment's value wins)."""
    from vdkit.run.rundir import LOG_DIR
    from vdkit.validation.tensorboard_events import parse_tensorboard

    return {r.step: r.loss for r in parse_tensorboard(run_dir / LOG_DIR).steps if r.loss is not None}


def start_local_run(overrides, out_dir: Path) -> subprocess.Popen:
    """The uninterrupted run of the same recipe on local processes (`vdkit run`), started; its output
    goes to files (a pipe nobody reads while the Slurm job runs would fill and stall it)."""
    out_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "vdkit", "run", *overrides, "--out", str(out_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    with open(out_dir / "vdkit-run.out", "wb") as out, open(out_dir / "vdkit-run.err", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    proc.out_dir = out_dir
    return proc


def finish_local_run(proc: subprocess.Popen) -> Path:
    proc.wait(timeout=1200)
    out, err = ((proc.out_dir / f"vdkit-run.{x}").read_text(errors="replace") for x in ("out", "err"))
    assert proc.returncode == 0, err[-3000:]
    return Path(out.strip().splitlines()[-1])


def local_run(overrides, out_dir: Path) -> Path:
    return finish_local_run(start_local_run(overrides, out_dir))


def seconds_per_step(overrides, out_dir: Path) -> float:
    """This machine's speed now for the cell (a 20-step local run; the first three steps excluded)."""
    from vdkit.validation.logs import read_source

    run_dir = local_run([*overrides, "train.max_steps=20"], out_dir)
    timings = read_source(run_dir).timings[3:]
    return sum(timings) / len(timings)


def local_overrides(cell):
    """The cell on local processes: the same world size and layout, cluster=local."""
    nodes = next((o.split("=")[1] for o in cell if o.startswith("cluster.nodes=")), "1")
    per_node = next(o.split("=")[1] for o in cell if o.startswith("cluster.gpus_per_node="))
    keep = [o for o in cell if not o.startswith("cluster.")]
    return [*keep, "cluster=local", f"cluster.gpus_per_node={int(nodes) * int(per_node)}"]


def check_losses(run_dir: Path, whole: Path, figures: dict, max_steps: int) -> list:
    """The run's TensorBoard losses against the uninterrupted run's: every step once, the same until the first
    stop; puts the figures line in ``figures["losses"]`` and returns the (1-based step, loss, uninterrupted loss)
    that differ after it (the caller prints the figures first, then asserts none)."""
    got, want = tb_losses(run_dir), tb_losses(whole)
    assert sorted(got) == sorted(want) == list(range(max_steps))  # none lost, none twice
    first = figures["stops"][0]  # until the first stop: the same arithmetic as the uninterrupted run
    assert [got[s] for s in range(first)] == pytest.approx([want[s] for s in range(first)], rel=1e-5, abs=1e-6)
    off = [s for s in sorted(want) if got[s] != pytest.approx(want[s], rel=1e-5, abs=1e-6)]
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in sorted(want))
    figures["losses"] = (f"final loss {got[max_steps - 1]:.6f} vs uninterrupted {want[max_steps - 1]:.6f} "
                         f"({len(off)} of {max_steps} steps' losses differ, at most {worst:.1e} relative)")
    return [(s + 1, got[s], want[s]) for s in off]


def check_finished_run_not_restarted(run_dir: Path) -> None:
    """A job submitted again into the finished run does nothing."""
    again = sub.submit_run(run_dir).job_id
    assert sub.wait(again, timeout=120, poll_s=1).state == "COMPLETED"
    assert "has finished" in _log(run_dir, again) and not _steps(run_dir, again)


def skip_unless_installed(engine: str) -> None:
    """Skip where the engine's stack (megatron-core; Megatron-Bridge) is not installed."""
    if engine != "reference":
        pytest.importorskip("megatron.core")
    if engine == "bridge" and importlib.util.find_spec("megatron.bridge") is None:
        pytest.skip("megatron-bridge not installed (extra [bridge])")


def test_two_minute_time_limit_finishes_every_step_across_allocations(local_slurm, tmp_path, capsys, monkeypatch):
    """A real 2-minute limit (stop lead 30 s): Slurm's USR1 reaches the batch shell 30-90 s in (it may come
    up to 60 s early), the budget ends at 90 s; the ranks stop, the batch shell submits the next
    allocation; N steps in all, 0 lost, losses equal to an uninterrupted run's (run alongside). Slurm's signal
    at the limit, the trap and the resubmission are the batch shell's, the same for every engine: one engine
    (reference) proves them here; each engine's own stop and resume at that USR1 is the USR1 test's, below."""
    local = local_overrides(TIME_LIMIT_CELL)
    # The job's ranks (sbatch exports this environment) use as many threads as the local ranks: the
    # same arithmetic, so the same losses to the last bit (more threads sum in another order).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    per_step = seconds_per_step(local, tmp_path / "calibrate")
    # TIME_LIMIT_WORK_S of calibrated training (margin for a machine whose load drops after calibration);
    # bounded above.
    max_steps = min(8000, max(60, int(TIME_LIMIT_WORK_S / per_step)))
    assert max_steps * per_step > 0.75 * TIME_LIMIT_WORK_S, \
        f"{per_step:.3f} s/step: the cell is too light for a 2-minute limit test"
    whole_proc = start_local_run([*local, f"train.max_steps={max_steps}"], tmp_path / "whole")
    t0 = time.monotonic()
    # A 2-minute allocation holds start-up, a step and the stop's lead only with this machine's start-up
    # (a few seconds for the reference ranks), not the default 120 s of a real cluster's container and
    # weights: the door refuses a limit no step fits in.
    run_dir, _ = _submit(tmp_path / "runs", capsys, *TIME_LIMIT_CELL, f"train.max_steps={max_steps}",
                         "cluster.time_limit_min=2", "cluster.startup_s=30")
    wait_run(run_dir, timeout=1800)
    whole = finish_local_run(whole_proc)
    figures = check_unbroken(run_dir, max_steps)
    assert figures["allocations"] >= 2 and figures["restarts"] == figures["allocations"] - 1
    off = check_losses(run_dir, whole, figures, max_steps)
    text = (run_dir / "launch.sbatch").read_text()
    lead = re.search(r"--signal=B:USR1@(\d+)", text).group(1)
    print(f"\nreference time-limit figures: --time=2 min, stop lead {lead} s, {per_step:.3f} s/step calibrated, "
          f"{max_steps} steps done 1..{max_steps} (0 lost, 0 repeated) in {figures['allocations']} allocations "
          f"(jobs {', '.join(figures['jobs'])}), {figures['restarts']} restarts, stopped after steps "
          f"{figures['stops']}; {figures['losses']}; {time.monotonic() - t0:.0f} s to finish")
    assert not off, off[:5]  # (a finished run is never started again: the batch shell's, in the USR1 test)


@pytest.mark.parametrize("engine", list(USR1_RUNS))
def test_usr1_to_the_batch_shell_stops_the_step_and_the_next_job_finishes(engine, local_slurm, tmp_path, capsys,
                                                                         monkeypatch):
    """USR1 to the batch shell once step k is logged (``scancel --batch --signal=USR1``: what Slurm's
    ``--signal=B:USR1@lead`` does at the limit): the engine's ranks stop after a step >= k, the batch shell
    submits the next allocation, which resumes there and finishes: N steps in all, 0 lost, 0 repeated, losses
    equal to an uninterrupted run's (run alongside); the finished run is never started again."""
    skip_unless_installed(engine)
    cell, max_steps, signal_step = USR1_RUNS[engine]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the same arithmetic as the local ranks (the time-limit test's)
    whole_proc = start_local_run([*local_overrides(cell), f"train.max_steps={max_steps}"], tmp_path / "whole")
    out = tmp_path / (PERCENT_OUT if engine == "reference" else "runs")
    run_dir, job_id = _submit(out, capsys, *cell, f"train.max_steps={max_steps}", "cluster.time_limit_min=10")
    if engine == "reference":  # escaped in the script's directives; check_unbroken reads both allocations' logs
        assert run_dir.parent == out and "%%" in (run_dir / "launch.sbatch").read_text()
    t0 = time.monotonic()
    deadline = t0 + 300
    while not (_steps(run_dir, job_id) and _steps(run_dir, job_id)[-1] >= signal_step):
        assert time.monotonic() < deadline and not sub.job_state(job_id).done, _log(run_dir, job_id)[-2000:]
        time.sleep(0.2)
    signalled_at = _steps(run_dir, job_id)[-1]
    # What Slurm's --signal=B:USR1@lead does: the batch shell gets it and passes it to the step.
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    wait_run(run_dir, timeout=600)
    whole = finish_local_run(whole_proc)
    figures = check_unbroken(run_dir, max_steps)
    assert figures["allocations"] == 2 and signalled_at <= figures["stops"][0] < max_steps
    assert "USR1 from Slurm" in (run_dir / f"slurm-{job_id}.err").read_text()
    off = check_losses(run_dir, whole, figures, max_steps)
    print(f"\n{engine} USR1 figures: job {job_id}, USR1 to the batch shell after step {signalled_at}, stopped after "
          f"step {figures['stops'][0]}, next job {figures['jobs'][1]} finished 1..{max_steps} unbroken; "
          f"{figures['losses']}; {time.monotonic() - t0:.0f} s")
    check_finished_run_not_restarted(run_dir)
    assert not off, off[:5]
    if engine == "bridge":  # every allocation's rank fixed megatron-core's loss-mask cache, once (job.py)
        assert [_log(run_dir, j).count("patched GPTDataset's loss-mask cache") for j in figures["jobs"]
                if _steps(run_dir, j)] == [1] * figures["allocations"]


def test_a_second_job_in_a_run_dir_is_refused_and_status_names_the_holder(local_slurm, tmp_path, capsys):
    assert main(["render", *CELL, "train.max_steps=2000", "cluster.time_limit_min=10", "--out", str(tmp_path)]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    # The README's cluster path: plain sbatch, no `vdkit submit` (no job_id.txt until the job starts).
    first = subprocess.run(["sbatch", "--parsable", str(run_dir / "launch.sbatch")], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert main(["status", str(run_dir)]) == 0  # found in squeue (pending) or through run.lock (running)
    assert f"\t{first}\t" in capsys.readouterr().out
    try:
        deadline = time.monotonic() + 120
        # running, holding the lock, and recorded in job_id.txt (the job records itself as it starts)
        while (sub.job_state(first).state != "RUNNING" or not (run_dir / "run.lock").exists()
               or first not in sub.job_ids(run_dir)):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        second = sub.submit_run(run_dir).job_id  # `sbatch launch.sbatch` again, same directory
        st = sub.wait(second, timeout=120, poll_s=1)
        err = (run_dir / f"slurm-{second}.err").read_text()
        assert (st.state, st.exit_code) == ("FAILED", "1:0")
        assert f"held by slurm {first}; job {second} did not start" in err and len(err.strip().splitlines()) == 1
        assert sub.job_ids(run_dir)[0] == first  # the plainly submitted job recorded itself
        assert main(["status", str(run_dir)]) == 0
        line = capsys.readouterr().out
        assert f"held by slurm job {first}" in line, line
    finally:
        subprocess.run(["scancel", first], check=True)  # never leave the nodes busy for the next test
    assert sub.wait(first, timeout=120, poll_s=1).done
    assert _steps(run_dir, second) == []  # the refused job trained nothing


def test_job_steps_see_no_slurm_client_the_batch_shell_does(local_slurm, tmp_path):
    script = tmp_path / "probe.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=2 --time=1\n"
                      f"#SBATCH --output={tmp_path}/probe-%j.out\n"
                      'echo "batch: $(command -v scontrol) $(command -v sbatch)"\n'
                      "srun bash -c 'echo \"task $SLURM_PROCID: $(command -v scontrol || echo none) "
                      "$(command -v srun || echo none) $(command -v python3 || echo nopython)\"'\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert sub.wait(job, timeout=120, poll_s=1).state == "COMPLETED"
    out = (tmp_path / f"probe-{job}.out").read_text()
    assert re.search(r"^batch: \S*/scontrol \S*/sbatch$", out, re.M), out
    assert sorted(re.findall(r"^task \d: none none (\S+)$", out, re.M)) and len(re.findall("none none", out)) == 2
    assert "nopython" not in out
