"""The transformers-engine regime's one fitted constant, each GPU's hf_gemm_efficiency, from public H100 / A100 runs.

Each run of benchmarks/hf_public_runs.yaml is planned as the kit plans it; the efficiency at which its prediction
equals its published time is solved for (bisection); a GPU's value is the geometric mean over its runs marked
``fit`` (full rows), and each such run is also predicted with the mean of the same GPU's others (leave-one-out):
the ``fsdp`` range (full rows) comes from those errors. Never fitted, predicted at the fitted values: the HF
Trainer's Alpaca runs and the seed's OPT rows (validation/published/alpaca_opt.yaml) - the ``fsdp_unpacked``
range - and the seed's MI300X ZeRO-3 cells - the ``zero3`` range.

    python benchmarks/hf_efficiency.py          # the table, the fit and its leave-one-out errors
    python benchmarks/hf_efficiency.py --fit    # also write the efficiencies and the ranges to hf_step_time.yaml
"""
from __future__ import annotations

import argparse
import copy
import math
import re
import sys
from pathlib import Path
from typing import List

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from vdkit.composition.config import compose, conf_dir  # noqa: E402
from vdkit.planner import predict_hf  # noqa: E402

PLAN_ONLY = ["model.hf_path=null"]  # planning needs no weights (the sweeps name the cluster's staged copies)
from vdkit.planner.plan import make_plan  # noqa: E402

DATA = Path(__file__).with_name("hf_public_runs.yaml")


def _flat(items) -> List[str]:
    out: List[str] = []
    for x in items:
        out.extend(_flat(x) if isinstance(x, list) else [x])
    return out


def hf_cells(table: str, tcp_gb_s=None):
    """(cell, published entry, plan) for each cell of a seed table (transformers-engine regime);
    ``tcp_gb_s`` replaces the TCP clusters' inter-node bandwidth."""
    from vdkit.planner.plan import make_plan
    from vdkit.render.sweep import sweep_cells
    from vdkit.validation.tables import load_published

    pub = load_published(table)
    out = []
    for cell, c in zip(sweep_cells(table, PLAN_ONLY), pub["cells"]):
        extra = [f"cluster.inter_node_gb_s={tcp_gb_s:.6g}"] if tcp_gb_s and "cluster=xe9680_mi300x_noroce" in cell else []
        out.append((cell, c, make_plan(compose(list(cell) + extra))))
    return out


def load_runs() -> List[dict]:
    """Each run with its resolved recipe (``recipe``) and published seconds per step (``published_s``)."""
    from vdkit.render.sweep import sweep_cells

    data = yaml.safe_load(DATA.read_text())
    base = [o for o in sweep_cells("alpaca_opt", PLAN_ONLY)[0] if not o.startswith(("model=", "model.hf_path="))]
    runs = []
    for run in data["runs"]:
        over = _flat(run["overrides"])
        plan = make_plan(compose(base + over if run.get("alpaca_cell") else over))
        r = plan.recipe
        if "minutes" in run:
            published = run["minutes"] * 60 / r.train.target_steps
        else:
            published = r.train.global_batch_size * r.train.seq_length / (run["tokens_per_s_per_gpu"] * r.world_size)
        runs.append(dict(run, recipe=r, published_s=published, feasible=plan.feasible,
                         memory_gb=plan.memory.total_gb, source_text=data["sources"][run["source"]]))
    return runs


def step_s(recipe, eff=None) -> float:
    """Predicted seconds per step with the recipe's GPU at GEMM efficiency ``eff`` (None: the file's)."""
    calib = copy.deepcopy(predict_hf.constants())
    if eff is not None:
        calib["gpus"][recipe.cluster.gpu_type]["hf_gemm_efficiency"] = eff
    return predict_hf.predict_hf_step(recipe, recipe.parallelism.recompute or "none", calib).total_s


def implied_efficiency(recipe, published_s: float) -> float:
    """The efficiency at which the prediction equals ``published_s`` (the step time falls as it rises)."""
    lo, hi = 0.01, 10.0
    for _ in range(50):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if step_s(recipe, mid) < published_s else (mid, hi)
    return math.sqrt(lo * hi)


def geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def evaluate(runs: List[dict]) -> dict:
    """Implied efficiency of every run; per GPU the fit over its ``fit`` runs and each one's leave-one-out error;
    every run's error at the fitted values. Returns {gpu: efficiency}."""
    for r in runs:
        r["implied"] = implied_efficiency(r["recipe"], r["published_s"])
    effs = {}
    for gpu in dict.fromkeys(r["recipe"].cluster.gpu_type for r in runs if r["fit"]):
        fitted = [r for r in runs if r["fit"] and r["recipe"].cluster.gpu_type == gpu]
        effs[gpu] = geomean([r["implied"] for r in fitted])
        for r in fitted:
            r["loo_eff"] = geomean([o["implied"] for o in fitted if o is not r])
            r["loo_error"] = step_s(r["recipe"], r["loo_eff"]) / r["published_s"] - 1
    for r in runs:
        r["error"] = step_s(r["recipe"], effs.get(r["recipe"].cluster.gpu_type)) / r["published_s"] - 1
    return effs


def seed_rows(effs=None):
    """(label, published minutes, predicted minutes) of the seed's timed OPT cells (H100), at ``effs`` (None: the file's)."""

    out = []
    for _, pub, plan in hf_cells("alpaca_opt"):
        if pub.get("minutes") and plan.prediction:
            r = plan.recipe
            eff = (effs or {}).get(r.cluster.gpu_type)
            out.append((r.model.name, pub["minutes"], step_s(r, eff) * r.train.target_steps / 60))
    return out


