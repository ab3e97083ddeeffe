"""What megatron-core needs to train on a CPU (gloo): applied only when CUDA is absent.

megatron-core 0.16.1 hard-codes CUDA in a few places that no configuration flag reaches:

1. tensors created on ``device="cuda"`` / ``torch.cuda.current_device()`` (schedules, p2p shapes,
   grad-norm buffers, the distributed optimizer's gather buffers) and ``tensor.cuda()`` calls;
2. the RNG tracker reads and writes the CUDA generator (``torch.cuda.get_rng_state`` and the
   private ``_get_cuda_rng_state`` / ``_set_cuda_rng_state``);
3. type checks that insist on CUDA tensors: ``param.grad.type() == 'torch.cuda.FloatTensor'``
   (grad clipping) and the distributed optimizer's "Wrapped parameters must be one of
   torch.cuda.FloatTensor, ..." check;
4. ``torch.cuda.synchronize()`` in p2p communication;
5. the default causal mask (``device="cuda"``), also built inside backward under recomputation.

The shim answers exactly these: a ``TorchFunctionMode`` maps CUDA devices to the CPU for tensor
factories, ``.to()`` and ``.cuda()``, and reports CPU tensors' ``.type()`` by their CUDA name;
``torch.cuda.current_device`` / ``synchronize`` / the RNG-state calls are mapped to the CPU
generator. It relies on private names, so it is pinned to :data:`TESTED_VERSION` and refuses
any other version (tests/test_megatron_shim.py fails loudly when an upgrade breaks it). On a GPU it
is never applied.
"""
from __future__ import annotations

import functools
import os

TESTED_VERSION = "0.16.1"
_APPLIED = False

# CPU tensor type names as megatron's CUDA checks spell them.
_CUDA_TYPE_NAMES = {"torch.FloatTensor": "torch.cuda.FloatTensor", "torch.HalfTensor": "torch.cuda.HalfTensor",
                    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor"}


class ShimVersionError(RuntimeError):
    """The installed megatron-core is not the version this shim was written and tested for."""


def needed() -> bool:
    """True when the shim applies: no CUDA device in this process."""
    import torch

    return not torch.cuda.is_available()


def _cpu_device(device):
    """``device`` with CUDA (a name, a torch.device or a bare ordinal) replaced by the CPU."""
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _make_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_cuda, tensor_to, tensor_type = torch.Tensor.cuda, torch.Tensor.to, torch.Tensor.type

    class CudaToCpu(TorchFunctionMode):
        """Every torch call: a CUDA ``device=`` becomes the CPU; ``.cuda()`` is a no-op; ``.type()``
        of a CPU float tensor answers with the CUDA name megatron checks for."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is tensor_cuda:
                return args[0]
            if func is tensor_type and len(args) == 1 and not kwargs:
                name = func(*args)
                return _CUDA_TYPE_NAMES.get(name, name)
            if "device" in kwargs:
                kwargs = dict(kwargs, device=_cpu_device(kwargs["device"]))
            if func is tensor_to and len(args) > 1:
                args = (args[0], _cpu_device(args[1]), *args[2:])
            return func(*args, **kwargs)

    return CudaToCpu()


def _check_version() -> None:
    from importlib.metadata import version

    have = version("megatron-core")
    if have != TESTED_VERSION:
        raise ShimVersionError(
            f"vdkit's CPU shim for megatron-core was written for {TESTED_VERSION}, found {have}: it patches "
            f"private names that may have changed; install megatron-core=={TESTED_VERSION} or re-validate "
            "recipes/common/mcore_cpu.py (tests/test_megatron_shim.py) against the new version")


def apply() -> bool:
    """Apply the shim once in this process when there is no CUDA; returns whether it is active.

    Raises ShimVersionError on a megatron-core other than TESTED_VERSION, and AttributeError (via
    :func:`_patch`) when a patched name is gone."""
    global _APPLIED
    if _APPLIED:
        return True
    if not needed():
        return False
    _check_version()
    import torch

    from megatron.core.tensor_parallel import random as mrandom

    def _patch(obj, name, value):
        getattr(obj, name)  # AttributeError: the name this shim replaces is gone (new version)
        setattr(obj, name, value)

    @functools.wraps(mrandom._get_cuda_rng_state)
    def get_state(device="cuda", clone=False, graph_safe=False):
        return torch.get_rng_state()

    @functools.wraps(mrandom._set_cuda_rng_state)
    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    _patch(mrandom, "_get_cuda_rng_state", get_state)
    _patch(mrandom, "_set_cuda_rng_state", set_state)
    _patch(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    _patch(torch.cuda, "set_rng_state", lambda new_state, device="cuda": torch.set_rng_state(new_state))
    _patch(torch.cuda, "manual_seed", lambda seed: torch.manual_seed(seed))
    # The CPU device itself, not an ordinal: custom autograd Functions' backward runs without the
    # mode below (tensor-parallel reduce-scatter buffers are made there).
    _patch(torch.cuda, "current_device", lambda: torch.device("cpu"))
    _patch(torch.cuda, "synchronize", lambda device=None: None)
    # 5. activation recomputation re-runs the forward inside a backward, where a TorchFunctionMode
    #    is off (a mode steps aside while it handles `backward` itself): the one CUDA literal on that
    #    path, the default causal mask, gets a CPU twin.
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as tutils

    @functools.wraps(tutils.get_default_causal_mask)
    def causal_mask(sq: int):
        return torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()

    _patch(tutils, "get_default_causal_mask", causal_mask)
    _patch(fused_softmax, "get_default_causal_mask", causal_mask)
    _make_mode().__enter__()  # stays on the mode stack for the life of the process
    _APPLIED = True
    return True


def local_block_spec(config, vp_stage=None):
    """megatron-core's local GPT layer spec with torch norms that work under sequence parallelism.

    Without Apex / Transformer Engine the local spec uses torch's norm through ``WrappedTorchNorm``,
    which megatron refuses under sequence parallelism; torch's RMSNorm / LayerNorm are right there too
    once their parameters are marked ``sequence_parallel`` (then ``finalize_model_grads`` all-reduces
    their gradients over TP). Returns the block's submodules for this (virtual) pipeline stage; the
    signature is the one Bridge's providers call a ``transformer_layer_spec`` with."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    base = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm

    class Norm(base):
        def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
            super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
            for p in self.parameters():
                setattr(p, "sequence_parallel", config.sequence_parallel)

    layer = get_gpt_layer_local_spec(normalization=config.normalization)
    layer.submodules.input_layernorm = Norm
    layer.submodules.pre_mlp_layernorm = Norm
    n = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * n, layer_norm=Norm)


