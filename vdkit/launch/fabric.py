"""The cluster's fabric environment: NCCL / RCCL over InfiniBand, RoCE or TCP sockets, as data.

Launcher-neutral: the Slurm launcher exports these variables before srun, a Kubernetes launcher
puts them in the pod spec. What an engine adds (its variables) arrives as data
(:class:`vdkit.run.jobspec.JobSpec`); nothing here knows an engine's or a scheduler's name. Pure
functions (no I/O). Facts behind the choices: docs/cluster-guide.md.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from vdkit.errors import UserError


# An adapter as NCCL_IB_HCA names it: device, optionally ":port" (mlx5_0, mlx5_0:1).
_HCA_RE = re.compile(r"^[A-Za-z0-9_.-]+(:[0-9]+)?$")
_IFNAME_RE = re.compile(r"^\^?=?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")  # NCCL's environment docs (cluster.nccl_debug)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def ib_hca_value(hcas: List[str]) -> str:
    """NCCL_IB_HCA for an exact-match adapter list: '=mlx5_0,mlx5_3,...'.

    Without the leading '=' NCCL matches prefixes, so mlx5_1 would also select mlx5_10.
    """
    for name in hcas:
        if not _HCA_RE.match(str(name)):
            raise UserError(f"cluster.ib_hcas entry {name!r} is not an adapter name",
                            "list adapters as printed by `ibv_devinfo -l`, e.g. [mlx5_0,mlx5_3]")
    twice = sorted({str(h) for h in hcas if [str(x) for x in hcas].count(str(h)) > 1})
    if twice:  # NCCL opens each adapter once; the plan would count it twice (vdkit.planner.interconnect)
        raise UserError(f"cluster.ib_hcas lists {', '.join(twice)} more than once: NCCL uses each adapter once, so the "
                        "plan would count inter-node bandwidth that is not there",
                        "list each adapter once, as `ibv_devinfo -l` prints them")
    return "=" + ",".join(str(h) for h in hcas)


def check_names(c) -> None:
    """Refuse a ``cluster.socket_ifname`` or ``cluster.ib_hcas`` entry that is no interface / adapter name (a shell
    word such as ``eth0; reboot`` would land in the job's environment): at the door (composition) and at render."""
    ib_hca_value(list(c.ib_hcas or []))
    if c.socket_ifname and not _IFNAME_RE.match(c.socket_ifname):
        raise UserError(f"cluster.socket_ifname={c.socket_ifname!r} is not an interface name",
                        "use the name of an interface every node has, e.g. cluster.socket_ifname=bond0")


def job_env(plan, engine_env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Every rank's fabric variables, in order (name -> value): the cluster's, then the engine's.

    From the cluster config, as data: NCCL_IB_HCA (exact match) from ``cluster.ib_hcas``,
    NCCL/GLOO_SOCKET_IFNAME from ``cluster.socket_ifname``, then ``cluster.env`` in its order (the
    fabric's and site's settings: NCCL_NVLS_ENABLE=0 and TORCH_NCCL_AVOID_RECORD_STREAMS=1 on the
    H100 clusters, NCCL_IB_GID_INDEX for RoCE, NCCL_IB_DISABLE=1 for TCP sockets - RCCL reads the
    same names); then ``engine_env`` (what the engine's ``env(plan)`` returned, e.g.
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism); then NCCL_DEBUG only when asked.
    A launcher appends its own after these (Slurm: SRUN_CPUS_PER_TASK).
    Nothing here depends on the GPU vendor or the transport: those are in the cluster's data.
    """
    c = plan.recipe.cluster
    check_names(c)
    env: Dict[str, str] = {}
    if c.ib_hcas:
        env["NCCL_IB_HCA"] = ib_hca_value(list(c.ib_hcas))
    if c.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = c.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = c.socket_ifname
    for name, value in (c.env or {}).items():
        env[_env_name(str(name), "cluster.env")] = _env_value(str(name), str(value))
    for name, value in (engine_env or {}).items():
        if not _ENV_NAME_RE.match(str(name)):
            raise UserError(f"the engine asks for an environment variable named {name!r}",
                            "engine env names are letters, digits and '_' (a bug in the engine module)")
        env[str(name)] = str(value)
    if c.nccl_debug:
        if str(c.nccl_debug).upper() not in NCCL_DEBUG_LEVELS:
            raise UserError(f"cluster.nccl_debug={c.nccl_debug!r} is not an NCCL_DEBUG level",
                            "use one of " + ", ".join(NCCL_DEBUG_LEVELS) + " (or leave it null)")
        env["NCCL_DEBUG"] = str(c.nccl_debug).upper()
    return env


def _env_name(name: str, where: str) -> str:
    if not _ENV_NAME_RE.match(name):
        raise UserError(f"{where} has a variable named {name!r}, which a shell cannot export",
                        "use letters, digits and '_' (not starting with a digit)")
    return name


def _env_value(name: str, value: str) -> str:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise UserError(f"cluster.env {name}={value!r} contains a control character", "give a one-line value")
    return value


# How the script's comment names the fabric (cluster.transport) and the collective library (gpu_vendor).
TRANSPORT_WORDS = {"ib": "native InfiniBand", "roce": "RoCE (RDMA over Converged Ethernet)",
                   "tcp": "TCP sockets (no RDMA)"}
COLLECTIVES = {"nvidia": "NCCL", "amd": "RCCL"}


def fabric_comment(cluster) -> str:
    """``# NCCL over native InfiniBand, from cluster xe9680`` (the cluster's own words, from its data)."""
    return (f"# {COLLECTIVES.get(cluster.gpu_vendor, 'NCCL')} over "
            f"{TRANSPORT_WORDS.get(cluster.transport, cluster.transport)}, from cluster {cluster.name}")
