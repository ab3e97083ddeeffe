"""Independent public runs predicted with the fitted constants (never fitted on): the table, median and worst.

Data: benchmarks/independent_runs.yaml (each run names its source; assumptions written beside it).
Run by benchmarks/bench_prediction.py (its last block) or alone: python benchmarks/independent_runs.py
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vdkit.composition.config import compose  # noqa: E402
from vdkit.planner import predict as P  # noqa: E402
from vdkit.planner.plan import make_plan  # noqa: E402

DATA = Path(__file__).with_name("independent_runs.yaml")


def _compose(run: dict):
    """The run's recipe. A run marked ``shape_only`` (NVIDIA's GPT3 rows: no kit engine builds GPT3's learned
    positions, LayerNorm and biases, so the engine door refuses it) is composed without the engine's spec check:
    only its shape and its engine's step-time regime are predicted, nothing is rendered."""
    if not run.get("shape_only"):
        return compose(run["overrides"])
    from unittest import mock

    with mock.patch("vdkit.recipes.engines.check_recipe", lambda recipe: None):
        return compose(run["overrides"])


def rows() -> List[dict]:
    """Each run: published and predicted seconds per step, the error, the layout, the range, the source."""
    data = yaml.safe_load(DATA.read_text())
    out = []
    for run in data["runs"]:
        r = _compose(run)
        tokens = r.train.global_batch_size * r.train.seq_length
        if "tokens_per_s_per_gpu" in run:
            tps, text = run["tokens_per_s_per_gpu"], f"{run['tokens_per_s_per_gpu']} tok/s/GPU"
        elif "samples_per_s" in run:  # the whole job's samples per second (MLPerf's tracked_stats throughput)
            tps = run["samples_per_s"] * r.train.seq_length / r.world_size
            text = f"{run['samples_per_s']} samples/s ({tps:.0f} tok/s/GPU)"
        else:
            tps = run["tflops"] * 1e12 / P.flops_per_token(r)
            text = f"{run['tflops']} TFLOP/s ({tps:.0f} tok/s/GPU)"
        plan = make_plan(r)
        published = tokens / (tps * r.world_size)
        pred = plan.prediction
        from vdkit.planner.interval import group

        row = {"name": run["name"], "group": run["source"], "range_group": group(plan.recipe), "gpu": r.cluster.gpu_type,
               "source": data["sources"][run["source"]].split(",")[0] + f" [{run['source']}]",
               "published": text, "published_step_s": published, "fits": plan.feasible,
               "memory_gb": plan.memory.total_gb, "recompute": plan.recipe.parallelism.recompute,
               # what the published run holds that no kit engine renders (the yaml's not_expressed: its key's why)
               "not_expressed": data["not_expressed"][run["not_expressed"]] if "not_expressed" in run else None}
        if pred is not None:
            row.update(predicted_step_s=pred.step_seconds, error=pred.step_seconds / published - 1,
                       interval=pred.interval_s,
                       inside=pred.interval_s[0] <= published <= pred.interval_s[1])
        out.append(row)
    return out


def print_independent() -> None:
    """The table, then median and worst absolute error over the runs with a prediction."""
    import numpy as np

    data = yaml.safe_load(DATA.read_text())
    print("independent public runs (never fitted on; benchmarks/independent_runs.yaml)")
    print(f"  {'run':<48} {'published':<30} {'pub s/step':>10} {'pred':>8} {'error':>7}  in range  memory (planned)")
    got = rows()
    for w in got:
        if "error" not in w:
            print(f"  {w['name']:<48} {w['published']:<30} {w['published_step_s']:>10.3f}  no prediction "
                  f"({'fits' if w['fits'] else 'does not fit'}, {w['memory_gb']:.1f} GB"
                  + ("; not expressed, below)" if w["not_expressed"] else ")"))
            continue
        print(f"  {w['name']:<48} {w['published']:<30} {w['published_step_s']:>10.3f} {w['predicted_step_s']:>8.3f} "
              f"{w['error']:>+7.0%}  {'yes' if w['inside'] else 'NO ':<8}  {w['memory_gb']:.1f} GB, recompute {w['recompute']}"
              + ("" if w["fits"] else " (does not fit)") + ("; not expressed, below" if w["not_expressed"] else ""))
    keys = [(None, None), *((("group", g)) for g in dict.fromkeys(w["group"] for w in got)),
            *((("range_group", g)) for g in dict.fromkeys(w["range_group"] for w in got)),
            *((("gpu", g)) for g in dict.fromkeys(w["gpu"] for w in got))]
    # A run marked not_expressed is planned and predicted as the kit renders it, which is not what the run did (its
    # planned memory, hence its recompute, differs): it stays outside these figures and gets its own line below.
    for field, value in keys:  # all runs, each source's, each range group's (vdkit.planner.interval.group), each GPU's
        some = [w for w in got if "error" in w and not w["not_expressed"] and (field is None or w[field] == value)]
        if not some:  # every run of the group lacks a prediction (listed below)
            continue
        errs = [abs(w["error"]) for w in some]
        widths = [w["interval"][1] / w["interval"][0] for w in some]
        label = "all" if field is None else {"group": f"[{value}]", "range_group": f"range {value}", "gpu": f"gpu {value}"}[field]
        print(f"  {label:<21} n={len(errs):>2}  median |error| {np.median(errs):.0%}  "
              f"worst {max(errs):.0%}  inside the printed range: {sum(w['inside'] for w in some)} of {len(errs)}  "
              f"(ranges {min(widths):.2f}x .. {max(widths):.2f}x wide)")
    missing = [w for w in got if "error" not in w or w["not_expressed"]]
    for why in dict.fromkeys(w["not_expressed"] for w in missing):  # outside the figures above, each with its why
        names = [w["name"] for w in missing if w["not_expressed"] == why]
        errs = [abs(w["error"]) for w in missing if w["not_expressed"] == why and "error" in w]
        figures = f"predicted as rendered: median |error| {np.median(errs):.0%}, worst {max(errs):.0%}; " if errs else ""
        print(f"  {'outside' if errs else 'no prediction':<21} n={len(names):>2}  " + figures
              + (f"not expressed ({why}): " if why else "the published layout does not fit by the planner's memory: ")
              + ", ".join(names))
    for key, text in data["sources"].items():
        print(f"  [{key}] {text}")


if __name__ == "__main__":
    print_independent()
