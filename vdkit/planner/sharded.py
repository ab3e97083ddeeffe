"""The memory model of sharded data parallelism (FSDP full-shard, DeepSpeed ZeRO-3) and its plan.

With ``parallelism.sharding=fsdp|zero3`` every rank is a data-parallel rank (TP = PP = 1) and the
model state is divided over the shard group (all N ranks). Per GPU, in bytes (1 GB = 1e9):

- sharded model state, mixed precision with Adam, ``sharded_bytes`` = 16 per trainable parameter / N:
  FSDP (torch's MixedPrecision over fp32 shards, as the HF Trainer runs it): fp32 parameter 4 +
  fp32 gradient 4 + Adam m and v 8; ZeRO-3 (Rajbhandari et al. 2020, "2 + 2 + K" with K = 12):
  bf16 parameter 2 + bf16 gradient 2 + fp32 master copy, m and v 12. Frozen parameters (PEFT) keep
  only their parameter bytes.
- the gathered units: FSDP / ZeRO-3 materialise one decoder block at a time in bf16, prefetch the
  next one, and hold the gathered block's bf16 gradient before the reduce-scatter:
  ``gathered_layers`` x 2 bytes + 2 bytes per block parameter; the root unit (embeddings, positions,
  final norm, untied output) stays gathered from forward to backward: 2 + 2 bytes per parameter.
- activations at the recipe's micro batch b and sequence s, per layer: what transformers' decoder layers save
  for backward in bf16 weights (fp32 on a CPU), tensor by tensor, with ``engine.attention`` sdpa (no s^2 term) or
  eager (the fp32 softmax and its bf16 cast) - vdkit.planner.hf_activations, measured with saved-tensor hooks on
  the engine's model, the formula the DDP plan counts too. Gradient checkpointing (``recompute=full``) keeps only
  each block's input (sbh, 2 bytes in bf16) plus one block's working set; with ``recompute_num_layers`` N < L only
  N layers are checkpointed, the others keep all. The logits: bf16 plus the fp32 upcast and its gradient for the
  loss, 10 s b V.
- CPU offload (``parallelism.cpu_offload``): the sharded state lives in host memory (reported per
  node), the GPU keeps the gathered units and activations.
- unsharded gradients during gradient accumulation (``accumulation_grad_bytes``): the HF Trainer runs
  FSDP's ``no_sync`` on every micro batch but a step's last, so each rank keeps the whole model's bf16
  gradient until the reduce-scatter (counted when gradient accumulation > 1); ZeRO-3 reduces every
  micro batch and keeps none.
- overhead: the cluster's ``memory_overhead_gb``, else memory.yaml's ``overhead_gb`` (context,
  communicator buffers, fragmentation) - the same rule as vdkit.planner.memory.

Every number above is in conf/calibration/memory.yaml.
"""
from __future__ import annotations

from typing import Optional

from vdkit.planner.activations import layer_bytes
from vdkit.planner.arch import param_counts, trainable_params
from vdkit.planner.lora_targets import of as lora_of
from vdkit.planner.calibration import HEADROOM, is_borderline, memory, overhead_gb
from vdkit.errors import UserError
from vdkit.composition.plan_types import Memory, Plan, Prediction
from vdkit.composition.schema import GB, Recipe
from vdkit.planner.memory import activation_bytes, run_precision
from vdkit.planner.tokens import full_rows

# The byte counts (STATE / FROZEN / accumulation gradients / gathered blocks / logits) are data:
# conf/calibration/memory.yaml, read here through vdkit.planner.calibration.
LIBRARY = {"fsdp": "torch FSDP full-shard", "zero3": "DeepSpeed ZeRO-3"}


def activation_bytes_per_layer(r: Recipe, recompute: str = "none") -> float:
    """Stored activations of one decoder block for one micro batch (see the module docstring): transformers' layers
    as the reference engine runs them, the one formula every strategy's plan counts (vdkit.planner.activations,
    kernels ``hf``) - bf16 weights (no autocast), fp32 on a CPU cluster."""
    m, t, meth = r.model, r.train, r.method
    s = t.seq_length + (meth.ptuning_virtual_tokens if meth.name == "ptuning" else 0)
    return layer_bytes(m, s, t.micro_batch_size, 1, False, recompute, "hf", activation_bytes(run_precision(r)),
                       peft=meth.name if r.is_peft else "", lora_dim=meth.lora_adapter_dim,
                       attention=r.engine.attention, lora_targets=lora_of(r))


