"""engine=bridge rendered for the cluster: Megatron-Bridge's own ConfigContainer and the job around it.

Fast (no training): the sbatch and bridge.yaml of `vdkit render engine=bridge model=llama2_70b
method=lora cluster.nodes=2` against golden files; bridge.yaml loaded by Bridge's own
``ConfigContainer.from_yaml`` in strict mode (every key a real field) and checked value by value against
the plan; packed sequences with recipe=fast (the GPU configuration, by contract); NVIDIA's env
(CUDA_DEVICE_MAX_CONNECTIONS by its rule); one srun task per GPU running the job file, which imports
nothing from vdkit; P-tuning and CPU-packed refused in one line. Regenerate goldens after a deliberate
change: ``VDKIT_UPDATE_GOLDEN=1 python -m pytest tests/test_bridge_engine.py -q`` and review the diff.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.render.prepare import render_run
from vdkit.run.rundir import SBATCH_FILE

GOLDEN = Path(__file__).resolve().parent / "golden"
ISSUE_CELL = ["engine=bridge", "model=llama2_70b", "method=lora", "cluster.nodes=2"]


def _have_bridge() -> bool:
    try:
        return importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        return False


def _render(overrides, tmp_path) -> Path:
    return render_run(make_plan(compose(overrides)), tmp_path, check_mounts=False)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("VDKIT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"{path} missing: regenerate with VDKIT_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file (regenerate and review the diff)"


def test_issue_cell_renders_the_golden_job_and_config(tmp_path):
    run_dir = _render(ISSUE_CELL, tmp_path)
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["bridge.yaml", "bridge_job.py", "bridge_trust.py", "export_hf.sbatch", "import_hf.sbatch",
                     "launch.sbatch",
                     "overrides.txt", "plan.json", "preflight.json", "recipe.yaml", "vdkit_heartbeat.py",
                     "vdkit_preflight.py"]  # run.mode=train: export_hf.sbatch
    for name in ("launch.sbatch", "bridge.yaml", "import_hf.sbatch", "export_hf.sbatch"):
        _check_golden(f"bridge_llama2_70b_lora_2node.{name}", (run_dir / name).read_text().replace(str(run_dir), "@RUN_DIR@"))


def test_the_job_runs_in_the_nemo_image_one_task_per_gpu(tmp_path):
    run_dir = _render(ISSUE_CELL, tmp_path)
    sbatch = (run_dir / SBATCH_FILE).read_text()
    assert "--container-image=/shared/containers/nemo-26.02.01.sqsh" in sbatch
    assert "#SBATCH --ntasks-per-node=8" in sbatch and "#SBATCH --nodes=2" in sbatch
    assert "torchrun" not in sbatch  # Bridge reads SLURM_PROCID / SLURM_NTASKS itself: one srun task per GPU
    assert f"python {run_dir}/bridge_job.py {run_dir}/bridge.yaml" in sbatch
    assert "--container-mounts=/data/dolly:/data/dolly,/models/llama2-70b-bridge:/models/llama2-70b-bridge," in sbatch
    # the job file is Bridge-only: it runs in the stock image without vdkit installed
    imported = set()
    for name in ("bridge_job.py", "bridge_trust.py"):  # the job and the checkpoint check beside it
        tree = ast.parse((run_dir / name).read_text())
        imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    # the standard library, Bridge and torch (torch.distributed.checkpoint reads a checkpoint's .metadata); the
    # heartbeat and the checkpoint check are the run dir's vdkit_heartbeat.py and bridge_trust.py, imported by name
    assert imported <= {"functools", "importlib", "inspect", "os", "shutil", "signal", "sys", "time", "megatron", "torch"}


def test_image_is_a_setting(tmp_path):
    run_dir = _render([*ISSUE_CELL, "engine.container_image='nvcr.io#nvidia/nemo:26.02.01'"], tmp_path)
    assert "--container-image=nvcr.io#nvidia/nemo:26.02.01" in (run_dir / SBATCH_FILE).read_text()


@pytest.mark.parametrize("tp, want", [(1, "8"), (2, "1"), (4, "1")])
def test_cuda_device_max_connections_follows_nvidias_rule(tp, want, tmp_path):
    from vdkit.recipes import bridge

    plan = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=sft", f"parallelism.tp={tp}"]))
    env = bridge.env(plan)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == want
    assert env["TORCH_NCCL_HIGH_PRIORITY"] == "1" and env["NVTE_NORM_FWD_USE_CUDNN"] == "1"


def _config(overrides, tmp_path) -> tuple:
    run_dir = _render(overrides, tmp_path)
    return run_dir, yaml.safe_load((run_dir / "bridge.yaml").read_text()), make_plan(compose(overrides))


CASES = {"7b-sft-tp2pp2vp4": ["model=llama2_7b", "method=sft", "parallelism.tp=2", "parallelism.pp=2", "parallelism.vp=4"],
         "13b-pretrain": ["model=llama2_13b", "method=pretrain", "cluster.nodes=2"],
         "70b-lora-2node": ISSUE_CELL[1:],
         "7b-lora-fast": ["model=llama2_7b", "method=lora", "recipe=fast"],
         # the checkpoint policy's two train shapes: periodic async saves; the end's weights-only save
         "7b-sft-long": ["model=llama2_7b", "method=sft", "train.max_steps=100000"],
         "7b-sft-1000": ["model=llama2_7b", "method=sft", "train.max_steps=1000"],
         "70b-lora-timing": [*ISSUE_CELL[1:], "run.mode=timing"],
         # Bridge's own Llama 3.1 provider; FP8 as current scaling with the distributed optimizer
         "llama31-8b-sft": ["model=llama3_1_8b", "method=sft", "train.seq_length=4096", "data.data_dir=/data/dolly",
                            "model.megatron_path=/models/llama31-8b-bridge"],
         "7b-lora-fp8": ["model=llama2_7b", "method=lora", "train.precision=fp8", "parallelism.distributed_optimizer=true"],
         # MLPerf's LoRA: QKV and the output projection, the projection's output by all-to-all
         "70b-lora-attention": [*ISSUE_CELL[1:], "method.lora_targets=[linear_qkv,linear_proj]", "method.lora_a2a=true"]}


@pytest.fixture(scope="module")
def bridge_loads(tmp_path_factory):
    """Each case's bridge.yaml loaded by Bridge's own loader, all in one process (one Bridge import):
    case id -> the line it prints (provider, TP, PP, PEFT, packed size); None without Bridge."""
    if not _have_bridge():
        return None
    root = tmp_path_factory.mktemp("bridge_loads")
    paths = {k: _render(["engine=bridge", *v], root / k) / "bridge.yaml" for k, v in CASES.items()}
    out = subprocess.run([sys.executable, "-c", _LOAD, *map(str, paths.values())], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()[-len(paths):]
    return dict(zip(paths, lines))


@pytest.mark.parametrize("case", ["7b-sft-tp2pp2vp4", "13b-pretrain", "70b-lora-2node", "70b-lora-attention"])
def test_config_carries_the_plan(case, tmp_path, bridge_loads):
    run_dir, cfg, plan = _config(["engine=bridge", *CASES[case]], tmp_path)
    r, m = plan.recipe, cfg["model"]
    provider = {"llama2_7b": "Llama2ModelProvider7B", "llama2_13b": "Llama2ModelProvider13B",
                "llama2_70b": "Llama2ModelProvider70B"}[r.model.name]
    assert m["_target_"].endswith(provider)
    assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]) == (plan.tp, plan.pp)
    assert m["virtual_pipeline_model_parallel_size"] == (r.parallelism.vp if (r.parallelism.vp or 1) > 1 else None)
    assert m["sequence_parallel"] == bool(r.parallelism.sequence_parallel)
    # fine-tuning: the loss per answer token of the global batch (any layout's gradient the same)
    fine_tuning = r.method.name != "pretrain"
    assert m.get("calculate_per_token_loss", False) is fine_tuning
    assert cfg["ddp"]["average_in_collective"] is not fine_tuning
    if (r.parallelism.vp or 1) > 1:  # NVIDIA's interleaved-schedule sends
        assert (m["overlap_p2p_comm"], m["batch_p2p_comm"]) == (True, False)
    t = cfg["train"]
    assert (t["global_batch_size"], t["micro_batch_size"], t["train_iters"]) == (
        r.train.global_batch_size, r.train.micro_batch_size, r.train.max_steps)
    assert cfg["optimizer"]["use_distributed_optimizer"] == bool(r.parallelism.distributed_optimizer)
    assert cfg["optimizer"]["lr"] == r.method.lr and cfg["scheduler"]["lr_decay_iters"] == r.train.max_steps
    ck = cfg["checkpoint"]
    assert ck["ckpt_format"] == "torch_dist" and ck["save"] == ck["load"] == str(run_dir / "checkpoints")
    if r.method.name == "pretrain":
        assert ck["pretrained_checkpoint"] is None and "peft" not in cfg
        assert cfg["dataset"]["_target_"].endswith("GPTDatasetConfig")
        assert cfg["dataset"]["blend"][0] == [f"/data/pile/{f}" for f in r.data.train_files]
    else:
        assert ck["pretrained_checkpoint"] == r.model.megatron_path
        assert cfg["dataset"]["_target_"].endswith("FinetuningDatasetConfig")
        assert cfg["dataset"]["dataset_root"] == r.data.data_dir
    if r.method.name == "lora":
        a2a = {"a2a_experimental": True} if r.method.lora_a2a else {}  # rendered only when set
        assert cfg["peft"] == {"_target_": "megatron.bridge.peft.lora.LoRA", "target_modules": list(r.method.lora_targets),
                               "dim": r.method.lora_adapter_dim, "alpha": r.method.lora_adapter_dim, "dropout": 0.0, **a2a}
    if bridge_loads is not None:  # Bridge's own loader accepted every key (strict) and built the container
        provider_, tp, pp, peft, _packed = bridge_loads[case].split()[:5]
        assert (provider_, int(tp), int(pp)) == (provider, plan.tp, plan.pp)
        assert peft == ("LoRA" if r.method.name == "lora" else "None")


_LOAD = r"""
import sys
from vdkit.recipes.bridge import cpu_shim
cpu_shim.apply()
from vdkit.recipes.bridge import job
for path in sys.argv[1:]:
    cfg = job.load(path)
    m = cfg.model
    assert type(m).__name__ != "Llama31ModelProvider8B" or (m.rope_scaling, m.rope_scaling_factor) == (True, 8.0)
    print(type(m).__name__, m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
          type(cfg.peft).__name__ if cfg.peft else None,
          getattr(getattr(cfg.dataset, "packed_sequence_specs", None), "packed_sequence_size", None),
          cfg.checkpoint.save_interval, cfg.checkpoint.most_recent_k, cfg.checkpoint.async_save,
          cfg.checkpoint.save_optim)
    cfg.checkpoint.finalize()  # Bridge's own checks (async_save: a save dir and the persistent worker)