def zero3_rows():
    """(label, published s/epoch, predicted s/epoch) of the seed's MI300X ZeRO-3 cells (not fitted)."""

    out = []
    for _, pub, plan in hf_cells("llama31_roce"):
        r = plan.recipe
        out.append((f"{r.model.name} {r.cluster.nodes} node(s) {r.cluster.transport}", pub["seconds"],
                    step_s(r) * r.train.target_steps))
    return out


def _range_line(key: str, errs, figures: str) -> str:
    lo, hi = math.floor(min(errs) * 1000) / 1000, math.ceil(max(errs) * 1000) / 1000  # outward: the edges stay inside
    return (f"  {key}: {{min: {lo:.3f}, max: {hi:.3f}, figures: \"{figures}, "
            f"{min(errs):+.0%} .. {max(errs):+.0%}\"}}")


def write(effs: dict, ranges: dict) -> Path:
    """Each GPU's hf_gemm_efficiency (the H200 takes the H100's) and the ranges into hf_step_time.yaml (text kept)."""
    path = conf_dir() / "calibration" / "hf_step_time.yaml"
    text = path.read_text()
    for gpu, eff in {**effs, "H200-SXM5-141GB": effs["H100-SXM5-80GB"]}.items():
        text = re.sub(rf"(\n  {re.escape(gpu)}:\n(?:    .*\n)*?    hf_gemm_efficiency: )[0-9.eE+-]+",
                      lambda m: m.group(1) + f"{eff:.3g}", text)
    for key, (errs, figures) in ranges.items():
        text = re.sub(rf"\n  {key}: \{{.*\}}", lambda m: "\n" + _range_line(key, errs, figures), text)
    path.write_text(text)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="write the efficiencies and the ranges to hf_step_time.yaml")
    report(ap.parse_args().fit)
    return 0


def report(fit: bool = False) -> None:
    """Print the runs, the fit, the leave-one-out errors and the ranges; ``fit``: also write them."""
    runs = load_runs()
    before = {g: float(p["hf_gemm_efficiency"]) for g, p in predict_hf.constants()["gpus"].items()}
    seed_before = seed_rows()
    effs = evaluate(runs)
    print(f"{'run':<52} {'published':>14} {'pub s/step':>10} {'implied eff':>11} {'LOO eff':>8} {'LOO err':>8} "
          f"{'err at fit':>10} {'fits':>5}")
    for r in runs:
        pub = f"{r['minutes']} min" if "minutes" in r else f"{r['tokens_per_s_per_gpu']} tok/s/GPU"
        loo = f"{r['loo_eff']:>8.3f} {r['loo_error']:>+8.0%}" if "loo_error" in r else f"{'-':>8} {'-':>8}"
        print(f"{r['name']:<52} {pub:>14} {r['published_s']:>10.3f} {r['implied']:>11.3f} {loo} {r['error']:>+10.0%} "
              f"{'yes' if r['feasible'] else 'NO':>5}{'' if r['fit'] else '  (not fitted)'}")
    gpus = predict_hf.constants()["gpus"]
    full = [r["loo_error"] for r in runs if "loo_error" in r]
    for gpu, eff in effs.items():
        n = sum(1 for r in runs if r["fit"] and r["recipe"].cluster.gpu_type == gpu)
        print(f"{gpu}: hf_gemm_efficiency = {eff:.3f} of MAMF = {eff * gpus[gpu]['mamf_tflops_bf16'] / gpus[gpu]['peak_tflops_bf16']:.0%} "
              f"of BF16 peak (geometric mean of {n} runs; was {before[gpu]:g})")
    print(f"range fsdp (full rows) from {len(full)} leave-one-out errors {min(full):+.0%} .. {max(full):+.0%}: p / "
          f"{1 + max(full):.2f} .. p / {1 + min(full):.2f} ({(1 + max(full)) / (1 + min(full)):.2f}x wide)")
    seed_after = seed_rows(effs)
    unpacked = [r["error"] for r in runs if not r["fit"] and r.get("in_range", True)]
    for (name, pub, was), (_, _, now) in zip(seed_before, seed_after):
        unpacked.append(now / pub - 1)
        print(f"seed alpaca_opt {name:<10} published {pub:5.1f} min: before {was:6.1f} min ({was / pub - 1:+.0%}), "
              f"after {now:6.1f} min ({now / pub - 1:+.0%})")
    print(f"range fsdp_unpacked from {len(unpacked)} never-fitted HF Trainer Alpaca runs {min(unpacked):+.0%} .. "
          f"{max(unpacked):+.0%} ({(1 + max(unpacked)) / (1 + min(unpacked)):.2f}x wide)")
    z = zero3_rows()
    zerr = [p / pub - 1 for _, pub, p in z]
    for (label, pub, pred), e in zip(z, zerr):
        print(f"zero3 (MI300X, not fitted) {label:<28} published {pub:8.0f} s/epoch predicted {pred:8.0f} ({e:+.0%})")
    print(f"range zero3 from these {len(z)} cells {min(zerr):+.0%} .. {max(zerr):+.0%} "
          f"({(1 + max(zerr)) / (1 + min(zerr)):.2f}x wide)")
    if fit:
        ranges = {"fsdp": (full, f"leave-one-out errors of {len(full)} public torch FSDP pretraining runs (full rows, "
                                 "seq 4096-8192) on H100 and A100, benchmarks/hf_public_runs.yaml"),
                  "fsdp_unpacked": (unpacked, f"{len(unpacked)} HF Trainer + FSDP Alpaca fine-tuning runs (unpacked "
                                              "rows; LLaMA-7B on A100 #170, the seed's OPT-6.7B / 13B on H100), never fitted"),
                  "zero3": (zerr, f"the multi-node blog's {len(z)} DeepSpeed ZeRO-3 cells on MI300X, never fitted")}
        print(f"wrote {write(effs, ranges)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