def state_bytes(kind: str):
    """(weights, gradients, optimizer) bytes per trainable parameter of ``kind`` (fsdp | zero3), unsharded."""
    return tuple(float(x) for x in memory()["sharded_bytes"][kind])


def checkpoint_gb(r: Recipe) -> float:
    """The checkpoint's size (GB): each trainable parameter's own copy and its optimizer state (``sharded_bytes``:
    FSDP's fp32 parameter + m + v, 12; ZeRO-3's bf16 parameter + fp32 master + m + v, 14)."""
    w, _, o = state_bytes(r.parallelism.sharding)
    return trainable_params(r) * (w + o) / GB


def accumulation_gradient_bytes(r: Recipe) -> float:
    """Bytes of unsharded gradients a rank keeps while it accumulates (0 without accumulation)."""
    t = r.train
    if t.global_batch_size // (t.micro_batch_size * r.world_size) <= 1:
        return 0.0
    trainable = min(trainable_params(r), param_counts(r.model).total)
    return float(memory()["accumulation_grad_bytes"][r.parallelism.sharding]) * trainable


def estimate_sharded_memory(r: Recipe, recompute: str, cpu_offload: Optional[bool] = None):
    """Per-GPU memory (a vdkit.composition.plan_types.Memory) of sharded data parallelism, and host GB per node."""
    kind = r.parallelism.sharding
    offload = r.parallelism.cpu_offload if cpu_offload is None else cpu_offload
    m, t = r.model, r.train
    n = r.world_size
    counts = param_counts(m)
    total = counts.total
    trainable = min(trainable_params(r), total)
    frozen = total - trainable if r.is_peft else 0
    consts = memory()
    w_b, g_b, o_b = state_bytes(kind)
    weights = (trainable * w_b + frozen * float(consts["sharded_frozen_bytes"][kind])) / n
    grads = trainable * g_b / n
    optim = trainable * o_b / n
    host = 0.0
    if offload:
        host = (weights + grads + optim) * r.cluster.gpus_per_node
        weights = grads = optim = 0.0
    grads += accumulation_gradient_bytes(r)  # on the GPU even with offload (the Trainer's no_sync)
    gathered = (float(consts["gathered_layers"]) * 2.0 + 2.0) * counts.per_layer + 4.0 * counts.outside_layers
    per_layer = activation_bytes_per_layer(r)
    s, b = t.seq_length, t.micro_batch_size
    if recompute == "full":  # checkpointed layers keep their input; the rest (recompute_num_layers < L) keep all
        kept = m.num_layers - (r.parallelism.recompute_num_layers or m.num_layers)
        acts = (m.num_layers - kept) * activation_bytes_per_layer(r, "full") + kept * per_layer + per_layer
    else:
        acts = m.num_layers * per_layer
    acts += float(consts["logit_bytes"]) * s * b * m.vocab_size
    mem = Memory(weights_gb=(weights + gathered) / GB, gradients_gb=grads / GB, optimizer_gb=optim / GB,
                 activations_gb=acts / GB, overhead_gb=overhead_gb(r.cluster))
    return mem, host / GB


def _breakdown(mem, r: Recipe, recompute: str) -> str:
    cap = r.cluster.gpu_memory_gb
    return (f"{mem.total_gb:.1f} GB per GPU ({LIBRARY[r.parallelism.sharding]} over {r.world_size} GPUs, "
            f"recompute {recompute}: weights + gathered blocks {mem.weights_gb:.1f} + gradients "
            f"{mem.gradients_gb:.1f} + optimizer {mem.optimizer_gb:.1f} + activations {mem.activations_gb:.1f} "
            f"(MBS {r.train.micro_batch_size} x seq {r.train.seq_length}) + overhead {mem.overhead_gb:.1f}) "
            f"{'<=' if mem.total_gb <= cap else '>'} {cap:g} GB")