"""


def test_checkpoint_policy_loads_into_bridges_checkpoint_config(bridge_loads):
    """Bridge's CheckpointConfig takes the policy (vdkit.checkpoint_policy): a timing run's save_interval 0,
    a long run's periodic async saves, a short train run's weights-only end; two kept."""
    if bridge_loads is None:
        pytest.skip("megatron-bridge not installed (extra [bridge])")
    assert bridge_loads["70b-lora-timing"].split()[5:] == ["0", "2", "False", "True"]
    interval, keep, async_save, optim = bridge_loads["7b-sft-long"].split()[5:]
    assert int(interval) > 0 and (keep, async_save, optim) == ("2", "True", "True")
    assert bridge_loads["7b-sft-1000"].split()[5:] == ["None", "2", "False", "False"]


def test_llama31_is_bridges_llama31_and_fp8_is_current_scaling(tmp_path, bridge_loads):
    """Llama 3.1 renders Bridge's Llama31ModelProvider8B (rope scaling factor 8, theta 500000: the provider's
    own); FP8 renders NVIDIA's current-scaling recipe with the distributed optimizer (the planner turns it on when
    unset: the preset gathers FP8 parameters through it), and with it set off FP8 is refused at the door in one line."""
    _, cfg, _ = _config(["engine=bridge", *CASES["llama31-8b-sft"]], tmp_path / "a")
    assert cfg["model"]["_target_"] == "megatron.bridge.models.llama.llama_provider.Llama31ModelProvider8B"
    _, cfg, _ = _config(["engine=bridge", *CASES["7b-lora-fp8"]], tmp_path / "b")
    assert cfg["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    assert cfg["optimizer"]["use_distributed_optimizer"] is True
    _, cfg, _ = _config(["engine=bridge", "model=llama2_7b", "method=lora", "train.precision=fp8"], tmp_path / "c")
    assert cfg["optimizer"]["use_distributed_optimizer"] is True  # (in bf16 a LoRA plan leaves it off)
    with pytest.raises(UserError, match="only with the distributed optimizer"):
        _render(["engine=bridge", "model=llama2_7b", "method=lora", "train.precision=fp8",
                 "parallelism.distributed_optimizer=false"], tmp_path / "d")
    if bridge_loads is not None:  # Bridge's own loader built the provider, with its own RoPE scaling
        assert bridge_loads["llama31-8b-sft"].split()[0] == "Llama31ModelProvider8B"


def test_fast_recipe_packs_sequences_for_the_gpu(tmp_path, bridge_loads):
    """recipe=fast: Bridge's PackedSequenceSpecs at the sequence length, MBS 1 (the GPU configuration;
    packed attention needs TE, so it is tested by contract here and refused on this CPU)."""
    run_dir, cfg, plan = _config(["engine=bridge", *CASES["7b-lora-fast"]], tmp_path)
    spec = cfg["dataset"]["packed_sequence_specs"]
    assert spec["_target_"] == "megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs"
    assert spec["packed_sequence_size"] == plan.recipe.train.seq_length == 4096
    assert cfg["train"]["micro_batch_size"] == 1 and cfg["dataset"]["dataset_kwargs"]["pad_to_max_length"] is True
    assert all(cfg["model"][k] for k in ("apply_rope_fusion", "gradient_accumulation_fusion", "bias_activation_fusion"))
    if bridge_loads is not None:
        assert bridge_loads["7b-lora-fast"].split()[4] == "4096"


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "vdkit", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_ptuning_is_refused_naming_the_engines_that_do_it(tmp_path):
    out = _cli("render", "engine=bridge", "method=ptuning", "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "method.name=ptuning: engine=bridge has no such method" in lines[0]
    assert "engine=nemo or engine=reference or engine=megatron" in lines[0]  # every engine whose spec has it
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_packed_sequences_are_refused_on_this_cpu_in_one_line(tmp_path):
    out = _cli("run", "engine=bridge", "model=tiny_llama", "data=synthetic", "method=sft", "data.packed=true", "train.seq_length=64",
               "train.micro_batch_size=1", "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "packed sequences cannot train on this CPU" in lines[0]


def test_fine_tuning_without_a_base_checkpoint_is_refused(tmp_path):
    from vdkit.recipes import bridge

    # with neither a Bridge checkpoint nor HF weights to convert one from (tests/test_bridge_chain.py: with them)
    plan = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=sft", "model.megatron_path=null",
                              "model.hf_path=null"]))
    with pytest.raises(UserError, match="model.megatron_path is not set"):
        bridge.check(plan)


def test_byte_tokenizer_gives_the_kits_ids(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from vdkit.recipes.common.byte_tokenizer import byte_tokenizer_files

    for name, text in byte_tokenizer_files("tok").items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    text = "upper: héllo World"
    assert tok(text, add_special_tokens=False)["input_ids"] == [b + 3 for b in text.encode()]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_the_job_exit_code_is_the_contracts():
    """bridge_job.py cannot import vdkit (it runs in the stock image): its stop code must equal the contract's."""
    from vdkit.run import jobspec
    from vdkit.recipes.bridge import job

    assert job.EXIT_STOPPED == getattr(jobspec, "EXIT_STOPPED", 75)
    assert job.STOP_AT_ENV == getattr(jobspec, "STOP_AT_ENV", "VDKIT_STOP_AT")


