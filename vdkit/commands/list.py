"""`vdkit list`: what exists (models, methods, clusters, data, engines, launchers, sweeps, tables), one line each."""
from __future__ import annotations


def register(sub) -> None:
    """Add the `list` verb."""
    from vdkit.commands.catalog import KINDS

    names = [k.name for k in KINDS] + ["keys"]
    p = sub.add_parser("list", help="what exists: models, methods, clusters, data, engines, launchers, sweeps, tables",
                       description="List what the kit knows, one line each, read from conf/, the engine and "
                                   "launcher registries and the published tables. KIND narrows it "
                                   f"({', '.join(names)}); `vdkit list keys` lists every recipe key with its meaning "
                                   "(`vdkit plan --explain KEY` says more about one).")
    # (checked in run: argparse's `choices` refuses an empty nargs="*" list when options and positionals mix)
    p.add_argument("kinds", nargs="*", metavar="KIND",
                   help="one or more of: " + ", ".join(names) + " (singular too: cluster, model, ...)")
    p.add_argument("--json", action="store_true",
                   help="with `engines`: each engine's capabilities (its spec) as JSON, what `vdkit plan` accepts")
    p.set_defaults(func=run)


def run(args) -> int:
    """`vdkit list [KIND...]`: what the kit knows (models, methods, clusters, engines, ...), one line each; the exit code."""
    from vdkit.commands.catalog import KINDS, render
    from vdkit.errors import UserError

    names = [k.name for k in KINDS] + ["keys"]
    # singular or plural: `vdkit list cluster` is `vdkit list clusters` (the group's own name is singular)
    singular = {n[:-1]: n for n in names if n.endswith("s")}
    kinds = list(dict.fromkeys(singular.get(k, k) for k in args.kinds))
    for kind in kinds:
        if kind not in names:
            raise UserError(f"{kind!r} is not a kind of thing vdkit lists", "use one or more of " + ", ".join(names))
    if args.json:
        if kinds != ["engines"]:
            raise UserError("--json lists the engines only", "use `vdkit list engines --json`")
        import json

        from vdkit.commands.catalog import engine_records

        print(json.dumps(engine_records(), indent=2))
        return 0
    if kinds == ["engines"]:  # the capability table (with other kinds: one line each, as every kind)
        from vdkit.commands.catalog import engine_table

        print(engine_table())
        return 0
    blocks = []
    if [k for k in kinds if k != "keys"] or not kinds:
        blocks.append(render([k for k in kinds if k != "keys"]))
    if "keys" in kinds:
        from vdkit.commands.keys import all_keys

        width = max(len(d.key) for d in all_keys())
        blocks.append("keys (KEY=VALUE on any verb; `vdkit plan --explain KEY`)\n"
                      + "\n".join(f"  {d.key.ljust(width)}  {d.meaning}" for d in all_keys()))
    print("\n\n".join(blocks))
    if not kinds:
        print("\nevery recipe key and its meaning: `vdkit list keys`; one key: `vdkit plan --explain KEY`")
    return 0
