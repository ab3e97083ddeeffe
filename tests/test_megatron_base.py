"""engine=megatron fine-tunes its base, never random weights (issue 34): the base at model.hf_path loaded into
megatron-core's GPTModel (recipes/megatron/base.py), the door's rule, the rank's guard.

- a tiny Hugging Face Llama (GQA, a vocabulary the kit pads) and a Qwen2 (Q/K/V biases), random but far from the
  engine's seeded init, give megatron-core's logits equal to transformers' at TP1, TP2 and PP2 (2 gloo ranks);
- a LoRA run from that base starts at the base's loss on its first batch (computed here with transformers);
- the rank refuses a base that is missing, empty or another model's in one line, exit 2, before any step;
- the door refuses a run.mode=train fine-tune of a pretrained model with no local base; timing runs and toy models
  without weights may train seeded weights, and the plan and the render say so.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EMPTY_SAFETENSORS
from vdkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["engine=megatron", "model=tiny_llama", "method=lora", "data=synthetic", "cluster=local", "cluster.gpus_per_node=1",
        "train.seq_length=64", "train.global_batch_size=4", "train.micro_batch_size=2", "method.warmup_steps=0"]


def _hf_base(out: Path, arch: str = "llama", vocab: int = 512) -> Path:
    """A Hugging Face model of tiny_llama's sizes, initialised with std 0.3 (the engine's seeded init is 0.02), so
    its logits and loss are far from a seeded model's; Qwen2's Q/K/V biases drawn too (transformers zeroes them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048,
                 tie_word_embeddings=False, initializer_range=0.3)
    torch.manual_seed(0)
    model = (Qwen2ForCausalLM(Qwen2Config(**sizes)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**sizes)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:  # norms 1 and biases 0 would hide a misplaced tensor
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(str(out))
    return out


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests"), **extra)
    return env


@pytest.mark.slow  # two gloo ranks building 6 models: ~20 s on idle cores
def test_megatron_logits_from_a_hf_base_equal_transformers_at_tp1_tp2_and_pp2(tmp_path):
    pytest.importorskip("megatron.core")
    # Llama with grouped-query attention and a vocabulary of 500 (the kit pads it to 512: padded_vocab); Qwen2's biases
    models = {_hf_base(tmp_path / "llama", "llama", 500): ["model.vocab_size=500"],
              _hf_base(tmp_path / "qwen2", "qwen2", 512): ["model.qkv_bias=true"]}
    out, port = tmp_path / "diffs.json", _port()
    args = [",".join([str(hf), *o]) for hf, o in models.items()]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "megatron_base_worker.py"), str(out), *args],
                              env=_env(RANK=str(r), WORLD_SIZE="2", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    found = json.loads(out.read_text())
    assert set(found) == {str(hf) for hf in models}
    for hf, got in found.items():
        assert got["scale"] > 1.0  # logits of a model far from the seeded init
        assert set(got["diffs"]) == {"tp1", "tp2", "pp2"}
        assert all(d < 1e-4 * got["scale"] for d in got["diffs"].values()), (hf, got)


def _first_batch_loss(run_dir: Path, hf: Path) -> float:
    """transformers' loss on the run's first global batch, as the engine forms it (its own data path, one rank)."""
    import torch
    from transformers import AutoModelForCausalLM

    from vdkit.recipes.common import data as rdata
    from vdkit.recipes.megatron.data import step_micro_batches
    from vdkit.run.rundir import load_plan

    plan = load_plan(run_dir)
    r = plan.recipe
    tok = rdata.load_tokenizer(r)
    samples = rdata.load_samples(r, run_dir, tok, r.train.seq_length)
    order = rdata.BatchOrder(len(samples), r.train.seed, r.train.micro_batch_size, plan.dp, plan.grad_accum)
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    losses = []
    with torch.no_grad():
        for mb in step_micro_batches(samples, order, 0, 0, tok.pad_id, 0, 1):
            logits = model(mb["tokens"]).logits
            ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), mb["labels"], reduction="none")
            losses.append(float((ce * mb["loss_mask"]).sum() / mb["loss_mask"].sum()))
    return sum(losses) / len(losses)


