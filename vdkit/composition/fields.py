"""The recipe's field rules: each field's allowed values and its obvious pairs, checked once composition has built the
Recipe (:func:`vdkit.composition.config.compose`) or a run directory's recipe is read back (vdkit.run.rundir).
Ranges live in :data:`vdkit.rules.numbers.DOMAINS` (checked before these), layout rules in vdkit.planner.layout.
"""
from __future__ import annotations

import math

from vdkit.errors import UserError
from vdkit.launch.fabric import NCCL_DEBUG_LEVELS, check_names
from vdkit.composition.limits import MAX_SEQ_LENGTH, MAX_TRAIN_STEPS, check_node_cpus
from vdkit.composition.schema import ARCHS, ATTENTIONS, METHODS, PRECISIONS, RUN_MODES, SHARDINGS, ModelCfg, Recipe

# ----------------------------------------------------------------------------- allowed values
def _engine_names() -> tuple:
    from vdkit.recipes.engines import names

    return names()


PEFT_SCHEMES = {"sft": "none", "lora": "lora", "ptuning": "ptuning", "pretrain": "none"}
RECOMPUTE = ("none", "selective", "full")
MPI_TYPES = ("pmix", "pmi2", "pmi1", "none")
DATA_KINDS = ("sft", "pretrain")
TRANSPORTS = ("ib", "roce", "tcp")
NORMS = ("rmsnorm", "layernorm")
ACTIVATIONS = ("swiglu", "relu", "gelu")
POSITION_EMBEDDINGS = ("rope", "learned")
TOKENIZERS = ("sentencepiece", "huggingface", "byte-level")


def _check(ok: bool, what: str, fix: str) -> None:
    if not ok:
        raise UserError(what, fix)


