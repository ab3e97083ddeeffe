"""Validation on real public logs (tests/fixtures/logs, sources and hand-worked answers in SOURCES.md).

Each fixture's per-step values and 1000-step estimate are compared with ``answers.yaml``, which
was worked by hand from the log lines; the special cases (timer glitch, checkpoint slow-down,
two jobs, restarts, interleaved ranks, ANSI codes, TensorBoard) get their own tests.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from vdkit.cli import main
from vdkit.errors import UserError
from vdkit.validation.extrapolate import MIN_STEADY_SAMPLES, estimate, estimate_log, min_samples
from vdkit.validation.logs import merge_logs, parse_tensorboard, parse_text_log, read_source
from vdkit.validation.steps import TIMING_MEGATRON, TIMING_TQDM_RATE

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
ANSWERS = yaml.safe_load((FIXTURES / "answers.yaml").read_text())
TARGET = 1000


def test_fixture_set_is_the_documented_one():
    logs = sorted(p.name for p in FIXTURES.glob("*.log"))
    assert logs == sorted(ANSWERS)
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in logs + ["two_jobs_same_steps_4090/"]:
        assert f"`{name}`" in sources, f"{name} has no entry in SOURCES.md"
    assert len(logs) + 1 >= 15


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_fixture_steps_and_estimate_match_the_hand_worked_answer(name):
    answer = ANSWERS[name]
    log = read_source(FIXTURES / name, require_timing=False)
    got = [(r.step, r.timing_s, r.loss) for r in log.steps]
    want = [tuple(row) for row in answer["steps"]]
    assert [s for s, _, _ in got] == [s for s, _, _ in want]
    for (step, seconds, loss), (_, w_seconds, w_loss) in zip(got, want):
        assert seconds == (None if w_seconds is None else pytest.approx(w_seconds, rel=1e-9)), step
        assert loss == (None if w_loss is None else pytest.approx(w_loss, rel=1e-9)), step
    minutes = answer["minutes_1000"]
    if minutes is None:
        with pytest.raises(UserError):
            estimate_log(read_source(FIXTURES / name), TARGET)
    else:
        est = estimate_log(log, TARGET)
        assert est.extrapolated_minutes == pytest.approx(minutes, rel=2e-4)
        lo, hi = est.interval_minutes
        assert lo < est.extrapolated_minutes < hi  # never zero wide


# ----------------------------------------------------------------------------- the glitch
def test_timer_glitch_is_repaired_reported_and_lands_near_the_sane_estimate():
    log = parse_text_log(FIXTURES / "nemo2_timer_glitch_verdimrc.log")
    assert [r.timing_s for r in log.steps if r.step in (8, 9)] == [13.75, -12.71]  # kept as logged
    est = estimate_log(log, TARGET)
    sane = 7.9  # ~0.47 s per step: the run's ordinary steps
    assert abs(est.extrapolated_minutes - sane) / sane < 0.15
    assert est.repaired_steps == [8, 9]
    assert any("steps 8-9" in w and "13.75" in w and "-12.71" in w for w in est.data_warnings)


def test_glitch_that_cannot_be_paired_is_left_out_and_named():
    ts = [3.0] + [0.5] * 9 + [-0.2] + [0.5] * 9  # a lone negative value: no spike to pair it with
    est = estimate(ts, TARGET)
    assert est.excluded_steps == [10] and est.step_time_mean_s == pytest.approx(0.5)
    assert any("step 10" in w and "left out" in w for w in est.data_warnings)


def test_glitch_warning_reaches_the_cli(capsys):
    assert main(["validate", str(FIXTURES / "nemo2_timer_glitch_verdimrc.log")]) == 0
    out = capsys.readouterr().out
    assert "timer glitch at steps 8-9" in out and "1000 steps: 7.9 min" in out
    assert "interval      95 % Student t interval" in out


# ----------------------------------------------------------------------------- checkpoint / validation slow-down
def test_async_checkpoint_slowdown_is_found_reported_and_left_out():
    log = read_source(FIXTURES / "nemo2_async_checkpoint_evo2.log")
    assert (49, "checkpoint") in log.events and (49, "validation") in log.events
    est = estimate_log(log, TARGET)
    assert est.excluded_steps == list(range(50, 64))
    assert "checkpoint saving" in est.excludes and "validation" in est.excludes
    assert any("steps 50-63" in w and "step 49" in w and "excluded from the estimate" in w
               for w in est.data_warnings)
    # Measured total over its 100 steps: the left-out steps count at the steady mean.
    measured = estimate_log(log, 100)
    assert not measured.extrapolated
    expected = (sum(r.timing_s for r in log.steps if not 50 <= r.step <= 63) + 14 * est.step_time_mean_s) / 60
    assert measured.extrapolated_minutes == pytest.approx(expected)


def test_slowdown_is_kept_and_said_when_no_clean_steps_would_remain():
    ts = [2.0, 0.35, 0.35, 0.35, 0.35, 0.40, 0.41, 0.40, 0.42, 0.41]  # every steady step follows the save
    est = estimate(ts, TARGET, steps=list(range(10)), events=[(4, "checkpoint")])
    assert est.excluded_steps == [] and any("KEPT" in w for w in est.data_warnings)
    assert any("slow-down" in item for item in est.includes)


# ----------------------------------------------------------------------------- NeMo 2 quirks
def test_nemo2_within_epoch_iteration_is_not_max_steps():
    log = read_source(FIXTURES / "nemo2_ray_prefix_epochs_aws.log")
    assert log.total_steps is None and not any("stops at step" in w for w in log.warnings)
    assert [r.step for r in log.steps] == [45, 46, 48]


def test_nemo2_trailing_text_after_a_value(tmp_path):
    line = ("Training epoch 0, iteration 97/99 | lr: 1.469e-05 | global_step: 97 | reduced_train_loss: 6.265 | "
            "train_step_timing in s: 12.22   <- slow node?")
    p = tmp_path / "n.out"
    p.write_text(line + "\n")
    assert [(r.step, r.timing_s, r.loss) for r in parse_text_log(p).steps] == [(97, 12.22, 6.265)]


# ----------------------------------------------------------------------------- Megatron intervals
def test_megatron_interval_lines_are_one_sample_each():
    nccl = read_source(FIXTURES / "megatron_bert_interval_nccl_issue743.log")
    assert nccl.timing_source == TIMING_MEGATRON and [r.span for r in nccl.steps] == [10, 10]
    assert [r.span for r in read_source(FIXTURES / "mbridge_interval10_verdimrc.log").steps] == [10]
    old = read_source(FIXTURES / "megatron_2019_mp2_prefix_gpt2.log")
    assert [r.span for r in old.steps] == [100] * 6
    est = estimate_log(old, TARGET)
    assert est.steps_measured == 6 and est.iterations_measured == 600  # 6 samples, not 600 invented ones
    gap = read_source(FIXTURES / "mbridge_timestamps_gap_deeplink.log")
    assert [r.span for r in gap.steps] == [1, 1, 1, 1]
    assert any("skips iteration(s) 483-499" in w for w in gap.warnings)


# ----------------------------------------------------------------------------- TQDM
def test_tqdm_rate_is_a_labelled_fallback():
    log = read_source(FIXTURES / "nemo1_rate_only_launcher_issue55.log")
    assert log.timing_source == TIMING_TQDM_RATE and log.steps[0].timing_s == 41.36
    assert any("TQDM's rate" in w for w in log.warnings)
    est = estimate([1 / 1.27] * 10, TARGET, timing_source=TIMING_TQDM_RATE)
    assert "FALLBACK" in est.includes[0] and "validation" not in est.excludes


def test_tqdm_without_total_and_prefixes(tmp_path):
    log = read_source(FIXTURES / "nemo1_no_total_prefixed_hyperpod.log")
    assert log.total_steps is None and log.steps[0].step == 1
    lines = [f"Epoch 1: : {n}it [00:0{n}, {0.5 + n / 100:.2f}it/s, v_num=0, reduced_train_loss=0.5, "
             f"global_step={n - 1}.00, consumed_samples={n * 8}.0]" for n in range(1, 8)]
    p = tmp_path / "rate.out"
    p.write_text("\r".join(lines) + "\n")
    log = parse_text_log(p)
    assert log.timing_source == TIMING_TQDM_RATE
    assert [round(r.timing_s, 6) for r in log.steps] == [round(1 / (0.5 + n / 100), 6) for n in range(1, 8)]


def test_ansi_colour_codes_and_literal_ctrl_m(tmp_path):
    real = (FIXTURES / "nemo2_srun_label_esm2_aws_guidance.log").read_text().splitlines()
    coloured = [f"\x1b[32m{line}\x1b[0m" for line in real]
    p = tmp_path / "ansi.out"
    p.write_text("\n".join(coloured) + "\n")
    want = [(r.step, r.timing_s) for r in parse_text_log(FIXTURES / "nemo2_srun_label_esm2_aws_guidance.log").steps]
    assert [(r.step, r.timing_s) for r in parse_text_log(p).steps] == want
    ctrl = parse_text_log(FIXTURES / "nemo1_literal_ctrl_m_short_numbers_peft.log")
    assert [r.step for r in ctrl.steps] == [1999] and any("cut off" in w for w in ctrl.warnings)


# ----------------------------------------------------------------------------- ranks, restarts, two jobs
def test_interleaved_ranks_are_not_mixed(tmp_path):
    """Real lines from two runs given two srun labels and interleaved, as `srun -l` would print them."""
    zero = [f"0: {x}" for x in (FIXTURES / "nemo2_nemorun_stdout_cloudai.log").read_text().splitlines()]
    one = [f"1: {x}" for x in (FIXTURES / "nemo2_bionemo_recipes_pr740.log").read_text().splitlines()]
    mixed = []
    for i in range(max(len(zero), len(one))):
        mixed += zero[i:i + 1] + one[i:i + 1]
    p = tmp_path / "ranks.out"
    p.write_text("\n".join(mixed) + "\n")
    log = parse_text_log(p)
    assert [r.step for r in log.steps] == list(range(17, 29))
    assert any("more than one process" in w and "'0'" in w and "'1'" in w for w in log.warnings)


def test_restart_segments_are_joined_by_step_and_reported(tmp_path):
    """The real Evo 2 log cut as a requeue cuts it: job 1 dies after step 63, job 2 (requeued, the next
    day: its stamps moved by one day) resumes from the step-49 checkpoint at step 50."""
    lines = (FIXTURES / "nemo2_async_checkpoint_evo2.log").read_text().splitlines()
    cut = next(i for i, x in enumerate(lines) if "iteration 64/99" in x)
    resume = next(i for i, x in enumerate(lines) if "iteration 50/99" in x)
    run = tmp_path / "run"
    run.mkdir()
    (run / "slurm-10.out").write_text("\n".join(lines[:cut]) + "\n")
    (run / "slurm-11.out").write_text("\n".join(lines[resume:]).replace("2025-06-18", "2025-06-19") + "\n")
    os.utime(run / "slurm-10.out", (1, 1))
    os.utime(run / "slurm-11.out", (2, 2))
    log = read_source(run)
    assert [r.step for r in log.steps] == list(range(100))
    assert any(w.startswith("restart: slurm-11.out resumes at step 50 and reruns steps 50-63") for w in log.warnings)
    assert estimate_log(log, TARGET).extrapolated_minutes == pytest.approx(ANSWERS["nemo2_async_checkpoint_evo2.log"]
                                                                           ["minutes_1000"], rel=2e-4)


def test_two_jobs_writing_the_same_steps_are_reported_not_averaged(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "two_jobs_same_steps_4090", run)
    os.utime(run / "slurm-1.out", (1, 1))
    os.utime(run / "slurm-2.out", (2, 2))
    log = read_source(run)
    assert any("two different jobs wrote steps 0-9" in w and "not averaged" in w for w in log.warnings)
    only_second = parse_text_log(run / "slurm-2.out")
    assert [r.timing_s for r in log.steps] == [r.timing_s for r in only_second.steps]
    assert estimate_log(log, TARGET).extrapolated_minutes == pytest.approx(226.90, rel=2e-4)


def test_two_jobs_running_at_once_by_their_timestamps():
    a = parse_text_log(FIXTURES / "nemo2_nemorun_iso_timestamp_deeplink.log")
    b = parse_text_log(FIXTURES / "nemo2_nemorun_iso_timestamp_deeplink.log")
    b.source = "other.out"
    merged = merge_logs("run", [a, b])  # same steps, same stamps: both were running at once
    assert any("two different jobs" in w for w in merged.warnings)


# ----------------------------------------------------------------------------- TensorBoard
def test_tensorboard_keeps_non_positive_values_for_the_glitch_repair(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    steps = read_source(FIXTURES / "nemo2_timer_glitch_verdimrc.log").steps
    w = SummaryWriter(str(tmp_path / "tb"))
    for r in steps:
        w.add_scalar("train_step_timing in s", r.timing_s, r.step)
        w.add_scalar("reduced_train_loss", r.loss, r.step)
    w.close()
    log = parse_tensorboard(tmp_path / "tb")
    assert [round(r.timing_s, 4) for r in log.steps] == [r.timing_s for r in steps]
    assert estimate_log(log, TARGET).extrapolated_minutes == pytest.approx(7.895, rel=1e-3)


# ----------------------------------------------------------------------------- one rule, honest interval
def test_one_minimum_rule_and_a_never_zero_interval():
    n = min_samples()
    assert n == 5 and MIN_STEADY_SAMPLES == 3
    with pytest.raises(UserError, match=f"at least {n} timed steps"):
        estimate([1.0] * (n - 1), TARGET)
    est = estimate([2.0, 1.0, 1.0, 1.0, 1.0], TARGET)  # the smallest accepted run, identical steady steps
    lo, hi = est.interval_minutes
    assert est.steady_samples == 3 and lo < est.extrapolated_minutes < hi
    assert "floored at 1%" in est.interval_method


# ----------------------------------------------------------------------------- validate --steps
def test_steps_csv_for_a_log_too_short_to_extrapolate(capsys):
    assert main(["validate", "--steps", str(FIXTURES / "megatron_bert_interval_nccl_issue743.log")]) == 0
    out = capsys.readouterr().out
    assert out == "step,seconds,loss\n9,0.3562,\n19,0.1406,10.05022\n"
    assert main(["validate", "--steps", str(FIXTURES / "nemo1_empty_values_speech_issue11900.log")]) == 0
    assert capsys.readouterr().out == "step,seconds,loss\n613,,\n"


def test_steps_csv_keeps_values_as_logged(capsys):
    assert main(["validate", "--steps", str(FIXTURES / "nemo2_timer_glitch_verdimrc.log")]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "step,seconds,loss" and len(rows) == 21
    assert rows[9:11] == ["8,13.75,10.84", "9,-12.71,10.84"]


def test_steps_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["validate", "--steps", str(tmp_path / "nope.out")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert main(["validate", "--steps", str(FIXTURES / "megatron_lm_srun_label_aws.log"),
                 str(FIXTURES / "megatron_lm_srun_label_aws.log")]) == 2
    assert "--steps takes one" in capsys.readouterr().err


def test_megatron_tensorboard_scalars_are_interval_samples(tmp_path):
    """Megatron writes `iteration-time` / `lm loss` at each log interval's 1-based iteration: the
    2019 2-GPU run's six intervals of 100, as TensorBoard events, give the text log's answer."""
    from torch.utils.tensorboard import SummaryWriter

    text = read_source(FIXTURES / "megatron_2019_mp2_prefix_gpt2.log")
    w = SummaryWriter(str(tmp_path / "tb"))
    for r in text.steps:
        w.add_scalar("iteration-time", r.timing_s, r.step + 1)
        w.add_scalar("lm loss", r.loss, r.step + 1)
    w.close()
    log = read_source(tmp_path / "tb")
    assert log.timing_source == TIMING_MEGATRON
    assert [(r.step, r.span) for r in log.steps] == [(s, 100) for s in (99, 199, 299, 399, 499, 599)]
    assert estimate_log(log, TARGET).extrapolated_minutes == pytest.approx(
        ANSWERS["megatron_2019_mp2_prefix_gpt2.log"]["minutes_1000"], rel=1e-3)


def test_restart_inside_one_output_file_is_reported(tmp_path):
    """A requeued job appending to the same output: the real ESM-2 lines, then the run again from step 30."""
    lines = (FIXTURES / "nemo2_srun_label_esm2_aws_guidance.log").read_text().splitlines()
    p = tmp_path / "slurm-7.out"
    p.write_text("\n".join(lines + lines[2:]) + "\n")
    log = parse_text_log(p)
    assert [r.step for r in log.steps] == list(range(28, 35))
    assert any("restarts inside the file (after step 34 back to step 30" in w for w in log.warnings)
