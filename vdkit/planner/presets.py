"""NVIDIA's published layouts as candidates: for a model and GPU count NVIDIA publishes a layout for, the
planner scores it beside its own choice and says why it departs (memory, the prediction).

Each preset names its source; a recipe matches by architecture (layers, hidden size), method and world
size. The preset is scored at the recipe's batch and precision with its own CP, no recompute (as published).
"""
from __future__ import annotations

from typing import List, Optional

from vdkit.planner.calibration import HEADROOM
from vdkit.planner.layout import layout_violations
from vdkit.planner.memory import estimate_memory

#: (layers, hidden, method, GPUs) -> NVIDIA's layout, with its source
PRESETS = [
    {"layers": 32, "hidden": 4096, "method": "pretrain", "gpus": 8, "tp": 1, "pp": 1, "vp": 1, "cp": 2,
     "source": "Megatron-Bridge 0.3.1 recipes/llama/llama3.py llama3_8b_pretrain_config"},
    {"layers": 80, "hidden": 8192, "method": "pretrain", "gpus": 64, "tp": 4, "pp": 4, "vp": 5, "cp": 2,
     "source": "Megatron-Bridge 0.3.1 recipes/llama/llama3.py llama3_70b_pretrain_config"},
]


def preset_for(r) -> Optional[dict]:
    """NVIDIA's published layout for this recipe's model, method and GPU count, or None."""
    m = r.model
    return next((p for p in PRESETS if (p["layers"], p["hidden"], p["method"], p["gpus"])
                 == (m.num_layers, m.hidden_size, r.method.name, r.world_size)), None)


def preset_notes(r, chosen, distributed_optimizer: bool) -> List[str]:
    """One note comparing NVIDIA's preset with the chosen candidate (none when no preset matches or the
    plan is the preset)."""
    from vdkit.planner.predict import predict_step

    p = preset_for(r)
    if p is None or chosen is None:
        return []
    rp = r.with_parallelism(cp=p["cp"], recompute_num_layers=None)
    label = f"TP {p['tp']} x PP {p['pp']}" + (f" (VP {p['vp']})" if p["vp"] > 1 else "") + f" x CP {p['cp']}"
    same = (chosen.tp, chosen.pp, chosen.vp, chosen.recompute, r.parallelism.cp) == (p["tp"], p["pp"], p["vp"], "none", p["cp"])
    if same:
        return [f"this is NVIDIA's published layout ({p['source']})"]
    broken = layout_violations(rp, p["tp"], p["pp"], p["vp"])
    if broken:
        return [f"NVIDIA's layout {label} ({p['source']}) does not apply here: {broken[0]}"]
    mem = estimate_memory(rp, p["tp"], p["pp"], p["vp"], p["tp"] > 1, "none", distributed_optimizer)
    step = predict_step(rp, p["tp"], p["pp"], p["vp"], "none", distributed_optimizer)
    usable = r.cluster.gpu_memory_gb * (1 - HEADROOM)
    if mem.total_gb > usable:
        why = f"it needs {mem.total_gb:.1f} GB per GPU, more than the {usable:.0f} GB usable"
    elif chosen.step is not None and step.total_s > chosen.step.total_s:
        why = f"predicted {step.total_s / chosen.step.total_s - 1:.0%} slower ({step.total_s:.3g} vs {chosen.step.total_s:.3g} s/step)"
    else:
        why = (f"predicted {step.total_s:.3g} s/step at {mem.total_gb:.1f} GB; the plan keeps "
               f"parallelism.cp={r.parallelism.cp}" if r.parallelism.cp != p["cp"] else
               f"predicted {step.total_s:.3g} s/step at {mem.total_gb:.1f} GB (a pinned layout is kept)")
    return [f"NVIDIA's layout {label}, no recompute ({p['source']}): {why}"]
