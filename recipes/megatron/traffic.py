"""The memory traffic of megatron-core's local layers, counted live: every tensor each op reads and writes (and the
ops a layer launches, :func:`layer_ops`, the host-time model's count).

A ``TorchDispatchMode`` sees every ATen op a layer runs - forward, backward and recomputed forward, the
composite ops (torch's RMSNorm, megatron-core's unfused softmax, RoPE and SwiGLU) already decomposed into
the kernels a GPU launches too. Each op is charged what it must move at least: the distinct bytes of every
tensor it reads (a broadcast operand once) and of every tensor it writes. Views (reshape, transpose,
slice, expand, detach) and allocations (``torch.empty``) move nothing. The linear layers' GEMMs (``aten.mm``)
and tensor parallelism's collectives (``c10d`` ops, and the copy by which gloo completes a reduce-scatter into its
output, which NCCL writes in place) are left out: their time is the step-time model's compute and communication
terms (vdkit.planner.predict); the attention's
batched matmuls (``bmm`` / ``baddbmm``), whose operands are the materialised s x s scores, are counted. RNG-state
compares (the CPU shim forking megatron's RNG tracker) are left out too. ``baddbmm`` with ``beta=0``
does not read its output buffer (cuBLAS skips C when beta is 0).

:func:`vdkit.planner.local_traffic.layer_traffic` is the hand count from the modules' shapes; this is the
check that it counts what megatron-core runs (tests/test_local_traffic.py).
"""
from __future__ import annotations

from typing import Callable, Dict

# ops that alias their input (no kernel, no traffic)
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "split",
                   "split_with_sizes", "slice", "select", "squeeze", "unsqueeze", "detach", "alias", "chunk", "unbind",
                   "as_strided", "_reshape_alias", "lift_fresh", "unflatten"})
LINEAR_GEMMS = frozenset({"mm", "addmm"})  # the linears' GEMMs: compute, not this count
# no kernel (an allocation), or one element read back to the host
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                         "_local_scalar_dense"})
WRITE_ONLY = frozenset({"copy_"})  # in-place ops that overwrite their first argument without reading it


def distinct_bytes(t) -> int:
    """Bytes of the distinct elements ``t`` spans (a broadcast dimension, stride 0, once)."""
    n = t.element_size()
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n


def _rng_state(args) -> bool:
    """Whether an op works on RNG states only (uint8, and the bool of comparing them): the CPU generator's ~5 KB
    state, compared when megatron forks its RNG tracker on the CPU; a GPU's Philox state is 16 bytes."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(a.dtype in (torch.uint8, torch.bool) for a in tensors)


def count(run: Callable[[], object], written_only: bool = False) -> Dict[str, int]:
    """Run ``run()`` (a forward and its backward) and return ``{op name: bytes read + written}`` summed over every
    call (see the module docstring for what is charged); ``written_only``: the bytes written only."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    totals: Dict[str, int] = {}
    collective = set()  # storages a collective writes (gloo completes a reduce-scatter by a copy into its output)

    class Traffic(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if func.namespace == "c10d":
                collective.update(a.untyped_storage().data_ptr() for a in tree_flatten(args)[0]
                                  if isinstance(a, torch.Tensor))
                return out
            if name in WRITE_ONLY and args[0].untyped_storage().data_ptr() in collective:
                return out
            if name in VIEWS or name in LINEAR_GEMMS or name in ALLOCATIONS or _rng_state(args):
                return out
            beta0 = name == "baddbmm" and kwargs.get("beta", 1) == 0
            reads = args[1:] if beta0 or name in WRITE_ONLY else args
            moved = 0 if written_only else sum(distinct_bytes(a) for a in tree_flatten((reads, kwargs))[0]
                                               if isinstance(a, torch.Tensor))
            moved += sum(distinct_bytes(o) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor))
            totals[name] = totals.get(name, 0) + moved
            return out

    with Traffic():
        run()
    return totals


def _layer(config, seq: int, micro_batch: int, frozen: bool):
    """(one decoder layer of megatron-core's local spec, its input, the output's gradient, the RoPE table) for one
    micro batch of ``micro_batch`` sequences of ``seq`` tokens; ``frozen``: every weight frozen."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from vdkit.recipes.common.mcore_cpu import local_block_spec

    block = TransformerBlock(config, local_block_spec(config), post_layer_norm=False)
    for p in block.parameters() if frozen else ():
        p.requires_grad_(False)
    rope = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0)(seq)  # shared by all layers
    local = seq // config.tensor_model_parallel_size if config.sequence_parallel else seq  # this rank's share
    x = torch.randn(local, micro_batch, config.hidden_size, dtype=config.params_dtype, requires_grad=True)
    grad = torch.randn(local, micro_batch, config.hidden_size, dtype=config.params_dtype)
    return block, x, grad, rope


def layer_traffic(config, seq: int, micro_batch: int, frozen: bool = False,
                  forward_writes: bool = False) -> Dict[str, int]:
    """Bytes one decoder layer of megatron-core's local spec (``config``: one layer, its recompute settings) moves
    for one micro batch of ``micro_batch`` sequences of ``seq`` tokens: its forward, its backward (the input's
    gradient included) and what recompute repeats, by op; ``frozen``: every weight frozen (P-tuning's base model);
    ``forward_writes``: the bytes the forward writes, nothing else. Model parallel state must be initialised."""
    block, x, grad, rope = _layer(config, seq, micro_batch, frozen)

    def run():
        out = block(x, attention_mask=None, rotary_pos_emb=rope)
        if not forward_writes:
            (out[0] if isinstance(out, tuple) else out).backward(grad)

    return count(run, written_only=forward_writes)


def layer_ops(config, seq: int, micro_batch: int, frozen: bool = False, lora_dim: int = 0) -> Dict[str, int]:
    """The ops one decoder layer of megatron-core's local spec launches for one micro batch - ``{"forward": n,
    "backward": n}``, backward counting what recompute reruns - as the dispatcher sees them: every ATen op but the
    views and allocations (no kernel) and the CPU shim's RNG-state compares (a GPU forks a 16-byte Philox state).
    ``frozen``: every base weight frozen; ``lora_dim``: the megatron engine's LoRA adapter (rank ``lora_dim``) on the
    fused QKV projection, as vdkit.recipes.megatron.model builds it. The host cost the step-time model charges per
    op (vdkit.planner.host_time) multiplies this count; tests/test_host_time.py checks its table against it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    block, x, grad, rope = _layer(config, seq, micro_batch, frozen)
    if lora_dim:
        from vdkit.recipes.megatron.model import BASE_SPLIT, _adapter_classes

        attention = block.layers[0].self_attention
        attention.linear_qkv = _adapter_classes()[0](attention.linear_qkv, BASE_SPLIT["linear_qkv"], lora_dim,
                                                     config, 0.0).to(config.params_dtype)
    counts = {"forward": 0, "backward": 0}
    phase = ["forward"]

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not (name in VIEWS or name in ALLOCATIONS or _rng_state(args)):
                counts[phase[0]] += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        out = block(x, attention_mask=None, rotary_pos_emb=rope)
        phase[0] = "backward"
        (out[0] if isinstance(out, tuple) else out).backward(grad)
    return counts
