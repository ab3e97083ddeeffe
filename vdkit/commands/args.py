"""Argument declarations the verbs share (argparse only: cheap to import, imports no verb)."""
from __future__ import annotations

import argparse


def out_path(value: str) -> str:
    """argparse type of every output path: an empty one would silently mean the current directory."""
    if not str(value).strip():
        raise argparse.ArgumentTypeError("an empty path would write into the current directory; name a directory")
    return value


def finite_seconds(value: str) -> float:
    """argparse type of a duration in seconds: a finite number >= 0 (nan / inf would print 'nan min')."""
    import math

    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a finite, non-negative number of seconds")
    return x


def count(limit: int):
    """argparse type of a count in [0, limit] (a 400-digit --target-steps would overflow the arithmetic)."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if n > limit:
            raise argparse.ArgumentTypeError(f"{value[:20]}{'...' if len(value) > 20 else ''} is more than {limit:,}")
        return n
    return parse


def add_override_args(parser: argparse.ArgumentParser, sweeps: bool = True) -> None:
    """The arguments every recipe verb shares: Hydra overrides, -m and --sweep."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides, e.g. model=llama2_70b method=lora cluster.nodes=2")
    parser.add_argument("--config-dir", metavar="DIR",
                        help="your own config dir (Hydra's convention): DIR/cluster/NAME.yaml is cluster=NAME "
                             "(what `vdkit site probe --out DIR` writes)")
    if sweeps:
        parser.add_argument("-m", "--multirun", action="store_true",
                            help="cartesian sweep over comma lists: -m model=llama2_7b,llama2_13b cluster.nodes=1,2")
        parser.add_argument("--sweep", metavar="NAME",
                            help=f"a named sweep from conf/sweep/ ({_sweep_names()}; `vdkit list sweeps` says what each "
                                 "is); overrides apply to every cell")


def run_dir_files_help() -> str:
    """What a run directory holds, per engine (every engine of the registry named): for the verbs' --help."""
    from vdkit.recipes.engines import specs
    from vdkit.run.rundir import OVERRIDES_FILE, PLAN_FILE, RECIPE_FILE, SBATCH_FILE

    per = "; ".join(f"engine={s.name}: " + (", ".join(s.run_dir_files) or "no other file") for s in specs())
    return (f"Each run directory holds {RECIPE_FILE}, {PLAN_FILE}, {OVERRIDES_FILE}, the launcher's file "
            f"({SBATCH_FILE} for Slurm, manifests for Kubernetes) and the engine's ({per}).")


def _sweep_names() -> str:
    """The sweeps in conf/sweep/, for help text (read from the tree, never typed here)."""
    from vdkit.composition.config import group_options
    from vdkit.errors import UserError

    try:
        return ", ".join(group_options("sweep"))
    except UserError:  # no config tree: the verb itself will say so
        return "see `vdkit list sweeps`"


def add_render_args(p: argparse.ArgumentParser) -> None:
    """The arguments of every verb that renders run directories (render, submit)."""
    add_override_args(p)
    p.add_argument("--out", metavar="DIR", type=out_path,
                   help="parent directory of the run directories (default: run.out_dir)")
    mounts = p.add_mutually_exclusive_group()
    mounts.add_argument("--check-mounts", dest="check_mounts", action="store_true", default=None,
                        help="require the data dir, the base model and a squashfs image to exist here")
    mounts.add_argument("--no-check-mounts", dest="check_mounts", action="store_false",
                        help="do not check them (rendering away from the cluster's storage). Default: check "
                             "a path only when its top-level directory (e.g. /data) exists on this machine")
