"""The reference engine in-process: formats, batch order, ranks, samples, and real training.

Training tests use model=tiny_llama on data=synthetic with small batches and a raised learning
rate (the recipe defaults, e.g. SFT's lr 5e-6 with 50 warm-up steps, are for real models).

The transformers-engine sweeps rendered: both MI300X fabrics with the ROCm image, the OPT sweep on the
H100 node; every script is valid bash and accepted by the local Slurm's `sbatch --test-only`.
"""
from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.recipes.common import data as rdata
from vdkit.recipes.common.distributed import resolve_dist_env
from vdkit.recipes.common.progress import progress_line, tqdm_num


BASE = ["model=tiny_llama", "data=synthetic", "engine=reference", "cluster=local", "train.seq_length=128",
        "method.warmup_steps=0", "engine.checkpoint_every_n_steps=0"]
LINE = re.compile(r"Epoch (\d+): : +(\d+)%\|[^|]*\| (\d+)/(\d+) \[[\d:]+<[\d:]+, reduced_train_loss=([^,]+), "
                  r"global_step=([^,]+), consumed_samples=([^,]+), train_step_timing in s=([^\]]+)\]")


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the engine then leaves torch's thread count alone
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------------------- NeMo-style output
def test_numbers_match_lightnings_progress_bar():
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    for x in (20.0, 49.0, 2000.0, 256000.0, 2688.0, 1.234, 0.0156, 9.05, 6.0, 123456.0, 0.5):
        assert tqdm_num(x) == Tqdm.format_num(x), x
    # nemo.md's examples
    assert (tqdm_num(20.0), tqdm_num(2000.0), tqdm_num(256000.0), tqdm_num(2688.0)) == \
           ("20.00", "2e+3", "2.56e+5", "2688.0")


def test_progress_line_has_nemos_shape():
    line = progress_line(0, 21, 50, 190.0, 263.0, 1.234, 20, 2688, 9.05)
    m = LINE.fullmatch(line)
    assert m, line
    assert m.group(2) == "42" and m.group(3) == "21" and m.group(6) == "20.00" and m.group(7) == "2688.0"
    assert "[03:10<04:23," in line


# ----------------------------------------------------------------------------- ranks
def test_ranks_from_slurm_local_and_nothing():
    slurm = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_NTASKS_PER_NODE": "8(x2)", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "20042",
             "SLURM_JOB_ID": "42"}
    d = resolve_dist_env(slurm)
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank, d.source) == (9, 16, 1, 8, 1, "slurm")
    assert d.master_addr == "10.0.0.1" and d.master_port == 20042
    # no MASTER_PORT: the launcher's job, not guessed from the scheduler's job id by the rank
    no_port = {k: v for k, v in slurm.items() if k != "MASTER_PORT"}
    with pytest.raises(UserError, match="MASTER_PORT is not set for a 16-rank job"):
        resolve_dist_env(no_port)
    local = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             **slurm, "MASTER_PORT": "1234"}  # explicit ranks win over a surrounding allocation
    d = resolve_dist_env(local)
    assert (d.rank, d.world_size, d.local_rank, d.master_port, d.source) == (1, 2, 1, 1234, "local")
    assert resolve_dist_env({}).world_size == 1
    with pytest.raises(UserError, match="MASTER_ADDR"):
        resolve_dist_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    with pytest.raises(UserError, match="not an integer"):
        resolve_dist_env({"RANK": "x", "WORLD_SIZE": "2"})


# ----------------------------------------------------------------------------- data
def test_batch_order_covers_each_epoch_once_and_splits_ranks():
    n, mbs, dp, ga = 40, 2, 2, 3  # GBS 12
    order = rdata.BatchOrder(n, seed=7, mbs=mbs, dp=dp, grad_accum=ga)
    seen = []
    for step in range(10):  # 120 positions = 3 epochs
        per_rank = [order.micro_batches(step, r) for r in range(dp)]
        for mb in per_rank:
            assert len(mb) == ga and all(len(b) == mbs for b in mb)
        seen.extend(i for mb in per_rank for b in mb for i in b)
    for e in range(3):
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))
    assert seen[:n] != seen[n:2 * n]  # a fresh shuffle each epoch
    fresh = rdata.BatchOrder(n, seed=7, mbs=mbs, dp=dp, grad_accum=ga)  # a restarted process
    assert fresh.micro_batches(7, 1) == order.micro_batches(7, 1)


