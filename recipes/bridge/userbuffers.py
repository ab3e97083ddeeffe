"""``parallelism.tp_comm_overlap_cfg`` rendered for Megatron-Bridge: a conf/tp_overlap/ file (Transformer Engine's
userbuffers settings per GEMM) as Bridge's ``comm_overlap.tp_comm_overlap_cfg``; the step-time model prices the same
file (vdkit.planner.tp_overlap)."""
from __future__ import annotations

from typing import Dict

_T = "_target_"
# Megatron-Bridge 0.3.1's dataclass per userbuffers method (training/comm_overlap.py), and its boolean fields
_UB_CLASSES = {"bulk": "BulkOverlapCfg", "pipeline": "PipelineOverlapCfg", "ring_exchange": "RingExchangeOverlapCfg"}
_UB_FLAGS = ("set_sm_margin", "fp8_buf", "atomic_gemm", "aggregate")


def ub_overlap_cfg(name: str) -> Dict:
    """``parallelism.tp_comm_overlap_cfg``'s conf/tp_overlap/ file as Bridge's ``TransformerLayerTPOverlapCfg``: one
    dataclass per GEMM with the file's keys (checked at the door: vdkit.composition.conftree.tp_overlap_source), which
    Bridge hands to Transformer Engine's initialize_ub as its ub_cfgs (comm_overlap.py CommOverlapConfig.setup)."""
    from vdkit.composition.conftree import tp_overlap_source

    mod = "megatron.bridge.training.comm_overlap."
    return {_T: mod + "TransformerLayerTPOverlapCfg",
            **{gemm: {_T: mod + _UB_CLASSES[s["method"]],
                      **{k: bool(v) if k in _UB_FLAGS else v for k, v in s.items() if k != "method"}}
               for gemm, s in tp_overlap_source(name).items()}}
