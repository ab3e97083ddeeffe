"""The kit's constants as data: ``conf/calibration/*.yaml`` (memory model, step-time model), loaded once.

A low layer: the memory model (vdkit.planner.memory, vdkit.planner.sharded) and the step-time model (vdkit.planner.predict,
vdkit.planner.predict_hf) both read their numbers here, so no number lives in two places and no lower layer
imports the prediction layer to find one.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

from vdkit.errors import UserError
from vdkit.composition.schema import GB, GPU_VENDORS

CALIBRATION_DIR = Path("calibration")  # under the conf/ tree (package data in a wheel)

# Headroom: the memory model already counts the per-GPU overhead (memory.yaml overhead_gb: CUDA context and
# cuBLAS / Transformer Engine workspaces ~1 GB, NCCL buffers ~1-2 GB for the TP / PP / DP communicators, the
# rest for slack). What it cannot count - PyTorch caching-allocator fragmentation (typically 5-15 % of what
# is reserved), transient peaks (loss upcasts, optimizer-step temporaries, checkpoint saving), a
# co-scheduled monitoring process - needs a reserve of its own: an automatic layout (vdkit.planner.plan) and the
# largest micro batch of a sharded plan (vdkit.planner.sharded) leave HEADROOM of the GPU unused.
HEADROOM = 0.10


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """``conf/calibration/<name>.yaml`` as a dict, checked against its schema
    (:data:`vdkit.planner.calibration_schema.SCHEMAS`); UserError, one line naming the file and the key, when
    the file is missing, unreadable, or has an unknown key, a value of the wrong type or a required key missing."""
    from vdkit.composition.conftree import conf_dir

    path = conf_dir() / CALIBRATION_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"the calibration file {path} is missing",
                        "reinstall vdkit, or copy conf/calibration/ into your VDKIT_CONF_DIR")
    return checked(path, name)


def checked(path: Path, name: str) -> dict:
    """The calibration file ``path`` merged into the schema ``SCHEMAS[name]``, as plain data (UserError on a defect)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vdkit.planner.calibration_schema import SCHEMAS

    fix = f"fix {path.name} (the keys and types: vdkit/planner/calibration_schema.py; sources beside each number)"
    try:
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot be read ({str(exc).splitlines()[0]})", fix) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a mapping of keys", fix)
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(SCHEMAS[name]), data)
    except OmegaConfBaseException as exc:
        # OmegaConf names the key (full_key) and the defect (the message's first line); a section of the wrong
        # kind (a list for a mapping) comes without a key: the first top-level key that fails alone is it
        key = exc.full_key or next((k for k in data if not _merges(OmegaConf, SCHEMAS[name], {k: data[k]})), "?")
        raise UserError(f"{path}: {key}: {str(exc).splitlines()[0]}", fix) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{path}: {missing[0]} is missing{more}", fix)
    return OmegaConf.to_container(cfg)


def _merges(omegaconf, schema, data: dict) -> bool:
    try:
        omegaconf.merge(omegaconf.structured(schema), data)
    except Exception:  # noqa: BLE001 - any failure marks the key
        return False
    return True


def memory() -> dict:
    """The memory model's constants (conf/calibration/memory.yaml)."""
    return load("memory")


def overhead_gb(cluster) -> float:
    """Per-GPU reserve: the cluster's ``memory_overhead_gb``, else the calibration default."""
    return float(memory()["overhead_gb"]) if cluster.memory_overhead_gb is None else float(cluster.memory_overhead_gb)


def gb_of_bytes(total_bytes: float) -> float:
    """A device's memory in the planner's GB (1e9 bytes), rounded down to 0.1 GB: never more than the device has."""
    import math

    return math.floor(total_bytes / GB * 10) / 10


def capacity_gb(gpu_type: str) -> Optional[float]:
    """The GPU's memory as the planner compares it (GB = 1e9 bytes) from what its tools report
    (hf_step_time.yaml ``memory_total_bytes``); GPU makers sell "80GB" that is ~80 GiB (85.5 GB). None: unknown."""
    gpu = (load("hf_step_time")["gpus"] or {}).get(gpu_type) or {}
    total = gpu.get("memory_total_bytes")
    return gb_of_bytes(float(total)) if total else None


# A cluster file's ``gpu_memory_gb`` that follows its ``gpu_type`` (an OmegaConf resolver, registered by
# vdkit.composition.config): a command-line cluster.gpu_type=H200-SXM5-141GB on cluster=xe9680 plans on the
# H200's memory, not the H100's figure the file would otherwise keep. A number written there (a site's measured
# figure, `vdkit site probe`) stays as written.
MEMORY_RESOLVER = "gpu_memory_gb"
FOLLOWS_GPU_TYPE = "${%s:${.gpu_type}}" % MEMORY_RESOLVER


