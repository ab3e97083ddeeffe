"""`vdkit validate` and `vdkit report` end to end through vdkit.cli.main, on run directories made here."""
from __future__ import annotations

import csv
import json

import pytest

from helpers import TINY, make_run, series, write_nemo1_log
from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.run.rundir import load_recipe
from vdkit.planner.plan import make_plan


# ----------------------------------------------------------------------------- validate
def test_validate_text_and_json(tmp_path, capsys):
    run = make_run(tmp_path, TINY + ["train.target_steps=400"], series(0.5))
    assert main(["validate", str(run)]) == 0
    out = capsys.readouterr().out
    assert "warm-up" in out and "400 steps" in out and "excludes      model load, data load, validation" in out
    assert main(["validate", str(run), "--json", "--target-steps", "1000"]) == 0
    obj = json.loads(capsys.readouterr().out)
    for key in ("source", "steps_measured", "warmup_steps", "step_time_mean_s", "step_time_median_s", "fluctuating",
                "target_steps", "extrapolated_minutes", "interval_minutes"):
        assert key in obj
    assert obj["steps_measured"] == 50 and obj["target_steps"] == 1000 and obj["warmup_steps"] >= 5
    assert obj["step_time_mean_s"] == pytest.approx(0.5, rel=0.02)
    lo, hi = obj["interval_minutes"]
    assert lo <= obj["extrapolated_minutes"] <= hi


