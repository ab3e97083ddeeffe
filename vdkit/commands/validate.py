"""`vdkit validate` (measured steps -> target-step estimate) and `vdkit report` (design-guide tables)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from vdkit.commands.args import count, finite_seconds, out_path
from vdkit.errors import UserError

MAX_STEPS = 10 ** 9  # --target-steps / --val-every: far beyond any run, small enough for exact arithmetic

# Light: the default's one home is the domain module (standard library + vdkit.run.rundir).
from vdkit.validation.run_dir import DEFAULT_TARGET_STEPS  # noqa: E402


def register(sub) -> None:
    """Add the `vdkit validate` and `vdkit report` verbs to ``sub``."""
    v = sub.add_parser(
        "validate", help="turn a run's measured steps into an estimate for the target steps, with a 95 %% interval",
        description="Parse a run directory (TensorBoard events under logs/, else its *.out files), a Slurm .out / "
                    "NeMo log file, or a TensorBoard event directory; drop the warm-up, report the steady-state "
                    "step time and extrapolate to the target steps. Only train_step_timing is summed: model load, "
                    "data load, validation and checkpoints are excluded unless --val-* / --checkpoint-seconds "
                    "add them.")
    v.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_LOG")
    v.add_argument("--target-steps", type=count(MAX_STEPS), metavar="N",
                   help=f"steps to extrapolate to (default: the run's train.target_steps, else {DEFAULT_TARGET_STEPS})")
    v.add_argument("--json", action="store_true", help="print one JSON object per run (one per line)")
    v.add_argument("--steps", action="store_true",
                   help="print the parsed per-step figures of one source as CSV (step,seconds,loss; loss empty where "
                        "the log has none) instead of an estimate; works on logs too short to extrapolate")
    v.add_argument("--val-every", type=count(MAX_STEPS), default=0, metavar="N",
                   help="add a validation every N steps ...")
    v.add_argument("--val-seconds", type=finite_seconds, default=0.0, metavar="S", help="... taking S seconds each")
    v.add_argument("--checkpoint-seconds", type=finite_seconds, default=0.0, metavar="S",
                   help="add S seconds per checkpoint (at the run's planned cadence, plan.json's time plan, "
                        "else one at the end)")
    v.set_defaults(func=run_validate)

    r = sub.add_parser(
        "report", help="rebuild a published table (`vdkit list tables`: table9, training, ...) from run "
                       "directories, next to the published one",
        description="Read each run directory's recipe, plan and logs; write the table as Markdown, CSV and JSON "
                    "plus PNG plots (minutes vs GPUs, step-time traces) into --out and print the Markdown.")
    r.add_argument("runs", nargs="*", metavar="RUN_DIR",
                   help="run directories (optional: without them, the planned table)")
    from vdkit.validation.tables import DEFAULT_TABLE  # standard library only at its top

    r.add_argument("--table", default=DEFAULT_TABLE, metavar="NAME",
                   help=f"a published table: validation/published/NAME.yaml (default: {DEFAULT_TABLE})")
    r.add_argument("--out", default="report", metavar="DIR", type=out_path, help="output directory (default: ./report)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.set_defaults(func=run_report)


# ----------------------------------------------------------------------------- validate
def _overheads(args, run_dir: Optional[Path]):
    from vdkit.validation.extrapolate import Overheads
    from vdkit.validation.run_dir import checkpoint_every

    if args.val_every < 0 or args.val_seconds < 0 or args.checkpoint_seconds < 0:
        raise UserError("--val-every, --val-seconds and --checkpoint-seconds must not be negative",
                        "pass e.g. --val-every 200 --val-seconds 30")
    if (args.val_every > 0) != (args.val_seconds > 0):
        raise UserError("--val-every and --val-seconds go together", "pass both, e.g. --val-every 200 --val-seconds 30")
    if not (args.val_every or args.checkpoint_seconds):
        return None
    return Overheads(args.val_every, args.val_seconds, checkpoint_every(run_dir), args.checkpoint_seconds)


def describe(result: dict) -> str:
    """A validate result as the text block the CLI prints."""
    r = result
    pct = lambda x: f"{x:.1%}"  # noqa: E731
    where = "extrapolated from" if r["extrapolated"] else "measured over"
    intervals = r.get("iterations_measured", r["steps_measured"]) != r["steps_measured"]
    unit = "log interval(s)" if intervals else "step(s)"
    its = f", {r['iterations_measured']} iterations" if intervals else ""
    why = r["fluctuation_reason"]  # the estimate's rule (a CPU run's threshold included)
    flag = f"YES: {why}" if r["fluctuating"] else ("no" if why == "steady" else f"no: {why}")
    lines = [
        f"{r['source']}  ({r['format']}: {', '.join(Path(f).name for f in r['files'][:3])}"
        f"{' ...' if len(r['files']) > 3 else ''})",
        f"  measured      {r['steps_measured']} timed {unit} (global steps {r['first_step']}-{r['last_step']}"
        f"{its})",
        f"  warm-up       {r['warmup_steps']} {unit} excluded, {r['warmup_seconds']:.1f} s: {r['warmup_reason']}",
        f"  steady state  mean {r['step_time_mean_s']:.4g} s, median {r['step_time_median_s']:.4g} s, "
        f"std {r['step_time_std_s']:.3g} s (CV {pct(r['step_time_cv'])}), p5-p95 {r['step_time_p5_s']:.4g}-"
        f"{r['step_time_p95_s']:.4g} s, drift {r['drift']:+.1%}",
        f"  fluctuating   {flag}",
        f"  estimate      {r['target_steps']} steps: {r['extrapolated_minutes']:.1f} min (95 % interval "
        f"{r['interval_minutes'][0]:.1f}-{r['interval_minutes'][1]:.1f}), {where} {r['steps_measured']} {unit}",
        f"  interval      {r['interval_method']}",
        f"  includes      {'; '.join(r['includes'])}",
        f"  excludes      {', '.join(r['excludes']) or 'nothing'}",
    ]
    lines += [f"  warning       {w}" for w in r["warnings"]]
    return "\n".join(lines)


def check_log_sizes(sources) -> None:
    """Each log file named on the command line is at most MAX_LOG_BYTES, checked before a byte is read
    (a 2 GB sparse file took 35 s to say "no steps")."""
    from vdkit.composition.limits import MAX_LOG_BYTES, check_size

    for src in sources:
        if Path(src).is_file():
            check_size(src, MAX_LOG_BYTES, "training log", "pass the job's own log (or the run directory)")


def run_steps(args) -> int:
    """`vdkit validate --steps SOURCE`: the per-step CSV (warnings to stderr, so the CSV stays clean)."""
    from vdkit.validation.logs import read_source
    from vdkit.validation.steps import steps_csv

    if len(args.sources) != 1:
        raise UserError(f"--steps takes one RUN_DIR_OR_LOG, got {len(args.sources)}",
                        "run `vdkit validate --steps` once per source")
    check_log_sizes(args.sources)
    log = read_source(args.sources[0], require_timing=False)
    sys.stdout.write(steps_csv(log))
    for w in log.warnings:
        print(f"vdkit validate: warning: {w}", file=sys.stderr)
    return 0


def run_validate(args) -> int:
    """`vdkit validate`: a run's measured steps extrapolated to its target steps (``--steps``: the per-step CSV);
    the exit code."""
    if args.steps:
        return run_steps(args)
    from vdkit.run.rundir import find_run_dir
    from vdkit.validation.run_dir import validate_one

    if args.target_steps is not None and args.target_steps < 1:
        raise UserError(f"--target-steps {args.target_steps} must be >= 1", "pass e.g. --target-steps 1000")
    failures = []
    check_log_sizes(args.sources)
    for i, src in enumerate(args.sources):
        try:
            overheads = _overheads(args, find_run_dir(Path(src)))
            result = validate_one(src, args.target_steps, overheads)
        except UserError as exc:
            if len(args.sources) == 1:
                raise
            failures.append(exc)
            print(f"vdkit validate: error: {exc}", file=sys.stderr)
            continue
        public = {k: v for k, v in result.items() if not k.startswith("_")}
        if args.json:
            print(json.dumps(public))
        else:
            print(("\n" if i else "") + describe(public))
    return 2 if failures else 0


# ----------------------------------------------------------------------------- report
def run_report(args) -> int:
    """`vdkit report`: a published table rebuilt from run directories, beside the published one; the exit code."""
    from vdkit.validation import tables
    from vdkit.validation.report import markdown, write_report

    tables.spec(args.table)  # an unknown name: one line before anything else
    if not args.runs:  # the planned table: every cell planned and predicted, next to the published figure
        print(f"vdkit report: no run directories: the planned {args.table} (predicted next to published); "
              "pass run directories to add measured times", file=sys.stderr)
    table, written = write_report(args.runs, args.table, args.out, plots=not args.no_plots)
    print(markdown(table))
    for w in table.warnings:
        print(f"vdkit report: warning: {w}", file=sys.stderr)
    print(f"wrote {len(written)} files to {Path(args.out)}: " + ", ".join(p.name for p in written), file=sys.stderr)
    return 0
