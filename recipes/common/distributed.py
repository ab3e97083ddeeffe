"""Who am I in the job: rank, world size, local rank, node rank, rendezvous address.

Two sources, checked in this order:
- local processes / torchrun style: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (+ ``LOCAL_WORLD_SIZE``,
  ``NODE_RANK``), as ``vdkit run`` sets them;
- Slurm tasks: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
  ``SLURM_NTASKS_PER_NODE`` (one task per GPU, as the rendered sbatch asks).
``MASTER_ADDR`` / ``MASTER_PORT`` come from the environment, exported by the launcher (the sbatch
script derives the address from the first node and the port from the job id; emulated nodes share
localhost, so a bare hostname is not trusted here).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from vdkit.errors import UserError
from vdkit.run.ports import LOCAL_DEFAULT_PORT



@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    source: str  # "local", "slurm" or "single"


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise UserError(f"environment variable {key}={env[key]!r} is not an integer",
                        f"unset {key} or give it a whole number") from None


def resolve_dist_env(env: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Read the distributed layout from ``env`` (default ``os.environ``); see the module docstring."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        node = _int(env, "NODE_RANK") if "NODE_RANK" in env else rank // max(local_world, 1)
        source = "local"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        # SLURM_NTASKS_PER_NODE may read "8" or "8(x2)"; the per-node count is the leading number.
        per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0].split(",")[0]
        local_world = int(per_node) if per_node.isdigit() else world
        node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else rank // max(local_world, 1)
        source = "slurm"
    else:
        rank, world, local, local_world, node, source = 0, 1, 0, 1, 0, "single"
    if not (0 <= rank < world) or not (0 <= local < local_world):
        raise UserError(f"inconsistent ranks from the environment ({source}): rank {rank} of {world}, "
                        f"local rank {local} of {local_world}",
                        "launch with `vdkit run` or srun --ntasks-per-node=GPUs per node")
    addr = env.get("MASTER_ADDR", "")
    if world > 1 and not addr:
        raise UserError(f"MASTER_ADDR is not set for a {world}-rank job",
                        "export MASTER_ADDR=<first node's address> (the rendered sbatch does this)")
    # The launcher exports MASTER_PORT (its own rule, e.g. vdkit.run.ports.job_port of the job id): the
    # rank does not guess it from a scheduler's variables.
    if world > 1 and "MASTER_PORT" not in env:
        raise UserError(f"MASTER_PORT is not set for a {world}-rank job",
                        "export MASTER_PORT=<a free port on the first node> (the rendered sbatch does this)")
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else LOCAL_DEFAULT_PORT
    return DistEnv(rank, world, local, local_world, node, addr or "127.0.0.1", port, source)
