"""`vdkit cluster up|down|status`: the Slurm launcher's own verb, a real Slurm with six emulated XE9680
nodes on this machine (:mod:`vdkit.slurm.localcluster`)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    """Add the `vdkit cluster` verb (the emulated local Slurm) to ``sub``."""
    c = sub.add_parser("cluster", help="an emulated six-node XE9680 Slurm on this machine (root; slurm-wlm, munge)",
                       description="Start, stop or show a real Slurm on localhost with six emulated XE9680 nodes "
                                   "(8 GPU gres each), to try `vdkit submit` without a cluster. After `up`, export "
                                   "the SLURM_CONF line it prints.")
    from vdkit.slurm.localcluster import add_cluster_args  # stdlib-only module: cheap to import

    add_cluster_args(c)
    c.set_defaults(func=run_cluster)


def run_cluster(args: argparse.Namespace) -> int:
    """`vdkit cluster up|down|status`: the local Slurm's command; the exit code."""
    from vdkit.slurm.localcluster import run_cluster_command

    return run_cluster_command(args)
