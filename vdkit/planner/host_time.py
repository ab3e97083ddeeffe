"""The host's (CPU's) time to issue a layer's kernels: the eager launch time of the step-time model (issue 35).

PyTorch runs eagerly: for every op the host runs Python, the dispatcher and autograd, then enqueues the kernel, and
the GPU runs it later. The host issues asynchronously, so a stage of ``L`` layers costs, per micro batch,
``max(GPU time, L x host time per layer)``: while a layer's kernels take longer on the GPU than the host takes to
issue them, the host runs ahead and its time is hidden; a layer that is small on the GPU (short rows, one micro batch
split over TP x CP) waits for the host. Host time per layer = the ops the layer launches, forward and backward (what
recompute reruns included) x the host cost of one op.

- The cost of one op: conf/calibration/hf_step_time.yaml ``stack.op_overhead_us`` (one home for the eager per-op
  cost, with its sources; the transformers regime charges the same).
- The ops: conf/calibration/step_time.yaml ``host``. megatron-core's local layer (engine=megatron,
  ``layer_kernels="local"``) is counted live on the CPU engine's real layer (vdkit.recipes.megatron.traffic
  ``layer_ops``; tests/test_host_time.py checks the table against it); the Transformer Engine layer (Bridge, NeMo
  on GPUs) is counted from the source as op-equivalents (a TE module's host time relative to a torch op's).
- Tensor parallelism's collectives are launched ops too: 2 forward and 2 backward per layer (+2 recomputed), as
  vdkit.planner.predict counts them.
- ``train.cuda_graphs=layer`` (megatron-core's per-layer graphs): a layer's forward and backward are one graph
  replay each plus the copies into the graph's input buffers (megatron-core 0.16.1 transformer/cuda_graphs.py
  ``_CudagraphReplayNode``).

- Drains (``drain_terms``): where the engine's loop reads a CUDA tensor back on the host, the host waits for the
  GPU's queue to empty, and what it issues next runs in series with the GPU until a kernel outlasts the host's
  pace: those ops are priced on top of max(GPU, host). Which read-backs a loop makes is its engine's (the spec's
  ``loop_drains``): the kit's fused engine (Bridge 0.3.1 + megatron-core 0.16.1) checks the loss for NaN / Inf every
  micro batch and each gradient bucket before its reduce-scatter every step (step_time.yaml ``host.drain``, with the
  lines); no layer reads anything back (TE 2.12's and megatron-core's
  layer paths, the CP ring included: docs/prediction.md).

What the model leaves out: the host time outside the layers where no sync exposes it (embedding, loss, optimizer
launches), and the step's tail after the gradient norm's read-back (the optimizer's launches, the loop's Python and
logging: interpreter time, not ops counted in the source).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

from vdkit.planner.dp_tail import bucket_params


def _layer_kernels(recipe) -> str:
    """The engine's layer kind (its spec's ``layer_kernels``, read through the registry): local | fused | hf."""
    from vdkit.recipes import engines

    return engines.get(recipe.engine.name).spec.layer_kernels


def graphed(recipe) -> bool:
    """Whether the run replays per-layer CUDA graphs (``train.cuda_graphs=layer`` on Transformer Engine layers)."""
    return (getattr(recipe.train, "cuda_graphs", "none") == "layer" and _layer_kernels(recipe) == "fused"
            and renders_graphs(recipe))


def layer_ops(recipe, tp: int, cp: int, recompute: str, share: float, calib: dict,
              kind: Optional[str] = None) -> Tuple[float, float]:
    """(forward, backward) ops one layer of ``recipe`` launches per micro batch on a GPU of the layout, the backward
    counting what recompute reruns (``share``: the share of layers fully recomputed, vdkit.planner.memory
    recompute_share). ``kind``: the layer kind (default: the engine's)."""
    h, m = calib["host"], recipe.model
    kind = kind or _layer_kernels(recipe)
    frozen = recipe.method.name in ("lora", "ptuning")
    lora = recipe.method.name == "lora"
    collectives = 2.0 if tp > 1 else 0.0  # per pass: predict.py's 4 per layer (+2 recomputed)
    if kind == "fused" and graphed(recipe):
        return float(h["graphed_forward"]), float(h["graphed_backward"])
    if kind == "local":
        o = h["local"]
        gqa = m.num_query_groups < m.num_attention_heads
        fwd = (o["forward"] + (o["gqa_forward"] if gqa else 0)
               + (o["gqa_query_copy"] if gqa and m.num_query_groups // tp > 1 else 0)
               + (o["lora_forward"] if lora else 0) + collectives)
        bwd = (o["backward"] + (o["frozen_backward"] if frozen else 0) + (o["gqa_backward"] if gqa else 0)
               + (o["selective_backward"] if recompute == "selective" else 0) + (o["lora_backward"] if lora else 0)
               + collectives)
    else:  # Transformer Engine's layer (fused): op-equivalents from the source
        linear = float(h["te_linear_forward"]["fp8" if recipe.train.precision == "fp8" else "bf16"])
        lora_f, lora_b = (h["local"]["lora_forward"], h["local"]["lora_backward"]) if lora else (0, 0)
        ring = cp if cp > 1 else 0
        fwd = h["te_linears"] * linear + h["te_other_forward"] + ring * h["cp_step_forward"] + lora_f + collectives
        bwd = (h["te_linears"] * linear * (1 if frozen else 2) + h["te_other_backward"] + ring * h["cp_step_backward"]
               + lora_b + collectives)
    return float(fwd), float(bwd + share * fwd)


def op_cost_s() -> float:
    """Host seconds to issue one op eagerly (hf_step_time.yaml ``stack.op_overhead_us``, the one home)."""
    from vdkit.planner.calibration import load

    return float(load("hf_step_time")["stack"]["op_overhead_us"]) * 1e-6


def stage_host_s(recipe, tp: int, cp: int, layers: int, recompute: str, share: float, calib: dict) -> float:
    """Host seconds to issue one micro batch's forward and backward of a stage's ``layers`` layers."""
    fwd, bwd = layer_ops(recipe, tp, cp, recompute, share, calib)
    return layers * (fwd + bwd) * op_cost_s()


def stage_terms(recipe, tp: int, cp: int, layers: int, recompute: str, share: float, calib: dict,
                gpu_mb: float, micro: int) -> Tuple[float, dict]:
    """(the host-bound seconds a micro batch adds to its stage, the step's host parts): the stage costs
    ``max(gpu_mb, host)`` per micro batch, ``gpu_mb`` the GPU's seconds of it (vdkit.planner.predict)."""
    host = stage_host_s(recipe, tp, cp, layers, recompute, share, calib)
    bound = max(0.0, host - gpu_mb)
    fwd, bwd = (calib["host"]["graphed_forward"], calib["host"]["graphed_backward"])
    return bound, {"host_s": host, "host_issue_s": micro * host, "host_bound_s": micro * bound,
                   "host_graphed_s": micro * layers * (fwd + bwd) * op_cost_s()}


def step_note(step, recipe) -> list:
    """The plan's note when the host bounds the step (its parts, vdkit.planner.predict): how much, and for an eager
    run on an engine that renders per-layer CUDA graphs, what ``train.cuda_graphs=layer`` would issue instead."""
    q = step.parts
    bound = q.get("host_bound_s", 0.0)
    if bound <= 0.0:
        return []
    line = (f"host-bound: issuing the layers' kernels takes {q['host_issue_s']:.3g} s/step of CPU time, "
            f"{bound:.3g} s/step more than the GPU's work (in the overhead; vdkit.planner.host_time)")
    if not graphed(recipe) and _layer_kernels(recipe) == "fused" and could_graph(recipe):  # eager, could graph
        line = (f"host-bound eager: train.cuda_graphs=layer would issue each layer as one graph replay "
                f"({q['host_graphed_s']:.3g} s/step of CPU time) and save up to {bound:.3g} s/step; " + line)
    return [line]


def renders_graphs(recipe) -> bool:
    """Whether the recipe's engine renders ``train.cuda_graphs=layer`` (its spec's ``cuda_graphs``: megatron-core's
    cuda_graph_impl, read through the registry)."""
    from vdkit.recipes import engines

    return "layer" in engines.get(recipe.engine.name).spec.cuda_graphs


def could_graph(recipe) -> bool:
    """Whether the door would take ``train.cuda_graphs=layer`` for this eager recipe (vdkit.rules.cuda_graphs)."""
    from dataclasses import replace

    from vdkit.errors import UserError
    from vdkit.rules.cuda_graphs import check_cuda_graphs

    try:
        check_cuda_graphs(replace(recipe, train=replace(recipe.train, cuda_graphs="layer")))
    except UserError:
        return False
    return renders_graphs(recipe)


def loop_drains(recipe) -> tuple:
    """The host read-backs the recipe's engine's training loop makes (its spec's ``loop_drains``, read through the
    registry; names from vdkit.composition.schema.LOOP_DRAINS)."""
    from vdkit.recipes import engines

    return engines.get(recipe.engine.name).spec.loop_drains


def drain_terms(recipe, micro: int, trainable_held: float, dp: int, distributed_optimizer: bool,
                calib: dict) -> Tuple[float, dict]:
    """(seconds a step runs in series with the GPU after the loop's host syncs, the plan's parts): per micro batch
    the loss checks' ops, per gradient bucket the DDP checks' ops (step_time.yaml ``host.drain``), x the eager cost of
    an op, for the read-backs the engine's loop makes (:func:`loop_drains`); ``trainable_held``: the trainable
    parameters one GPU holds. 0 for engines whose loop has none."""
    drains = loop_drains(recipe)
    if not drains:
        return 0.0, {}
    d = calib["host"]["drain"]
    ops, parts = (micro * d["loss"] if "loss" in drains else 0), {}
    if "grad_bucket" in drains:
        # buckets only with overlap_grad_reduce, which Bridge's render ties to the distributed optimizer
        size = bucket_params(calib, dp)
        buckets = max(1, math.ceil(trainable_held / size)) if distributed_optimizer else 1
        ops, parts = ops + buckets * d["grad_bucket"], {"grad_buckets": buckets}
    seconds = ops * op_cost_s()
    return seconds, {"drain_s": seconds, **parts}