def validate_fields(r: Recipe, host: bool = True) -> None:
    """Rules on single fields and their obvious pairs, after :func:`vdkit.rules.check_recipe` (so every
    field of :data:`vdkit.rules.numbers.DOMAINS` is already in its range: its rule lives there, not here).
    Layout rules live in vdkit.planner.layout. ``host=False`` leaves out the rules that read this machine
    (its CPU count): a run directory read back elsewhere (vdkit.run.rundir.load_recipe) is not refused for it."""
    c, t, m = r.cluster, r.train, r.method
    _check(m.name in METHODS, f"method.name={m.name!r} is not a method", "use one of " + ", ".join(METHODS))
    _check(m.peft_scheme == PEFT_SCHEMES[m.name],
           f"method.peft_scheme={m.peft_scheme!r} does not match method {m.name}",
           f"set method.peft_scheme={PEFT_SCHEMES[m.name]}")
    engines = _engine_names()  # the registry now (a test or plugin may have added a line)
    _check(r.engine.name in engines, f"engine.name={r.engine.name!r} is not an engine",
           "use " + " or ".join(f"engine={e}" for e in engines))
    from vdkit.launch import launchers

    _check(c.launcher in launchers.names(), f"cluster.launcher={c.launcher!r} is not a launcher",
           "use " + " or ".join(f"cluster.launcher={n}" for n in launchers.names()))
    # Fabric rules (RDMA adapters, NCCL_IB_DISABLE) apply where ranks span nodes, not on this machine's launcher.
    spans_nodes = not launchers.get(c.launcher).executes_here
    _check(c.mpi in MPI_TYPES, f"cluster.mpi={c.mpi!r} is not an srun --mpi type", "use " + ", ".join(MPI_TYPES))
    _check(c.min_nodes <= c.nodes <= c.max_nodes,
           f"cluster.nodes={c.nodes} is outside {c.min_nodes}-{c.max_nodes} for cluster {c.name}",
           f"use cluster.nodes between {c.min_nodes} and {c.max_nodes}")
    _check(c.gpus_per_node >= 1, f"cluster.gpus_per_node={c.gpus_per_node} must be at least 1",
           "use cluster.gpus_per_node=8 (or 4 for half a node)")
    _check(c.node_gpus is None or c.gpus_per_node <= c.node_gpus,
           f"cluster.gpus_per_node={c.gpus_per_node} is more than a node of cluster {c.name} has ({c.node_gpus} GPUs): "
           "the scheduler would refuse the job", f"use cluster.gpus_per_node={c.node_gpus} (or fewer), and more cluster.nodes")
    _check(c.max_time_min > 0, "cluster.max_time_min must be positive",
           "set it to your partition's maximum time in minutes (`sinfo -o \"%P %l\"`)")
    _check(c.time_limit_min is None or c.time_limit_min <= c.max_time_min,
           f"cluster.time_limit_min={c.time_limit_min} exceeds the partition's maximum cluster.max_time_min="
           f"{c.max_time_min}", "lower cluster.time_limit_min (the run continues over several allocations), or "
           "set cluster.max_time_min to your partition's real limit")
    _check(c.storage_write_gbps_per_node > 0, "cluster.storage_write_gbps_per_node must be positive",
           "measure the checkpoint storage's write rate per node (GB/s), e.g. 0.67 for PowerScale F710")
    _check(c.startup_s >= 0, f"cluster.startup_s={c.startup_s} must be >= 0",
           "set the seconds an allocation takes before its first step (read a job's log), e.g. cluster.startup_s=120")
    _check(c.mtbf_h > 0, f"cluster.mtbf_h={c.mtbf_h} must be positive",
           "set the mean hours between job failures on your cluster, e.g. cluster.mtbf_h=24")
    _check(c.max_lost_work_min > 0, f"cluster.max_lost_work_min={c.max_lost_work_min} must be positive",
           "set the most minutes of training a failure may lose, e.g. cluster.max_lost_work_min=60")
    for key in ("heartbeat_timeout_s", "kill_grace_s", "restart_delay_s"):
        value = getattr(c, key)
        _check(value is None or (math.isfinite(value) and 1 <= value <= 86400),
               f"cluster.{key}={value} must be between 1 and 86400 seconds",
               f"leave it out (the default in vdkit.run.faults) or give e.g. cluster.{key}=20")
    _check(c.cpus_per_task >= 1, f"cluster.cpus_per_task={c.cpus_per_task} must be at least 1 (sbatch rejects it)",
           "use e.g. cluster.cpus_per_task=12 (the CPU cores per GPU rank)")
    check_node_cpus(c.cpus_per_task, c.gpus_per_node, launchers.get(c.launcher).executes_here and host)
    _check(t.micro_batch_size >= 1, f"train.micro_batch_size={t.micro_batch_size} must be >= 1",
           "use train.micro_batch_size=1")
    _check(t.global_batch_size >= t.micro_batch_size,
           f"train.global_batch_size={t.global_batch_size} is smaller than the micro batch",
           "use a multiple of train.micro_batch_size x DP")
    _check(r.run.mode in RUN_MODES, f"run.mode={r.run.mode!r} is not a run mode",
           "use run.mode=train (validation, checkpoints, exported weights) or run.mode=timing (the guides' timing run)")
    _check(t.val_every_n_steps is None or t.val_every_n_steps >= 1,
           f"train.val_every_n_steps={t.val_every_n_steps} must be >= 1", "use e.g. train.val_every_n_steps=100, or leave it unset")
    _check(t.val_batches >= 1, f"train.val_batches={t.val_batches} must be >= 1", "use e.g. train.val_batches=10")
    _check(t.max_steps > 0, f"train.max_steps={t.max_steps} must be > 0 (NeMo needs a positive max_steps)",
           "use e.g. train.max_steps=50")
    _check(t.target_steps > 0, f"train.target_steps={t.target_steps} must be > 0", "use train.target_steps=1000")
    for key, steps in (("train.max_steps", t.max_steps), ("train.target_steps", t.target_steps)):
        _check(steps <= MAX_TRAIN_STEPS, f"{key}={steps} is more than {MAX_TRAIN_STEPS:,} optimizer steps: no "
               "training run takes that many (Llama 2's pretraining took 500,000)",
               f"use the steps you mean to train, e.g. {key}=1000")
    _check(t.seq_length >= 1, f"train.seq_length={t.seq_length} must be >= 1", "use e.g. train.seq_length=2048")
    _check(t.seq_length <= MAX_SEQ_LENGTH, f"train.seq_length={t.seq_length:,} is more than the {MAX_SEQ_LENGTH:,} "
           "tokens any model's context holds", "use the sequence length you mean, e.g. train.seq_length=4096")
    _check(t.precision in PRECISIONS, f"train.precision={t.precision!r} is not supported",
           "use " + " or ".join(PRECISIONS))
    _check(not t.fp8_attention or t.precision == "fp8", f"train.fp8_attention=true with train.precision={t.precision}: "
           "FP8 attention runs inside Transformer Engine's FP8 autocast, which only FP8 precision turns on",
           "set train.precision=fp8, or train.fp8_attention=false")
    _validate_model(r.model)
    from vdkit.planner.calibration import check_gpu_memory, check_gpu_vendor

    check_gpu_vendor(c)  # a vendor the kit runs, and the gpu_type's (hf_step_time.yaml): the images and collectives
    check_gpu_memory(c)  # no more memory than the gpu_type has: the plan's "fits" is the job's
    _check(c.nccl_debug is None or str(c.nccl_debug).upper() in NCCL_DEBUG_LEVELS,
           f"cluster.nccl_debug={c.nccl_debug!r} is not an NCCL_DEBUG level (NCCL would ignore it)",
           "use one of " + ", ".join(NCCL_DEBUG_LEVELS) + ", or null")
    check_names(c)  # interface and adapter names: shell words at render, so refused here (the door) already
    _check(c.transport in TRANSPORTS, f"cluster.transport={c.transport!r} is not a transport",
           "use " + ", ".join(TRANSPORTS))
    _check(not (c.transport == "tcp" and c.ib_hcas),
           f"cluster {c.name}: transport=tcp but cluster.ib_hcas lists RDMA adapters {list(c.ib_hcas)}",
           "set cluster.ib_hcas=[] for TCP sockets, or cluster.transport=ib / roce")
    _check(not (c.transport in ("ib", "roce") and spans_nodes and not c.ib_hcas),
           f"cluster {c.name}: transport={c.transport} needs the RDMA adapters in cluster.ib_hcas",
           "list them as `ibv_devinfo -l` prints them (mlx5_*, bnxt_re*), or use cluster.transport=tcp")
    _check(not (c.transport == "tcp" and spans_nodes and str((c.env or {}).get("NCCL_IB_DISABLE")) != "1"),
           f"cluster {c.name}: transport=tcp but cluster.env does not set NCCL_IB_DISABLE=1, so NCCL / RCCL "
           "would still use any RDMA adapter it finds", "add NCCL_IB_DISABLE: \"1\" to the cluster's env")
    from vdkit.planner import lora_targets

    lora_targets.check(r)  # engine.lora_qkv and method.lora_targets (the engine's spec says which layers it adapts)
    _check(r.parallelism.sharding in SHARDINGS, f"parallelism.sharding={r.parallelism.sharding!r} is not a sharding",
           "use " + ", ".join(SHARDINGS))
    from vdkit.recipes.engines import check_recipe

    check_recipe(r)  # what the engine's spec holds: model family and fields, method, sharding, precision
    _check(not r.parallelism.cpu_offload or r.parallelism.sharding != "none",
           "parallelism.cpu_offload=true needs a sharded strategy", "set parallelism.sharding=fsdp or zero3")
    _check(r.parallelism.deepspeed_config is None or r.parallelism.sharding == "zero3",
           "parallelism.deepspeed_config is set but parallelism.sharding is not zero3",
           "set parallelism.sharding=zero3 or parallelism.deepspeed_config=null")
    p = r.parallelism
    _check(p.recompute is None or p.recompute in RECOMPUTE,
           f"parallelism.recompute={p.recompute!r} is not a recompute mode", "use none, selective or full")
    for key in ("tp", "pp", "vp"):
        v = getattr(p, key)
        _check(v is None or v >= 1, f"parallelism.{key}={v} must be >= 1", f"use parallelism.{key}=1 or leave it unset")
    _check(p.recompute_num_layers is None or p.recompute_num_layers >= 1,
           f"parallelism.recompute_num_layers={p.recompute_num_layers} must be >= 1",
           "use e.g. parallelism.recompute_num_layers=4, or leave it unset (every layer)")
    _check(p.recompute_num_layers is None or p.recompute == "full",
           "parallelism.recompute_num_layers is set but parallelism.recompute is not full",
           "set parallelism.recompute=full (the first N layers of each stage recompute), or drop recompute_num_layers")
    _check(r.engine.attention in ATTENTIONS, f"engine.attention={r.engine.attention!r} is not an attention implementation",
           "use " + " or ".join(f"engine.attention={a}" for a in ATTENTIONS))
    from vdkit.planner import context

    context.check(r)
    _check(r.data.kind in DATA_KINDS, f"data.kind={r.data.kind!r} is not a data kind", "use sft or pretrain")
    _check(not (r.data.packed and m.name == "pretrain"),
           "data.packed=true is for fine-tuning data (pretraining samples already fill train.seq_length)",
           "drop data.packed (and recipe=fast) for method=pretrain")
    # NeMo 1.23 swaps the first virtual_tokens embeddings of a sequence for the prompt encoder's: in a
    # packed row they overwrite the first sample's first tokens and the other samples get no prompt (later
    # NeMo asserts "P-Tuning with packed sequence is not supported"); the kit's engines cannot either.
    _check(not (r.data.packed and m.name == "ptuning"),
           "data.packed=true with method=ptuning: P-tuning's virtual tokens prefix one sequence, and a packed "
           "row holds many samples (NeMo would overwrite the row's first tokens and prompt no other sample)",
           "set data.packed=false for method=ptuning (recipe=fast already leaves P-tuning unpacked)")
    _check(not (r.data.packed and t.micro_batch_size != 1),
           "data.packed=true needs train.micro_batch_size=1 (NeMo's packed sequences)",
           "set train.micro_batch_size=1 or data.packed=false")
    _check((r.data.kind == "pretrain") == (m.name == "pretrain") or r.data.name == "synthetic",
           f"data={r.data.name} ({r.data.kind} data) does not suit method={m.name}",
           "use data=pile for pretrain, and dolly / alpaca / pubmedqa / synthetic for fine-tuning")


