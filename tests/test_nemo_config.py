"""Values of the rendered NeMo config: every number comes from the recipe or the plan."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.recipes.nemo import nemo_command, nemo_script, render_nemo_yaml
from vdkit.recipes.nemo.config import build_config
from vdkit.run.rundir import LOG_DIR, NEMO_CONFIG_FILE

RUN_DIR = Path("/cluster/runs/llama2_7b_lora_1n8g")


def _plan(*overrides):
    return make_plan(compose(list(overrides)))


def _cfg(*overrides, run_dir=RUN_DIR):
    plan = _plan(*overrides)
    return plan, build_config(plan, run_dir)


@pytest.mark.parametrize("overrides", [
    ["model=llama2_70b", "method=lora"],
    ["model=llama2_70b", "method=sft", "cluster.nodes=2"],
    ["model=llama2_13b", "method=sft", "parallelism.tp=2", "parallelism.pp=2"],
    ["model=llama2_7b", "method=lora", "parallelism.tp=1"],
])
def test_layout_comes_from_the_plan(overrides):
    plan, cfg = _cfg(*overrides)
    m = cfg["model"]
    assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]) == (plan.tp, plan.pp)
    assert m["sequence_parallel"] is plan.recipe.parallelism.sequence_parallel is (plan.tp > 1)
    assert cfg["exp_manager"]["checkpoint_callback_params"]["model_parallel_size"] == plan.tp * plan.pp
    assert cfg["trainer"]["devices"] == plan.recipe.cluster.gpus_per_node
    assert cfg["trainer"]["num_nodes"] == plan.recipe.cluster.nodes
    assert plan.tp * plan.pp * plan.dp == cfg["trainer"]["devices"] * cfg["trainer"]["num_nodes"]


def test_virtual_pipeline_only_when_interleaved():
    _, cfg = _cfg("model=llama2_13b", "method=sft", "parallelism.tp=1", "parallelism.pp=4", "parallelism.vp=10")
    assert cfg["model"]["virtual_pipeline_model_parallel_size"] == 10
    _, cfg = _cfg("model=llama2_13b", "method=sft", "parallelism.tp=1", "parallelism.pp=4")
    assert "virtual_pipeline_model_parallel_size" not in cfg["model"]


def test_batch_sizes_steps_and_validation_interval():
    plan, cfg = _cfg("train.global_batch_size=64", "train.micro_batch_size=2", "train.max_steps=7",
                     "engine.log_every_n_steps=5", "run.mode=timing")
    t, m = cfg["trainer"], cfg["model"]
    assert (m["global_batch_size"], m["micro_batch_size"]) == (64, 2)
    for ds in ("train_ds", "validation_ds", "test_ds"):
        assert (m["data"][ds]["global_batch_size"], m["data"][ds]["micro_batch_size"]) == (64, 2)
    assert t["max_steps"] == 7 and t["val_check_interval"] == 7  # validation never inside the timing
    assert t["num_sanity_val_steps"] == 0 and t["limit_val_batches"] >= 1
    assert t["log_every_n_steps"] == 5
    assert t["precision"] == "bf16-mixed"
    assert m["seed"] == plan.recipe.train.seed


def test_run_mode_train_validates_periodically_keeps_best_and_last_and_exports():
    """run.mode=train (a single render's default): validation every N steps on the validation split,
    train.val_batches batches, best (lowest validation loss) + last checkpoints, the best exported as .nemo;
    run.mode=timing: one validation after the last step, no periodic checkpoint, no export."""
    plan, cfg = _cfg("train.max_steps=1000")
    assert plan.recipe.run.mode == "train"
    t, params = cfg["trainer"], cfg["exp_manager"]["checkpoint_callback_params"]
    assert t["val_check_interval"] == 200 and t["limit_val_batches"] == 4
    assert cfg["model"]["data"]["validation_ds"]["file_names"][0].endswith("validation.jsonl")
    assert params["monitor"] == "validation_loss" and params["save_top_k"] == 1 and params["save_last"] is True
    assert params["save_nemo_on_train_end"] is True and params["save_best_model"] is True
    assert params["every_n_train_steps"] >= 1
    _, cfg = _cfg("train.max_steps=1000", "train.val_every_n_steps=250", "train.val_batches=4")
    assert (cfg["trainer"]["val_check_interval"], cfg["trainer"]["limit_val_batches"]) == (250, 4)
    _, cfg = _cfg("train.max_steps=1000", "run.mode=timing")
    t, params = cfg["trainer"], cfg["exp_manager"]["checkpoint_callback_params"]
    assert t["val_check_interval"] == 1000 and t["limit_val_batches"] == 1
    assert "every_n_train_steps" not in params and params["save_nemo_on_train_end"] is False
    _, cfg = _cfg("method=pretrain", "data=pile", "train.max_steps=1000")
    assert cfg["exp_manager"]["checkpoint_callback_params"]["save_nemo_on_train_end"] is True
    assert cfg["trainer"]["val_check_interval"] == 200


def test_logs_and_checkpoints_under_the_run_dir():
    plan, cfg = _cfg()
    e = cfg["exp_manager"]
    assert e["explicit_log_dir"] == str(RUN_DIR / LOG_DIR)
    assert e["checkpoint_callback_params"]["dirpath"] == str(RUN_DIR / "checkpoints")
    assert e["resume_if_exists"] is True and e["resume_ignore_no_checkpoint"] is True
    assert e["create_tensorboard_logger"] is True and e["log_step_timing"] is True
    assert e["step_timing_kwargs"] == {"sync_cuda": True, "buffer_size": 1}
    assert cfg["model"]["data"]["train_ds"]["index_mapping_dir"] == str(RUN_DIR / "index_mapping")
    assert "every_n_train_steps" not in e["checkpoint_callback_params"]  # engine default 0: only at the end


def test_checkpoints_in_shared_results_dir_and_periodic():
    _, cfg = _cfg("run.results_dir=/shared/results", "engine.checkpoint_every_n_steps=25")
    params = cfg["exp_manager"]["checkpoint_callback_params"]
    assert params["dirpath"] == f"/shared/results/{RUN_DIR.name}/checkpoints"
    assert (params["every_n_train_steps"], params["every_n_epochs"]) == (25, 0)
    assert cfg["exp_manager"]["explicit_log_dir"] == str(RUN_DIR / LOG_DIR)  # logs stay with the run


def test_relative_run_dir_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, cfg = _cfg(run_dir="runs/x")
    assert cfg["exp_manager"]["explicit_log_dir"] == str(tmp_path / "runs" / "x" / LOG_DIR)


def test_fine_tuning_restores_the_base_model_and_reads_file_lists():
    plan, cfg = _cfg("model=llama2_13b", "method=sft", "data=alpaca",
                     "data.train_files=[a.jsonl,b.jsonl,c.jsonl]", "train.seq_length=4096")
    m = cfg["model"]
    assert m["restore_from_path"] == plan.recipe.model.nemo_path == "/models/llama2-13b.nemo"
    assert m["peft"]["peft_scheme"] == "none"
    train = m["data"]["train_ds"]
    assert train["file_names"] == ["/data/alpaca/a.jsonl", "/data/alpaca/b.jsonl", "/data/alpaca/c.jsonl"]
    assert len(train["concat_sampling_probabilities"]) == 3 and sum(train["concat_sampling_probabilities"]) == 1.0
    assert m["data"]["validation_ds"]["file_names"] == ["/data/alpaca/validation.jsonl"]
    assert m["data"]["test_ds"]["file_names"] == ["/data/alpaca/test.jsonl"]
    assert {m["data"][ds]["max_seq_length"] for ds in ("train_ds", "validation_ds", "test_ds")} == {4096}
    assert "packed_sequence" not in train


def test_single_file_still_gets_a_probability_list():
    _, cfg = _cfg()
    assert cfg["model"]["data"]["train_ds"]["concat_sampling_probabilities"] == [1.0]


def test_packed_sequences_read_the_packed_npy_not_the_jsonl():
    """NeMo 1.23's GPTSFTPackedDataset np.loads every file_names entry: the packed .npy per training file,
    per model (its tokenizer) and sequence length; the validation set stays JSONL (unpacked)."""
    plan, cfg = _cfg("data.packed=true")
    train = cfg["model"]["data"]["train_ds"]
    assert train["packed_sequence"] is True and cfg["model"]["micro_batch_size"] == 1
    assert train["file_names"] == [f"/data/dolly/packed/llama2_7b/training.{plan.recipe.train.seq_length}.npy"]
    assert cfg["model"]["data"]["validation_ds"]["file_names"] == ["/data/dolly/validation.jsonl"]


def test_a_packed_jsonl_and_an_optimizer_nemo_lacks_are_refused():
    from vdkit.recipes.nemo.contract import check_nemo_config

    plan, cfg = _cfg("data.packed=true")
    cfg["model"]["data"]["train_ds"]["file_names"] = ["/data/dolly/training.jsonl"]
    with pytest.raises(UserError, match="np.loads each file .* must be the packed .npy"):
        check_nemo_config(cfg, plan)
    plan, cfg = _cfg("method=sft")
    cfg["model"]["optim"]["name"] = "mcore_distributed_optim"  # NeMo 2.0's, not 1.23's
    with pytest.raises(UserError, match="NeMo 1.23 has no such optimizer"):
        check_nemo_config(cfg, plan)


def test_fast_sft_uses_distributed_fused_adam_and_keeps_grad_accumulation_fusion():
    plan, cfg = _cfg("recipe=fast", "method=sft")
    m = cfg["model"]
    assert m["optim"]["name"] == "distributed_fused_adam" and m["megatron_amp_O2"] is True
    assert m["gradient_accumulation_fusion"] is True
    # without the distributed optimizer on DP > 1, PP 1, NeMo 1.23 would drop the fusion: not rendered
    plan, cfg = _cfg("recipe=fast", "method=sft", "parallelism.distributed_optimizer=false", "parallelism.pp=1")
    assert plan.dp > 1 and cfg["model"]["optim"]["name"] == "fused_adam"
    assert "gradient_accumulation_fusion" not in cfg["model"]


def test_lora_parameters():
    _, cfg = _cfg("method=lora")
    assert cfg["model"]["peft"]["peft_scheme"] == "lora"
    assert cfg["model"]["peft"]["lora_tuning"]["adapter_dim"] == 32
    _, cfg = _cfg("method=lora", "method.lora_adapter_dim=16", "method.lora_dropout=0.05")
    assert cfg["model"]["peft"]["lora_tuning"]["adapter_dim"] == 16
    assert cfg["model"]["peft"]["lora_tuning"]["adapter_dropout"] == 0.05
    assert cfg["name"] == "megatron_gpt_peft_lora_tuning"


def test_ptuning_parameters():
    _, cfg = _cfg("method=ptuning")
    p = cfg["model"]["peft"]
    assert p["peft_scheme"] == "ptuning" and p["p_tuning"]["virtual_tokens"] == 10
    assert (p["p_tuning"]["bottleneck_dim"], p["p_tuning"]["embedding_dim"]) == (1024, 1024)
    _, cfg = _cfg("method=ptuning", "method.ptuning_virtual_tokens=20")
    assert cfg["model"]["peft"]["p_tuning"]["virtual_tokens"] == 20


@pytest.mark.parametrize("method,optimizer,amp_o2", [
    ("lora", "fused_adam", False), ("ptuning", "fused_adam", False),
    ("sft", "distributed_fused_adam", True), ("pretrain", "distributed_fused_adam", True),
])
def test_optimizer_per_method(method, optimizer, amp_o2):
    plan, cfg = _cfg(f"method={method}")
    o, meth = cfg["model"]["optim"], plan.recipe.method
    assert o["name"] == optimizer
    assert (o["lr"], o["sched"]["min_lr"], o["sched"]["warmup_steps"]) == (meth.lr, meth.min_lr, meth.warmup_steps)
    assert o["weight_decay"] == meth.weight_decay and isinstance(o["lr"], float)
    assert cfg["model"]["megatron_amp_O2"] is amp_o2


@pytest.mark.parametrize("mode,granularity,method,layers", [
    ("none", None, None, None), ("selective", "selective", None, None), ("full", "full", "uniform", 1)])
def test_activation_checkpointing_from_the_plan(mode, granularity, method, layers):
    _, cfg = _cfg("method=sft", f"parallelism.recompute={mode}")
    m = cfg["model"]
    assert (m["activations_checkpoint_granularity"], m["activations_checkpoint_method"],
            m["activations_checkpoint_num_layers"]) == (granularity, method, layers)


def test_fp8():
    _, cfg = _cfg("train.precision=fp8")
    assert cfg["model"]["fp8"] is True and cfg["model"]["fp8_hybrid"] is True
    assert cfg["trainer"]["precision"] == "bf16-mixed"
    _, cfg = _cfg()
    assert "fp8" not in cfg["model"]


@pytest.mark.parametrize("model", ["llama2_7b", "llama2_13b", "llama2_70b"])
def test_pretrain_architecture_and_data(model):
    plan, cfg = _cfg(f"model={model}", "method=pretrain", "cluster.nodes=2")
    m, mc = cfg["model"], plan.recipe.model
    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "max_position_embeddings"):
        assert m[key] == getattr(mc, key)
    assert m["encoder_seq_length"] == m["data"]["seq_length"] == plan.recipe.train.seq_length == 4096
    assert m["global_batch_size"] == 144
    assert m["data"]["data_prefix"] == [0.5, "/data/pile/my-llama_00_text_document",
                                        0.5, "/data/pile/my-llama_01_text_document"]
    assert m["tokenizer"]["model"] == "/data/pile/tokenizer.model"
    assert cfg["restore_from_path"] is None and "peft" not in m
    assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]) == (plan.tp, plan.pp)


def test_script_and_command():
    plan = _plan("method=lora")
    assert nemo_script(plan.recipe) == "/opt/NeMo/examples/nlp/language_modeling/tuning/megatron_gpt_finetuning.py"
    assert nemo_command(plan, RUN_DIR) == [
        "python", "-u", "/opt/NeMo/examples/nlp/language_modeling/tuning/megatron_gpt_finetuning.py",
        f"--config-path={RUN_DIR}", f"--config-name={NEMO_CONFIG_FILE}"]
    pre = _plan("method=pretrain", "engine.nemo_root=/workspace/NeMo")
    assert nemo_script(pre.recipe) == "/workspace/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py"
    assert nemo_command(pre, RUN_DIR, "other.yaml")[-1] == "--config-name=other.yaml"


def test_render_is_yaml_of_the_config_headed_by_its_command():
    plan = _plan("method=lora")
    text = render_nemo_yaml(plan, RUN_DIR)
    assert yaml.safe_load(text) == build_config(plan, RUN_DIR)
    assert " ".join(nemo_command(plan, RUN_DIR)) in text.splitlines()[1]
    assert render_nemo_yaml(plan, RUN_DIR) == text  # deterministic


def test_nemo_scripts_hydra_can_load_the_rendered_file(tmp_path):
    """NeMo's scripts are Hydra apps: --config-path/--config-name must find and parse nemo.yaml."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    plan = _plan("method=sft", "cluster.nodes=2")
    (tmp_path / NEMO_CONFIG_FILE).write_text(render_nemo_yaml(plan, tmp_path))
    argv = nemo_command(plan, tmp_path)
    config_path = argv[3].split("=", 1)[1]
    config_name = argv[4].split("=", 1)[1]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=config_path):
            cfg = hydra_compose(config_name=config_name)
    finally:
        GlobalHydra.instance().clear()
    assert OmegaConf.to_container(cfg, resolve=True) == build_config(plan, tmp_path)


def test_bf16_optimizer_state_renders_apex_dtypes():
    # train.optimizer_dtype=bf16: what NVIDIA's SFT launcher config sets (conf/peft/llama/sft.yaml optim.dtype /
    # grad_sync_dtype) and the memory model counts (conf/calibration/memory.yaml bf16_optimizer_bytes)
    _, cfg = _cfg("recipe=fast", "method=sft", "train.optimizer_dtype=bf16")
    optim = cfg["model"]["optim"]
    assert optim["name"] == "distributed_fused_adam" and optim["dtype"] == optim["grad_sync_dtype"] == "bf16"
    _, cfg = _cfg("recipe=fast", "method=sft")
    assert "dtype" not in cfg["model"]["optim"] and "grad_sync_dtype" not in cfg["model"]["optim"]
