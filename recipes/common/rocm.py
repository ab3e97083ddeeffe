"""The Megatron stack on AMD MI300X clusters (``cluster.gpu_vendor=amd``): which image, which environment.

The megatron and bridge engines run on MI300X in a ROCm image (``engine.rocm_image``): AMD publishes
``rocm/megatron-lm`` (ROCm, PyTorch, Transformer Engine for ROCm, Megatron-LM's ROCm fork; AMD's
"Training a model with Megatron-LM for ROCm" guide), and the site adds megatron-core 0.16.1 and vdkit
(conf/engine/megatron.yaml shows how); for Bridge, megatron-bridge 0.3.1 on top (no AMD-published image
carries it: a site build, unverified here). torch's ``nccl`` backend is RCCL there and reads the same
``NCCL_*`` variables (the cluster's env: NCCL_IB_HCA = the Thor 2 bnxt_re devices, NCCL_IB_GID_INDEX for
RoCE v2).

NVIDIA-only settings are left out on AMD: cuDNN LayerNorm kernels (``NVTE_NORM_*_USE_CUDNN``) and
``CUDA_DEVICE_MAX_CONNECTIONS`` (a CUDA driver variable); ROCm's counterpart of the latter, the number
of hardware queues HIP streams map to, is ``GPU_MAX_HW_QUEUES`` (HIP environment variables, ROCm docs),
which AMD's own multi-node training launchers set to 2 (e.g. AMD-AGI's launch scripts for Llama 3 70B on
MI300X), and ``HSA_NO_SCRATCH_RECLAIM=1`` (ROCm's training guides: keeps the scratch memory kernels
allocate, avoiding a reclaim stall per step).
"""
from __future__ import annotations

from typing import Dict, Optional

from vdkit.errors import UserError

NVIDIA_ONLY = ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN",
               "NCCL_NVLS_ENABLE")
ROCM_ENV = {"GPU_MAX_HW_QUEUES": "2", "HSA_NO_SCRATCH_RECLAIM": "1"}


def on_amd(plan) -> bool:
    """Whether the plan's cluster has AMD GPUs (ROCm, RCCL)."""
    return plan.recipe.cluster.gpu_vendor == "amd"


def image(plan) -> Optional[str]:
    """The image ranks run in: engine.rocm_image on an AMD cluster, else engine.container_image."""
    e = plan.recipe.engine
    return e.rocm_image if on_amd(plan) else e.container_image


def check(plan) -> None:
    """An AMD cluster needs the engine's ROCm image (one line naming the key)."""
    r = plan.recipe
    if on_amd(plan) and not r.engine.rocm_image:
        raise UserError(f"engine={r.engine.name} on cluster {r.cluster.name} (AMD {r.cluster.gpu_type}) runs in a ROCm "
                        "image and engine.rocm_image is not set",
                        f"build one from rocm/megatron-lm (conf/engine/{r.engine.name}.yaml says how) and set "
                        "engine.rocm_image=/shared/containers/....sqsh")


def vendor_env(plan, env: Dict[str, str]) -> Dict[str, str]:
    """``env`` as the engine asks it on NVIDIA; on AMD without the NVIDIA-only names, plus ROCM_ENV."""
    if not on_amd(plan):
        return env
    out = {k: v for k, v in env.items() if k not in NVIDIA_ONLY}
    out.update(ROCM_ENV)
    return out
