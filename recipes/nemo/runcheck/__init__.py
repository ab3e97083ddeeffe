"""`vdkit check` for engine=nemo: NeMo 1.23's own code on each rendered nemo.yaml, in NeMo 1.23's venv.

The kit side (this module) turns each run directory into what the probe needs (the plan's layout and
model dimensions, the stand-in tokenizer) and runs :mod:`.probe` once for all of them in the venv of
:mod:`.venv`; the probe prints findings as JSON lines. Where the venv is not made it is made first (a
progress line on stderr); where it cannot be, each run says so ("could not check": `vdkit check` exits 3,
never a pass).
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from vdkit.run.jobcheck import DEFECT, NOT_HERE, Report

PROBE = Path(__file__).parent / "probe.py"


def _cell(run_dir: Path, tokenizer_dir: str) -> dict:
    from vdkit.planner.arch import trainable_params
    from vdkit.recipes.common.preflight import problem
    from vdkit.run.rundir import NEMO_CONFIG_FILE, load_plan

    plan = load_plan(run_dir)
    r = plan.recipe
    m = r.model
    model = {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "ffn_hidden_size": m.ffn_hidden_size,
             "num_attention_heads": m.num_attention_heads, "num_query_groups": m.num_query_groups,
             "max_position_embeddings": m.max_position_embeddings, "encoder_seq_length": m.max_position_embeddings,
             "position_embedding_type": "rope" if m.position_embedding == "rope" else "learned_absolute",
             "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "precision": "bf16"}
    restore = m.nemo_path or ""
    here = bool(restore) and Path(restore).is_file()
    # A base that is here but damaged is the pre-flight's defect (`vdkit check` runs it on what is here: NeMo's tarfile
    # error would name no key); the probe then merges onto the plan's dimensions, as for a base on the cluster
    broken = problem("model.nemo_path", restore, "nemo") if here and r.method.name != "pretrain" else None
    return {"run_dir": str(run_dir), "config": str(run_dir / NEMO_CONFIG_FILE), "finetune": r.method.name != "pretrain",
            "restore_from_path": restore, "restore_here": here and not broken, "restore_problem": broken, "model": model,
            "tokenizer_dir": tokenizer_dir, "trainable": trainable_params(r),
            "virtual_tokens": r.method.ptuning_virtual_tokens if r.method.peft_scheme == "ptuning" else 0,
            "plan": {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
                     "micro_batch_size": r.train.micro_batch_size, "global_batch_size": r.train.global_batch_size,
                     "seq_length": r.train.seq_length}}


def check_runs(run_dirs, render) -> list:
    """One Report per run directory: the probe's findings, or why NeMo could not be run here. ``render``: the
    engine's nemo.yaml renderer, for the hand-edit comparison (:func:`.edits.compare`)."""
    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files
    from vdkit.recipes.nemo.runcheck import venv

    from vdkit.errors import UserError
    from vdkit.recipes.nemo.runcheck import edits
    from vdkit.run.rundir import PLAN_FILE

    order = [str(d) for d in run_dirs]
    reports, edit_s = {}, {}
    for d in run_dirs:  # the hand edits first (about a second): a refused file never waits for NeMo's import
        start = time.perf_counter()
        reports[str(d)] = Report(Path(d), f"NeMo {venv.NEMO_VERSION}")
        try:
            ok = edits.check(Path(d), reports[str(d)], render)
        except UserError as exc:  # plan.json unreadable: this run dir's defect, not the whole command's
            reports[str(d)].defect(exc.what, PLAN_FILE, exc.fix or "re-render the run with `vdkit render`")
            ok = False
        if not ok:
            edit_s[str(d)] = time.perf_counter() - start
    refused = {k: reports.pop(k) for k in edit_s}
    for k, rep in refused.items():
        rep.seconds = edit_s[k]
    run_dirs = [d for d in run_dirs if str(d) not in refused]
    if not run_dirs:
        return list(refused.values())
    import sys

    try:
        py = venv.ensure(progress=lambda line: print(f"vdkit check: {line}", file=sys.stderr, flush=True))
    except venv.CannotCheck as exc:
        for rep in reports.values():
            rep.unchecked(f"NeMo {venv.NEMO_VERSION}'s code did not run: {exc} (fix: give this machine the package "
                          "index, or make it where there is one: `python -m vdkit.recipes.nemo.runcheck.venv`)")
        return [{**refused, **reports}[k] for k in order]
    with tempfile.TemporaryDirectory(prefix="vdkit-nemo-tok-") as tok:
        for name, text in byte_tokenizer_files("").items():
            (Path(tok) / Path(name).name).write_text(text)
        cells = [_cell(Path(d), tok) for d in run_dirs]
        start = time.perf_counter()
        proc = subprocess.run([str(py), str(PROBE)], input=json.dumps(cells), capture_output=True, text=True)
    seen = set()
    for line in proc.stdout.splitlines():
        try:
            f = json.loads(line)
        except ValueError:
            continue
        rep = reports.get(f.get("run_dir"))
        if f["kind"] == "version":
            for r in reports.values():
                r.stack = f"NeMo {f['text']} (own venv)"
        elif rep is not None and f["kind"] == "done":
            seen.add(f["run_dir"])
        elif rep is not None:
            rep.lines.append((f["kind"], f["text"]))
    spent = time.perf_counter() - start
    for key, rep in reports.items():
        rep.seconds = spent / max(len(reports), 1)
        if key not in seen:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            rep.lines.append((DEFECT, f"the NeMo {venv.NEMO_VERSION} check did not finish (exit {proc.returncode}): "
                                      f"{tail[:300]} (vdkit check; fix: rerun; recreate the venv with "
                                      "`python -m vdkit.recipes.nemo.runcheck.venv`)"))
    return [{**refused, **reports}[k] for k in order]


__all__ = ["check_runs", "NOT_HERE"]