def test_validate_default_target_from_recipe_and_log_file(tmp_path, capsys):
    run = make_run(tmp_path, TINY + ["train.target_steps=300"], series(1.0))
    assert main(["validate", str(run / "slurm-1.out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target_steps"] == 300
    loose = write_nemo1_log(tmp_path / "loose.out", series(1.0))
    assert main(["validate", str(loose), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target_steps"] == 1000


def test_validate_tensorboard_dir_and_overheads(tmp_path, capsys):
    run = make_run(tmp_path, TINY, series(2.0, seed=4), kind="tb")
    assert main(["validate", str(run / "logs"), "--json", "--target-steps", "1000"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["validate", str(run), "--json", "--target-steps", "1000", "--val-every", "250", "--val-seconds",
                 "60", "--checkpoint-seconds", "120"]) == 0
    extra = json.loads(capsys.readouterr().out)
    from vdkit.validation.run_dir import checkpoint_every

    every = checkpoint_every(run)  # checkpoints as often as the run does (the plan's cadence or the fallback)
    ckpts = 1000 // every if every else 1
    assert extra["extrapolated_minutes"] == pytest.approx(plain["extrapolated_minutes"] + (4 * 60 + ckpts * 120) / 60)
    assert "validation" not in extra["excludes"]


def test_validate_errors_are_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.out"
    empty.write_text("no progress here\n")
    assert main(["validate", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "empty.out" in err and "Traceback" not in err
    assert main(["validate", str(tmp_path / "missing")]) == 2
    assert main(["validate", str(empty), "--target-steps", "0"]) == 2
    assert main(["validate", str(empty), "--val-every", "10"]) == 2
    # Several sources: the good ones print, the bad one is one line on stderr, exit 2.
    good = write_nemo1_log(tmp_path / "good.out", series(1.0))
    capsys.readouterr()
    assert main(["validate", str(good), str(empty), "--json"]) == 2
    cap = capsys.readouterr()
    assert len(cap.out.strip().splitlines()) == 1 and "empty.out" in cap.err


def test_validate_flags_a_cpu_run_by_the_cpu_rule_as_report_does(tmp_path, capsys):
    """One rule for validate, report and the plots: a CPU run's spread (CV between the accelerator's 10 % and
    CPU_FLUCTUATION_CV) is not flagged; over it, it is; a GPU run and a log with no run directory keep 10 %."""
    from vdkit.validation.extrapolate import CPU_FLUCTUATION_CV, FLUCTUATION_CV
    from vdkit.validation.run_dir import collect_run

    noisy = series(0.1, cv=0.18, seed=3)  # the demo's spread on shared cores
    cpu = make_run(tmp_path / "cpu", TINY, noisy)
    assert main(["validate", str(cpu), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert FLUCTUATION_CV < obj["step_time_cv"] < CPU_FLUCTUATION_CV and obj["fluctuating"] is False
    assert main(["validate", str(cpu)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "fluctuating" in ln)
    assert "YES" not in line and "spread of a CPU run" in line and f"{CPU_FLUCTUATION_CV:.0%}" in line
    # report reads the same run directory to the same estimate (its cell copies the flag; no second rule)
    assert collect_run(cpu).estimate.fluctuating is False
    # over the CPU threshold a CPU run is flagged, with the threshold it crossed
    stalled = make_run(tmp_path / "stalled", TINY, [12.0] + [0.05, 0.25] * 25)
    assert main(["validate", str(stalled), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["step_time_cv"] > CPU_FLUCTUATION_CV and obj["fluctuating"] is True
    assert f"{CPU_FLUCTUATION_CV:.0%}" in obj["fluctuation_reason"]
    # no run directory (hardware unknown) and a GPU run: the accelerator rule
    loose = write_nemo1_log(tmp_path / "loose.out", noisy)
    gpu = make_run(tmp_path / "gpu", ["model=llama2_7b", "method=lora"], noisy)
    for src in (loose, gpu):
        assert main(["validate", str(src), "--json"]) == 0
        obj = json.loads(capsys.readouterr().out)
        assert obj["fluctuating"] is True and f"> {FLUCTUATION_CV:.0%}" in obj["fluctuation_reason"]


# ----------------------------------------------------------------------------- report
def test_report_table9_with_published_and_infeasible(tmp_path, capsys):
    runs = tmp_path / "runs"
    lora = make_run(runs, ["model=llama2_7b", "method=lora", "cluster.nodes=1", "cluster.gpus_per_node=4"],
                    series(6.0, seed=1))  # 6 s x 1000 ~ 100 min, near the published 102
    sft = make_run(runs, ["model=llama2_7b", "method=sft", "cluster.nodes=1", "cluster.gpus_per_node=4"],
                   series(22.8, seed=2, cv=0.2))  # fluctuating, as the guide saw
    infeasible = make_run(runs, ["model=llama2_70b", "method=sft", "cluster.nodes=1"])  # no logs: cannot fit
    out = tmp_path / "report"
    assert main(["report", str(lora), str(sft), str(infeasible), "--table", "table9", "--out", str(out)]) == 0
    md = capsys.readouterr().out
    written = (out / "table9.md").read_text()
    assert written.startswith(md.strip()) and "(table9_scaling.png)" in written  # + the plots, linked
    assert "| Llama 2 7B | 4 |" in md and "/ 102 (" in md and "[e]" in md and "[f]" in md
    assert "| Llama 2 70B | 8 |" in md and "N/A / N/A" in md
    data = json.loads((out / "table9.json").read_text())
    cells = {(c["model"], c["gpus"], c["method"]): c for c in data["cells"]}
    c = cells[("llama2_7b", 4, "lora")]
    assert c["status"] == "extrapolated" and c["published_minutes"] == 102
    assert c["ratio"] == pytest.approx(c["minutes"] / 102, rel=1e-2) and 0.9 < c["ratio"] < 1.1
    assert cells[("llama2_7b", 4, "sft")]["fluctuating"] is True
    assert cells[("llama2_70b", 8, "sft")]["status"] == "infeasible"
    assert "GB per GPU" in cells[("llama2_70b", 8, "sft")]["reason"]
    assert cells[("llama2_7b", 16, "lora")]["status"] == "not run"  # published rows of a model that ran
    assert ("llama2_13b", 4, "lora") not in cells  # models that did not run stay out
    rows = list(csv.DictReader((out / "table9.csv").open()))
    assert len(rows) == len(data["cells"]) and {r["status"] for r in rows} >= {"extrapolated", "infeasible"}
    for png in ("table9_scaling.png", f"trace_{lora.name}.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_tiny_model_rows_with_na_published(tmp_path, capsys):
    run = make_run(tmp_path / "runs", TINY, series(0.2, seed=5))
    out = tmp_path / "rep"
    assert main(["report", str(run), "--out", str(out), "--no-plots"]) == 0
    md = capsys.readouterr().out
    assert "| tiny_llama | 1 |" in md and "/ n/p" in md and "/ N/A" not in md  # no figure is not the guide's N/A
    data = json.loads((out / "table9.json").read_text())
    assert [c["method"] for c in data["cells"]] == ["lora", "ptuning", "sft"]
    assert data["cells"][0]["published_minutes"] is None and data["cells"][0]["minutes"] > 0
    assert not list(out.glob("*.png"))


def test_report_training_table(tmp_path, capsys):
    run = make_run(tmp_path / "runs", ["model=llama2_7b", "method=pretrain", "data=pile", "cluster.nodes=1",
                                       "parallelism.tp=2", "parallelism.pp=1", "train.max_steps=40",
                                       "train.target_steps=40"], series(5.0, n=40))
    out = tmp_path / "rep"
    assert main(["report", str(run), "--table", "training", "--out", str(out), "--no-plots"]) == 0
    md = capsys.readouterr().out
    assert "time for 40 steps" in md and "/ 3.32 (" in md and "/ 100 (" in md
    data = json.loads((out / "training.json").read_text())
    cell = [c for c in data["cells"] if c["model"] == "llama2_7b"][0]
    plan_ckpt = make_plan(compose(["model=llama2_7b", "method=pretrain", "data=pile",
                                   "parallelism.tp=2"])).checkpoint_gb
    assert cell["status"] == "measured" and cell["checkpoint_gb"] == pytest.approx(plan_ckpt, abs=0.01)
    assert cell["published_checkpoint_gb"] == 100
    assert cell["minutes"] == pytest.approx(sum(series(5.0, n=40)) / 60, rel=1e-3)


def test_report_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    (tmp_path / "plain").mkdir()
    assert main(["report", str(tmp_path / "plain")]) == 2
    assert "recipe.yaml" in capsys.readouterr().err


def _nonfinite_log(path, fmt: str, bad: str):
    """50 steps of ~0.5 s with steps 30-39 timed ``bad`` as the format prints it."""
    from helpers import bar_update

    lines = []
    for step in range(50):
        t = bad if 30 <= step < 40 else f"{0.5 + 0.001 * (step % 3):.3f}"
        if fmt == "nemo1":  # Lightning's TQDM bar pads inf / nan to 'inf.0' / 'nan.0' (Tqdm.format_num)
            lines.append(bar_update(step + 1, 50, step, 0.5).replace("=0.500", f"={t}"))
        elif fmt == "nemo2":
            lines.append(f"Training epoch 0, iteration {step}/49 | lr: 1e-05 | global_step: {step} | "
                         f"reduced_train_loss: 2.1 | train_step_timing in s: {t} | consumed_samples: {(step + 1) * 4}")
        else:
            ms = t if bad in t else f"{float(t) * 1000:.1f}"
            lines.append(f" iteration {step + 1:8d}/      50 | consumed samples: {(step + 1) * 4:10d} | elapsed time per "
                         f"iteration (ms): {ms} | learning rate: 1.0E-05 | lm loss: 2.1E+00 |")
    path.write_text("\r".join(lines) + "\n" if fmt == "nemo1" else "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fmt, bad", [("nemo1", "inf.0"), ("nemo1", "nan.0"), ("nemo2", "inf"), ("nemo2", "nan"),
                                      ("megatron", "inf"), ("megatron", "nan")])
def test_validate_warns_of_infinite_or_nan_step_times_never_a_silent_figure(tmp_path, capsys, fmt, bad):
    log = _nonfinite_log(tmp_path / "job.out", fmt, bad)
    assert main(["validate", str(log), "--target-steps", "100"]) == 0
    out = capsys.readouterr().out
    assert "10 of 50 step timings" in out and "NaN, infinite" in out and "left out of the estimate" in out, out


@pytest.mark.parametrize("fmt, bad", [("nemo1", "0.000"), ("nemo2", "0.0"), ("nemo2", "1e-07"), ("megatron", "0.0")])
def test_validate_counts_zero_step_times_as_unmeasured_in_one_line(tmp_path, capsys, fmt, bad):
    """A step timed 0 s (or under the clock's resolution) is a timer that did not run: `vdkit validate` said
    "measured 50 timed step(s)" with ten of them 0 s (and one "timer glitch" line each; a 1e-07 s one was averaged)."""
    log = _nonfinite_log(tmp_path / "job.out", fmt, bad)
    assert main(["validate", str(log), "--target-steps", "100"]) == 0
    out = capsys.readouterr().out
    assert "measured      40 timed step(s)" in out, out
    warned = [ln for ln in out.splitlines() if "not measured" in ln]
    assert len(warned) == 1 and "10 of 50 step timings" in warned[0] and "left out of the estimate" in warned[0], out
    assert "timer glitch" not in out and "under 1 ms" not in out, out
    assert main(["validate", str(log), "--target-steps", "100", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["steps_measured"] == 40 and obj["step_time_mean_s"] == pytest.approx(0.501, abs=0.001)


def test_a_run_whose_job_failed_before_its_first_step_says_why(tmp_path, capsys):
    """`vdkit validate RUN_DIR` of a run the pre-flight refused said 'no training steps found (fix: pass ... a run
    directory ...)' - it was one. The run's own fault record says why no step ran."""
    from vdkit.run.faults import append_fault

    (tmp_path / "slurm-5.out").write_text("vdkit pre-flight: ...\n")
    assert main(["validate", str(tmp_path)]) == 2
    assert "no training steps found" in capsys.readouterr().err  # no record: the plain line
    append_fault(tmp_path, job="5", rc=2, cause="vdkit pre-flight: data.data_dir=/x: it holds no non-empty file",
                 why="the recipe's fault", **{"continue": "sbatch x/launch.sbatch"})
    assert main(["validate", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "its job stopped before the first step (1 fault(s); last: job 5 vdkit pre-flight: data.data_dir=/x" in line
