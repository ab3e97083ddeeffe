"""What each rank of a megatron-core model really holds for weights, gradients and optimizer states, next to
the plan (shared by the engines on megatron-core: megatron and bridge).

Counted from the live objects, by storage (a tensor that is a view of a buffer counts the buffer
once, padding included):

- weights: the storages of every model parameter (megatron's contiguous parameter buffer under the
  distributed optimizer, or each parameter's own);
- gradients: the storages of every ``main_grad`` (megatron DDP's contiguous gradient buffer);
- optimizer: every tensor the optimizer holds that is not already one of the above - Adam's
  ``exp_avg`` / ``exp_avg_sq`` (and step counters), fp32 master copies of bf16 parameters.

``memory.json`` (rank 0 writes it): ``{"ranks": [{"rank", "stage", "measured": {...}, "planned":
{...}}]}`` in bytes, "planned" from :func:`vdkit.planner.memory.stage_static_bytes` for the rank's pipeline
stage, with the precision the engine trains in (fp32 on CPU, bf16 mixed precision on GPU).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, List

from vdkit.run.rundir import MEMORY_FILE  # the run-dir name's one home

TOLERANCE = 0.02  # measured and planned agree within 2 %


def _storages(tensors: Iterable) -> Dict[int, int]:
    out = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        out[st.data_ptr()] = st.nbytes()
    return out


def _optimizer_tensors(optimizer):
    """Every tensor an (unwrapped) megatron optimizer holds: its params, states and master copies."""
    import torch

    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for sub in subs:
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            yield from group["params"]
        for state in inner.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    yield v


def measure(chunks, optimizer) -> Dict[str, int]:
    """Bytes this rank holds: {"weights", "gradients", "optimizer"} (see the module docstring)."""
    params = [p for c in chunks for p in c.parameters()]
    weights = _storages(params)
    grads = _storages(getattr(p, "main_grad", None) for p in params)
    grads.update(_storages(p.grad for p in params))
    opt = {k: v for k, v in _storages(_optimizer_tensors(optimizer)).items() if k not in weights and k not in grads}
    return {"weights": sum(weights.values()), "gradients": sum(grads.values()), "optimizer": sum(opt.values())}


def planned(plan, stage: int, precision: str) -> Dict[str, int]:
    """The planner's bytes for one rank of pipeline stage ``stage``."""
    from vdkit.planner.memory import stage_static_bytes

    p = plan.recipe.parallelism
    raw = stage_static_bytes(plan.recipe, p.tp, p.pp, stage, bool(p.distributed_optimizer), precision)
    return {k: int(round(v)) for k, v in raw.items()}


def disagreements(report: dict, tolerance: float = TOLERANCE) -> List[str]:
    """Each (rank, kind) whose measured bytes are off the plan by more than ``tolerance``."""
    bad = []
    for r in report["ranks"]:
        for kind, want in r["planned"].items():
            got = r["measured"][kind]
            if abs(got - want) > tolerance * max(want, 1):
                bad.append(f"rank {r['rank']} {kind}: measured {got} planned {want}")
    return bad


def write(run_dir: Path, ranks: List[dict]) -> Path:
    """Write memory.json atomically (rank 0)."""
    path = Path(run_dir) / MEMORY_FILE
    tmp = path.with_name(f".{MEMORY_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"ranks": sorted(ranks, key=lambda r: r["rank"])}, indent=2) + "\n")
    os.replace(tmp, path)
    return path
