"""Bridge LoRA under TP communication overlap: the rendered job reduce-scatters the frozen base's input gradients.

Transformer Engine 2.12 reduce-scatters a column-parallel norm + linear's input gradient only inside its
weight-gradient GEMM's bulk overlap, which a frozen weight never runs (vdkit.recipes.bridge.runcheck_tp_overlap). So the
render switches megatron-core's bulk overlaps off for PEFT, and `vdkit check` refuses a bridge.yaml that turns them
back on (planted end to end in tests/test_check.py). A CPU cannot run userbuffers: these tests hold what the render
writes and the rule check applies.
"""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.planner.plan import make_plan

LORA_TP2 = ["engine=bridge", "model=llama2_7b", "method=lora", "data=synthetic", "parallelism.tp=2", "parallelism.pp=1"]
BULK = ("tp_comm_bulk_wgrad", "tp_comm_bulk_dgrad")


def _rendered(overrides):
    from vdkit.recipes import bridge
    from vdkit.recipes.bridge.config import bridge_config

    plan = make_plan(compose(overrides))
    return bridge_config(plan, "/r", "/r/checkpoints", in_container=bridge.in_container(plan))


@pytest.mark.parametrize("extra, off", [([], True),  # LoRA with the overlap on: both bulk overlaps off
                                        (["parallelism.sequence_parallel=false"], False),  # no overlap: not written
                                        (["method=pretrain"], False)])  # every weight trains: megatron's defaults
def test_peft_with_the_overlap_renders_the_bulk_overlaps_off(extra, off):
    cfg = _rendered(LORA_TP2 + extra)
    assert ("comm_overlap" in cfg) is (extra != ["parallelism.sequence_parallel=false"])
    assert [cfg["model"].get(k) for k in BULK] == ([False, False] if off else [None, None])


@pytest.mark.parametrize("flags, unreduced", [
    ({}, ["qkv", "fc1"]),  # megatron-core's defaults: bulk wgrad on for both
    ({"tp_comm_bulk_wgrad": False, "tp_comm_bulk_dgrad": False}, []),  # what the kit renders for PEFT
    # NVIDIA's NeMo 2 LoRA flags (fc1's dgrad RS overlapped, QKV's overlap disabled), bulk wgrad left on: fc1 is
    # reduce-scattered in its dgrad GEMM, the QKV still only in the wgrad GEMM a frozen weight never runs
    ({"tp_comm_bulk_dgrad": False, "tp_comm_overlap_rs_dgrad": True, "tp_comm_overlap_disable_qkv": True}, ["qkv"]),
    ({"tp_comm_overlap_rs_dgrad": True}, []),  # the dgrad GEMM's RS for both: TE drops the bulk overlaps
    ({"sequence_parallel": False}, [])])  # no userbuffers (Bridge turns the overlap off)
def test_the_layers_whose_frozen_input_gradient_te_leaves_unreduced(flags, unreduced):
    """The rule `vdkit check` applies (recipes/bridge/runcheck_tp_overlap.py, end to end in tests/test_check.py) on
    megatron-core's own config and defaults (extensions/transformer_engine.py 782-804, TE 2.12 1211-1219)."""
    from megatron.core.model_parallel_config import ModelParallelConfig

    from vdkit.recipes.bridge.runcheck_tp_overlap import unreduced as rule

    model = ModelParallelConfig(**{"tensor_model_parallel_size": 2, "sequence_parallel": True, "tp_comm_overlap": True,
                                   **flags})
    assert rule(model) == unreduced