def _losses(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    return [e.value for e in sorted(acc.Scalars("reduced_train_loss"), key=lambda e: e.step)]


@pytest.mark.slow  # one real `vdkit run` (megatron-core's imports, one step): ~15 s on idle cores
def test_a_lora_run_from_a_hf_base_starts_at_the_bases_loss(tmp_path):
    pytest.importorskip("megatron.core")
    hf = _hf_base(tmp_path / "hf")
    proc = subprocess.run([sys.executable, "-m", "vdkit", "run", *TINY, "model.pretrained=true", f"model.hf_path={hf}",
                           "train.max_steps=1", "run.mode=timing", "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert f"base weights from {hf}" in (proc.stdout + proc.stderr)
    want = _first_batch_loss(run_dir, hf)
    assert abs(want - math.log(512)) > 1.0  # the base's loss is far from a seeded (near-uniform) model's
    assert _losses(run_dir)[0] == pytest.approx(want, rel=1e-4)


def _rank(run_dir: Path) -> subprocess.CompletedProcess:
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=_port())
    return subprocess.run([sys.executable, "-m", "vdkit.recipes.megatron", str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=300)


def _break(base: Path, how: str) -> str:
    shutil.rmtree(base, ignore_errors=True)
    if how == "missing":
        return "does not exist"
    base.mkdir()
    if how == "empty":
        return "it is empty"
    if how == "bridge":  # a Megatron-Bridge checkpoint where a Hugging Face directory belongs
        (base / "latest_checkpointed_iteration.txt").write_text("0")
        return "holds no config.json"
    _config(base, hidden_size=128)
    return "is another model: hidden_size 128"


def _config(base: Path, **change) -> Path:
    """config.json of tiny_llama's sizes (``change`` on top) and a weights file: what the guards read."""
    cfg = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
           "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2, **change}
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    return base


def test_a_megatron_rank_refuses_a_missing_empty_or_foreign_base_and_trains_nothing(tmp_path, capsys):
    """Rendered against a good base, which then goes away, is emptied or replaced: one line, exit 2, no step."""
    base = tmp_path / "base"
    base.mkdir()
    _config(base)
    assert main(["render", *TINY, "model.pretrained=true", f"model.hf_path={base}", "train.max_steps=2",
                 "--out", str(tmp_path / "runs")]) == 0, capsys.readouterr().err
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    spec = json.loads((run_dir / "preflight.json").read_text())
    assert {"what": "model.hf_path", "path": str(base), "kind": "hf"} in spec["needs"]  # the job's pre-flight too
    for how in ("missing", "empty", "bridge", "foreign"):
        words = _break(base, how)
        proc = _rank(run_dir)
        assert proc.returncode == 2, (how, proc.stdout[-2000:] + proc.stderr[-2000:])
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "model.hf_path" in lines[0] and words in lines[0], (how, lines)
        assert "no step trained" in lines[0] and not (run_dir / "checkpoints").exists()


# ----------------------------------------------------------------------------- the door
DOOR = [  # overrides, exit code, words of the one line (or of the plan's note)
    (["model=llama2_7b", "method=lora", "model.hf_path=null"], 2, "model.hf_path is not set: it would train random"),
    (["model=llama2_7b", "method=sft", "model.hf_path=meta-llama/Llama-2-7b-hf"], 2, "is a hub id"),
    (["model=opt_125m", "method=lora"], 2, "loads llama-architecture Hugging Face bases only"),
    (["model=tiny_llama", "method=lora", "model.pretrained=true"], 2, "model.hf_path is not set"),
    (["model=llama2_7b", "method=lora", "model.hf_path=null", "run.mode=timing"], 0,
     "note        seeded weights: no local model.hf_path, so this run.mode=timing lora times"),
    (["model=tiny_llama", "method=ptuning"], 0, "note        seeded weights: model tiny_llama has no pretrained"),
    (["model=llama2_7b", "method=pretrain", "model.hf_path=null", "data=synthetic"], 0, ""),
]


@pytest.mark.parametrize("overrides,code,words", DOOR)
def test_the_door_refuses_a_megatron_fine_tune_with_no_base_and_says_when_weights_are_seeded(capsys, overrides, code,
                                                                                             words):
    rc = main(["plan", "engine=megatron", *overrides])
    out, err = capsys.readouterr()
    assert rc == code, err
    if code:
        assert len(err.strip().splitlines()) == 1 and words in err and "(fix: " in err
    else:
        assert words in out and ("seeded weights" in out) == bool(words)


def test_the_render_says_a_timing_run_trains_seeded_weights(tmp_path, capsys):
    assert main(["render", "engine=megatron", "model=llama2_7b", "method=lora", "model.hf_path=null", "run.mode=timing",
                 "--no-check-mounts", "--out", str(tmp_path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert "  weights    no local model.hf_path, so this run.mode=timing lora times the engine's seeded" in out.out + out.err
