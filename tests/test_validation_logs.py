"""Parsing NeMo 1.x TQDM output, NeMo 2.x ProgressPrinter lines and TensorBoard events.

The logs are built here in NeMo's exact formats (../shared/reference/nemo.md); one test renders
the bar with Lightning's own Tqdm class so the format is not only our reading of it.
"""
from __future__ import annotations

import os
import struct

import pytest

from helpers import bar_update, nemo2_line, tqdm_num, write_events, write_nemo1_log
from vdkit.errors import UserError
from vdkit.validation.logs import (StepLog, merge_logs, parse_tensorboard, parse_text_log, read_source)


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
    import vdkit.validation.logs as logs

    monkeypatch.setattr(logs, "CHUNK_BYTES", 37)  # updates straddle every chunk boundary
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
    progress = pytest.importorskip("vdkit.recipes.progress")
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