def _validate_model(mc: ModelCfg) -> None:
    """The architecture fields: known values, and sizes that divide."""
    for key, allowed in (("arch", ARCHS), ("norm", NORMS), ("activation", ACTIVATIONS),
                         ("position_embedding", POSITION_EMBEDDINGS), ("tokenizer", TOKENIZERS)):
        value = getattr(mc, key)
        _check(value in allowed, f"model.{key}={value!r} is not supported", "use one of " + ", ".join(allowed))
    _check(mc.rope_scaling is None or isinstance(mc.rope_scaling, dict),
           f"model.rope_scaling={mc.rope_scaling!r} is not a mapping",
           "use e.g. model.rope_scaling={rope_type:llama3,factor:8.0} or null")
    _check(mc.rope_scaling is None or mc.position_embedding == "rope",
           "model.rope_scaling is set but model.position_embedding is not rope", "set model.rope_scaling=null")
    # heads and query groups are >= 1 here (vdkit.rules.numbers.DOMAINS): the remainders are defined
    _check(mc.hidden_size % mc.num_attention_heads == 0 and mc.num_attention_heads % mc.num_query_groups == 0,
           f"model {mc.name}: hidden_size {mc.hidden_size}, {mc.num_attention_heads} heads and "
           f"{mc.num_query_groups} query groups do not divide evenly",
           "make hidden_size a multiple of num_attention_heads, and heads a multiple of num_query_groups")