def _bridge_checkpoint(save_dir, n):
    """A checkpoint as Bridge 0.3.1's save leaves it: torch's DCP shards and .metadata, megatron-core's common.pt and
    metadata.json, Bridge's train_state.pt and run_config.yaml (see trust.COMPLETE_FILES)."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = save_dir / f"iter_{n:07d}"
    dcp.save({"w": torch.full((4000,), float(n))}, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    for name in ("common.pt", "metadata.json", "run_config.yaml"):
        (path / name).write_text("{}")
    (path / "train_state.pt").write_text(f"state {n}")
    return path


def test_a_damaged_or_incomplete_latest_checkpoint_is_set_aside_and_the_previous_used(tmp_path):
    """A save cut off before its tracker (iter_6), one whose shard was cut short (iter_4): each set aside (renamed,
    never deleted) with one line, the tracker and latest_train_state.pt pointed at the newest complete one."""
    import warnings

    from vdkit.recipes.bridge import trust
    from vdkit.recipes.common.trust import DAMAGED_MARK

    assert trust.DAMAGED_MARK == DAMAGED_MARK  # `vdkit status` finds the set-aside ones by it
    warnings.filterwarnings("ignore", category=UserWarning)  # torch: no process group (one process here)
    for n in (2, 4, 6):
        _bridge_checkpoint(tmp_path, n)
    (tmp_path / "iter_0000006" / "run_config.yaml").unlink()  # a kill before Bridge's last file
    (tmp_path / trust.TRACKER).write_text("4")
    (tmp_path / trust.LATEST_STATE).write_text("state 4")
    said = []
    assert trust.trust_latest(tmp_path, said.append) == 4 and len(said) == 1
    assert said[0].startswith("bridge_job: checkpoint iter_0000006 is damaged (incomplete: no run_config.yaml")
    assert said[0].endswith("; resuming from iter_0000004")
    assert trust.trust_latest(tmp_path, said.append) == 4 and len(said) == 1  # nothing more to do
    shard = tmp_path / "iter_0000004" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # cut short: the bytes torch's .metadata names are not there
    (tmp_path / trust.TRACKER).write_text("")  # ... and a kill mid-write of the tracker
    assert trust.trust_latest(tmp_path, said.append) == 2
    assert "iter_0000004 is damaged (__0_0.distcp is cut short (100 of" in said[1]
    assert trust.checkpointed_iteration(tmp_path) == 2 and (tmp_path / trust.LATEST_STATE).read_text() == "state 2"
    aside = sorted(p.name.split(trust.DAMAGED_MARK)[0] for p in tmp_path.iterdir() if trust.DAMAGED_MARK in p.name)
    assert aside == ["aside-iter_0000004", "aside-iter_0000006"]  # kept, and named so Bridge's clean-up skips them
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("iter_") and not p.name[5:].isdigit()]
    # ... and with none complete left, the tracker and state go aside too: the run starts over.
    (tmp_path / "iter_0000002" / ".metadata").unlink()
    assert trust.trust_latest(tmp_path, said.append) == 0 and said[-1].endswith("resuming from step 0 (none is left)")
    assert not (tmp_path / trust.TRACKER).exists() and not (tmp_path / trust.LATEST_STATE).exists()
    assert len([p for p in tmp_path.iterdir() if trust.DAMAGED_MARK in p.name]) == 5


def test_the_record_names_bridges_last_complete_checkpoint(tmp_path):
    """The batch shell's vdkit_last_step (vdkit.slurm.recovery) agrees with the job on what is complete."""
    import subprocess
    import warnings

    from vdkit.recipes.bridge import trust
    from vdkit.slurm.recovery import last_step_lines

    warnings.filterwarnings("ignore", category=UserWarning)
    for n in (30, 60):
        _bridge_checkpoint(tmp_path, n)
    (tmp_path / "iter_0000060" / "run_config.yaml").unlink()
    script = "\n".join(["set -euo pipefail", *last_step_lines(tmp_path), "vdkit_last_step"])
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.strip() == "30"
    assert trust.trust_latest(tmp_path, lambda line: None) == 30


