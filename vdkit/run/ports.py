"""The rendezvous port of a scheduled job: one rule, derived from the job id the launcher passes.

A fixed port (29500) collides when two jobs share a host (two 4-GPU jobs on one 8-GPU XE9680,
emulated nodes on localhost): the second job's rank 0 fails with EADDRINUSE. The port is therefore
derived from the job id, ``PORT_BASE + job_id % PORT_SPAN`` (20000-29999): distinct for any
two jobs whose ids differ by less than PORT_SPAN, and below Linux's ephemeral range (32768+,
``net.ipv4.ip_local_port_range``), where the kernel and enroot's pytorch hook pick ports.
"""
from __future__ import annotations

import socket

PORT_BASE = 20000
PORT_SPAN = 10000  # PORT_BASE + PORT_SPAN - 1 = 29999 < 32768
LOCAL_DEFAULT_PORT = 29500  # torch's default: a single process that is given no MASTER_PORT


def job_port(job_id: int) -> int:
    """The rendezvous port of job ``job_id`` (a scheduler's numeric id)."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def job_port_shell(job_id_var: str) -> str:
    """The same rule as a bash arithmetic expression over ``$job_id_var`` (the launcher names its job-id variable)."""
    return f"$(({PORT_BASE} + {job_id_var} % {PORT_SPAN}))"


def free_port() -> int:
    """A TCP port free on this machine right now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