def make_sharded_plan(recipe: Recipe) -> Plan:
    """The plan of a sharded data-parallel recipe: TP = PP = 1, DP = world size, the memory above.

    Recomputation: the pinned ``parallelism.recompute``, else none, else full (gradient
    checkpointing) when none does not leave the planner's headroom (HEADROOM of the GPU; none is kept when
    full does not leave it either but none fits). An infeasible plan says by how much it misses and what
    would fit (gradient checkpointing, CPU offload, more nodes).
    """
    p, t = recipe.parallelism, recipe.train
    if (p.tp or 1) != 1 or (p.pp or 1) != 1 or (p.vp or 1) != 1:
        raise UserError(f"parallelism.sharding={p.sharding} is data parallel only; tp={p.tp} pp={p.pp} vp={p.vp}",
                        "unset parallelism.tp / pp / vp (or set them to 1)")
    n = recipe.world_size
    if t.global_batch_size % (t.micro_batch_size * n):
        raise UserError(f"train.global_batch_size={t.global_batch_size} is not a multiple of MBS x DP = "
                        f"{t.micro_batch_size} x {n}",
                        f"use train.global_batch_size={t.micro_batch_size * n * max(1, t.global_batch_size // (t.micro_batch_size * n))}")
    cap = recipe.cluster.gpu_memory_gb
    options = [p.recompute] if p.recompute else ["none", "full"]
    tried = [(rc, estimate_sharded_memory(recipe, rc)) for rc in options]
    fitting = [(rc, mh) for rc, mh in tried if mh[0].total_gb <= cap]
    # the cheapest recompute that leaves the planner's headroom (as an automatic layout must), else one that fits
    roomy = [(rc, mh) for rc, mh in fitting if mh[0].total_gb <= cap * (1 - HEADROOM)]
    rc, (mem, host) = (roomy or fitting)[0] if fitting else min(tried, key=lambda x: x[1][0].total_gb)
    feasible = bool(fitting)
    borderline = is_borderline(mem.total_gb, cap)
    notes = [f"sharded data parallel: {LIBRARY[p.sharding]}, shard group {n} GPUs"]
    if host:
        notes.append(f"CPU offload: {host:.0f} GB of host memory per node for the sharded state")
    if feasible:
        notes.append(_largest_micro_batch_note(recipe, rc))
    reason = None
    if feasible:
        notes.append("memory: " + _breakdown(mem, recipe, rc))
        if borderline:
            notes.append(f"borderline: {mem.total_gb:.1f} of {cap:g} GB per GPU")
    else:
        reason = f"needs {_breakdown(mem, recipe, rc)}, short by {mem.total_gb - cap:.1f} GB"
        reason += _what_would_fit(recipe, rc)
    resolved = recipe.with_parallelism(tp=1, pp=1, vp=1, sequence_parallel=False, recompute=rc,
                                       distributed_optimizer=True)
    prediction = _prediction(resolved, rc) if feasible else None
    if prediction is not None:
        parts = prediction.step.parts
        notes.append(f"prediction: the transformers-engine regime (vdkit.planner.predict_hf): {parts['tokens_per_micro_batch']:.0f} "
                     f"tokens per micro batch (rows padded to {parts['padded_row']:.0f}, {parts['mean_row']:.0f} "
                     f"on average), collectives at {parts['bus_gb_s']:.0f} GB/s bus bandwidth")
        notes.append(f"tokens: {parts['tokens_source']}")
        if p.sharding in FLOOR_STACKS and not full_rows(resolved):
            notes.append(FLOOR_NOTE)
        if borderline:
            notes.append(MEMORY_PRESSURE_NOTE)
    if feasible and prediction is None:
        notes.append(_why_no_prediction(recipe))
    return Plan(recipe=resolved, dp=n, grad_accum=t.global_batch_size // (t.micro_batch_size * n), memory=mem,
                feasible=feasible, borderline=borderline, reason=reason, checkpoint_gb=checkpoint_gb(recipe),
                layout_source="pinned", notes=tuple(notes), prediction=prediction,
                params=param_counts(recipe.model).total, trainable_params=trainable_params(recipe))


# Near the card's memory the caching allocator runs out of free cached blocks and frees and retries
# (torch.cuda.memory_stats "num_alloc_retries"; torch 2.0's FSDP has limit_all_gathers=False, so the CPU issues
# all-gathers ahead of the GPU and over-allocates); DeepSpeed ZeRO-3 warns of "allocator cache flushes ... when
# there is high memory pressure and is detrimental to performance". The step-time model has no term for it.
MEMORY_PRESSURE_NOTE = ("prediction: near the GPU's memory the caching allocator frees and retries (num_alloc_retries; "
                        "DeepSpeed's 'allocator cache flushes ... detrimental to performance'), a cost the model "
                        "leaves out: expect slower than predicted, or lower train.micro_batch_size")