def test_a_stop_during_start_up_is_kept_not_fatal():
    """USR1 (and TERM, passed on as USR1) before Bridge's handler exists: noted for it, the rank lives on;
    in a checkpoint writer's child (``forward_term=False``) TERM still ends the process."""
    import subprocess
    import sys

    probe = ("import os, signal, sys; from vdkit.recipes.bridge import job; job.hold_stops(forward_term=sys.argv[1] == '1');"
             "os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGTERM); print(len(job._EARLY_STOPS))")
    rank = subprocess.run([sys.executable, "-c", probe, "1"], capture_output=True, text=True, timeout=60)
    assert (rank.returncode, rank.stdout.strip()) == (0, "2")  # both kept, for Bridge's handler
    child = subprocess.run([sys.executable, "-c", probe, "0"], capture_output=True, text=True, timeout=60)
    assert child.returncode == -15 and child.stdout == ""  # USR1 ignored, TERM ends it


def test_a_base_dir_without_a_bridge_checkpoint_is_refused_before_the_run(tmp_path, capsys):
    """Bridge itself would fine-tune fresh random weights from a directory without its tracker files."""
    from vdkit.cli import main

    (tmp_path / "notabase" / "base" / "iter_0000000").mkdir(parents=True)  # one level too high
    rc = main(["run", "engine=bridge", "model=tiny_llama", "data=synthetic", "method=sft",
               f"model.megatron_path={tmp_path / 'notabase'}", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "holds no Megatron-Bridge checkpoint" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


_EDITED = r"""
import importlib.util, sys
from vdkit.recipes.bridge import cpu_shim
cpu_shim.apply()
spec = importlib.util.spec_from_file_location("bridge_job", sys.argv[1])
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)
for path in sys.argv[2:]:
    print("rc", job.main([path]), flush=True)
"""


def test_an_edited_bridge_yaml_bridge_refuses_is_one_line_and_exit_2_in_the_rank(tmp_path):
    """A user edits bridge.yaml and runs `sbatch launch.sbatch` without `vdkit check`: the rank's own job
    (the run dir's bridge_job.py) says in one line which file Bridge refused and why, and exits 2 (the
    recipe's fault: the batch shell does not restart it), not a traceback."""
    if not _have_bridge():
        pytest.skip("megatron-bridge not installed (extra [bridge])")
    run_dir = _render(["engine=bridge", "model=tiny_llama", "data=synthetic", "method=pretrain",
                       "cluster.nodes=1", "cluster.gpus_per_node=1"], tmp_path)
    text = (run_dir / "bridge.yaml").read_text()
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(text.replace("\nmodel:\n", "\nmodel:\n  num_layerz: 3\n", 1))
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text(text.replace("\nmodel:\n", "\nmodel: [\n", 1))
    out = subprocess.run([sys.executable, "-c", _EDITED, str(run_dir / "bridge_job.py"), str(misspelt), str(syntax)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RANK": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [ln for ln in out.stdout.splitlines() if ln.startswith("rc ")] == ["rc 2", "rc 2"], out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("bridge_job: Bridge's ConfigContainer")]
    assert len(lines) == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"refuses {misspelt}:" in lines[0] and "num_layerz" in lines[0] and "fix: correct the key" in lines[0]
    assert f"refuses {syntax}:" in lines[1]


_RESUME = r"""
import sys, time
from vdkit.cli import main
from vdkit.recipes.engines import get
from vdkit.run.rundir import load_plan
get("bridge").resume_check(load_plan(sys.argv[1]), sys.argv[1])  # the rendered file itself passes the door
print("clean passes", flush=True)
for d in [d for d in sys.argv[2:] if not d.endswith("/accepted")]:
    print("@@@ " + d, file=sys.stderr, flush=True)
    start = time.monotonic()
    rc = main(["run", "--resume", d])
    print("rc", rc, round(time.monotonic() - start, 1), flush=True)
typed = [d for d in sys.argv[2:] if d.rpartition("/")[2] in TYPED] + [d for d in sys.argv[2:] if d.endswith("/accepted")]
print("@@@ check", file=sys.stderr, flush=True)
start = time.monotonic()
print("check rc", main(["check", *typed]), round(time.monotonic() - start, 1), flush=True)
"""
# Hand edits of a local run's bridge.yaml -> what the refusal names. A section given a wrong type passes Bridge's
# loader; the type comparison (recipes/bridge/edits.py: ConfigContainer.train is a TrainingConfig) refuses it
# before Bridge's runtime_config_update would (with "finalize").
_EDITS = {"misspelt": (lambda t: t.replace("\ntrain:\n", "\ntrain:\n  bogus_key: 1\n", 1), "bogus_key"),
          "syntax": (lambda t: t.replace("\nmodel:\n", "\nmodel: [\n", 1), "ParserError"),
          "target": (lambda t: t.replace("config.TrainingConfig\n", "config.TrainingConfigz\n", 1), "TrainingConfigz"),
          "section-type": (lambda t: t.split("\ntrain:\n", 1)[0] + "\ntrain: 5\noptimizer:\n"
                           + t.split("\noptimizer:\n", 1)[1], "train is 5, an int in"),
          # Values Bridge's loader and validate() take although its dataclass field declares another type, and counts
          # its loop needs > 0 (the shared comparison, vdkit.recipes.common.edits): `vdkit check` refuses them too
          "word-count": (lambda t: t.replace("train_iters: 50\n", "train_iters: fifty\n", 1),
                         "train.train_iters is 'fifty', a str in"),
          "list-mbs": (lambda t: t.replace("micro_batch_size: 1\n", "micro_batch_size: [1, 2]\n", 1),
                       "train.micro_batch_size is a list in"),
          "yaml-1e-4": (lambda t: t.replace("  lr: 0.0002\n", "  lr: 1e-4\n", 1),  # PyYAML (Bridge's reader): a str
                        "optimizer.lr is '1e-4', a str in"),
          "zero-log": (lambda t: t.replace("log_interval: 1\n", "log_interval: 0\n", 1), "logger.log_interval=0 in"),
          "literal": (lambda t: t.replace("lr_decay_style: cosine\n", "lr_decay_style: cosin\n", 1),
                      "scheduler.lr_decay_style='cosin'"),
          # not an edit: bridge.yaml replaced by a FIFO, which Bridge's loader would open and block on for ever
          "fifo": (None, "is a FIFO (named pipe), not a file"),
          # the run dir's bridge_job.py (the loader the door runs) replaced by a FIFO, or edited into a syntax error
          "job-fifo": ("job", "bridge_job.py is a FIFO (named pipe), not a file"),
          "job-syntax": ("job-syntax", "SyntaxError")}
TYPED = ("word-count", "list-mbs", "yaml-1e-4", "zero-log", "literal")  # `vdkit check` run on these too
_RESUME = _RESUME.replace("TYPED", repr(TYPED))


def _copy_run_dir(clean: Path, dest: Path) -> Path:
    """A copy of a rendered run dir as if rendered at ``dest``: its pre-flight names its own paths (`vdkit check`
    refuses a copy whose preflight.json still points at the original)."""
    import shutil

    d = Path(shutil.copytree(clean, dest))
    pre = d / "preflight.json"
    if pre.is_file():
        pre.write_text(pre.read_text().replace(str(clean), str(d)))
    return d


def test_vdkit_run_resume_refuses_an_edited_bridge_yaml_before_any_rank_starts(tmp_path):
    """`vdkit run --resume RUN_DIR` after a hand edit of bridge.yaml that Bridge refuses: each rank started, imported
    Bridge and exited 2. The door now loads the file as `vdkit check` does (the run dir's own loader, then Bridge's
    runtime_config_update) before any rank starts: one line naming the file, Bridge's error and the fix, exit 2.
    All edits in one process: Bridge is imported once (only for engine=bridge run dirs)."""
    if not _have_bridge():
        pytest.skip("megatron-bridge not installed (extra [bridge])")
    import shutil

    clean = _render(["engine=bridge", "model=tiny_llama", "data=synthetic", "method=pretrain", "cluster=local"],
                    tmp_path / "clean")
    text = (clean / "bridge.yaml").read_text()
    dirs = {}
    for name, (edit, _) in _EDITS.items():
        d = dirs[name] = _copy_run_dir(clean, tmp_path / name)
        if edit is None or edit == "job":
            target = d / ("bridge.yaml" if edit is None else "bridge_job.py")
            target.unlink()
            os.mkfifo(target)
            continue
        if edit == "job-syntax":
            (d / "bridge_job.py").write_text((d / "bridge_job.py").read_text() + "\ndef broken(:\n")
            continue
        # a copy writes into its own run dir (one that writes into the clean's is refused: common.edits.moved_output)
        (d / "bridge.yaml").write_text(edit(text.replace(str(clean), str(d))))
        assert (d / "bridge.yaml").read_text() != text, name
    accepted = _copy_run_dir(clean, tmp_path / "accepted")  # a new lr and a null train_samples: Bridge's types
    (accepted / "bridge.yaml").write_text(text.replace(str(clean), str(accepted))
                                          .replace("  lr: 0.0002\n", "  lr: 0.0003\n", 1)
                                          .replace("train_iters: 50\n", "train_iters: 50\n  train_samples: null\n", 1))
    out = subprocess.run([sys.executable, "-c", _RESUME, str(clean), *map(str, dirs.values()), str(accepted)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "clean passes" in out.stdout.splitlines(), out.stderr[-3000:]
    results = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("rc ")]
    errs = out.stderr.split("@@@ check")[0].split("@@@ ")[1:]
    assert len(results) == len(errs) == len(dirs), (out.stdout, out.stderr[-3000:])
    for (name, d), (_, rc, seconds), err in zip(dirs.items(), results, errs):
        lines = [ln for ln in err.splitlines()[1:] if ln.strip()]
        assert rc == "2" and len(lines) == 1, (name, rc, err[-3000:])
        line = lines[0]
        assert f"{d / 'bridge.yaml'}" in line and _EDITS[name][1] in line and "fix:" in line, (name, line)
        assert not (d / "local-1.out").exists() and not (d / "logs").exists(), name  # no rank started
        assert float(seconds) < 5, (name, seconds)  # Bridge imported already (by the clean check): the door's own time
    # `vdkit check` on the typed edits: one line each (the comparison, after Bridge's loader, before validate()); the
    # accepted edit passes and is listed
    (check,) = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("check rc ")]
    assert check[2] == "2", out.stderr[-3000:]
    check_err = out.stderr.split("@@@ check", 1)[1]
    for name in TYPED:
        lines = [ln for ln in check_err.splitlines() if ln.startswith(f"vdkit check: error: {dirs[name]}:")]
        assert len(lines) == 1 and _EDITS[name][1] in lines[0] and "fix:" in lines[0], (name, check_err[-3000:])
    assert f"vdkit check: error: {accepted}:" not in check_err
    assert ("(each of the type Megatron-Bridge 0.3.1's dataclass field declares): train.train_samples, optimizer.lr"
            in out.stdout), out.stdout[-3000:]


def test_the_export_runs_only_after_the_runs_last_allocation(tmp_path):
    """export_hf.sbatch advised afterok of the run's first job, which hands over and exits 0: the export started
    mid-run (issue 36). Now, until `finished` exists, it queues itself after the run's latest job and exits."""
    import subprocess

    run_dir = _render(ISSUE_CELL, tmp_path / "runs")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for tool, body in (("squeue", 'echo "squeue $*" >> CALLS; [ -n "$QUEUED" ] && echo "$QUEUED"; exit 0'),
                       ("sbatch", 'echo "sbatch $*" >> CALLS'), ("srun", 'echo "srun" >> CALLS')):
        (bin_dir / tool).write_text("#!/bin/sh\n" + body.replace("CALLS", str(calls)) + "\n")
        (bin_dir / tool).chmod(0o755)
    script = run_dir / "export_hf.sbatch"

    def run(queued=""):
        calls.write_text("")
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "QUEUED": queued}
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
        return proc.returncode, calls.read_text().splitlines(), proc.stdout + proc.stderr

    (run_dir / "job_id.txt").write_text("101\n102\n")  # 101 handed over to 102, which runs
    rc, seen, out = run(queued="102")
    assert rc == 0 and f"sbatch --dependency=afterany:102 {script}" in seen and "srun" not in seen, (seen, out)
    rc, seen, out = run()  # nothing queued and not finished: the run ended unfinished
    assert rc == 1 and "srun" not in seen and "has not finished" in out
    (run_dir / "finished").touch()
    rc, seen, out = run()
    assert rc == 0 and seen == ["srun"], (seen, out)