def test_samples_mask_the_prompt_and_truncate_the_input_first():
    tok = rdata.ByteTokenizer()
    s = rdata.encode_sample(tok, "upper: abc", "ABC", 64, answer_only=True)
    assert s.ids[0] == tok.bos_id and s.ids[-1] == tok.eos_id
    answer = [i for i, lab in zip(s.ids, s.labels) if lab != rdata.IGNORE]
    assert answer == tok.encode_one("ABC") + [tok.eos_id]
    assert rdata.encode_sample(tok, "upper: abc", "ABC", 64, answer_only=False).labels == s.ids
    short = rdata.encode_sample(tok, "x" * 50, "ABC", 10, answer_only=True)
    assert len(short.ids) == 10 and short.ids[-4:] == tuple(tok.encode_one("ABC") + [tok.eos_id])


def test_synthetic_rows_are_deterministic():
    assert rdata.synthetic_rows(3, 50) == rdata.synthetic_rows(3, 50) != rdata.synthetic_rows(4, 50)


def test_packed_sequences_keep_samples_apart():
    import torch

    from vdkit.composition.config import compose
    from vdkit.recipes.reference.model import build_model

    tok = rdata.ByteTokenizer()
    model = build_model(compose(BASE + ["method=sft"]), tok).eval()
    samples = [rdata.encode_sample(tok, r["input"], r["output"], 128, True) for r in rdata.synthetic_rows(3, 8)]
    packed = rdata.pack(samples, 64)
    assert sorted(len(p.ids) for p in packed) != sorted(len(s.ids) for s in samples)  # it did pack
    assert sum(len(p.ids) for p in packed) == sum(len(s.ids) for s in samples)
    row = max(packed, key=lambda p: p.positions.count(0))
    b = rdata.collate([row], tok.pad_id)
    starts = [i for i, p in enumerate(row.positions) if p == 0] + [len(row.ids)]
    a, e = starts[1], starts[2]
    with torch.no_grad():
        together = model(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits[0, a:e]
        alone = model(input_ids=b["input_ids"][:, a:e]).logits[0]
    assert torch.allclose(together, alone, atol=1e-5)
    assert row.labels[a] == rdata.IGNORE  # nothing predicted across a boundary


# ----------------------------------------------------------------------------- training
def _train(tmp_path, overrides):
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.reference.train import train
    from vdkit.run.create import create_run_dir

    run_dir = create_run_dir(make_plan(compose(BASE + overrides)), {}, tmp_path)
    out = io.StringIO()
    train(run_dir, stream=out)
    text = out.getvalue()
    rows = [LINE.fullmatch(u) for u in re.split(r"[\r\n]", text) if u.startswith("Epoch")]
    assert rows and all(rows), text[:500]
    return run_dir, [float(m.group(5)) for m in rows], text


def _tail(xs, k=5):
    return sum(xs[-k:]) / k


@pytest.mark.parametrize("method,lr,extra", [
    ("sft", "3e-3", []),
    ("lora", "3e-2", []),
    ("ptuning", "3e-2", ["method.ptuning_bottleneck_dim=64"]),
])
def test_method_really_trains(tmp_path, method, lr, extra):
    """The loss goes down, against a control run on the same batches with learning rate 0."""
    common = [f"method={method}", "train.global_batch_size=16", "train.micro_batch_size=8", "train.max_steps=30"] + extra
    _, trained, _ = _train(tmp_path / "a", common + [f"method.lr={lr}"])
    _, control, _ = _train(tmp_path / "b", common + ["method.lr=0", "method.min_lr=0"])
    assert len(trained) == 30
    assert _tail(trained) < _tail(control) - 0.05, (trained, control)
    assert _tail(trained) < trained[0] - 0.05


def test_pretrain_logs_and_checkpoints(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vdkit.recipes.common.checkpoint import latest

    run_dir, losses, text = _train(tmp_path, ["method=pretrain", "train.micro_batch_size=1",
                                              "train.global_batch_size=4", "train.max_steps=12",
                                              "method.lr=3e-3", "engine.checkpoint_every_n_steps=5"])
    assert _tail(losses, 3) < losses[0] - 0.3
    assert "consumed_samples=48.00" in text and "global_step=11.00" in text and text.endswith("\n")
    acc = EventAccumulator(str(run_dir / "logs"))
    acc.Reload()
    timing = acc.Scalars("train_step_timing in s")
    assert [e.step for e in timing] == list(range(12)) and all(e.value > 0 for e in timing)
    assert [e.value for e in acc.Scalars("consumed_samples")] == [4.0 * (i + 1) for i in range(12)]
    assert latest(run_dir / "checkpoints").name == "step=12.ckpt"
    _assert_kept(run_dir / "checkpoints", [10, 12])


def _assert_kept(ckpt_dir, steps):
    """``ckpt_dir`` holds the checkpoints of ``steps`` (each with its .sha256), the best one (run.mode=train:
    best.json names it, kept even when older) and nothing else."""
    from vdkit.recipes.common.checkpoint import read_best

    best = read_best(ckpt_dir)
    kept = sorted(set(steps) | {best["step"]})
    assert sorted(p.name for p in ckpt_dir.iterdir()) == sorted(
        ["best.json"] + [f"step={s}.ckpt" for s in kept] + [f"step={s}.ckpt.sha256" for s in kept])


def test_engine_refuses_a_model_parallel_plan(tmp_path):
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.reference.train import check_layout

    plan = make_plan(compose(BASE + ["cluster.gpus_per_node=2", "parallelism.tp=2", "train.global_batch_size=2"]))
    assert (plan.tp, plan.pp) == (2, 1)
    with pytest.raises(UserError, match="data parallel only"):
        check_layout(plan, resolve_dist_env({}))


def test_a_configured_sentencepiece_tokenizer_is_used_and_checked(tmp_path):
    import sentencepiece as spm

    from vdkit.composition.config import compose

    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(f"{r['input']} {r['output']}" for r in rdata.synthetic_rows(1, 400)))

    def trained(vocab):
        spm.SentencePieceTrainer.Train(input=str(text), model_prefix=str(tmp_path / f"sp{vocab}"),
                                       vocab_size=vocab, minloglevel=2, hard_vocab_limit=False)
        return compose(BASE + ["method=sft", f"data.tokenizer_model={tmp_path / f'sp{vocab}.model'}"])

    tok = rdata.load_tokenizer(trained(100))
    assert "sentencepiece" in tok.name
    s = rdata.encode_sample(tok, "upper: abc", "ABC", 64, answer_only=True)
    assert s.ids[0] == tok.bos_id and s.ids[-1] == tok.eos_id and max(s.ids) < 100
    assert len(s.ids) < len(rdata.encode_sample(rdata.ByteTokenizer(), "upper: abc", "ABC", 64, True).ids)
    with pytest.raises(UserError, match="needs a vocabulary of"):
        rdata.load_tokenizer(trained(600))  # more ids than tiny_llama's 512 embeddings


def test_the_planner_counts_the_lora_parameters_the_engine_trains():
    """peft puts LoRA on q, k and v separately: the plan's trainable count is the peft model's own."""
    pytest.importorskip("peft")
    from vdkit.composition.config import compose
    from vdkit.planner.plan import make_plan
    from vdkit.recipes.common.data import load_tokenizer
    from vdkit.recipes.reference.model import build_model
    from vdkit.recipes.reference.train import check_layout

    recipe = compose(BASE + ["method=lora"])
    assert recipe.engine.lora_qkv == "separate"
    model = build_model(recipe, load_tokenizer(recipe))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    plan = make_plan(recipe)
    assert plan.trainable_params == trained
    with pytest.raises(UserError, match="engine.lora_qkv=separate"):
        check_layout(make_plan(compose(BASE + ["method=lora", "engine.lora_qkv=fused"])), resolve_dist_env({}))


def _render(sweep, tmp_path, capsys):
    assert main(["render", "--sweep", sweep, "--no-check-mounts", "--out", str(tmp_path)]) == 0
    return [Path(p) for p in capsys.readouterr().out.split()]


def test_llama31_roce_scripts_roce_and_tcp_with_the_rocm_image(tmp_path, capsys):
    dirs = _render("llama31_roce", tmp_path, capsys)
    assert [d.name for d in dirs] == ["llama3_1_8b_1n", "llama3_1_8b_2n_noroce", "llama3_1_8b_2n_roce",
                                      "llama3_1_70b_1n", "llama3_1_70b_2n_noroce", "llama3_1_70b_2n_roce"]
    image = compose(["cluster=xe9680_mi300x"]).cluster.container_image
    for d in dirs:
        text = (d / "launch.sbatch").read_text()
        assert subprocess.run(["bash", "-n", str(d / "launch.sbatch")]).returncode == 0
        assert f"--container-image={image}" in text and "python3 -m vdkit.recipes.reference" in text
        assert "NCCL_NVLS_ENABLE" not in text  # an NVIDIA setting, not in the MI300X clusters' data
        if d.name.endswith("_noroce"):
            assert "RCCL over TCP sockets" in text and "export NCCL_IB_DISABLE=1" in text
            assert "NCCL_IB_HCA" not in text and "NCCL_IB_GID_INDEX" not in text
        else:
            assert "RCCL over RoCE" in text and "export NCCL_IB_GID_INDEX=3" in text
            assert "export NCCL_IB_HCA==bnxt_re0,bnxt_re1," in text and "NCCL_IB_DISABLE" not in text
    assert "--nodes=2" in (dirs[2] / "launch.sbatch").read_text()


def test_alpaca_opt_render_writes_the_cells_that_fit(tmp_path, capsys):
    dirs = _render("alpaca_opt", tmp_path, capsys)
    assert [d.name for d in dirs] == ["opt_125m_sft_1n8g", "opt_350m_sft_1n8g", "opt_1_3b_sft_1n8g",
                                      "opt_2_7b_sft_1n8g", "opt_6_7b_sft_1n8g", "opt_13b_sft_1n8g"]
    text = (dirs[-1] / "launch.sbatch").read_text()
    assert "NCCL over native InfiniBand" in text and "--container-image" not in text  # host Python on xe9680
    assert subprocess.run(["bash", "-n", str(dirs[-1] / "launch.sbatch")]).returncode == 0
    # the one that does not fit, rendered alone: one line saying by how much, exit 2, nothing written
    assert main(["render", "model=opt_30b", "engine=reference", "parallelism.sharding=fsdp", "method=sft",
              "data=alpaca", "train.micro_batch_size=4", "train.global_batch_size=256", "train.seq_length=512",
              "parallelism.recompute=none", "--no-check-mounts", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"short by [0-9.]+ GB", err) and len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("sweep", ["llama31_roce", "alpaca_opt"])
def test_sbatch_test_only_accepts_every_script(local_slurm, tmp_path, capsys, sweep):
    rc = main(["submit", "--sweep", sweep, "--test-only", "--no-check-mounts", "--out", str(tmp_path)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "\t" in ln]
    assert rc == 0
    assert len(lines) == (6 if sweep == "llama31_roce" else 6)  # alpaca_opt: OPT-30B does not fit, not written
    for line in lines:
        run_dir, tag, message = line.split("\t")
        assert tag == "test-only" and "to start at" in message, line
        assert not (Path(run_dir) / "job_id.txt").exists()


def test_run_mode_train_validates_keeps_the_best_and_exports(tmp_path):
    """run.mode=train (the default for one recipe): validation every N steps on the validation split, the best
    checkpoint named in best.json and kept, the final adapter written by save_pretrained."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "vdkit", "run", "model=tiny_llama", "method=lora",
                           "train.max_steps=6", "train.global_batch_size=2", "cluster.gpus_per_node=1",
                           "train.val_every_n_steps=3", "train.val_batches=1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "tiny_llama_lora_1n1g"
    log = (run / "local-1.out").read_text()
    assert log.count("validation_loss") == 2 and "at global_step 3" in log and "at global_step 6" in log
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert (run / "checkpoints" / best["checkpoint"]).exists() and best["step"] in (3, 6)
    assert (run / "export" / "adapter_config.json").is_file()


def test_full_recompute_uses_transformers_current_switch():
    """parallelism.recompute=full turns on checkpointing through the name transformers keeps (5.x deprecates
    gradient_checkpointing_enable, 'removed in v6'): no FutureWarning, and every decoder layer checkpoints."""
    import warnings

    from vdkit.recipes.reference.model import build_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = build_model(compose(BASE + ["method=sft", "parallelism.recompute=full"]), rdata.ByteTokenizer())
    layers = model.model.layers
    assert len(layers) > 0 and all(layer.gradient_checkpointing for layer in layers)


def test_the_reference_extra_stops_below_the_transformers_major_that_removes_what_peft_reads():
    """peft's PeftModel (get_peft_model, recipes/reference/model.py wrap_method) reads ``is_gradient_checkpointing``
    as getattr(model, ..., True); transformers 5.x deprecates it, 'removed in v6'. On 6 peft's getattr falls back to
    True: every LoRA / P-tuning model gets the input-gradient hook of a checkpointed one, unasked and unwarned (and
    peft declares no transformers bound of its own). The reference extra ends below that major and admits the
    installed release. The installed sources are read, not imported (an import of both costs seconds)."""
    import importlib.util
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    def source(package: str, module: str) -> str:
        return (Path(importlib.util.find_spec(package).origin).parent / module).read_text()

    assert 'getattr(model, "is_gradient_checkpointing", True)' in source("peft", "peft_model.py")
    removed = re.search(r"`is_gradient_checkpointing` is deprecated and will be removed in v(\d+)",
                        source("transformers", "modeling_utils.py"))
    assert removed, "transformers no longer says when is_gradient_checkpointing goes: look at peft's read again"
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["reference"]
    (pin,) = [Requirement(r) for r in extra if Requirement(r).name == "transformers"]
    assert Version(version("transformers")) in pin.specifier, (pin, version("transformers"))
    assert Version(f"{removed.group(1)}.0") not in pin.specifier, pin
