"""vdkit.validation.logs: parsing NeMo 1.x TQDM output, NeMo 2.x ProgressPrinter lines and TensorBoard events.

The logs are built here in NeMo's exact formats (../shared/reference/nemo.md); one test renders
the bar with Lightning's own Tqdm class so the format is not only our reading of it.

Validation on real public logs (tests/fixtures/logs, sources and hand-worked answers in SOURCES.md).

Each fixture's per-step values and 1000-step estimate are compared with ``answers.yaml``, which
was worked by hand from the log lines; the special cases (timer glitch, checkpoint slow-down,
two jobs, restarts, interleaved ranks, ANSI codes, TensorBoard) get their own tests.
"""
from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
import yaml

from helpers import bar_update, nemo2_line, tqdm_num, write_events, write_nemo1_log
from vdkit.cli import main
from vdkit.errors import UserError
from vdkit.validation.extrapolate import MIN_STEADY_SAMPLES, estimate, estimate_log, min_samples
from vdkit.validation.logs import read_source
from vdkit.validation.merge import merge_logs
from vdkit.validation.steps import StepLog
from vdkit.validation.tensorboard_events import parse_tensorboard
from vdkit.validation.text_log import parse_text_log
from vdkit.validation.steps import TIMING_MEGATRON, TIMING_TQDM_RATE


def _record_offset(raw: bytes, k: int) -> int:
    """Byte offset of the k-th (0-based) TFRecord in an event file."""
    off = 0
    for _ in range(k):
        (length,) = struct.unpack("<Q", raw[off:off + 8])
        off += 12 + length + 4
    return off


def timings_of(log: StepLog):
    return [(s.step, s.timing_s) for s in log.timed]


# ----------------------------------------------------------------------------- NeMo 1.x
def test_nemo1_cr_separated_updates_one_value_per_step(tmp_path):
    ts = [20.0] + [9.0 + 0.01 * i for i in range(1, 50)]
    log = parse_text_log(write_nemo1_log(tmp_path / "slurm-1.out", ts))
    assert log.format == "nemo1"
    assert [s for s, _ in timings_of(log)] == list(range(50))
    assert [t for _, t in timings_of(log)] == pytest.approx([float(tqdm_num(t)) for t in ts])
    assert log.steps[10].consumed_samples == pytest.approx(11 * 128)
    assert log.steps[10].loss == pytest.approx(2.0 - 0.01, abs=1e-3)
    assert log.total_steps == 50 and not log.warnings


def test_nemo1_last_update_of_a_step_wins(tmp_path):
    first = bar_update(1, 3, 0, 5.0)
    again = bar_update(1, 3, 0, 7.0)  # e.g. a refresh after the timing callback updated the metric
    second = bar_update(2, 3, 1, 6.0)
    third = bar_update(3, 3, 2, 6.5)
    p = tmp_path / "x.out"
    p.write_text("\r".join([first, again, second, third]) + "\n")
    assert timings_of(parse_text_log(p)) == [(0, 7.0), (1, 6.0), (2, 6.5)]


def test_nemo1_records_glued_to_updates_and_v_num(tmp_path):
    log = parse_text_log(write_nemo1_log(tmp_path / "g.out", [3.0] * 20, glue_every=3))
    assert len(log.timed) == 20 and all(t == 3.0 for t in log.timings)


def test_nemo1_short_numbers_past_1000_steps(tmp_path):
    # global_step >= 1000 prints as 1e+3, 1.01e+3 ...: the exact step comes from the bar counter.
    ts = [1.0 + (i % 7) * 0.125 for i in range(1200)]
    p = write_nemo1_log(tmp_path / "long.out", ts)
    text = p.read_text()
    assert "global_step=1e+3" in text and "consumed_samples=1.28e+5" in text
    log = parse_text_log(p)
    assert [s for s, _ in timings_of(log)] == list(range(1200))
    assert log.timings == pytest.approx([float(tqdm_num(t)) for t in ts])
    assert log.steps[1199].consumed_samples == pytest.approx(1.54e5)  # TQDM keeps 3 significant digits


