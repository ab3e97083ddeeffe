"""The trial: run every row of cases.yaml and print the outcome counts by defect class.

  .venv/bin/python tests/bad_inputs/trial.py [--jobs 2] [--class 3] [--list] [--only OUTCOME]

Not a test (tests/test_bad_input_classes.py asserts every row is clean); this prints what the
issue's note reports: how many inputs of each class end clean, vague, in a traceback, accepted,
failed in a rank, or hung.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
import multiprocessing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CLASSES, HANG_S, OUTCOMES, classify, load_cases, run_case, warm_up, why  # noqa: E402
from workspace import build_template, workspace  # noqa: E402


_ROOT = _TEMPLATE = None


def _one(i_case):
    i, case = i_case
    ws = workspace(_TEMPLATE, _ROOT / f"ws{i}", case.needs)
    res = run_case(case, ws, limit=HANG_S if case.cls == 5 else 6 * HANG_S)  # the test's limits (a slow refusal is no hang)
    return case, res, classify(case, res, ws)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--class", dest="cls", type=int, action="append")
    ap.add_argument("--list", action="store_true", help="print every case that is not clean")
    ap.add_argument("--only", help="with --list: only this outcome")
    ap.add_argument("--id", help="only cases whose id contains this")
    args = ap.parse_args()
    cases = [c for c in load_cases() if (not args.cls or c.cls in args.cls) and (not args.id or args.id in c.id)]
    root = Path(tempfile.mkdtemp(prefix="vdkit-trial-"))
    template = build_template(root / "template")
    warm_up(template)

    global _ROOT, _TEMPLATE
    _ROOT, _TEMPLATE = root, template
    t0 = time.monotonic()
    # Worker processes (single-threaded, so each may fork its cases safely), one case at a time.
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        results = pool.map(_one, list(enumerate(cases)), chunksize=1)
    counts = {k: Counter() for k in CLASSES}
    for case, res, outcome in results:
        counts[case.cls][outcome] += 1
        if args.list and outcome != "clean" and (not args.only or outcome == args.only):
            print(f"{outcome:15} {case.id}: {why(case, res)}")
    print(f"{'class':24} {'inputs':>6} " + " ".join(f"{o:>14}" for o in OUTCOMES))
    total = Counter()
    for k, name in CLASSES.items():
        c = counts[k]
        total.update(c)
        print(f"{k} {name:22} {sum(c.values()):6} " + " ".join(f"{c[o]:14}" for o in OUTCOMES))
    print(f"{'all':24} {sum(total.values()):6} " + " ".join(f"{total[o]:14}" for o in OUTCOMES))
    print(f"({len(cases)} inputs in {time.monotonic() - t0:.0f} s, {args.jobs} jobs; workspaces under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
