"""The emulated cluster's files: six Dell PowerEdge XE9680 nodes as Slurm sees them (slurm.conf, gres.conf
with fake GPU device files), and the container stand-in (a TaskProlog that hides the Slurm clients from job
steps, as a pyxis container does). Written into the local cluster's own directory by
:class:`vdkit.slurm.localcluster.LocalCluster`; nothing under /etc is read or written.
"""
from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import List

# The emulated hardware: one Dell PowerEdge XE9680 per node (what `slurmd -C` would report on one).
NODE_PREFIX = "xe9680"
NUM_NODES = 6


def _xe9680_gpus_per_node() -> int:
    """The XE9680's GPU count from its one home, conf/cluster/xe9680.yaml."""
    import yaml

    from vdkit.composition.conftree import conf_dir

    return int(yaml.safe_load((conf_dir() / "cluster" / "xe9680.yaml").read_text())["gpus_per_node"])


GPUS_PER_NODE = _xe9680_gpus_per_node()
SOCKETS = 2
CORES_PER_SOCKET = 48
THREADS_PER_CORE = 2
REAL_MEMORY_MB = 2_000_000
PARTITION = "xe9680"
# Keep finished jobs' records for a day: without accounting, scontrol is where a job's end state lives.
MIN_JOB_AGE_S = 86400
REQUEUE_WAIT_S = 10  # Slurm's cred_expire: a requeued job's earliest restart (Slurm's default: 120 s)

SERVER_BINARIES = ("slurmctld", "slurmd", "munged", "munge", "unmunge")
CLIENT_BINARIES = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")
# What a pyxis container lacks: every Slurm client command (hidden from job steps, see the docstring).
HIDDEN_IN_STEPS = CLIENT_BINARIES + ("salloc", "sacct", "sattach", "sbcast", "scrontab", "sdiag", "sprio",
                                     "sreport", "sshare", "sstat", "strigger", "sview", "sacctmgr")
BATCH_STEP_ID = "4294967294"  # SLURM_BATCH_SCRIPT: the step id Slurm gives the batch shell


def _free_ports(n: int) -> List[int]:
    """n distinct TCP ports free right now on 127.0.0.1 (held open together so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def write_config(root: Path, node_names: List[str], munge_socket: Path, conf: Path) -> None:
    """Write slurm.conf (at ``conf``), gres.conf, an empty plugstack.conf, the fake GPU devices and the
    container stand-in into ``root``."""
    for sub in ("state", "spool", "log", "run", "dev", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ctld_port, *node_ports = _free_ports(1 + len(node_names))
    r = root
    lines = [
        "# Written by vdkit.slurm.localcluster: an emulated XE9680 cluster on localhost.",
        "ClusterName=vdkit-local",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire is also how long a requeued job waits before it may start again (default
        # 120 s); a preempted job on the emulated cluster restarts after REQUEUE_WAIT_S instead.
        f"AuthInfo=socket={munge_socket},cred_expire={REQUEUE_WAIT_S}",
        f"StateSaveLocation={r / 'state'}",
        f"SlurmdSpoolDir={r / 'spool'}/%n",
        f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={r / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
        f"PlugStackConfig={r / 'plugstack.conf'}",
        f"TaskProlog={r / 'container' / 'task_prolog.sh'}",  # the container stand-in (module docstring)
        # The nodes claim more than this machine has (that is the point of the emulation).
        "SlurmdParameters=config_overrides",
        # No cgroups: processes are tracked by process group, no task binding.
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        # Accounting off, as on many small sites: sacct is unavailable, scontrol keeps records.
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        f"MinJobAge={MIN_JOB_AGE_S}",
        "SchedulerType=sched/backfill",
        # Pending jobs whose start time has come (a restart's --begin, vdkit.run.faults.RESTART_DELAY_S) start
        # within 5 s, not at the next periodic pass (30 s backfill, 60 s main loop by default).
        "SchedulerParameters=bf_interval=5,sched_interval=5",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        "SlurmdTimeout=300",
        "InactiveLimit=0",
        "KillWait=5",
        "Waittime=0",
    ]
    for name, port in zip(node_names, node_ports):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"Sockets={SOCKETS} CoresPerSocket={CORES_PER_SOCKET} ThreadsPerCore={THREADS_PER_CORE} "
            f"RealMemory={REAL_MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={NODE_PREFIX}-[1-{len(node_names)}] Default=YES "
                 "MaxTime=INFINITE State=UP")
    conf.write_text("\n".join(lines) + "\n")

    gres = ["AutoDetect=off"]
    for name in node_names:
        devdir = r / "dev" / name
        devdir.mkdir(parents=True, exist_ok=True)
        for i in range(GPUS_PER_NODE):
            dev = devdir / f"nvidia{i}"
            if not dev.exists():
                # A character device like /dev/null (1, 3): slurmd only needs it to exist.
                os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        gres.append(f"NodeName={name} Name=gpu File={devdir}/nvidia[0-{GPUS_PER_NODE - 1}]")
    (r / "gres.conf").write_text("\n".join(gres) + "\n")
    # An empty SPANK stack: a site's plugins (pyxis in /etc/slurm) are not ours to load.
    (r / "plugstack.conf").write_text("")
    write_container_stand_in(root)


def write_container_stand_in(root: Path) -> None:
    """The TaskProlog that hides the Slurm clients from job steps (the container stand-in)."""
    r = root / "container"
    mirrors = {}
    for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]:
        if not d or not os.path.isdir(d) or d in mirrors:
            continue
        if not any(os.path.exists(os.path.join(d, b)) for b in HIDDEN_IN_STEPS):
            continue
        mirror = r / ("bin" + d.replace("/", "_"))
        mirror.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(d):
            link = mirror / name
            if name not in HIDDEN_IN_STEPS and not link.exists() and not link.is_symlink():
                link.symlink_to(os.path.join(d, name))
        mirrors[d] = str(mirror)
    lines = ["#!/bin/sh",
             "# vdkit's container stand-in: job steps see no Slurm client command, as under pyxis.",
             # The batch shell runs outside the container: its task prolog has no step id (Slurm 22.05).
             f'case "${{SLURM_STEP_ID:-batch}}" in batch|{BATCH_STEP_ID}) exit 0 ;; esac',
             'NEW=""', 'IFS=:', "for d in $PATH; do", '  case "$d" in']
    for d, mirror in mirrors.items():
        lines.append(f'    {d}|{d}/) d="{mirror}" ;;')
    lines += ["  esac", '  NEW="${NEW:+$NEW:}$d"', "done", 'echo "export PATH=$NEW"',
              f'echo "export VDKIT_CONTAINER_STAND_IN=1"']
    prolog = r / "task_prolog.sh"
    prolog.write_text("\n".join(lines) + "\n")
    prolog.chmod(0o755)
