"""Shared test helpers: logs written in NeMo's exact formats, run directories as `vdkit render` writes them.

The logs follow NeMo's formats (see docs/reproducing.md and validation/nemo1.py); tests import these
from here, never from another test module.
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest


# A whole safetensors file holding no tensor (its 8-byte header length, then the header "{}"): what a staged model's
# weights look like to the job's pre-flight (vdkit.recipes.common.preflight.safetensors_problem) where nothing loads them.
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


# ----------------------------------------------------------------------------- NeMo-format writers
def tqdm_num(x) -> str:
    """TQDM's format_num with Lightning's padding (lightning.pytorch...tqdm_progress.Tqdm.format_num)."""
    f = "{0:.3g}".format(x).replace("e+0", "e+").replace("e-0", "e-")
    n = str(x)
    s = f if len(f) < len(n) else n
    if isinstance(x, float) and "e" not in s:
        if "." not in s and len(s) < 5:
            s += "."
        s += "0" * (5 - len(s))
    return s


def bar_update(n, total, step, timing, loss=1.5, gbs=128, epoch=0, v_num="0", empty=False) -> str:
    """One NeMo 1.x progress-bar update as Lightning's TQDMProgressBar prints it."""
    tot = "?" if total is None else str(total)
    pct = "" if total is None else f"{int(100 * n / total):3d}%"
    metrics = {"v_num": v_num, "reduced_train_loss": loss, "global_step": float(step),
               "consumed_samples": float((step + 1) * gbs), "train_step_timing in s": timing}
    body = ", ".join(f"{k}={'' if empty and k != 'v_num' else (v if isinstance(v, str) else tqdm_num(v))}"
                     for k, v in metrics.items())
    return f"Epoch {epoch}: {pct}|███▏      | {n}/{tot} [03:10<04:23, 0.11it/s, {body}]"


def write_nemo1_log(path: Path, timings, total=None, stale_prints=True, glue_every=0, start_step=0,
                    epoch=0, tail="\n") -> Path:
    """A Slurm .out with one '\\r'-separated TQDM update per step (and Lightning's stale re-prints)."""
    total = len(timings) if total is None else total
    parts = []
    prev = None
    for i, t in enumerate(timings):
        step = start_step + i
        n = step + 1
        if stale_prints and prev is not None:
            parts.append(prev.replace(f"| {n - 1}/", f"| {n}/", 1))  # bar moved, metrics not yet updated
        upd = bar_update(n, total, step, t, loss=2.0 - 0.001 * step, epoch=epoch)
        if glue_every and i % glue_every == 0:
            upd += f"[NeMo I 2024-01-01 12:00:{i % 60:02d} nemo_logging:349] Saving checkpoint step={step}"
        parts.append(upd)
        prev = upd
    head = "[NeMo I 2024-01-01 11:59:00 megatron_init:263] Rank 0 has data parallel group : [0]\n"
    path.write_text(head + "\r".join(parts) + tail)
    return path


def nemo2_line(it, total, step, timing) -> str:
    return (f"Training epoch 0, iteration {it}/{total} | lr: 1.2e-05 | global_step: {step} | reduced_train_loss: 2.1"
            f" | train_step_timing in s: {timing} | consumed_samples: {(step + 1) * 128}")


def write_events(logdir: Path, values, tag="train_step_timing in s", start=0):
    """TensorBoard events the way Lightning's TensorBoardLogger writes them (torch's SummaryWriter)."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(logdir))
    for i, v in enumerate(values):
        w.add_scalar(tag, v, start + i)
        w.add_scalar("reduced_train_loss", 2.0 - 0.01 * i, start + i)
    w.close()
    return sorted(logdir.glob("events.out.tfevents.*"))[-1]




# ----------------------------------------------------------------------------- run directories
def make_run(base, overrides, timings=None, kind="out"):
    """A run directory as `vdkit render` writes it, plus (optionally) the job's log."""
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.run.create import create_run_dir

    run = create_run_dir(make_plan(compose(overrides)), {}, out_dir=base)
    if timings is not None:
        if kind == "out":
            write_nemo1_log(run / "slurm-1.out", timings)
        else:
            (run / "logs").mkdir()
            write_events(run / "logs", timings)
    return run


def series(mean, n=50, warm=12.0, seed=0, cv=0.01):
    """Step times: a warm-up step, then ``n - 1`` steps around ``mean`` (coefficient of variation ``cv``)."""
    import random

    rng = random.Random(seed)
    return [warm] + [rng.gauss(mean, cv * mean) for _ in range(n - 1)]


