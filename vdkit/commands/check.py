"""`vdkit check RUN_DIR...`: run each job's own entry code, in its engine's library, as far as this CPU goes.

Run directories are grouped by engine and each engine checks its group in one go (one import of its
stack for all of them): :func:`vdkit.recipes.engines.Engine.check_runs`. stdout: per run directory a
header and one line per finding (checked / not checked here / defect, :mod:`vdkit.run.jobcheck`).
Exit 0 only when no directory has a defect and every stack's probe ran; each defect is repeated on stderr
as one line (``vdkit check: error: RUN_DIR: ...``, exit 2); a probe that could not run here (NeMo's venv
could not be made) is one line per reason (``vdkit check: cannot check N run directories: ...``, exit 3).
"""
from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    """Add the `check` verb."""
    p = sub.add_parser("check", help="run each rendered job's own entry code on this CPU as far as it goes; "
                                     "exit 2 on a defect",
                       description="For each run directory, execute what its job runs (Megatron-Bridge's "
                                   "ConfigContainer and validate(), the model on the meta device, NeMo 1.23's "
                                   "optimizer registry and dataset class, ...) in the engine's real library "
                                   "version; name what only the cluster holds ('not checked here'); refuse a "
                                   "defect in one line (exit 2); exit 3 when a stack's probe could not run here (never 0 "
                                   "unchecked). docs/checking-jobs.md says how far each stack goes.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.set_defaults(func=run)


def check_dirs(run_dirs) -> list:
    """Every run directory's :class:`vdkit.run.jobcheck.Report`, in the order given: first its files against the kit's
    render of its recipe (:mod:`vdkit.render.rendercheck`: one that differs is refused and nothing of it runs), then the
    engines' checks, one call per engine."""
    from vdkit.errors import UserError
    from vdkit.recipes import engines
    from vdkit.run.rundir import RECIPE_FILE, load_recipe

    import contextlib
    import time
    import warnings

    from vdkit.render.rendercheck import check as against_render
    from vdkit.run.jobcheck import Report

    groups, reports, refused = {}, [], []
    for d in run_dirs:  # one run dir's unreadable recipe is that dir's defect, never the end of the others' check
        path = Path(d).resolve()
        try:
            if not (path / RECIPE_FILE).is_file():
                raise UserError(f"{d} is not a run directory (no {RECIPE_FILE})",
                                "pass a directory `vdkit render` printed")
            groups.setdefault(load_recipe(path / RECIPE_FILE).engine.name, []).append(path)
        except UserError as exc:
            rep = Report(path)
            rep.cannot_read(exc)
            refused.append(rep)
    for name in list(groups):  # before anything of a run dir runs: its files are the kit's render of its recipe
        kept = []
        for path in groups[name]:
            start = time.perf_counter()
            found = against_render(path)
            if found:
                rep = Report(path, f"engine={name}")
                for what, setting, fix in found:
                    rep.defect(what, setting, fix)
                rep.seconds = time.perf_counter() - start
                refused.append(rep)
            else:
                kept.append(path)
        groups[name] = kept
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):  # the stacks' own chatter: stderr
        warnings.simplefilter("ignore")
        for name in engines.names():
            if groups.get(name):
                reports += engines.get(name).check_runs(groups[name])
    for rep in reports:
        rep.lines.insert(0, ("checked", "every file the job runs or reads is the kit's render of its recipe.yaml "
                                        "(the engine's config held to the stack's types and value rules)"))
        preflight_here(rep)
    order = {Path(d).resolve(): i for i, d in enumerate(run_dirs)}
    return sorted(refused + reports, key=lambda r: order.get(Path(r.run_dir).resolve(), 0))


def preflight_here(rep) -> None:
    """The job's own pre-flight (``preflight.json``: each input path of the kind its stack reads) on the inputs that
    are on this machine (:func:`vdkit.composition.files.on_this_machine`, the render's rule): a damaged base or an
    empty data directory here is a defect now, not the job's refusal after the queue wait. The rest is the cluster's."""
    import json

    from vdkit.composition.files import on_this_machine
    from vdkit.recipes.common.preflight import DEFAULT_FIX, FIXES, problem
    from vdkit.run.rundir import PREFLIGHT_FILE

    try:
        needs = json.loads((Path(rep.run_dir) / PREFLIGHT_FILE).read_text()).get("needs", [])
    except (OSError, ValueError, AttributeError):  # none (rendered before the pre-flight) or compared already
        return
    here = [n for n in needs if isinstance(n, dict) and n.get("path") and on_this_machine(n["path"])]
    found, failed = [], []
    for need in here:
        path = Path(need["path"])
        if any(bad in path.parents for bad in failed):  # a file in a directory refused already: the same cause
            continue
        why = problem(need.get("what", "a path"), need["path"], need.get("kind", "file"))
        found.append((need, why))
        if why:
            failed.append(path)
            rep.defect(why, str(need.get("what")), FIXES.get(need.get("kind"), DEFAULT_FIX))
    if here and not failed:
        rep.checked(f"the job's pre-flight on its {len(here)} input(s) on this machine ("
                    + ", ".join(str(n.get("what")) for n in here) + "): each there and of the kind its stack reads")


def report(reports, out=None, err=None, brief: bool = False) -> int:
    """Print the reports (stdout), each defect as one line and each reason a probe did not run as one line
    (stderr); the exit code (:data:`vdkit.run.jobcheck.EXIT_DEFECT`, :data:`~vdkit.run.jobcheck.EXIT_NOT_CHECKED`, 0).
    ``brief`` (a checked sweep): one line per run directory and a total, not every finding."""
    from vdkit.run.jobcheck import EXIT_DEFECT, EXIT_NOT_CHECKED

    # sys.stdout / sys.stderr of the call, not of the import (a caller may have swapped them since).
    out, err = out or sys.stdout, err or sys.stderr
    bad = 0
    unchecked = {}
    for r in reports:
        print(r.summary() if brief else r.text(), file=out, flush=True)
    if brief:
        failed = sum(1 for r in reports if r.defects)
        print(f"checked {len(reports)} run dir(s): {len(reports) - failed} ok, {failed} with defects, "
              f"{sum(r.seconds for r in reports):.1f} s (`vdkit check RUN_DIR` lists one's findings)", file=out, flush=True)
    for r in reports:
        for text in r.defects:
            bad += 1
            where = "" if r.unreadable else f"{r.run_dir}: "  # an unreadable recipe's line names its file itself
            print(f"vdkit check: error: {where}{text}", file=err, flush=True)
        for text in r.not_checked:
            unchecked.setdefault(text, []).append(r.run_dir)
    for text, dirs in unchecked.items():  # one line per reason, however many run dirs it kept unchecked
        n = f"{len(dirs)} run directories" if len(dirs) > 1 else str(dirs[0])
        print(f"vdkit check: cannot check {n}: {text}", file=err, flush=True)
    return EXIT_DEFECT if bad else EXIT_NOT_CHECKED if unchecked else 0


def run(args) -> int:
    """`vdkit check RUN_DIR...`: every run directory checked, the reports printed; the exit code."""
    return report(check_dirs(args.run_dirs))
