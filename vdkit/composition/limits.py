"""The door's plausibility bounds: one home for every size and count a user's input is checked against.

Each bound is checked before the work it guards (a file's size before it is read, a sweep's cells
before they are expanded, a step count before it is planned), so a hostile or mistaken input is
refused in one line at once instead of after minutes or never. The numbers are generous: far above
any real input, far below what would hang or exhaust this machine. A low layer (standard library,
:mod:`vdkit.errors`, :mod:`vdkit.composition.files`).
"""
from __future__ import annotations

from pathlib import Path

from vdkit.errors import UserError

MB = 1 << 20
MAX_SWEEP_FILE_BYTES = 1 * MB  # conf/sweep/table9.yaml is 2 KB; 256 cells of overrides fit in a few tens of KB
MAX_DATASET_BYTES = 1024 * MB  # read whole by `data prepare` (Dolly 13 MB, Alpaca 22 MB, PubMedQA's artificial set ~300 MB)
MAX_SAMPLE_BYTES = 4 * MB  # one JSON record: a 128k-token context is ~0.5-1.5 MB of text even \\u-escaped
MAX_LOG_BYTES = 1024 * MB  # a training log `validate` reads: a 1000-step NeMo log is a few MB
MAX_TRAIN_STEPS = 10 ** 9  # optimizer steps; Llama 2's pretraining took 500k: a billion is a typo, not a run
MAX_SEQ_LENGTH = 10_000_000  # tokens in one sequence: the longest published contexts are 10M (Llama 4 Scout)
MAX_ALLOCATIONS = 10_000  # chained allocations one run may plan (10,000 x 4 h is 4.5 years on the cluster)
MAX_NODE_CPUS = 1024  # hardware threads of one node: a 2-socket 192-core EPYC has 768, an XE9680 224
INT32_MAX = 2 ** 31 - 1  # Kubernetes' int32 fields (backoffLimit, ttlSecondsAfterFinished)


def check_size(path, limit: int, what: str, fix: str) -> None:
    """UserError when the regular file ``path`` is larger than ``limit`` bytes, before a byte is read.

    (A sparse file counts its apparent size: reading it would read every hole.)"""
    size = Path(path).stat().st_size
    if size > limit:
        raise UserError(f"{what} {path} is {_size(size)}, more than the {_size(limit)} vdkit reads as {what}", fix)


def check_readable(path, limit: int, what: str, fix: str) -> None:
    """A regular file of at most ``limit`` bytes, or a UserError naming what it is instead."""
    from vdkit.composition.files import not_a_regular_file

    kind = not_a_regular_file(path)
    if kind:
        raise UserError(f"{what} {path} is {'missing' if kind == 'missing' else kind}, not a file", fix)
    check_size(path, limit, what, fix)


def _size(n: int) -> str:
    return f"{n / MB:,.1f} MB" if n < 1024 * MB else f"{n / (1024 * MB):,.1f} GB"


def check_node_cpus(cpus_per_task: int, gpus_per_node: int, here: bool) -> None:
    """cluster.cpus_per_task against the cores a node has: this machine's for a launcher that starts the ranks
    here, else the most any node has (MAX_NODE_CPUS) - more would pend in the queue forever."""
    import os

    if here:
        have = os.cpu_count() or 1
        if cpus_per_task > have:
            raise UserError(f"cluster.cpus_per_task={cpus_per_task} is more than this machine's {have} CPUs",
                            f"use cluster.cpus_per_task={min(have, 12)} or fewer")
        return
    per_node = cpus_per_task * gpus_per_node
    if per_node > MAX_NODE_CPUS:
        raise UserError(f"cluster.cpus_per_task={cpus_per_task} x {gpus_per_node} ranks per node asks {per_node:,} "
                        f"CPUs of one node; no node has more than {MAX_NODE_CPUS} (the job would pend forever)",
                        "use the cores per GPU your nodes have, e.g. cluster.cpus_per_task=12 on an XE9680 (224 threads)")
