"""An MLPerf llama2_70b_lora submission's result logs, block by block: how steady the published figure is (issue 35).

independent_runs.yaml takes an MLPerf LoRA row's samples/s as the median of one log's ``tracked_stats`` throughputs
after its first block. Each block's throughput is GBS x its steps over the summed time from ``on_train_batch_start``
to ``on_train_batch_end`` (NVIDIA's implementation, custom_callbacks.py ``Timer``); evaluation runs between a
``block_stop`` and the next ``block_start``, outside it. For every log of a submission this prints that figure and
four checks of it:
- the first block's throughput (the longest stretch of steps with no evaluation before them);
- the later blocks' wall-clock rate: the samples between ``block_start`` and ``block_stop`` over the time between
  the two events, which includes the loop's time outside the timed hooks;
- the evaluations' median seconds;
- the global batch size the log states.
It then prints the median over the logs and where the log the yaml uses falls among them. Nothing is fitted and
nothing is written. Usage (a clone of the MLCommons results repository):

    python benchmarks/mlperf_blocks.py Oracle/results/64xBM.GPU.H200.8/llama2_70b_lora
    python benchmarks/mlperf_blocks.py result_0.txt result_1.txt ...
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import List

MLLOG = re.compile(r":::MLLOG (\{.*\})")


def events(text: str) -> List[dict]:
    """The ``:::MLLOG`` events of a result log, in order (ranks' line prefixes such as ``  0: `` are ignored)."""
    return [json.loads(m.group(1)) for m in MLLOG.finditer(text)]


def blocks(evs: List[dict]) -> dict:
    """A log's figures: ``steady`` (the median tracked_stats throughput after the first block: the yaml's figure),
    ``first`` (the first block's), ``wall`` (the median wall-clock samples/s of the later blocks), ``eval_s`` (the
    median evaluation seconds), ``gbs`` and ``blocks`` (how many throughputs the log has)."""
    tracked = [e["value"]["throughput"] for e in evs if e["key"] == "tracked_stats"]
    if len(tracked) < 2:
        raise ValueError(f"{len(tracked)} tracked_stats events: a steady figure needs a block after the first")
    gbs = next((e["value"] for e in evs if e["key"] == "global_batch_size"), None)
    wall, evals, start, eval_start = [], [], None, None
    for e in evs:
        key = e["key"]
        if key == "block_start":
            start = e
        elif key == "block_stop" and start is not None:
            samples = e["metadata"]["samples_count"] - start["metadata"]["samples_count"]
            wall.append(samples / ((e["time_ms"] - start["time_ms"]) / 1000.0))
            start = None
        elif key == "eval_start":
            eval_start = e["time_ms"]
        elif key == "eval_stop" and eval_start is not None:
            evals.append((e["time_ms"] - eval_start) / 1000.0)
            eval_start = None
    return {"steady": statistics.median(tracked[1:]), "first": tracked[0],
            "wall": statistics.median(wall[1:]) if len(wall) > 1 else None,
            "eval_s": statistics.median(evals) if evals else None, "gbs": gbs, "blocks": len(tracked)}


def result_files(args: List[str]) -> List[Path]:
    """The result logs named: files as given, a folder's ``result_*.txt`` in their number's order."""
    out: List[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            out += sorted(path.glob("result_*.txt"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
        else:
            out.append(path)
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: List[str]) -> int:
    """Print each named result log's blocks (a folder or result_*.txt files in ``argv``); 2 when none is named."""
    files = result_files(argv)
    if not files:
        print("mlperf_blocks: name a submission's result folder or its result_*.txt files", file=sys.stderr)
        return 2
    rows = []
    for path in files:
        try:
            rows.append((path.name, blocks(events(path.read_text(errors="replace")))))
        except (OSError, ValueError) as err:
            print(f"mlperf_blocks: {path}: {err}", file=sys.stderr)
            return 2
    print(f"  {'log':<16} {'steady':>8} {'first':>8} {'wall':>8} {'eval s':>7} {'gbs':>5} {'s/step':>7}")
    for name, b in rows:
        step = b["gbs"] / b["steady"] if b["gbs"] else None
        print(f"  {name:<16} {b['steady']:8.2f} {b['first']:8.2f} {_fmt(b['wall'], '8.2f')} "
              f"{_fmt(b['eval_s'], '7.2f')} {_fmt(b['gbs'], '5')} {_fmt(step, '7.3f')}")
    steady = sorted(b["steady"] for _, b in rows)
    first = statistics.median(b["first"] for _, b in rows)
    print(f"  median over {len(rows)} logs: steady {statistics.median(steady):.2f} (range {steady[0]:.2f} .. "
          f"{steady[-1]:.2f}), first block {first:.2f}; {rows[0][0]} is number "
          f"{steady.index(rows[0][1]['steady']) + 1} of {len(rows)} from the slowest")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