def test_nemo1_short_numbers_resumed_run_starting_without_exact_steps(tmp_path):
    # A requeued job resuming at step 1995: steps 1995-2004 all print as 2e+3 (the first ten
    # updates hold no exact step at all); the bar counter still gives each its own step.
    ts = [2.0 + 0.125 * (i % 3) for i in range(30)]
    p = write_nemo1_log(tmp_path / "r.out", ts, start_step=1995, total=2100)
    first = p.read_text().split("\n")[1]
    assert "global_step=2e+3" in first and "| 1996/2100" in first
    log = parse_text_log(p)
    assert [s for s, _ in timings_of(log)] == list(range(1995, 2025))
    assert log.timings == pytest.approx([float(tqdm_num(t)) for t in ts])


def test_nemo1_unknown_total_and_empty_metric_values(tmp_path):
    lines = [bar_update(n, None, n - 1, 4.0) for n in range(1, 11)]
    lines.insert(3, bar_update(4, None, 3, 0.0, empty=True))  # max_steps=-1: empty values
    p = tmp_path / "q.out"
    p.write_text("\r".join(lines) + "\n")
    log = parse_text_log(p)
    assert [s for s, _ in timings_of(log)] == list(range(10))
    assert log.total_steps is None


def test_nemo1_with_lightning_own_tqdm(tmp_path):
    tqdm_progress = pytest.importorskip("lightning.pytorch.callbacks.progress.tqdm_progress")
    with open(tmp_path / "l.out", "w") as fh:
        bar = tqdm_progress.Tqdm(desc="Epoch 0", total=1100, file=fh,
                                 bar_format=tqdm_progress.TQDMProgressBar.BAR_FORMAT,
                                 dynamic_ncols=True, mininterval=0, smoothing=0)
        for i in range(1100):  # as Lightning: move the bar, then set the new metrics
            bar.n = i + 1
            bar.refresh()
            bar.set_postfix({"v_num": "xyz1", "reduced_train_loss": 2.0 - i * 1e-4, "global_step": float(i),
                             "consumed_samples": float((i + 1) * 128), "train_step_timing in s": 1.0 + (i % 5) / 10})
        bar.close()
    log = parse_text_log(tmp_path / "l.out")
    assert [s for s, _ in timings_of(log)] == list(range(1100))
    assert log.timings == pytest.approx([1.0 + (i % 5) / 10 for i in range(1100)])


def test_truncated_log_gives_what_it_has_plus_warning(tmp_path):
    p = write_nemo1_log(tmp_path / "t.out", [5.0] * 40, total=50, tail="")
    data = p.read_text()
    p.write_text(data[:-25])  # cut in the middle of the last update
    log = parse_text_log(p)
    assert [s for s, _ in timings_of(log)] == list(range(39))
    joined = " ".join(log.warnings)
    assert "cut off" in joined and "stops at step 39 of 50" in joined


def test_corrupt_bytes_warn_and_keep_the_rest(tmp_path):
    p = write_nemo1_log(tmp_path / "c.out", [5.0] * 10)
    raw = p.read_bytes()
    p.write_bytes(raw[:200] + b"\x00\xff\xfe garbage" + raw[200:])
    log = parse_text_log(p)
    assert len(log.timed) >= 9
    assert any("undecodable" in w for w in log.warnings)


def test_no_timing_is_a_user_error_naming_the_file(tmp_path):
    p = tmp_path / "empty.out"
    p.write_text("[NeMo I 2024-01-01] nothing here\nsrun: error: something\n")
    with pytest.raises(UserError, match="empty.out"):
        read_source(p)


def test_chunk_boundaries_do_not_split_updates(tmp_path, monkeypatch):
    from vdkit.validation import segments

    monkeypatch.setattr(segments, "CHUNK_BYTES", 37)  # updates straddle every chunk boundary
    ts = [1.0 + 0.001 * i for i in range(200)]
    log = parse_text_log(write_nemo1_log(tmp_path / "k.out", ts))
    assert log.timings == pytest.approx([float(tqdm_num(t)) for t in ts])