TINY = ["model=tiny_llama", "engine=reference", "cluster=local", "data=synthetic"]  # the CPU recipe


# ----------------------------------------------------------------------------- sbatch's reading of #SBATCH lines
def sbatch_parse(line: str) -> list:
    """Arguments sbatch reads from one '#SBATCH' line (a port of slurm's _get_argument loop)."""
    assert line.startswith("#SBATCH")
    s, i, args = line[len("#SBATCH"):], 0, []
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        if i >= len(s):
            return args
        buf, quoted, q, esc, comment = [], False, "", False, False
        while i < len(s) and (quoted or not s[i].isspace()) and s[i] != "\n":
            ch = s[i]
            if esc:
                esc = False
            elif ch == "\\":
                esc, i = True, i + 1
                continue
            elif quoted:
                if ch == q:
                    quoted, i = False, i + 1
                    continue
            elif ch in "'\"":
                quoted, q, i = True, ch, i + 1
                continue
            elif ch == "#":
                comment = True
                break
            buf.append(ch)
            i += 1
        assert not quoted, f"sbatch would refuse an unmatched quote in {line!r}"
        if buf:
            args.append("".join(buf))
        if comment or not buf:
            return args


def directives(text: str) -> dict:
    """{'--key': value or True} from the script's #SBATCH lines, as sbatch reads them."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            (arg,) = sbatch_parse(line)
            key, _, value = arg.partition("=")
            out[key] = value if _ else True
    return out


# ----------------------------------------------------------------------------- a pyxis container's PATH
def no_slurm_path(tmp_path: Path) -> str:
    """PATH as inside a pyxis container: this Python, no Slurm client command."""
    bin_dir = tmp_path / "container-bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return f"{bin_dir}{os.pathsep}/bin"


# ----------------------------------------------------------------------------- JSONL rows and a word-level tokenizer
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def make_rows(n=60, seed=0):
    """Rows with known word counts: input has 1 + i % 7 words, output 1 + i % 5 words."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        inp = " ".join(rng.choice(WORDS) for _ in range(1 + i % 7))
        out = " ".join(rng.choice(WORDS) for _ in range(1 + i % 5))
        rows.append({"input": inp, "output": out})
    rows += [dict(rows[0]), dict(rows[1]), dict(rows[1])]  # three duplicates
    return rows


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def word_level_tokenizer(path: Path) -> Path:
    """A tokenizer.json whose tokens are exactly the whitespace-separated words (trained on WORDS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    tok.save(str(path))
    return path


def assert_memory_agrees(run_dir: Path, world: int, activations: bool = False) -> dict:
    """The run's memory.json: every rank measured weights, gradients and optimizer, and none disagrees with
    the plan beyond the engine's tolerance (vdkit.recipes.common.mcore_memory); with ``activations`` (the megatron
    engine) each layer's saved bytes within 5 % of the plan's too. Returns the report."""
    from vdkit.recipes.common.mcore_memory import disagreements

    report = json.loads((run_dir / "memory.json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(world))
    for r in report["ranks"]:
        assert set(r["measured"]) == set(r["planned"]) == {"weights", "gradients", "optimizer"}
        assert r["measured"]["weights"] > 0
    assert disagreements(report) == [], report
    for r in report["ranks"] if activations else ():  # bytes each layer saves for backward vs the formula
        acts = r["activations_per_layer"]
        assert len(acts["measured"]) == len(acts["planned"]) > 0
        assert all(abs(got - want) <= 0.05 * want for got, want in zip(acts["measured"], acts["planned"])), acts
    return report


def submit_and_wait(main, capsys, overrides, out_dir: Path, timeout_s: int):
    """`vdkit submit OVERRIDES --wait` of one job on the local Slurm: (exit code, run dir, job id, the
    job's .out and .err, the last status line's first three fields)."""
    rc = main(["submit", *overrides, "--out", str(out_dir), "--wait", "--timeout", str(timeout_s)])
    out = capsys.readouterr().out.splitlines()
    run_dir = Path(out[0].split("\t")[0])
    job_id = out[0].split("\t")[1]
    log = "".join((run_dir / f"slurm-{job_id}.{ext}").read_text() for ext in ("out", "err"))
    return rc, run_dir, job_id, log, out[-1].split("\t")[:3]


def sbatch_of(plan, out_dir) -> tuple:
    """(launch.sbatch's text, its run directory) as `vdkit render --no-check-mounts` into ``out_dir`` would write
    them: the real render path (vdkit.render.prepare.prepare: every check, every file rendered in memory), nothing
    written. The run directory is ``out_dir``/the run's name."""
    from vdkit.render.prepare import prepare
    from vdkit.run.rundir import SBATCH_FILE

    cell = prepare(plan, out_dir, check_mounts=False)
    return cell.files[SBATCH_FILE], cell.run_dir


def toy_engine_module(module_name: str, engine_name: str = "toy", **spec):
    """A throwaway engine module: ``SPEC`` is the reference engine's capabilities with no functions but the ones
    given (``command`` at least) and ``name`` = ``engine_name``; register it with
    ``monkeypatch.setitem(sys.modules, module_name, mod)`` and ``engines.REGISTRY[engine_name] = module_name``."""
    import dataclasses
    import types

    from vdkit.recipes import engines
    from vdkit.recipes.spec import HOOKS

    base = engines.get("reference").spec
    mod = types.ModuleType(module_name)
    mod.SPEC = dataclasses.replace(base, **{"name": engine_name, **{h: None for h in HOOKS}, "runtime_modules": (),
                                            "extra": "", **spec})
    return mod


# The Kubernetes launcher's smallest recipe (a CPU RayJob) and its shared volume (tests/test_k8s_launcher.py, test_runs.py).
K8S_TINY = ["engine=reference", "model=tiny_llama", "data=synthetic", "cluster=k8s_cpu"]


def k8s_vols(tmp_path) -> str:
    """The cluster.kubernetes.storage override mounting ``tmp_path`` at the same path (a hostPath)."""
    return f"cluster.kubernetes.storage=[{{mount_path:'{tmp_path}',host_path:'{tmp_path}'}}]"


# Set to 1 (as .ci/run does) to run every row of the bad-input tables; else conftest samples each defect class.
FULL_TESTS_ENV = "VDKIT_FULL_TESTS"


# ----------------------------------------------------------------------------- Instruct models (chat templates)
CHAT_TEMPLATE = (  # Llama-3-shaped: a header per turn, <|eot|> after each
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}\n\n{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n\n{% endif %}")


def tiny_chat_tokenizer(path, template=CHAT_TEMPLATE):
    """A ~260-id byte-level tokenizer with special tokens and ``template`` in its tokenizer_config.json."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="<|eot|>", pad_token="<pad>",
                                  additional_special_tokens=["<|start|>"])
    if template:
        tok.chat_template = template
    tok.save_pretrained(str(path))
    return path


def prepared_dolly(root: Path, chat: bool) -> Path:
    """`vdkit data prepare dolly` of 20 short rows into ``root``/chat or ``root``/plain (``chat``: with --chat)."""
    from vdkit.cli import main

    src = root / "dolly.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"What is {i} plus {i}?", "context": "" if i % 2 else f"ctx {i}",
                                       "response": f"It is {2 * i}.", "category": "open_qa"}) + "\n" for i in range(20)))
    out = root / ("chat" if chat else "plain")
    assert main(["data", "prepare", "dolly", str(src), str(out), *(["--chat"] if chat else [])]) == 0
    return out


def local_layer_config(shape, mode):
    """megatron-core's TransformerConfig for one local-spec layer of ``shape`` = (seq, micro batch, hidden, heads,
    query groups, ffn) with recompute ``mode``, every fusion off as recipes/megatron/model.py renders it (the local
    layer's traffic and op counts are measured on it: test_local_traffic, test_host_time)."""
    from types import SimpleNamespace

    import torch
    import torch.nn.functional as fn
    from megatron.core.transformer.transformer_config import TransformerConfig

    from vdkit.planner import recompute

    _, _, h, a, g, f = shape
    keys = recompute.mcore(SimpleNamespace(recompute=mode, recompute_num_layers=1 if mode == "full" else None))
    return TransformerConfig(
        num_layers=1, hidden_size=h, ffn_hidden_size=f, num_attention_heads=a, num_query_groups=g,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=fn.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, **{k: v for k, v in keys.items() if v is not None})


BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def bench_module(name: str):
    """A benchmarks/ script imported as a module (benchmarks/ is no package: its scripts import each other by name,
    so the folder stays on sys.path while the module and what it imports load)."""
    import importlib

    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
