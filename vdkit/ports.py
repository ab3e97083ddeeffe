"""The rendezvous port of a Slurm job: one rule for the rendered sbatch and the engines' fallback.

A fixed port (29500) collides when two jobs share a host (two 4-GPU jobs on one 8-GPU XE9680,
emulated nodes on localhost): the second job's rank 0 fails with EADDRINUSE. The port is therefore
derived from the job id, ``PORT_BASE + SLURM_JOB_ID % PORT_SPAN`` (20000-29999): distinct for any
two jobs whose ids differ by less than PORT_SPAN, and below Linux's ephemeral range (32768+,
``net.ipv4.ip_local_port_range``), where the kernel and enroot's pytorch hook pick ports.
"""
from __future__ import annotations

PORT_BASE = 20000
PORT_SPAN = 10000  # PORT_BASE + PORT_SPAN - 1 = 29999 < 32768
LOCAL_DEFAULT_PORT = 29500  # torch's default: a process outside Slurm that is given no MASTER_PORT


def job_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id``."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def job_port_shell(job_id_var: str = "SLURM_JOB_ID") -> str:
    """The same rule as a bash arithmetic expression over ``$job_id_var`` (for the batch script)."""
    return f"$(({PORT_BASE} + {job_id_var} % {PORT_SPAN}))"
