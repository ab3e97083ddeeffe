"""`vdkit check` for engine=bridge, TP communication overlap with a frozen base: does every rank's input gradient
get summed over TP?

With userbuffers on (``model.tp_comm_overlap``: Bridge's CommOverlapConfig turns it on for TP >= 2 with sequence
parallelism), megatron-core hands each column-parallel norm + linear (QKV and fc1) Transformer Engine's
``ub_bulk_wgrad`` = ``tp_comm_bulk_wgrad`` and ``ub_overlap_rs_dgrad`` = ``tp_comm_overlap_rs_dgrad`` unless that
layer's overlap is disabled (megatron/core/extensions/transformer_engine.py:782-804), and TE keeps the bulk wgrad
overlap only without the dgrad reduce-scatter overlap (TE 2.12 module/layernorm_linear.py:1211-1219). With the bulk
wgrad overlap on, TE 2.12's backward writes the input gradient into the wgrad userbuffer (727-728), takes its own
chunk of it (755-756) instead of the NCCL reduce-scatter (757-766), and reduce-scatters it only inside the wgrad
GEMM's bulk overlap (876-879, 937-941), which runs only ``if ctx.requires_wgrad`` (781). A PEFT job freezes every
base weight (Bridge's peft/base.py), so each rank would keep its own partial sum of the QKV / fc1 input gradient:
wrong gradients for every layer below, and nothing fails.

The overlap is set up as the container does it (Bridge's ``CommOverlapConfig.setup`` with Transformer Engine
present; this CPU has none, where Bridge would switch the overlap off) on a copy of the config as loaded.
"""
from __future__ import annotations

import contextlib
import copy
import logging
from typing import Optional, Tuple

# (name TE's userbuffers give the layer, megatron-core's switch that disables its AG / dgrad RS overlap)
FROZEN_COLUMN_LAYERS = (("qkv", "tp_comm_overlap_disable_qkv"), ("fc1", "tp_comm_overlap_disable_fc1"))


def _on(model) -> bool:
    """Userbuffers in the job: the overlap on, TP >= 2, sequence parallelism (what Bridge's setup keeps)."""
    return bool(model.tp_comm_overlap and model.tensor_model_parallel_size > 1 and model.sequence_parallel)


def unreduced(model) -> list:
    """The column-parallel norm + linear layers (``qkv``, ``fc1``) whose input gradient TE 2.12 reduce-scatters only
    inside the weight-gradient GEMM's bulk overlap, from ``model`` (megatron-core's TransformerConfig as Bridge's
    setup leaves it); empty without userbuffers (TP 1, no sequence parallelism, overlap off)."""
    if not _on(model):
        return []
    out = []
    for name, disable in FROZEN_COLUMN_LAYERS:
        rs_dgrad = bool(model.tp_comm_overlap_rs_dgrad) and not getattr(model, disable, False)
        if model.tp_comm_bulk_wgrad and not rs_dgrad:
            out.append(name)
    return out


@contextlib.contextmanager
def _te_present():
    """Bridge's comm_overlap module told Transformer Engine is there, as in the image; its warnings (the job's own
    start-up lines, e.g. "No overlap config provided") held back."""
    import megatron.bridge.training.comm_overlap as co

    real, co.HAVE_TE = co.HAVE_TE, True
    held = logging.root.manager.disable
    logging.disable(max(held, logging.WARNING))
    try:
        yield
    finally:
        co.HAVE_TE = real
        logging.disable(held)


def as_the_container_sets_it(cfg):
    """A copy of ``cfg.model`` (a loaded ConfigContainer) with Bridge's CommOverlapConfig setup applied as the
    container applies it (training/config.py runtime_config_update); the model as loaded where there is none."""
    model = copy.deepcopy(cfg.model)
    if cfg.comm_overlap is not None:
        overlap = copy.deepcopy(cfg.comm_overlap)
        with _te_present():
            overlap.finalize()
            overlap.setup(model, None, None)  # the optimizer / DDP part (DP overlap) is not read here
    return model


def _flags(model) -> str:
    return (f"tp_comm_bulk_wgrad={model.tp_comm_bulk_wgrad}, tp_comm_bulk_dgrad={model.tp_comm_bulk_dgrad}, "
            f"tp_comm_overlap_rs_dgrad={model.tp_comm_overlap_rs_dgrad}")


def defect(cfg, model=None) -> Optional[Tuple[str, str, str]]:
    """(what, setting, fix) where a loaded ``cfg`` (before Bridge's runtime update) is a PEFT job whose frozen QKV /
    fc1 would keep an un-reduced input gradient under TP overlap; None otherwise. ``model``: the model as
    :func:`as_the_container_sets_it` returns it, where the caller has it."""
    model = model if model is not None else as_the_container_sets_it(cfg)
    bad = unreduced(model) if cfg.peft is not None else []
    if not bad:
        return None
    return (f"TP communication overlap with a frozen base ({type(cfg.peft).__name__}) and {_flags(model)}: Transformer "
            f"Engine 2.12 reduce-scatters the {' / '.join(bad)} input gradient only inside the weight-gradient GEMM's "
            "bulk overlap, which a frozen weight never runs (module/layernorm_linear.py:755-756, 781), so each TP rank "
            "keeps its own partial sum: wrong gradients for every layer below, silently", "model.tp_comm_bulk_wgrad",
            "set model.tp_comm_bulk_wgrad: false and model.tp_comm_bulk_dgrad: false (what vdkit render writes for "
            "PEFT), or re-render")


def check(cfg, rep) -> None:
    """The finding for a loaded ``cfg`` (before Bridge's runtime update) where the overlap is on: :func:`defect`, or
    a checked line saying which GEMM carries the input-gradient reduce-scatter."""
    model = as_the_container_sets_it(cfg)
    if not _on(model):
        return
    found = defect(cfg, model)
    if found:
        rep.defect(*found)
    elif cfg.peft is None:
        rep.checked(f"TP communication overlap (userbuffers, TP {model.tensor_model_parallel_size}, {_flags(model)}): "
                    "every weight trains, so every input-gradient reduce-scatter runs (beside the weight-gradient GEMM "
                    "or with NCCL)")
    else:
        rep.checked(f"TP communication overlap with a frozen base ({type(cfg.peft).__name__}, {_flags(model)}): "
                    "Transformer Engine reduce-scatters the QKV and fc1 input gradients (NCCL, or the dgrad GEMM's "
                    "overlap)")