_INHERITED: list = []  # the gloo groups a forked child inherited and forgot (kept referenced: never torn down)
_FORKED = False  # this process is a fork of one that may hold a gloo group (set after fork, in the child)


def _forked(value: bool = True) -> None:
    global _FORKED
    _FORKED = value


os.register_at_fork(after_in_child=_forked)


def single_rank_model_parallel() -> None:
    """A one-process gloo group with TP = PP = 1 (idempotent): what megatron-core needs to build a whole
    model in this process, e.g. on the meta device for `vdkit check`."""
    import tempfile

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    _forget_inherited()
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(prefix="vdkit-check-"), 1), rank=0,
                                world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)


def _forget_inherited() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if _FORKED and dist.is_initialized():
        # inherited through fork (`vdkit check` checks each run dir in a forked child): gloo's threads stayed in
        # the parent, so its first barrier would wait for ever - a group of this process's own instead
        # the parent's group is left alone (destroying it here joins threads this process lacks: a crash), only
        # forgotten: torch's registry of groups starts empty (private names of torch 2.x, tested by
        # tests/test_check_fooled.py)
        import torch.distributed.distributed_c10d as c10d

        # every inherited group stays referenced (never collected: its destructor would join those threads)
        _INHERITED.extend([c10d._world, c10d.GroupMember.WORLD, dict(vars(ps))])
        ps.destroy_model_parallel()
        c10d._world = c10d._World()
        c10d.GroupMember.WORLD = None
    _forked(False)


def parallel_state_at(world_size: int, tp: int, pp: int, vp) -> int:
    """megatron-core's ``initialize_model_parallel`` as the job calls it, at the job's world size, in this one
    process: torch's fake process group (``torch.testing._internal.distributed.fake_pg``: every collective a no-op)
    stands in for the job's ranks, so megatron-core's own rank arithmetic and checks run. Returns the data-parallel
    size it derives; the groups are torn down after (raises what megatron-core raises)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _forget_inherited()
    if dist.is_initialized():  # this process's own (the check's single-rank group): its model is built after
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     virtual_pipeline_model_parallel_size=vp,
                                     create_gloo_process_groups=False)  # gloo's groups need real peers
        return ps.get_data_parallel_world_size()
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()
