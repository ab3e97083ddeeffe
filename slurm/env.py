"""The job's environment on an XE9680 cluster: NCCL over native InfiniBand, rendezvous, pyxis flags.

Engine-agnostic: what an engine needs (its variables, its container) arrives as data
(:class:`vdkit.jobspec.JobSpec`); nothing here knows an engine's name. Pure functions (no I/O):
:mod:`vdkit.slurm.render` turns their output into shell
lines, quoting every value. Facts behind the choices: docs/cluster-guide.md.
"""
from __future__ import annotations

import re
import shlex
from typing import Dict, List, Optional

from vdkit.errors import UserError
from vdkit.ports import job_port_shell


# An adapter as NCCL_IB_HCA names it: device, optionally ":port" (mlx5_0, mlx5_0:1).
_HCA_RE = re.compile(r"^[A-Za-z0-9_.-]+(:[0-9]+)?$")
_IFNAME_RE = re.compile(r"^\^?=?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")
_NCCL_DEBUG = ("VERSION", "WARN", "INFO", "TRACE")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def ib_hca_value(hcas: List[str]) -> str:
    """NCCL_IB_HCA for an exact-match adapter list: '=mlx5_0,mlx5_3,...'.

    Without the leading '=' NCCL matches prefixes, so mlx5_1 would also select mlx5_10.
    """
    for name in hcas:
        if not _HCA_RE.match(str(name)):
            raise UserError(f"cluster.ib_hcas entry {name!r} is not an adapter name",
                            "list adapters as printed by `ibv_devinfo -l`, e.g. [mlx5_0,mlx5_3]")
    return "=" + ",".join(str(h) for h in hcas)


