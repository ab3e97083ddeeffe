"""`vdkit site probe --name NAME --out DIR`: this node's facts -> DIR/cluster/NAME.yaml (vdkit.composition.site).

Run it on a compute node (`srun -N1 --exclusive vdkit site probe ...`) so it sees the adapters, GPUs
and storage a job sees; then `vdkit plan --config-dir DIR cluster=NAME ...` uses the file.
"""
from __future__ import annotations

import sys
from pathlib import Path

from vdkit.commands.args import out_path


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
                                 "named in the file and keeps the documented default (vdkit/composition/schema.py ClusterCfg).")
    q.add_argument("--name", required=True, help="the cluster's name (cluster=NAME)")
    q.add_argument("--out", required=True, type=out_path, metavar="DIR", help="the config dir (--config-dir DIR)")
    q.add_argument("--run-dir", metavar="DIR", type=out_path,
                   help="where runs will write (checkpoints): the storage sample is taken there (default: --out)")
    q.add_argument("--sample-mb", type=int, default=None, help="MB written for the storage sample (default 256)")
    q.add_argument("--partition", help="the partition to read (default: sinfo's default partition)")
    q.add_argument("--force", action="store_true", help="replace DIR/cluster/NAME.yaml when it exists (a hand-edited "
                                                         "file is never overwritten without it)")
    q.set_defaults(func=run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run(args) -> int:
    """`vdkit site probe`: this node's facts written into DIR/cluster/NAME.yaml; the exit code."""
    import re

    from vdkit.composition import site
    from vdkit.errors import UserError
    from vdkit.composition.files import replace_all

    check_name(args.name)
    if args.sample_mb is not None and not 1 <= args.sample_mb <= 65536:
        raise UserError(f"--sample-mb {args.sample_mb} is out of range", "use 1 to 65536 (default 256)")
    out = Path(args.out).absolute()
    target = out / "cluster" / f"{args.name}.yaml"
    check_target(target, args.force)  # before the probe: nothing is sampled for a file that cannot be written
    sample_dir = Path(args.run_dir or args.out).absolute()
    pr = site.probe(storage_dir=sample_dir, sample_mb=args.sample_mb or site.SAMPLE_MB, partition=args.partition)
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


# Names a YAML reader takes for something else than a string (cluster=null composes no cluster, cluster=123 an int)
YAML_WORDS = frozenset({"null", "none", "true", "false", "yes", "no", "on", "off", "nan", "inf", "y", "n"})


def check_name(name: str) -> None:
    """Refuse a --name that would not name this cluster: not a plain name, a YAML word or number (``null``,
    ``123``), or the name of a cluster the kit ships (``xe9680``: --config-dir refuses the shadowing file)."""
    import re

    from vdkit.composition.config import conf_dir
    from vdkit.errors import UserError

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", name) or name.lower() in YAML_WORDS:
        raise UserError(f"--name {name!r} is not a cluster name (cluster={name} must read back as this name: a letter "
                        "first, then letters, digits, _ . -; not a YAML word such as null or true)",
                        "use e.g. --name mysite")
    if (conf_dir() / "cluster" / f"{name}.yaml").is_file():
        raise UserError(f"--name {name!r} is a cluster the kit ships (conf/cluster/{name}.yaml); a site file of that name "
                        "would shadow it", f"use a name of your own, e.g. --name {name}_site")


def check_target(target: Path, force: bool) -> None:
    """The cluster file's folder must be a folder (not a file, not a loop of links); an existing file is replaced
    only with --force."""
    import os

    from vdkit.errors import UserError

    folder = target.parent
    if os.path.lexists(folder) and not folder.is_dir():
        kind = "a loop of symbolic links" if folder.is_symlink() and not folder.exists() else "not a directory"
        raise UserError(f"{folder} is {kind}, so {target.name} cannot be written there",
                        "pass an --out whose cluster/ is a directory (or does not exist yet)")
    if os.path.lexists(target) and not force:
        raise UserError(f"{target} exists (maybe edited by hand); it is not overwritten",
                        "pass --force to replace it, or choose another --name")


def base_cluster() -> dict:
    """The values a probed file starts from: the kit's XE9680 cluster (conf/cluster/xe9680.yaml) as composed."""
    import dataclasses

    from vdkit.composition.config import compose

    return dataclasses.asdict(compose(["cluster=xe9680"]).cluster)