# Every published run of the HF Trainer + torch FSDP stack on unpacked fine-tuning rows the transformers regime is
# checked against took longer than it predicts (benchmarks/hf_efficiency.py: the fsdp_unpacked range), so the plan
# says how to read it; full-row FSDP plans (pretraining, packed) are centred on their public runs (the fsdp range)
# and ZeRO-3 plans carry no such note.
FLOOR_STACKS = ("fsdp",)
FLOOR_NOTE = ("prediction: read it as a floor - every published HF Trainer + FSDP run on unpacked rows it was checked "
              "against took longer (its range says by how much; docs/prediction.md)")


def largest_micro_batch(r: Recipe, recompute: str, fraction: float, limit: int = 256) -> int:
    """The largest micro batch whose memory stays within ``fraction`` of the GPU (0: not even 1), with
    the per-GPU batch kept (GBS = MBS x GPUs x the recipe's gradient accumulation)."""
    import dataclasses

    t, n = r.train, r.world_size
    accum = max(1, t.global_batch_size // (t.micro_batch_size * n))
    cap = r.cluster.gpu_memory_gb * fraction
    best = 0
    for b in range(1, limit + 1):
        trial = dataclasses.replace(r, train=dataclasses.replace(t, micro_batch_size=b, global_batch_size=b * n * accum))
        if estimate_sharded_memory(trial, recompute)[0].total_gb > cap:
            break
        best = b
    return best


def _largest_micro_batch_note(r: Recipe, recompute: str) -> str:
    """Memory decides the micro batch: the largest that leaves the planner's headroom."""
    b = largest_micro_batch(r, recompute, 1 - HEADROOM)
    return (f"micro batch: the largest that leaves {HEADROOM:.0%} of the GPU free at recompute {recompute} is "
            f"{b} (train.micro_batch_size={r.train.micro_batch_size}; activations counted at the full "
            f"train.seq_length={r.train.seq_length})")


def _why_no_prediction(r: Recipe) -> str:
    from vdkit.planner.predict_hf import why_not_hf

    return f"no step-time prediction: {why_not_hf(r)}"  # a sharded plan is data parallel: the GPU or the fabric


def _prediction(r: Recipe, recompute: str) -> Optional[Prediction]:
    """The transformers-engine regime of the step-time model (vdkit.planner.predict_hf), where it knows the GPU."""
    from vdkit.planner.predict_hf import predict_hf_step

    from vdkit.planner.interval import attach

    step = predict_hf_step(r, recompute)
    # with its range, as every plan's: where the published runs of this stack fell (vdkit.planner.interval)
    return None if step is None else attach(Prediction(step, r.train.target_steps, r.world_size), r)


def _what_would_fit(r: Recipe, rc: str) -> str:
    """What decides an infeasible sharded plan: gradient checkpointing, CPU offload, more nodes."""
    import dataclasses

    cap, hints = r.cluster.gpu_memory_gb, []
    if rc != "full":
        full, _ = estimate_sharded_memory(r, "full")
        hints.append(f"with gradient checkpointing (parallelism.recompute=full) {full.total_gb:.1f} GB: "
                     + ("fits" if full.total_gb <= cap else "still does not fit"))
    if not r.parallelism.cpu_offload:
        off, host = estimate_sharded_memory(r, rc, cpu_offload=True)
        hints.append(f"with CPU offload (parallelism.cpu_offload=true) {off.total_gb:.1f} GB and {host:.0f} GB "
                     "host memory per node: " + ("fits" if off.total_gb <= cap else "still does not fit"))
    c = r.cluster
    for nodes in range(c.nodes + 1, c.max_nodes + 1):
        t = r.train
        gbs = t.global_batch_size * nodes // c.nodes  # the same per-GPU batch on more GPUs
        bigger = dataclasses.replace(r, cluster=dataclasses.replace(c, nodes=nodes),
                                     train=dataclasses.replace(t, global_batch_size=gbs))
        mem, _ = estimate_sharded_memory(bigger, rc)
        if mem.total_gb <= cap:
            hints.append(f"it fits on {nodes} nodes ({mem.total_gb:.1f} GB per GPU): cluster.nodes={nodes}")
            break
    return "; " + "; ".join(hints) if hints else ""

