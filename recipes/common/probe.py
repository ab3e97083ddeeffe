"""`vdkit check`'s start-up probes shared by the engines that run the kit's own training loop (megatron, reference).

What their ranks do before the first step, run here on a CPU with the job's own functions: megatron-core's
micro-batch calculator at the plan's data-parallel size, and the data set-up (the tokenizer the settings name,
samples made by :func:`vdkit.recipes.common.data.encode_sample`, the first micro batch). A library's refusal is
named by the file and line that raised it (:func:`library_site`), so a defect line says whose rule it is.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

SAMPLE_ROWS = 8  # rows made from the run's settings when its data is the cluster's


def library_site(exc: BaseException) -> str:
    """``package/file.py:LINE`` of the innermost frame of ``exc`` inside an installed package ('' when none):
    the library line that refused, as the planted-defect table cites it."""
    import traceback

    site = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        if "site-packages" in parts:
            rel = parts[parts.index("site-packages") + 1:]
            site = f"{'/'.join(rel)}:{frame.lineno}"
    return site


def microbatches(plan, rep) -> None:
    """megatron-core's ``init_num_microbatches_calculator`` (as Megatron-LM and Bridge start it) with the recipe's
    global / micro batch and the plan's data-parallel size: its divisibility asserts, and the count it yields equal
    to the plan's gradient accumulation (the loop takes its micro batches from the plan)."""
    from megatron.core import num_microbatches_calculator as nmc

    t = plan.recipe.train
    try:
        nmc.init_num_microbatches_calculator(0, None, t.global_batch_size, t.micro_batch_size, plan.dp)
        got = nmc.get_num_microbatches()
    except AssertionError as exc:
        rep.defect(f"megatron-core's init_num_microbatches_calculator refuses train.global_batch_size="
                   f"{t.global_batch_size} with micro batch {t.micro_batch_size} x DP {plan.dp} "
                   f"({library_site(exc)}: {str(exc).splitlines()[0] if str(exc) else 'assertion'})",
                   "train.global_batch_size", f"a multiple of {t.micro_batch_size * plan.dp}, e.g. "
                   f"{t.micro_batch_size * plan.dp * plan.grad_accum} (the plan's)")
        return
    finally:
        nmc.destroy_num_microbatches_calculator()
    line = (f"megatron-core's micro-batch calculator at DP {plan.dp}: {got} micro batches of {t.micro_batch_size} "
            f"per step (GBS {t.global_batch_size}); plan {plan.grad_accum}")
    if got == plan.grad_accum:
        rep.checked(line)
    else:
        rep.defect(line, "train.global_batch_size", "re-render the run (the plan's accumulation is what the loop runs)")


def _rows(recipe, run_dir: Path, rep) -> Optional[List[tuple]]:
    """(input, output) rows: the run's own training file where it is here, else rows made from its settings (one
    longer than the sequence, so truncation runs); None after a defect."""
    from vdkit.errors import UserError
    from vdkit.recipes.common import data as rdata
    from vdkit.recipes.common.data_stats import iter_sft_rows

    d = recipe.data
    if d.name != "synthetic" and d.data_dir and all((Path(d.data_dir).expanduser() / f).is_file() for f in d.train_files):
        path = Path(d.data_dir).expanduser() / d.train_files[0]
        try:
            rows = []
            for _, inp, out in iter_sft_rows(path):
                rows.append((inp, out))
                if len(rows) >= SAMPLE_ROWS:
                    break
        except UserError as exc:
            rep.defect(exc.what, "data.data_dir / data.train_files", exc.fix or "fix the file")
            return None
        rep.checked(f"{len(rows)} rows of {path} read as the job reads them")
        return rows
    if d.name != "synthetic":
        rep.not_here(f"{d.data_dir}/{', '.join(d.train_files)} (data.data_dir): cluster storage; "
                     f"{SAMPLE_ROWS} rows made from the run's settings instead")
    rows = [(r["input"], r["output"]) for r in rdata.synthetic_rows(recipe.train.seed, SAMPLE_ROWS)]
    rows[0] = (rows[0][0] * (recipe.train.seq_length // max(1, len(rows[0][0])) + 2), rows[0][1])
    return rows


def sample_batch(recipe, run_dir: Path, rep, room: int):
    """The job's data set-up on sample rows: its tokenizer (:func:`~vdkit.recipes.common.data.load_tokenizer`; a
    path that is not here is "not checked here" and the byte-level stand-in tokenizes), its samples
    (``encode_sample``, packing as configured) and the first micro batch (:func:`~vdkit.recipes.common.data.collate`);
    returns (tokenizer, samples) or None after a defect."""
    from vdkit.errors import UserError
    from vdkit.recipes.common import data as rdata
    from vdkit.run.rundir import written_plan

    from vdkit.recipes.common.edits import other_seq_length

    planned = written_plan(run_dir).get("seq_length")  # the job trains at recipe.yaml's
    other = planned and other_seq_length("train.seq_length (recipe.yaml)", recipe.train.seq_length, planned)
    if other:
        rep.defect(other[0], "train.seq_length", other[1])
        return None
    key, path = rdata.tokenizer_source(recipe) or (None, None)
    try:
        if path is not None and not path.exists():
            rep.not_here(f"{path} ({key}): cluster storage; the byte-level tokenizer stands in")
            tok = rdata.ByteTokenizer()
        else:
            tok = rdata.load_tokenizer(recipe)
            rep.checked(f"tokenizer {tok.name} loaded as the job loads it; model vocabulary {recipe.model.vocab_size:,}")
        rows = _rows(recipe, run_dir, rep)
        if rows is None:
            return None
        answer_only = recipe.method.name != "pretrain"
        samples = [rdata.encode_sample(tok, inp, out, room, answer_only) for inp, out in rows]
        if recipe.data.packed:
            samples = rdata.pack(samples, room)
        batch = rdata.collate(samples[:recipe.train.micro_batch_size], tok.pad_id)
    except UserError as exc:
        rep.defect(exc.what, "data / train.seq_length", exc.fix or "fix the data settings")
        return None
    shape = "x".join(str(n) for n in batch["input_ids"].shape)
    rep.checked(f"the job's samples and first micro batch on {len(rows)} rows: input_ids [{shape}] (plan: micro batch "
                f"{recipe.train.micro_batch_size} x at most {room} positions)")
    return tok, samples
