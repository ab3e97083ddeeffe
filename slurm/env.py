"""The batch script's environment on a Slurm cluster: the fabric's variables, rendezvous, pyxis flags.

Engine-agnostic: what an engine needs (its variables, its container) arrives as data
(:class:`vdkit.run.jobspec.JobSpec`); nothing here knows an engine's name. The fabric's variables
(NCCL / RCCL, from the cluster's data) are :mod:`vdkit.launch.fabric`'s, shared with every launcher; what
is Slurm's own is here. Pure functions (no I/O): :mod:`vdkit.slurm.render` turns their output into
shell lines, quoting every value. Facts behind the choices: docs/cluster-guide.md.
"""
from __future__ import annotations

import shlex
from typing import Dict, List, Optional

from vdkit.launch import fabric
from vdkit.errors import UserError
from vdkit.run.ports import job_port_shell

JOB_ID_VAR = "SLURM_JOB_ID"  # what the batch script knows its job by (rendezvous port, run-dir lock)


def job_env(plan, engine_env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables exported before srun, in order: :func:`vdkit.launch.fabric.job_env`, then SRUN_CPUS_PER_TASK
    (Slurm 22.05-23.02 no longer passes --cpus-per-task from sbatch to srun)."""
    env = fabric.job_env(plan, engine_env)
    env["SRUN_CPUS_PER_TASK"] = str(plan.recipe.cluster.cpus_per_task)
    return env


RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")


def rendezvous_lines() -> List[str]:
    """Shell lines that export MASTER_ADDR / MASTER_PORT inside the batch script.

    MASTER_ADDR is the first node's NodeAddr as slurmctld knows it: node names need not resolve
    (emulated nodes, sites without DNS for compute names), the address slurmd uses does.
    ``sed -n 1p`` rather than ``head -n1``: it reads all input, so under ``pipefail`` the
    producer cannot die of SIGPIPE. MASTER_PORT is derived from the job id (:mod:`vdkit.run.ports`):
    two jobs sharing a host get different ports, all below the ephemeral range.
    """
    return [
        'MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "MASTER_ADDR=$(scontrol -o show node \"$MASTER_NODE\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'export MASTER_ADDR="${MASTER_ADDR:-$MASTER_NODE}"',
        f"export MASTER_PORT={job_port_shell(JOB_ID_VAR)}",
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


def pyxis_args(container, run_dir, env_names: List[str], writable: bool = False) -> List[str]:
    """srun's pyxis flags for a job whose ranks run in ``container`` (a vdkit.run.jobspec.Container).

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
    ] + (["--container-writable"] if writable else [])  # cluster.container_writable: a read-only enroot rootfs


def export_line(name: str, value: str) -> str:
    """``export NAME=value`` with the value shell-quoted."""
    return f"export {name}={shlex.quote(str(value))}"
