"""`vdkit render`: write one new run directory per recipe (launch.sbatch, recipe.yaml, nemo.yaml, ...).

  vdkit render [OVERRIDES...] [-m | --sweep NAME] [--out DIR] [--check-mounts | --no-check-mounts] [--check]

stdout: each run directory's path, one per line (for scripts). stderr, for the reader: under each
path its layout, memory and predicted time, and at the end the inputs this machine did not check
and the command that runs the job. With -m or --sweep, cells the planner finds infeasible (e.g. 70B
SFT on 8 GPUs) are skipped with a one-line note on stderr; every other problem stops the whole
command before any run directory is written.
"""
from __future__ import annotations

import re
import sys
from pathlib import PurePosixPath

from vdkit.commands.args import add_render_args, run_dir_files_help


def register(sub) -> None:
    """Add the `render` verb."""
    p = sub.add_parser("render", help="write a run directory with launch.sbatch (+ NeMo config); print its path",
                       description="Compose and plan each recipe, then write a new run directory (a re-render "
                                   "writes NAME-2, never over an earlier one). " + run_dir_files_help() + " Prints "
                                   "the paths (stdout) and, under each, its layout, memory and predicted time, then "
                                   "the site assumptions, the inputs not checked on this machine and the exact "
                                   "sbatch line (stderr).")
    add_render_args(p)
    p.add_argument("--check", action="store_true",
                   help="then run `vdkit check` on every run directory written (exit 2 on a defect)")
    p.set_defaults(func=run)


def run(args) -> int:
    """`vdkit render`: a run directory per feasible recipe (or sweep cell), its path printed; the exit code."""
    from vdkit.render.prepare import prepare_all
    from vdkit.render.sweep import feasible_plans

    plans = feasible_plans(args.overrides, args.multirun, args.sweep, "render")
    # Every cell is checked and rendered in memory before any run directory is written.
    cells = prepare_all(plans, args.out, args.check_mounts)
    written = []
    for cell in cells:
        run_dir = cell.write()
        written.append(run_dir)
        print(run_dir, flush=True)
        print(cell_lines(cell.plan), file=sys.stderr, flush=True)
    from vdkit.launch.launchers import of

    start = of(cells[0].plan).next_command(cells[0].files) if cells else ""
    print(closing_lines(cells, written, args.check_mounts, start), file=sys.stderr)
    if getattr(args, "check", False):
        from vdkit.commands.check import check_dirs, report

        return report(check_dirs(written), out=sys.stderr, brief=len(written) > 1)  # a sweep: a line per cell
    return 0


def cell_lines(plan) -> str:
    """Three indented lines: the layout with its memory, the predicted time (or why there is none), and
    the allocation (--time, how many, the checkpoint cadence); a fourth on more than one node: the
    inter-node fabric the prediction assumes."""
    r, p = plan.recipe, plan.recipe.parallelism
    if p.sharding != "none":  # sharded data parallel (FSDP / ZeRO-3): the layout is DP over every GPU
        layout = f"DP {plan.dp} ({p.sharding})"
    else:
        layout = f"TP {p.tp} x PP {p.pp}" + (f" x CP {p.cp}" if p.cp > 1 else "") + f" x DP {plan.dp} ({plan.layout_source})" + (f", VP {p.vp}" if p.vp > 1 else "")
    layout += (f", gradient accumulation {plan.grad_accum}; {plan.memory.total_gb:.1f} of {r.cluster.gpu_memory_gb:g} "
               f"GB per GPU" + (" (borderline)" if plan.borderline else ""))
    pred = plan.prediction
    if pred is not None:
        timing = (f"{pred.step_seconds:.3g} s/step, {pred.minutes:,.1f} min for {r.train.target_steps} steps, "
                  f"{pred.gpu_hours:,.1f} GPU-hours"
                  + (f" (range {pred.interval_s[0]:.3g} .. {pred.interval_s[1]:.3g} s/step)" if pred.interval_s else ""))
    else:
        why = next((n for n in plan.notes if "prediction" in n), "")
        why = re.sub(r"^no (time |step-time )?prediction:\s*", "", why)
        timing = "none" + (f" ({why})" if why else "")
    t = plan.time  # the planner's --time, allocations and cadence
    every = f"every {t.every_n_steps} steps" if t.every_n_steps else "at the end and at each stop"
    allocs = (f"{t.allocations} allocation(s)" + (", each continued by the job itself" if t.allocations > 1 else "")
              if t.allocations else "allocations unknown")
    times = f"--time={t.time_limit_min} min, {allocs}; checkpoint {every}"
    out = f"  layout     {layout}\n  predicted  {timing}\n  time       {times}"
    from vdkit.composition.schema import SEEDED_NOTE

    out += "".join(f"\n  weights    {n.split(': ', 1)[1]}" for n in plan.notes if n.startswith(SEEDED_NOTE))
    if r.cluster.nodes > 1:  # the fabric the prediction assumes (vdkit.planner.interconnect)
        from vdkit.planner.interconnect import interconnect

        out += f"\n  fabric     {interconnect(r.cluster).line()}"
    return out


def site_assumptions(cells) -> list:
    """One block: the site facts (vdkit.composition.site.SITE_FACTS) the rendered jobs use that nobody read on a node
    (not in ``cluster.probed``), for clusters whose ranks run elsewhere (not the local launcher)."""
    from vdkit.launch import launchers
    from vdkit.composition.site import SITE_FACTS

    seen, lines = set(), []
    for cell in cells:
        c = cell.plan.recipe.cluster
        if c.name in seen or launchers.executes_here(c.launcher):
            continue
        seen.add(c.name)
        assumed = [f"cluster.{k}={getattr(c, k)!r}".replace("'", "") for k in SITE_FACTS if k not in c.probed]
        if assumed:
            lines.append(f"site assumptions of cluster {c.name} (not read on your nodes; an adapter name that differs "
                         "silently costs NICs or falls back to TCP):")
            lines += [f"  {a}" for a in assumed]
            lines.append(f"  read yours on a compute node: vdkit site probe --name mysite --out DIR, then render "
                         f"with --config-dir DIR cluster=mysite")
    return lines


def closing_lines(cells, run_dirs, check_mounts, run_command: str) -> str:
    """What was not checked here (with the flag that checks it) and how to start the job(s)."""
    from vdkit.render.prepare import unchecked_inputs

    found = {}
    for cell in cells:
        for what, path in unchecked_inputs(cell.plan, cell.run_dir, check_mounts):
            found.setdefault(str(path), what)
    # a directory listed only because a file in it is (the .nemo file's folder) says nothing new
    unchecked = [f"{what} {path}" for path, what in found.items()
                 if not any(other != path and PurePosixPath(path) in PurePosixPath(other).parents for other in found)]
    lines = site_assumptions(cells)
    if unchecked:
        why = ("--no-check-mounts" if check_mounts is False else
               "their top-level directories are not on this machine: cluster storage")
        lines.append(f"not checked ({why}): " + ", ".join(unchecked)
                     + "; make sure the cluster has them (--check-mounts requires them here)")
    if len(run_dirs) == 1:
        lines.append("next: " + run_command.format(run_dirs[0]))
    elif run_dirs:
        lines.append(f"next: {run_command.format('DIR')} for each of the {len(run_dirs)} run directories above")
    return "\n".join(lines)
