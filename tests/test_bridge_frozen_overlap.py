"""Bridge LoRA under TP communication overlap: the rendered job reduce-scatters the frozen base's input gradients.

Transformer Engine 2.12 reduce-scatters a column-parallel norm + linear's input gradient only inside its
weight-gradient GEMM's bulk overlap, which a frozen weight never runs (vdkit.recipes.bridge.runcheck_tp). So the
render switches megatron-core's bulk overlaps off for PEFT, and `vdkit check` refuses a bridge.yaml that turns them
back on. A CPU cannot run userbuffers: these tests hold what the render writes and what check refuses.
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


def _loaded(tmp_path, cfg, **model):
    """``cfg`` (a rendered dict) with ``model`` keys set (None: removed), through Bridge's own loader."""
    from vdkit.recipes.bridge.config import to_yaml
    from vdkit.recipes.bridge.runcheck import _import_bridge

    _import_bridge()
    from megatron.bridge.training.config import ConfigContainer

    m = {k: v for k, v in {**cfg["model"], **model}.items() if v is not None}
    path = tmp_path / f"bridge{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(to_yaml({**cfg, "model": m}))
    return ConfigContainer.from_yaml(str(path))


def test_check_passes_the_render_and_refuses_a_planted_bulk_wgrad(tmp_path):
    from vdkit.recipes.bridge import runcheck_tp
    from vdkit.run.jobcheck import DEFECT, Report

    lora, pretrain = _rendered(LORA_TP2), _rendered(LORA_TP2 + ["method=pretrain"])

    def lines(cfg, **model):
        rep = Report(tmp_path)
        runcheck_tp.check(_loaded(tmp_path, cfg, **model), rep)
        return rep.lines

    (as_rendered,) = lines(lora)
    assert as_rendered[0] == "checked" and "frozen base (LoRA" in as_rendered[1]
    # planted: megatron-core's default back (the key removed), and set by hand - both QKV and fc1 left partial
    for planted in ({"tp_comm_bulk_wgrad": None}, {"tp_comm_bulk_wgrad": True}):
        ((kind, text),) = lines(lora, **planted)
        assert kind == DEFECT and "qkv / fc1 input gradient" in text and "model.tp_comm_bulk_wgrad" in text
    # NVIDIA's NeMo LoRA flags (fc1's dgrad RS overlapped, QKV's overlap disabled) with bulk wgrad left on: fc1 is
    # reduce-scattered in its dgrad GEMM, the QKV still is not
    ((kind, text),) = lines(lora, tp_comm_bulk_wgrad=True, tp_comm_overlap_rs_dgrad=True, tp_comm_overlap_disable_qkv=True)
    assert kind == DEFECT and "the qkv input gradient" in text
    ((kind, text),) = lines(pretrain)  # every weight trains: the wgrad GEMM's bulk overlap carries the RS
    assert kind == "checked" and "every weight trains" in text
