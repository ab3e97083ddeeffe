"""An MLPerf LoRA submission's result logs read block by block (benchmarks/mlperf_blocks.py; issue 35, docs/prediction.md
"The eager gap: the figure, the host count and the logs")."""
from __future__ import annotations

import json

import pytest

from helpers import bench_module


@pytest.fixture(scope="module")
def M():
    return bench_module("mlperf_blocks")


def _log(blocks, gbs=64, prefix="  0: "):
    """A result log as NVIDIA's custom_callbacks.py writes it: the batch size, then per block its start, its
    tracked_stats and stop (``(throughput, samples, seconds)``), then a 2 s evaluation; ranks prefix the lines."""
    lines, t, samples = ["+ srun ...", "STARTING TIMING RUN"], 1_000_000, 0

    def ev(key, value=None, **meta):
        lines.append(prefix + ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME",
                                                        "key": key, "value": value, "metadata": meta}))

    ev("global_batch_size", gbs)
    for throughput, n, seconds in blocks:
        ev("block_start", samples_count=samples)
        t += int(seconds * 1000)
        samples += n
        ev("tracked_stats", {"throughput": throughput}, step=samples)
        ev("block_stop", samples_count=samples)
        ev("eval_start", samples_count=samples)
        t += 2000
        ev("eval_stop", samples_count=samples)
    return "\n".join(lines) + "\n"


def test_a_log_gives_the_median_after_its_first_block_and_the_checks_of_it(M):
    """The yaml's figure is the median of the throughputs after the first block; the first block, the later blocks'
    wall-clock rate (samples over block_start -> block_stop) and the evaluation time are printed beside it."""
    text = _log([(82.0, 4224, 52.0), (80.0, 384, 4.8), (79.0, 384, 4.9), (81.0, 384, 4.75)])
    b = M.blocks(M.events(text))
    assert b["steady"] == 80.0 and b["first"] == 82.0 and b["gbs"] == 64 and b["blocks"] == 4
    assert b["wall"] == pytest.approx(384 / 4.8) and b["eval_s"] == 2.0


def test_a_log_with_one_block_has_no_steady_figure(M):
    with pytest.raises(ValueError, match="a steady figure needs a block after the first"):
        M.blocks(M.events(_log([(82.0, 4224, 52.0)])))


def test_the_folder_of_a_submission_is_read_in_its_logs_order_and_the_slowest_log_is_named(M, tmp_path, capsys):
    for i, steady in enumerate([80.2, 81.5, 80.6]):
        (tmp_path / f"result_{i}.txt").write_text(_log([(82.0, 4224, 52.0), (steady, 384, 4.8)]))
    (tmp_path / "result_10.txt").write_text(_log([(82.0, 4224, 52.0), (80.9, 384, 4.8)]))
    assert [p.name for p in M.result_files([str(tmp_path)])] == [
        "result_0.txt", "result_1.txt", "result_2.txt", "result_10.txt"]
    assert M.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "median over 4 logs: steady 80.75 (range 80.20 .. 81.50), first block 82.00" in out
    assert "result_0.txt is number 1 of 4 from the slowest" in out


def test_bad_input_is_one_line_and_exit_2(M, tmp_path, capsys):
    assert M.main([]) == 2
    assert M.main([str(tmp_path / "missing.txt")]) == 2
    (tmp_path / "result_0.txt").write_text("no MLLOG here\n")
    assert M.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("mlperf_blocks: ") for line in err)