def job_env(plan, engine_env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables exported before srun, in order (name -> value): the cluster's, then the engine's.

    From the cluster config, as data: NCCL_IB_HCA (exact match) from ``cluster.ib_hcas``,
    NCCL/GLOO_SOCKET_IFNAME from ``cluster.socket_ifname``, then ``cluster.env`` in its order (the
    fabric's and site's settings: NCCL_NVLS_ENABLE=0 and TORCH_NCCL_AVOID_RECORD_STREAMS=1 on the
    H100 clusters, NCCL_IB_GID_INDEX for RoCE, NCCL_IB_DISABLE=1 for TCP sockets - RCCL reads the
    same names); then ``engine_env`` (what the engine's ``env(plan)`` returned, e.g.
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism); then NCCL_DEBUG only when asked,
    SRUN_CPUS_PER_TASK (Slurm 22.05-23.02 no longer passes --cpus-per-task from sbatch to srun).
    Nothing here depends on the GPU vendor or the transport: those are in the cluster's data.
    """
    c = plan.recipe.cluster
    env: Dict[str, str] = {}
    if c.ib_hcas:
        env["NCCL_IB_HCA"] = ib_hca_value(list(c.ib_hcas))
    if c.socket_ifname:
        if not _IFNAME_RE.match(c.socket_ifname):
            raise UserError(f"cluster.socket_ifname={c.socket_ifname!r} is not an interface name",
                            "use the name of an interface every node has, e.g. cluster.socket_ifname=bond0")
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
        if str(c.nccl_debug).upper() not in _NCCL_DEBUG:
            raise UserError(f"cluster.nccl_debug={c.nccl_debug!r} is not an NCCL_DEBUG level",
                            "use one of " + ", ".join(_NCCL_DEBUG) + " (or leave it null)")
        env["NCCL_DEBUG"] = str(c.nccl_debug).upper()
    env["SRUN_CPUS_PER_TASK"] = str(c.cpus_per_task)
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


RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")


def rendezvous_lines() -> List[str]:
    """Shell lines that export MASTER_ADDR / MASTER_PORT inside the batch script.

    MASTER_ADDR is the first node's NodeAddr as slurmctld knows it: node names need not resolve
    (emulated nodes, sites without DNS for compute names), the address slurmd uses does.
    ``sed -n 1p`` rather than ``head -n1``: it reads all input, so under ``pipefail`` the
    producer cannot die of SIGPIPE. MASTER_PORT is derived from the job id (:mod:`vdkit.ports`):
    two jobs sharing a host get different ports, all below the ephemeral range.
    """
    return [
        'MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "MASTER_ADDR=$(scontrol -o show node \"$MASTER_NODE\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'export MASTER_ADDR="${MASTER_ADDR:-$MASTER_NODE}"',
        f"export MASTER_PORT={job_port_shell()}",
    ]


# ----------------------------------------------------------------------------- pyxis
def check_image(image: Optional[str], key: str = "engine.container_image") -> str:
    """Refuse a --container-image value pyxis cannot read; return it unchanged otherwise.

    pyxis takes either a squashfs file, which must start with '/' or './' (anything else is
    looked up in a registry), or an enroot image URI ``[USER@][REGISTRY#]IMAGE[:TAG]``, where the
    registry is separated by '#', not '/'.
    """
    fix_import = ("pre-import it: enroot import -o /shared/containers/IMAGE.sqsh docker://REGISTRY#IMAGE:TAG "
                  f"(e.g. nvcr.io#nvidia/nemo:24.01.01.framework), then {key}=/shared/containers/IMAGE.sqsh")
    if not image or not str(image).strip():
        raise UserError(f"this engine runs in a container and needs {key} (the image its ranks run in)", fix_import)
    image = str(image)
    if any(ch.isspace() or ord(ch) < 32 for ch in image) or "," in image:
        raise UserError(f"{key}={image!r} contains whitespace or a comma",
                        "give a squashfs path or an image name like nvcr.io#nvidia/nemo:24.01.01.framework")
    if "://" in image:
        raise UserError(f"{key}={image!r} has a URI scheme pyxis does not take",
                        "drop the scheme: nvcr.io#nvidia/nemo:TAG (or a squashfs path)")
    is_file = image.startswith("/") or image.startswith("./")
    if not is_file and image.endswith((".sqsh", ".squashfs")):
        raise UserError(f"{key}={image!r} looks like a squashfs file but pyxis would look it up "
                        "in a registry (a file path must start with / or ./)",
                        f"write {key}=./{image} or an absolute path")
    if not is_file and "#" not in image:
        first = image.split("/", 1)[0]
        if "/" in image and ("." in first or ":" in first or first == "localhost"):
            raise UserError(f"{key}={image!r} names a registry with '/', which pyxis reads as a "
                            "Docker Hub image", f"separate the registry with '#': {first}#{image.split('/', 1)[1]}")
    return image


def _mount_path(what: str, path: str) -> str:
    # --container-mounts is "SRC:DST[,SRC:DST...]": a ',' or ':' in a path cannot be quoted away.
    if "," in path or ":" in path or any(ord(ch) < 32 for ch in path):
        raise UserError(f"{what} {path!r} contains ',', ':' or a control character, which pyxis' "
                        "--container-mounts cannot express", "move it to a path without those characters")
    return path


def pyxis_args(container, run_dir, env_names: List[str]) -> List[str]:
    """srun's pyxis flags for a job whose ranks run in ``container`` (a vdkit.jobspec.Container).

    Unquoted argv; the renderer quotes them. --container-env lists the job's variables so that
    values baked into the image (enroot's pytorch hook sets MASTER_ADDR/PORT, NCCL_* may be set)
    do not win over ours.
    """
    image = check_image(container.image, container.image_key)
    mounts = ",".join(f"{p}:{p}" for p in (_mount_path(w, p) for w, p in container.mounts))
    return [
        f"--container-image={image}",
        f"--container-mounts={mounts}",
        f"--container-workdir={container.workdir or run_dir}",
        "--no-container-mount-home",
        "--container-env=" + ",".join(env_names),
    ]


def export_line(name: str, value: str) -> str:
    """``export NAME=value`` with the value shell-quoted."""
    return f"export {name}={shlex.quote(str(value))}"
