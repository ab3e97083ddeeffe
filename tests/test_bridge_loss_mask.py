"""megatron-core's GPTDataset loss-mask cache bug, fixed by the job every rank runs (GPU and CPU alike).

megatron-core 0.16.1 caches the first sample's loss mask itself and then zeroes that sample's pad labels in
it, so every later sample masks the first one's pad positions too (``job.LOSS_MASK_CACHE_BUG``). Here, on a
real ``MockGPTDataset`` (megatron-core's, what Bridge's synthetic pretraining reads) whose tokenizer's pad id
occurs in the data: without the job's fix a later sample's mask is contaminated, with it each sample masks
exactly its own pad labels and the cache stays all ones; the rendered ``bridge_job.py`` applies it with
vdkit unimportable (it runs in the stock NeMo image); a megatron-core without the bug is left alone.
Each case runs in a fresh interpreter (the fix patches megatron-core's class for the life of a process).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

JOB = Path(importlib.util.find_spec("vdkit.recipes.bridge.job").origin)

_PROBE = r"""
import importlib.util, inspect, json, sys, warnings
warnings.simplefilter("ignore")
job_path, mode = sys.argv[1], sys.argv[2]
sys.modules["vdkit"] = None  # `import vdkit` fails, as in the NeMo image
spec = importlib.util.spec_from_file_location("bridge_job", job_path)
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)

from collections import OrderedDict
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

PAD = 7


class Tokenizer:  # mock tokens run 1, 2, ... modulo the vocabulary: every sample holds the pad id somewhere
    vocab_size, eod, pad = 16, 0, PAD
    unique_identifiers = OrderedDict(cls="probe")


cfg = GPTDatasetConfig(random_seed=1, sequence_length=32, reset_position_ids=False, reset_attention_mask=False,
                       eod_mask_loss=False, tokenizer=Tokenizer())
ds, _, _ = BlendedMegatronDatasetBuilder(MockGPTDataset, [8, None, None], lambda: True, cfg).build()
assert ds.masks_and_position_ids_are_cacheable
original = GPTDataset.__getitem__
if mode == "fixed-upstream":  # megatron-core with the fix proposed upstream (NVIDIA/Megatron-LM#6981)
    source = inspect.getsource(original).replace("self.cached_loss_mask = loss_mask", "self.cached_loss_mask = loss_mask.clone()")
    job.inspect.getsource = lambda obj: source
applied = [job.keep_loss_mask_cache(), job.keep_loss_mask_cache()] if mode != "unpatched" else []


def own_mask(idx):  # 1 except where this sample's own label is the pad id
    text, _ = ds._query_document_sample_shuffle_indices(idx)
    return [0.0 if t == PAD else 1.0 for t in text[1:].tolist()]


first = ds[0]["loss_mask"].tolist()
later = ds[1]["loss_mask"].tolist()
cache_ones = bool(ds.cached_loss_mask.eq(1).all())
# a fresh process (a resumed run) whose first sample is 1: the dataset's state as its constructor leaves it
ds.masks_and_position_ids_are_cached, ds.cached_loss_mask = False, None
resumed = ds[1]["loss_mask"].tolist()
print(json.dumps({"applied": applied, "patched": GPTDataset.__getitem__ is not original,
                  "first_pads": first.count(0.0), "first_is_own": first == own_mask(0),
                  "later_is_own": later == own_mask(1), "later_equals_resumed": later == resumed,
                  "cache_all_ones": cache_ones}))
"""


def _probe(job_path: Path, mode: str) -> tuple:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(job_path), mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]), [l for l in lines[:-1] if l.startswith("bridge_job:")]


def test_without_the_fix_a_later_sample_masks_the_first_samples_pads():
    """The control: megatron-core as installed has the bug (so the fix below has something to fix)."""
    got, log = _probe(JOB, "unpatched")
    assert got["first_pads"] > 0 and got["first_is_own"]
    assert not got["later_is_own"] and not got["later_equals_resumed"] and not got["cache_all_ones"]
    assert log == []


def test_the_jobs_fix_keeps_each_samples_own_mask():
    got, log = _probe(JOB, "patched")
    assert got["applied"] == [True, True] and got["patched"]
    assert got["first_pads"] > 0 and got["first_is_own"]
    assert got["later_is_own"] and got["later_equals_resumed"] and got["cache_all_ones"]
    assert len(log) == 1 and "patched GPTDataset's loss-mask cache (core/datasets/gpt_dataset.py:263" in log[0], log


def test_a_megatron_core_without_the_bug_is_not_patched():
    got, log = _probe(JOB, "fixed-upstream")
    assert got["applied"] == [False, False] and not got["patched"]
    assert len(log) == 2 and all(l.endswith("not patched") and "no longer has the loss-mask cache bug" in l
                                 for l in log), log


def test_the_rendered_job_applies_the_fix_without_vdkit(tmp_path):
    """``vdkit render`` copies the job into the run dir; that file, loaded with vdkit unimportable, fixes the
    cache, and its run() applies the fix before Bridge's pretrain() builds the datasets."""
    import ast

    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.render.prepare import render_run

    run_dir = render_run(make_plan(compose(["engine=bridge", "model=llama2_7b", "method=pretrain", "data=pile"])),
                         tmp_path, check_mounts=False)
    job = run_dir / "bridge_job.py"
    got, log = _probe(job, "patched")
    assert got["patched"] and got["later_is_own"] and got["later_equals_resumed"] and len(log) == 1
    run = next(n for n in ast.parse(job.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "run")
    calls = {c.func.id: c.lineno for c in ast.walk(run) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert calls["keep_loss_mask_cache"] < calls["pretrain"], calls
