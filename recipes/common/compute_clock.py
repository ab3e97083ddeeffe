"""A rank's compute time per step: from the step's start until the rank reaches its gradient reduction.

In data parallelism every rank leaves the gradient all-reduce together, so a slow rank's step time is its
peers' too: only the time *before* the reduction tells them apart (the heartbeat's compute field,
vdkit.recipes.heartbeat; `vdkit status` names the straggler from it, vdkit.runs). Where the reduction starts:

- megatron-core (``overlap_grad_reduce=False``): ``config.finalize_model_grads_func``, called once after the
  pipeline schedule's last backward (:meth:`ComputeClock.wrap`). With TP or PP the schedule's own collectives
  are inside the measured time (a slow rank delays its model-parallel peers there too).
- torch DDP (the reference engine's Fabric DDP): a communication hook, called as each gradient bucket is ready;
  the last call is the end of the rank's own backward (:meth:`ComputeClock.ddp_hook`). FSDP and ZeRO-3 gather
  parameters inside the forward (every rank waits there for the slowest), so no compute time is reported.

On CUDA the moments are CUDA events read after the step's synchronize (the host runs ahead of the GPU).
"""
from __future__ import annotations

import time
from typing import Optional


class ComputeClock:
    """``start()`` at a step's start, ``reached()`` where the rank is about to reduce (the last call counts),
    ``seconds()`` after the step: the compute time, or None when the step never reached a reduction."""

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self._start = self._reached = None
        if cuda:
            import torch

            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def start(self) -> None:
        self._reached = None
        if self.cuda:
            self._events[0].record()
        self._start = time.perf_counter()

    def reached(self) -> None:
        if self.cuda:
            self._events[1].record()
        self._reached = time.perf_counter()

    def seconds(self) -> Optional[float]:
        """The last step's compute seconds (call after the step's ``torch.cuda.synchronize`` on CUDA)."""
        if self._start is None or self._reached is None:
            return None
        if self.cuda:
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return self._reached - self._start

    def wrap(self, finalize):
        """megatron-core's ``finalize_model_grads_func`` that first notes the moment."""
        def finalize_model_grads(*args, **kwargs):
            self.reached()
            return finalize(*args, **kwargs)

        return finalize_model_grads

    def ddp_hook(self, module) -> bool:
        """Register a DDP communication hook on ``module`` (a torch DistributedDataParallel, possibly inside
        Fabric's wrapper) that notes the moment and then all-reduces as DDP does; False when it is not DDP."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        ddp = getattr(module, "_forward_module", module)
        if not isinstance(ddp, DistributedDataParallel):
            return False

        def timed_allreduce(process_group, bucket):
            self.reached()
            return allreduce_hook(process_group, bucket)

        ddp.register_comm_hook(None, timed_allreduce)
        return True