# ----------------------------------------------------------------------------- NeMo 2.x
def test_nemo2_progress_printer_lines(tmp_path):
    lines = ["[NeMo I 2024-09-01 10:00:00 nemo_logging:393] Starting training"]
    lines += [nemo2_line(i, 49, i, 9.0 + (i % 3) * 0.5) for i in range(50)]
    p = tmp_path / "n2.out"
    p.write_text("\n".join(lines) + "\n")
    log = parse_text_log(p)
    # "iteration i/49" counts within the epoch: it is not max_steps (real runs print 10/999 at step 29)
    assert log.format == "nemo2" and log.total_steps is None
    assert timings_of(log) == [(i, 9.0 + (i % 3) * 0.5) for i in range(50)]
    assert log.steps[12].consumed_samples == 13 * 128


# ----------------------------------------------------------------------------- TensorBoard
def test_tensorboard_scalars(tmp_path):
    vals = [10.0, 6.0] + [4.0 + 0.25 * (i % 4) for i in range(30)]
    write_events(tmp_path / "logs", vals)
    log = parse_tensorboard(tmp_path / "logs")
    assert log.format == "tensorboard"
    assert timings_of(log) == [(i, pytest.approx(v)) for i, v in enumerate(vals)]
    assert log.steps[3].loss == pytest.approx(1.97)


def test_tensorboard_truncated_event_file_warns(tmp_path):
    f = write_events(tmp_path / "logs", [3.0] * 20)
    raw = f.read_bytes()
    f.write_bytes(raw[:_record_offset(raw, 30) + 20])  # cut inside the 31st record
    log = parse_tensorboard(tmp_path / "logs")
    assert 10 <= len(log.timed) < 20
    assert any("truncated" in w for w in log.warnings)


def test_tensorboard_corrupt_record_stops_with_warning(tmp_path):
    f = write_events(tmp_path / "logs", [3.0] * 20)
    raw = bytearray(f.read_bytes())
    raw[_record_offset(raw, 10)] ^= 0x55  # flip a byte of the 11th record's length header
    f.write_bytes(bytes(raw))
    log = parse_tensorboard(tmp_path / "logs")
    assert 0 < len(log.timed) < 20
    assert any("corrupt" in w for w in log.warnings)


# ----------------------------------------------------------------------------- run directories
def test_run_dir_prefers_tensorboard_events(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    write_events(run / "logs", [2.0] * 10)
    write_nemo1_log(run / "slurm-1.out", [9.0] * 10)
    log = read_source(run)
    assert log.format == "tensorboard" and log.timings == [2.0] * 10 and log.source == str(run)


def test_run_dir_merges_requeued_out_files_by_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = write_nemo1_log(run / "slurm-100.out", [5.0] * 30, total=50)  # killed at step 30
    second = write_nemo1_log(run / "slurm-101.out", [6.0] * 30, total=50, start_step=20)  # resumed at 20
    os.utime(first, (1, 1))
    os.utime(second, (2, 2))
    log = read_source(run)
    assert [s for s, _ in timings_of(log)] == list(range(50))
    assert log.timings == [5.0] * 20 + [6.0] * 30  # the later job's steps win
    assert not any("stops at step" in w for w in log.warnings)


def test_merge_of_incomplete_logs_still_warns(tmp_path):
    a = parse_text_log(write_nemo1_log(tmp_path / "a.out", [1.0] * 10, total=50))
    merged = merge_logs("x", [a])
    assert any("stops at step 10 of 50" in w for w in merged.warnings)


def test_missing_path_and_empty_run_dir_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_source(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no step timing"):
        read_source(tmp_path / "empty")


def test_reference_engine_progress_output_parses(tmp_path):
    """The reference engine's own progress writer (its contract with validation), epochs and all."""
    progress = pytest.importorskip("vdkit.recipes.common.progress")
    with open(tmp_path / "local-1.out", "w") as fh:
        pl = progress.ProgressLogger(tmp_path / "logs", total_steps=1200, start_step=0, stream=fh, tensorboard=False)
        for n in range(1, 1201):
            pl.update(epoch=(n - 1) // 16, n=n, loss=6.0 - n * 1e-3, lr=1e-4, consumed=n * 128,
                      timing=0.25 + (n % 4) * 0.125)
            if n == 600:
                pl.message("[vdkit I] saved checkpoint")
        pl.close()
    log = read_source(tmp_path / "local-1.out")
    assert [s for s, _ in timings_of(log)] == list(range(1200))
    assert log.timings == pytest.approx([0.25 + (n % 4) * 0.125 for n in range(1, 1201)], abs=1e-3)
    assert not log.warnings


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