def gpu_memory_gb(gpu_type: str) -> float:
    """``${gpu_memory_gb:GPU_TYPE}``: the GPU's reported total (:func:`capacity_gb`); UserError (one line) for a
    GPU the kit does not describe: its memory is the user's to state."""
    cap = capacity_gb(str(gpu_type))
    if cap is None:
        known = ", ".join(g for g, v in sorted((load("hf_step_time")["gpus"] or {}).items()) if v.get("memory_total_bytes"))
        raise UserError(f"cluster.gpu_type={gpu_type} is not a GPU the kit describes ({known}: conf/calibration/"
                        "hf_step_time.yaml gpus), so cluster.gpu_memory_gb cannot follow it",
                        "use one of those gpu_types, or state its memory too: cluster.gpu_memory_gb=GB (nvidia-smi's "
                        "memory.total in GB of 10^9 bytes; `vdkit site probe` writes both from a node)")
    return cap


def is_borderline(total_gb: float, cap_gb: float) -> bool:
    """The one borderline rule: within ``borderline_fraction`` of the GPU's memory, either way."""
    return abs(total_gb - cap_gb) <= float(memory()["borderline_fraction"]) * cap_gb


VENDOR_STACKS = {"nvidia": "NVIDIA's (CUDA, NCCL: the engines' NVIDIA images)",
                 "amd": "AMD's (ROCm, RCCL: the engines' ROCm images, engine.rocm_image)"}


def check_gpu_memory(cluster) -> None:
    """A stated ``cluster.gpu_memory_gb`` may be less than its ``gpu_type``'s reported total (MIG, a site's reserve),
    never more: ``gpu_memory_gb: 800`` on an H100 (a typo in a site file) planned a 70B SFT on one node as fitting in
    549.5 GB per GPU, and rendered a job that runs out of memory at its first step. The total as :func:`capacity_gb`;
    1 % over it is a rounding of nvidia-smi's MiB, not more memory."""
    cap = capacity_gb(str(cluster.gpu_type))
    if cap is None or cluster.gpu_memory_gb <= cap * 1.01:
        return
    raise UserError(f"cluster {cluster.name}: cluster.gpu_memory_gb={cluster.gpu_memory_gb:g} is more than a "
                    f"{cluster.gpu_type} holds ({cap:g} GB, its reported total: conf/calibration/hf_step_time.yaml "
                    "gpus): the plan would fit layouts that run out of memory on it",
                    f"state nvidia-smi's memory.total in GB of 10^9 bytes (at most {cap:g}), or leave "
                    "cluster.gpu_memory_gb to follow cluster.gpu_type (`vdkit site probe` writes both from a node)")


def check_gpu_vendor(cluster) -> None:
    """A cluster's ``gpu_vendor`` must be one the kit runs, and its ``gpu_type`` a GPU of that vendor
    (hf_step_time.yaml ``gpus.<gpu>.vendor``): the vendor picks the images, collectives and environment the ranks
    run, the gpu_type the memory and speed the plan assumes (an MI300X on an NVIDIA cluster would plan 192 GB in
    NVIDIA's image). A GPU the kit does not describe (``cpu``, a site's own type) has no vendor to compare."""
    if cluster.gpu_vendor not in GPU_VENDORS:
        raise UserError(f"cluster.gpu_vendor={cluster.gpu_vendor!r} is not supported", "use " + " or ".join(GPU_VENDORS))
    gpus = load("hf_step_time")["gpus"] or {}
    vendor = (gpus.get(cluster.gpu_type) or {}).get("vendor")
    if vendor is None or vendor == cluster.gpu_vendor:
        return
    same = ", ".join(g for g, v in sorted(gpus.items()) if v.get("vendor") == cluster.gpu_vendor) or "none described"
    raise UserError(f"cluster {cluster.name}: cluster.gpu_type={cluster.gpu_type} is an {vendor} GPU (conf/calibration/"
                    f"hf_step_time.yaml gpus) but the cluster's gpu_vendor is {cluster.gpu_vendor}: its ranks run "
                    f"{VENDOR_STACKS.get(cluster.gpu_vendor, cluster.gpu_vendor)} stack",
                    f"use an {cluster.gpu_vendor} gpu_type ({same}), or a cluster with {vendor} GPUs "
                    f"(cluster.gpu_vendor={vendor}, conf/cluster/)")
