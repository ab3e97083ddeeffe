"""The plan's checkpoint size is what the engines write: the trainable weights as held plus the optimizer state as
each engine's optimizer exports it (vdkit.planner.memory checkpoint_bytes; conf/calibration/memory.yaml
``checkpoint_optimizer_bytes``). The megatron engine's checkpoint is saved here for real on the CPU (fp32: no master
copy, 4 + 8 bytes per parameter) and weighed against the plan; NeMo's and Bridge's are derived from their source."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner.memory import checkpoint_bytes

SFT_7B = ["model=llama2_7b", "method=sft", "cluster.nodes=2", "parallelism.tp=2", "parallelism.pp=1",
          "parallelism.distributed_optimizer=true"]


@pytest.mark.parametrize("overrides, per_param", [
    (["engine=megatron"], 14.0),  # bf16 weight + megatron-core's fp32 master, m, v
    (["engine=bridge"], 14.0),
    (["engine=nemo"], 14.0),      # Apex writes the fp32 master rebuilt from the bf16 weight and remainder (held: 10)
    (["engine=nemo", "train.optimizer_dtype=bf16"], 8.0),    # bf16 weight + param, m, v in bf16
    (["engine=bridge", "train.optimizer_dtype=bf16"], 10.0),  # bf16 weight + fp32 master + bf16 m, v
    (["engine=nemo", "method=lora"], 16.0),  # NeMo's fp32 PEFT adapter (no O2) + Apex's fp32 param, m, v
    (["engine=nemo", "method=lora", "parallelism.distributed_optimizer=false"], 12.0),  # fused Adam: m, v only
])
def test_checkpoint_bytes_per_trainable_parameter(overrides, per_param):
    r = compose([*SFT_7B, *overrides])
    assert checkpoint_bytes(r, r.parallelism.distributed_optimizer) == per_param


_SAVE = r"""
import io, json, sys
import torch
from megatron.core import parallel_state as ps
from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan
from vdkit.recipes.common import mcore_cpu
from vdkit.recipes.megatron import train

plan = make_plan(compose(json.loads(sys.argv[1])))
mcore_cpu.apply()
mcore_cpu.single_rank_model_parallel()
ps.destroy_model_parallel()
_, wrapped, optimizer = train.build(plan, cuda=False)
optimizer.step()  # Adam's state exists after the first step
buf = io.BytesIO()
torch.save(train._state(wrapped, optimizer, 1), buf)
trainable = sum(p.numel() for w in wrapped for p in w.module.parameters() if p.requires_grad)
print(json.dumps({"bytes": buf.tell(), "trainable": trainable}))
"""


def test_the_megatron_engines_checkpoint_weighs_what_the_plan_says():
    """One optimizer step of the tiny model on one CPU rank, then the checkpoint the engine writes (its ``_state``,
    torch.save): bytes per trainable parameter within 3 % of the plan's (the rest is torch.save's framing). In a
    process of its own: the rank's gloo groups run collectives, and a later test's forked `vdkit check` child must
    not inherit them."""
    pytest.importorskip("megatron.core")
    import json
    import subprocess
    import sys

    from vdkit.planner.plan import make_plan

    cell = ["engine=megatron", "model=tiny_llama", "method=sft", "data=synthetic", "cluster=local", "cluster.nodes=1",
            "cluster.gpus_per_node=1", "parallelism.tp=1", "parallelism.pp=1", "parallelism.distributed_optimizer=true",
            "train.global_batch_size=1"]
    out = subprocess.run([sys.executable, "-c", _SAVE, json.dumps(cell)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    want = checkpoint_bytes(make_plan(compose(cell)).recipe, True, precision="fp32")
    assert want == 12.0  # fp32 on the CPU: the weight (4) and Adam's m and v (8), no master copy
    print(f"megatron engine checkpoint: {got['bytes']} bytes, {got['trainable']} trainable parameters, "
          f"{got['bytes'] / got['trainable']:.3f} B each")
    assert got["bytes"] / got["trainable"] == pytest.approx(want, rel=0.03)
