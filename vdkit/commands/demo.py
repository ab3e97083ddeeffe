"""`vdkit demo`: the whole pipeline on the embedded default, on this machine, in minutes.

The `demo` sweep (conf/sweep/demo.yaml: Table 9's shape - LoRA, P-tuning and SFT on 1 and 2
"nodes" - on tiny_llama with the megatron engine, in the TP / PP / VP / DP layouts the planner
picks) is planned, each cell is trained for real for its
measured steps (local processes, or jobs on the local emulated Slurm with --slurm), then
`vdkit validate` extrapolates every run to its target steps and `vdkit report` writes Table 9 as
Markdown, CSV and JSON plus the plots. Each stage is the same code the verbs run.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from vdkit.commands.args import add_override_args

DEMO_SWEEP = "demo"
# The local Slurm's emulated XE9680s share this machine: the demo's ranks per "node" (its
# cluster.gpus_per_node) as tasks, loopback for the rendezvous, no PMI plugin (Debian's slurm-wlm has
# no PMIx library by default), this machine's Python rather than a container.
SLURM_CELL_OVERRIDES = ("cluster=xe9680", "cluster.mpi=none", "cluster.socket_ifname=lo",
                        "cluster.cpus_per_task=1", "cluster.time_limit_min=30", "engine.container_image=null")


def register(sub) -> None:
    """Add the `vdkit demo` verb to ``sub``."""
    p = sub.add_parser("demo", help="the embedded default end to end: train, validate, report (minutes, CPU)",
                       description="Plan the Table 9-shaped demo sweep on a tiny Llama, train every cell for "
                                   "real (engine=megatron; the 1-node LoRA cell engine=bridge; engine=reference "
                                   "on request; engine=nemo is refused: it needs its container) as 1 and 2 'nodes' "
                                   "in the layouts the planner picks "
                                   "(local processes, or the local emulated Slurm with --slurm), extrapolate each run to 1000 steps and "
                                   "write the table (Markdown, CSV, JSON) and plots. Overrides apply to every "
                                   "cell; -m replaces the sweep's cells with a cartesian product.")
    add_override_args(p)
    from vdkit.commands.args import out_path

    p.add_argument("--out", metavar="DIR", default="demo", type=out_path,
                   help="where runs/ (one run directory per cell, with logs/ and checkpoints/) and report/ "
                        "(table9.md, .csv, .json, the PNG plots) go (default: ./demo)")
    p.add_argument("--slurm", action="store_true",
                   help="run each cell as a Slurm job on the local emulated XE9680 cluster (root, slurm-wlm, "
                        "munge); falls back to local processes, saying why, when it cannot start")
    p.set_defaults(func=run)


def _cells(args):
    from vdkit.render.sweep import load_sweep, override_sets

    if args.multirun:
        base = [str(x) for x in load_sweep(DEMO_SWEEP).get("base") or []]
        # override_sets checks the line (-m with --sweep, a key twice, the sweep's size) and expands it
        return [base + cell for cell in override_sets(args.overrides, True, args.sweep)]
    return override_sets(args.overrides, sweep=DEMO_SWEEP if args.sweep is None else args.sweep)


def _start_slurm():
    """(the local Slurm's environment, the cluster to stop afterwards or None), or (None, None) with
    the reason printed when it cannot start. A cluster that was already up is left running."""
    from vdkit.errors import UserError
    from vdkit.slurm import localcluster

    root = slurm_dir()
    reason = localcluster.why_unavailable()
    if reason is None:
        try:
            was_up = localcluster.LocalCluster(root).is_up()
            cluster = localcluster.up(root)
            print(f"demo: local Slurm up ({cluster.describe()})", flush=True)
            return cluster.env(), (None if was_up else cluster)
        except UserError as exc:
            reason = str(exc)
    print(f"demo: --slurm: the local Slurm cannot start ({reason}); using local processes", flush=True)
    return None, None


def slurm_dir() -> Path:
    """The local Slurm `--slurm` uses: the one SLURM_CONF names (what `vdkit cluster up --dir X` printed:
    ``export SLURM_CONF=X/slurm.conf``), else the default directory. A SLURM_CONF that is not the kit's
    local Slurm (a site's /etc/slurm/slurm.conf) is refused: the demo emulates nodes on this machine."""
    from vdkit.errors import UserError
    from vdkit.slurm import localcluster

    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return localcluster.default_dir()
    root = Path(conf).expanduser().absolute().parent
    cluster = localcluster.LocalCluster(root)
    ours = not cluster.conf.exists() or all((root / d).is_dir() for d in ("munge", "spool", "state"))  # write_config's
    if Path(conf).expanduser().absolute() != cluster.conf or not ours:
        raise UserError(f"SLURM_CONF={conf} is not a local Slurm that `vdkit cluster up` started (demo --slurm runs "
                        "its cells on emulated nodes of this machine)",
                        "start one with `vdkit cluster up --dir DIR` and export the SLURM_CONF it prints, or unset "
                        "SLURM_CONF (the default local Slurm directory is used)")
    return root


def run(args) -> int:
    """`vdkit demo`: the embedded default end to end (plan, train, validate, report); the exit code."""
    out = Path(args.out).expanduser().absolute()
    slurm_env, started_cluster = _start_slurm() if args.slurm else (None, None)
    try:
        return _pipeline(args, out, slurm_env)
    finally:
        if started_cluster is not None:
            started_cluster.down()


def _pipeline(args, out: Path, slurm_env) -> int:
    from vdkit.render.prepare import prepare_all
    from vdkit.render.sweep import plan_cells

    cells = _with_bridge_base(_cells(args), out)
    if slurm_env is not None:
        cells = [c + list(SLURM_CELL_OVERRIDES) for c in cells]
    # Plan, check and render every cell before training any: a bad override fails in seconds, not
    # after a run (an engine that cannot run on this machine is refused here too).
    # Cells without a layout or that do not fit are skipped with a note, as render does.
    prepared = prepare_all(plan_cells(cells, True, "demo"), out / "runs", check_mounts=False)
    refuse_what_cannot_run_here(prepared, slurm_env is not None)
    plans = [cell.plan for cell in prepared]
    if slurm_env is not None:  # the emulated nodes are this machine: its Python runs the ranks too
        from vdkit.render.prepare import engine_of

        for cell in prepared:
            engine_of(cell.plan).local_check(cell.plan)  # e.g. torch missing: one line naming the extra
    where = "the local emulated Slurm" if slurm_env is not None else "local processes"
    print(f"demo: {len(plans)} runs on {where}; everything goes to {out}", flush=True)
    run_dirs = []
    started = time.monotonic()
    for i, cell in enumerate(prepared, 1):
        plan = cell.plan
        r = plan.recipe
        p = r.parallelism
        print(f"demo: [{i}/{len(plans)}] {r.model.name} {r.method.name} on {r.cluster.nodes} node(s) x "
              f"{r.cluster.gpus_per_node} ({r.world_size} ranks, {r.engine.name} tp={p.tp} pp={p.pp} vp={p.vp} "
              f"dp={plan.dp}): training {r.train.max_steps} steps ...", flush=True)
        t0 = time.monotonic()
        run_dir, ok = _train(cell, slurm_env)
        print(f"demo: [{i}/{len(plans)}] {'done' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s  ({run_dir})",
              flush=True)
        if not ok:
            print(f"demo: the run failed; its output is in {run_dir}", file=sys.stderr)
            return 1
        run_dirs.append(str(run_dir))
    print(f"demo: trained {len(run_dirs)} runs in {time.monotonic() - started:.0f} s; validating and reporting",
          flush=True)

    from vdkit.validation import tables
    from vdkit.validation.report import markdown, write_report

    report_dir = out / "report"
    table, written = write_report(run_dirs, tables.DEFAULT_TABLE, report_dir)
    print(markdown(table))
    for w in table.warnings:
        print(f"demo: warning: {w}", file=sys.stderr)
    print(f"\ndemo: runs in {out / 'runs'}; table, CSV, JSON and plots ({len(written)} files) in {report_dir}")
    print(f"demo: next: `vdkit validate {run_dirs[0]}` for one run's estimate, "
          f"`vdkit plan --sweep table9` for the real cluster's layouts")
    return 0


def refuse_what_cannot_run_here(prepared, on_local_slurm: bool) -> None:
    """The demo trains on this machine (local processes or the local Slurm, no containers): a cell whose
    engine needs its container (engine=nemo) or whose launcher would submit elsewhere is refused before
    any cell trains, in one line."""
    from vdkit.errors import UserError
    from vdkit.render.prepare import engine_of, launcher_of

    for cell in prepared:
        r = cell.plan.recipe
        engine = engine_of(cell.plan)
        if not engine.runs_locally:
            raise UserError(f"engine={r.engine.name} ({r.run_name}) runs only in its container on a cluster, "
                            "not on this machine", "render it for the cluster (`vdkit render` / `vdkit submit`), or "
                            "demo a sweep of engine=megatron, bridge or reference cells (the default demo sweep)")
        if not launcher_of(cell.plan).executes_here and not on_local_slurm:
            raise UserError(f"cluster={r.cluster.name} ({r.run_name}) would submit to a scheduler; the demo "
                            "trains on this machine", "add --slurm for the local emulated Slurm, or use "
                            "`vdkit submit` for a real cluster")


def _with_bridge_base(cells, out: Path):
    """Bridge fine-tunes from a Megatron-Bridge checkpoint (model.megatron_path): for the demo's bridge
    cells that have none, make one once - a seeded toy HF model of the cell's size, converted with
    Bridge's HF import (what a site does once with its Llama 2 weights) - and point the cells at it."""
    from vdkit.composition.config import compose

    done = {}
    result = []
    from vdkit.recipes import engines

    for cell in cells:
        r = compose(cell)
        engine = engines.get(r.engine.name)
        spec = engine.spec  # an engine whose fine-tuning reads a converted base checkpoint (bridge: model.megatron_path)
        if spec.make_base and r.method.name != "pretrain" and not getattr(r.model, spec.base_model_key):
            key = (r.model.name, r.model.num_layers, r.model.hidden_size)
            if key not in done:
                engine.require_runtime()  # the conversion runs the stack here: a missing one is the engine's one line, first
                print(f"demo: converting a seeded toy HF {r.model.name} into a Megatron-Bridge checkpoint "
                      "(the base the bridge cells fine-tune; a site converts its Llama 2 weights once) ...",
                      end="", flush=True)
                t0 = time.monotonic()
                base = out / "base" / f"{r.model.name}_{r.model.num_layers}l"
                log = out / "base" / f"{base.name}.log"
                with _output_to(log):  # Bridge's and DeepSpeed's warnings and bars: to the log, not the screen
                    done[key] = spec.make_base(r, base)
                print(f" done in {time.monotonic() - t0:.0f} s (log: {log})", flush=True)
            cell = [*cell, f"model.{spec.base_model_key}={done[key]}"]
        result.append(cell)
    return result


class _output_to:
    """Send this process's stdout and stderr (file descriptors 1 and 2: what libraries and their C code
    print) to ``path`` for the block; restored afterwards, also on an error (which is then in the log)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        self.fh = open(self.path, "ab")
        os.dup2(self.fh.fileno(), 1)
        os.dup2(self.fh.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        self.fh.close()
        return False


TICK_S = 15.0  # a progress line at most this often while a cell trains (the demo's cells take 1-3 minutes)


def _train(cell, env):
    """Write the cell's run directory and train it through its launcher; (run_dir, succeeded)."""
    from vdkit.render.prepare import launcher_of
    from vdkit.run.runs import Ticker

    plan = cell.plan
    launcher = launcher_of(plan)
    if env is not None:
        os.environ.update(env)  # the local Slurm's SLURM_CONF for sbatch / squeue / scontrol
    run_dir = cell.write()
    if sys.stdout.isatty() and launcher.executes_here:  # the ranks' own live bar is on the terminal
        return _train_in(cell, launcher, run_dir)
    with Ticker(run_dir, plan.recipe.train.max_steps, prefix="demo:   ", every_s=TICK_S):  # a step counter and ETA
        return _train_in(cell, launcher, run_dir)


def _train_in(cell, launcher, run_dir):
    from vdkit.render.prepare import engine_of

    plan = cell.plan
    if not launcher.executes_here:
        from vdkit.launch.launchers import succeeded

        launcher.submit(run_dir)
        return run_dir, succeeded(launcher.wait(run_dir, timeout=plan.time.time_limit_min * 60))
    # The live progress bar only on a terminal; the log file gets every update either way.
    sink = sys.stdout.buffer if sys.stdout.isatty() else open(os.devnull, "wb")
    try:
        if sys.stdout.isatty():
            print(flush=True)
        rc = launcher.run(run_dir, plan, engine_of(plan).command(plan, run_dir), terminal=sink)
    finally:
        if sink is not sys.stdout.buffer:
            sink.close()
    return run_dir, rc == 0
