"""`vdkit site probe --name NAME --out DIR`: this node's facts -> DIR/cluster/NAME.yaml (vdkit.site).

Run it on a compute node (`srun -N1 --exclusive vdkit site probe ...`) so it sees the adapters, GPUs
and storage a job sees; then `vdkit plan --config-dir DIR cluster=NAME ...` uses the file.
"""
from __future__ import annotations

import sys
from pathlib import Path

from vdkit.args import out_path


def register(sub) -> None:
    """Add the `site` verb (one sub-verb: probe)."""
    p = sub.add_parser("site", help="read this node's facts into a cluster file: vdkit site probe --name NAME --out DIR",
                       description="`vdkit site probe` reads this node's RDMA adapters and link layers (ibv_devinfo, "
                                   "/sys/class/infiniband), the default-route NIC, the GPUs (nvidia-smi, rocm-smi), "
                                   "the partition's time limit and nodes (sinfo), enroot / pyxis and a storage "
                                   "write-speed sample, and writes DIR/cluster/NAME.yaml (the only file it writes; "
                                   "the sample file is removed). Use it with `vdkit plan --config-dir DIR cluster=NAME`.")
    s = p.add_subparsers(dest="site_verb", metavar="probe")
    q = s.add_parser("probe", help="write DIR/cluster/NAME.yaml from this node's facts",
                     description="Read this node's facts and write DIR/cluster/NAME.yaml; what cannot be read is "
                                 "named in the file and keeps the documented default (vdkit/schema.py ClusterCfg).")
    q.add_argument("--name", required=True, help="the cluster's name (cluster=NAME)")
    q.add_argument("--out", required=True, type=out_path, metavar="DIR", help="the config dir (--config-dir DIR)")
    q.add_argument("--run-dir", metavar="DIR", type=out_path,
                   help="where runs will write (checkpoints): the storage sample is taken there (default: --out)")
    q.add_argument("--sample-mb", type=int, default=None, help="MB written for the storage sample (default 256)")
    q.add_argument("--partition", help="the partition to read (default: sinfo's default partition)")
    q.set_defaults(func=run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run(args) -> int:
    import re

    from vdkit import site
    from vdkit.errors import UserError
    from vdkit.files import replace_all

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", args.name):
        raise UserError(f"--name {args.name!r} is not a cluster name", "use letters, digits, _ . - (e.g. --name mysite)")
    if args.sample_mb is not None and not 1 <= args.sample_mb <= 65536:
        raise UserError(f"--sample-mb {args.sample_mb} is out of range", "use 1 to 65536 (default 256)")
    out = Path(args.out).absolute()
    sample_dir = Path(args.run_dir or args.out).absolute()
    pr = site.probe(storage_dir=sample_dir, sample_mb=args.sample_mb or site.SAMPLE_MB, partition=args.partition)
    target = out / "cluster" / f"{args.name}.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_all(target.parent, {target.name: site.cluster_yaml(args.name, pr, base_cluster()).encode()})
    for k in sorted(pr.sources):
        print(f"  read     {k} = {pr.values.get(k)!r}  ({pr.sources[k]})", file=sys.stderr)
    for k, why in sorted(pr.missing.items()):
        print(f"  default  {k}: {why}", file=sys.stderr)
    for n in pr.notes:
        print(f"  note     {n}", file=sys.stderr)
    print(target)
    print(f"use it: vdkit plan --config-dir {out} cluster={args.name} ...", file=sys.stderr)
    return 0


def base_cluster() -> dict:
    """The values a probed file starts from: the kit's XE9680 cluster (conf/cluster/xe9680.yaml) as composed."""
    import dataclasses

    from vdkit.config import compose

    return dataclasses.asdict(compose(["cluster=xe9680"]).cluster)
