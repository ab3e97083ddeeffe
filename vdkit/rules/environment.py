"""What a job's environment may hold: the names the kit refuses to export (:data:`DENIED_NAMES`,
:data:`DENIED_PREFIXES`: they break the job) and ``cluster.env`` free of them and of secrets
(:data:`SECRET_NAME`, :data:`SECRET_VALUE`: cluster.env is written in clear into the run directory).

The deny-list is read by the door (here and :mod:`vdkit.rules.secrets`) and by the job script's own
reader of ``run.secrets_file`` (:mod:`vdkit.slurm.secrets`).
"""
from __future__ import annotations

import re
from typing import Optional

from vdkit.errors import UserError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the job's shell, srun, the container runtime or the rendezvous set: exporting one breaks the
# job (PATH= and srun is not found; UID= is read-only in bash and ends the script; SLURM_* lie to srun).
DENIED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "UID", "EUID", "PPID", "GROUPS", "IFS", "PWD",
                "OLDPWD", "HOSTNAME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "TMPDIR",
                "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                "NCCL_IB_HCA"}
# Denied names the kit itself exports from a cluster key (vdkit.launch.fabric): the fix names the key to set.
FROM_CLUSTER_KEY = {"NCCL_IB_HCA": "cluster.ib_hcas=[mlx5_0,mlx5_3] (the adapters, exact names)",
                    "NCCL_SOCKET_IFNAME": "cluster.socket_ifname=NAME (the interface)",
                    "GLOO_SOCKET_IFNAME": "cluster.socket_ifname=NAME (the interface)"}
DENIED_PREFIXES = ("LD_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "PMI_", "OMPI_", "TORCHELASTIC_",
                   "BASH_FUNC_", "VDKIT_")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
SECRET_VALUE = re.compile(r"(^hf_[A-Za-z0-9]{20,}$|^gh[pousr]_[A-Za-z0-9]{20,}$|^sk-[A-Za-z0-9_-]{20,}$|"
                          r"^(AKIA|ASIA)[A-Z0-9]{16}$|^xox[abpr]-|^glpat-|-----BEGIN)")


def denied_name(name: str) -> Optional[str]:
    """Why exporting ``name`` would break the job (None: it is fine)."""
    if not ENV_NAME.match(name):
        return "is not a shell variable name (letters, digits and _, not starting with a digit)"
    if name in DENIED_NAMES or name.startswith(DENIED_PREFIXES):
        return ("is set by the shell, Slurm, the container or the rendezvous; exporting it breaks the job "
                "(e.g. PATH= and srun is not found, UID= ends the batch script)")
    return None


def check_cluster_env(env: dict) -> None:
    """``cluster.env`` is written in clear into launch.sbatch and recipe.yaml: no job-breaking name, no secret."""
    for name, value in (env or {}).items():
        if str(name) in FROM_CLUSTER_KEY:  # a site's own adapters / interface: not a job-breaking name but a key
            raise UserError(f"cluster.env.{name} is the kit's to export: it writes {name} from the cluster's "
                            "own key, and two values would disagree",
                            f"drop cluster.env.{name} and set {FROM_CLUSTER_KEY[str(name)]}")
        why = denied_name(str(name))
        if why:
            raise UserError(f"cluster.env.{name} {why}", f"drop cluster.env.{name}; the kit sets what the job needs")
        if SECRET_NAME.search(str(name)) or SECRET_VALUE.search(str(value)):
            raise UserError(f"cluster.env.{name} looks like a secret, and cluster.env is written in clear into "
                            "launch.sbatch, recipe.yaml and overrides.txt",
                            f"put {name}=... in a file only you can read and pass run.secrets_file=PATH")
