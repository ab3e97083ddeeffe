"""A rank's heartbeat: liveness from a thread, progress after every step (vdkit.run.faults has the numbers).

The launcher names the directory in ``$VDKIT_HEARTBEAT_DIR`` (unset: no heartbeat, e.g. ``vdkit run``).
Rank R rewrites ``<dir>/rank<R>`` (write a hidden file, rename) with one line::

    <beat epoch s> <progress epoch s> <steps done> <last step ms> <node> <phase> <compute ms> <device>

``phase`` is ``start`` (building, loading), ``train`` or ``save`` (a checkpoint being written): the
watchdog allows the start-up grace, the hang limit or the save grace accordingly; ``exit`` once the
process leaves Python (a killed rank never writes it: the watchdog blames the silent one). The epochs are
written, not the file's mtime, because an NFS client's attribute cache can serve a stale mtime.

``compute ms`` is the median of the rank's last :data:`COMPUTE_WINDOW` compute times: a step's time until the
rank reaches the step's gradient reduction (its own forward and backward, before it waits for its peers), ``-``
while the engine reports none. In data parallelism every rank leaves the reduction together, so step times are
equal and only this field tells a slow rank from its peers (`vdkit status`'s straggler, vdkit.run.runs). It comes
last: a reader of the first six fields (the watchdog's ``read``) is unchanged. ``device`` is what the rank's torch
trains on: ``gpu``, ``cpu`` (no accelerator: a CPU-emulated cluster such as the local Slurm), ``-`` before torch is
imported; `vdkit status` says a CPU run's step time is not the plan's GPUs'.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from collections import deque
from typing import Optional

from vdkit.run.faults import HEARTBEAT_ENV, HEARTBEAT_S

# This module as one file beside a job that runs without vdkit (Megatron-Bridge's bridge_job.py, NeMo's script in
# NVIDIA's image): :func:`standalone_source` writes it into the run dir as <STANDALONE_NAME>.py.
STANDALONE_NAME = "vdkit_heartbeat"
_FAULTS_IMPORT = "from vdkit.run.faults import HEARTBEAT_ENV, HEARTBEAT_S\n"


COMPUTE_WINDOW = 5  # steps whose median compute time the heartbeat carries: one step's hiccup names no straggler
_STARTED: list = []  # this process's started heartbeats, for leave_all


def leave_all() -> None:
    """Every heartbeat this process started says ``exit`` now. For a rank that ends with ``os._exit`` (the
    reference and megatron engines, Bridge's rank: no C++ teardown), which runs no atexit handler: without it
    a rank that stopped cleanly stays a silent beat, and a peer slower to leave (srun waiting on an absent
    controller) has the watchdog kill the step and blame the rank that had left."""
    for beat in list(_STARTED):
        beat.leave()


def _device() -> str:
    """What this process's torch trains on: 'gpu', 'cpu' (it sees no accelerator), '-' (torch not imported yet)."""
    torch = sys.modules.get("torch")
    try:
        return "-" if torch is None else ("gpu" if torch.cuda.is_available() else "cpu")
    except Exception:  # noqa: BLE001 - torch half-imported (the main thread is importing it): ask on the next beat
        return "-"


class Heartbeat:
    """One rank's heartbeat file, refreshed by a daemon thread until :meth:`stop`."""

    def __init__(self, directory, rank: int, interval: float = HEARTBEAT_S, node: Optional[str] = None):
        self.path = Path(directory) / f"rank{rank}"
        self.node = (node or os.environ.get("SLURMD_NODENAME") or socket.gethostname() or "?").split()[0]
        self.interval = interval
        self.step, self.step_ms, self.phase = 0, 0, "start"
        self.progress_at = time.time()
        self.compute = deque(maxlen=COMPUTE_WINDOW)  # the last steps' compute seconds (see the module docstring)
        self.device = "-"  # asked of torch until it answers (_device)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def from_env(cls, rank: int, env=None) -> Optional["Heartbeat"]:
        """The launcher's heartbeat for this rank, started; None when the launcher asked for none."""
        env = os.environ if env is None else env
        directory = env.get(HEARTBEAT_ENV)
        if not directory:
            return None
        return cls(directory, rank, node=env.get("SLURMD_NODENAME")).start()

    def start(self) -> "Heartbeat":
        import atexit

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        # A rank that leaves Python (an error, a clean end) says so; one killed or on a dead node cannot,
        # which is how the watchdog tells the culprit from the peers that died of it.
        atexit.register(self.leave)
        _STARTED.append(self)
        self._thread = threading.Thread(target=self._run, name="vdkit-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write()
            except OSError:
                pass  # a full or lost disk: the save reports it; the watchdog sees the silence

    def write(self) -> None:
        with self._lock:
            compute = f"{int(statistics.median(self.compute) * 1000)}" if self.compute else "-"
            if self.device == "-":
                self.device = _device()
            line = (f"{int(time.time())} {int(self.progress_at)} {self.step} {self.step_ms} {self.node} "
                    f"{self.phase} {compute} {self.device}\n")
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(line)
            os.replace(tmp, self.path)

    def progress(self, step: int, step_s: float, compute_s: Optional[float] = None) -> None:
        """Step ``step`` (1-based count of steps done) finished in ``step_s`` seconds, ``compute_s`` of them
        before the gradient reduction (None: not measured); the thread writes it within ``interval``: no file
        write per step."""
        if compute_s is not None:
            self.compute.append(max(0.0, compute_s))
        self.step, self.step_ms, self.phase = step, int(step_s * 1000), "train"
        self.progress_at = time.time()

    def saving(self, on: bool) -> None:
        """A checkpoint is being written (True) or has been (False); the latter counts as progress."""
        self.phase = "save" if on else "train"
        self.progress_at = time.time()
        self.write()

    def stop(self) -> None:
        self._stop.set()

    def leave(self) -> None:
        """The process is exiting: phase ``exit`` (no more beats follow)."""
        self._stop.set()
        self.phase = "exit"
        try:
            self.write()
        except OSError:
            pass


def standalone_source() -> str:
    """This module's text with :mod:`vdkit.run.faults`' two names written in as values: importable where vdkit is
    not installed (the run dir's ``vdkit_heartbeat.py``), writing the very lines the watchdog reads."""
    text = Path(__file__).read_text()
    if text.count(_FAULTS_IMPORT) != 1:
        raise RuntimeError(f"{__file__} no longer imports vdkit.run.faults as {_FAULTS_IMPORT.strip()!r}: "
                           "update standalone_source")
    return text.replace(_FAULTS_IMPORT, f"HEARTBEAT_ENV, HEARTBEAT_S = {HEARTBEAT_ENV!r}, {HEARTBEAT_S!r}  "
                                        "# vdkit.run.faults' values, written in by standalone_source\n", 1)


# ----------------------------------------------------------------------------- compute time
# A rank's compute time per step: from the step's start until the rank reaches its gradient reduction.
#
# In data parallelism every rank leaves the gradient all-reduce together, so a slow rank's step time is its
# peers' too: only the time *before* the reduction tells them apart (the heartbeat's compute field; `vdkit
# status` names the straggler from it, vdkit.run.runs). Where the reduction starts:
#
# - megatron-core (``overlap_grad_reduce=False``): ``config.finalize_model_grads_func``, called once after the
#   pipeline schedule's last backward (:meth:`ComputeClock.wrap`). With TP or PP the schedule's own collectives
#   are inside the measured time (a slow rank delays its model-parallel peers there too). Megatron-Bridge runs
#   the same function: its rank's heartbeat callback wraps it as training starts (bridge_job.py).
# - torch DDP (the reference engine's Fabric DDP): a communication hook, called as each gradient bucket is ready;
#   the last call is the end of the rank's own backward (:meth:`ComputeClock.ddp_hook`). FSDP and ZeRO-3 gather
#   parameters inside the forward (every rank waits there for the slowest), so no compute time is reported.
#
# On CUDA the moments are CUDA events (the host runs ahead of the GPU), read once the GPU has passed them.
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
        """The last step's compute seconds (after the step)."""
        if self._start is None or self._reached is None:
            return None
        if self.cuda:
            self._events[1].synchronize()  # passed already where the step ends in torch.cuda.synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return self._reached - self._start

    def wrap(self, finalize):
        """megatron-core's ``finalize_model_grads_func`` that first notes the moment."""
        def finalize_model_grads(*args, **kwargs):
            self.reached()
            return finalize(*args, **kwargs)

        return finalize_model_grads

    def wrap_config(self, config) -> None:
        """Wrap a megatron-core model config's ``finalize_model_grads_func`` (:meth:`wrap`), where one is set."""
        if getattr(config, "finalize_model_grads_func", None) is not None:
            config.finalize_model_grads_func = self.wrap(config.finalize_model_grads_func)

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
