"""FP8 weights and a bf16 optimizer state as each engine's stack holds them (conf/calibration/memory.yaml
``fp8_linear_weight_bytes``, ``bf16_optimizer_bytes``), Bridge's bf16 optimizer state in bridge.yaml, the
doors that refuse what an engine or this machine cannot run, and the layers Bridge's FP8 preset keeps in bf16."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.layout import data_parallel
from vdkit.planner.memory import stage_params, stage_static_bytes
from vdkit.planner.plan import make_plan

LORA_70B = ["model=llama2_70b", "method=lora", "cluster.nodes=2", "parallelism.tp=4", "parallelism.pp=4",
            "parallelism.distributed_optimizer=true"]


@pytest.mark.parametrize("engine, linear_bytes", [("nemo", 4.0), ("bridge", 2.0)])
def test_fp8_linear_weights_are_what_the_engines_stack_keeps(engine, linear_bytes):
    # NeMo 1.23 (model.fp8, no fp8_params): the bf16 weight + Transformer Engine's cached FP8 copy + its FP8
    # transpose; Bridge (fp8_param): the FP8 parameter's data + transpose. Everything else stays bf16 (2).
    # NeMo's LoRA with megatron_amp_O2 (recipe=fast, as NVIDIA's LoRA FP8 rows; without O2 its weights are fp32:
    # tests/test_nemo_fp32_params.py)
    over = [*LORA_70B, f"engine={engine}", *(["recipe=fast"] if engine == "nemo" else [])]
    r = compose([*over, "train.precision=fp8"])
    held, linear, _ = stage_params(r, 4, 4, 1)
    weights = stage_static_bytes(r, 4, 4, 1, True)["weights"]
    assert weights == pytest.approx(2.0 * (held - linear) + linear_bytes * linear)
    bf16 = stage_static_bytes(compose(over), 4, 4, 1, True)["weights"]
    assert bf16 == pytest.approx(2.0 * held)
    assert 0.98 * held < linear < held  # the norms are all a middle stage holds beyond the linear weights


@pytest.mark.parametrize("engine, grad_bytes, optim_bytes, fp32_optim_bytes",
                         [("nemo", 2.0, 4.0, 10.0), ("bridge", 4.0, 8.0, 12.0)])
def test_bf16_optimizer_state_bytes_per_engine(engine, grad_bytes, optim_bytes, fp32_optim_bytes):
    # NeMo: Apex's bf16 gradient buffer, m and v (NeMo 1.23 stores no params_shard when the optimizer's dtype is the
    # model's); Bridge: the fp32 gradient buffer and master copy its presets keep, m and v in bf16
    over = ["model=llama2_7b", "method=sft", f"engine={engine}", "parallelism.distributed_optimizer=true",
            "parallelism.tp=2", "parallelism.pp=1"]
    r = compose([*over, "train.optimizer_dtype=bf16"])
    _, _, trainable = stage_params(r, 2, 1, 0)
    got = stage_static_bytes(r, 2, 1, 0, True)
    assert got["gradients"] == pytest.approx(grad_bytes * trainable)
    assert got["optimizer"] == pytest.approx(optim_bytes * trainable / data_parallel(r, 2, 1))
    fp32 = stage_static_bytes(compose(over), 2, 1, 0, True)
    assert fp32["gradients"] == pytest.approx(4.0 * trainable)
    assert fp32["optimizer"] == pytest.approx(fp32_optim_bytes * trainable / data_parallel(r, 2, 1))


def test_bridge_yaml_carries_the_precision_aware_optimizer(tmp_path):
    from vdkit.recipes.bridge.config import bridge_config

    over = ["engine=bridge", "model=llama2_7b", "method=sft", "parallelism.distributed_optimizer=true"]
    opt = bridge_config(make_plan(compose([*over, "train.optimizer_dtype=bf16"])), tmp_path, tmp_path / "ck")["optimizer"]
    bf16 = {"_target_": "torch.bfloat16", "_call_": False}
    assert opt["use_precision_aware_optimizer"] is True and opt["use_distributed_optimizer"] is True
    assert opt["exp_avg_dtype"] == bf16 and opt["exp_avg_sq_dtype"] == bf16
    assert "main_params_dtype" not in opt and "main_grads_dtype" not in opt  # fp32 (and main_grads_dtype is unused)
    opt = bridge_config(make_plan(compose(over)), tmp_path, tmp_path / "ck")["optimizer"]
    assert not ({"use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype"} & set(opt))


@pytest.mark.parametrize("overrides, says", [
    # megatron-core's precision-aware optimizer runs only inside the distributed optimizer
    (["engine=bridge", "method=lora"], "parallelism.distributed_optimizer=true"),
    (["engine=bridge", "method=sft", "parallelism.distributed_optimizer=false"], "parallelism.distributed_optimizer=true"),
])
def test_bf16_optimizer_state_is_refused_at_the_door_where_it_cannot_run(overrides, says):
    with pytest.raises(UserError, match=says):
        make_plan(compose(["model=llama2_7b", "train.optimizer_dtype=bf16", *overrides]))


def test_bf16_optimizer_state_is_refused_on_a_machine_without_a_gpu(monkeypatch):
    from vdkit.launch import local

    monkeypatch.setattr(local, "has_accelerator", lambda: False)
    plan = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=sft", "parallelism.distributed_optimizer=true",
                              "train.optimizer_dtype=bf16"]))
    with pytest.raises(UserError, match="optimizer_dtype=bf16.*no GPU"):
        local.check_host(plan)


def test_every_engine_that_renders_fp8_or_bf16_state_has_its_bytes():
    # an engine whose spec takes train.precision=fp8 / train.optimizer_dtype=bf16 has its own memory.yaml row; any
    # other is planned as it trains (bf16 weights, fp32 state)
    from vdkit.planner.calibration import memory
    from vdkit.recipes import engines

    specs = engines.specs()
    fp8 = {s.name for s in specs if "fp8" in s.precisions}
    bf16 = {s.name for s in specs if "bf16" in s.optimizer_dtypes}
    assert fp8 == set(memory()["fp8_linear_weight_bytes"]) == {"nemo", "bridge"}
    assert bf16 == set(memory()["bf16_optimizer_bytes"]) == {"nemo", "bridge"}


def test_bridge_keeps_its_fp8_presets_bf16_layers():
    # the spec's layers kept in bf16 under FP8 are the render's preset fields (which tests/test_fp8_attention.py holds
    # to Bridge's own bf16_with_fp8_current_scaling_mixed: first_last_layers_bf16, 1 at the start, 1 at the end)
    from vdkit.recipes import engines
    from vdkit.recipes.bridge.config import FP8_PRESET_FIELDS as preset

    r = compose(["model=llama2_7b", "engine=bridge", "train.precision=fp8"])
    assert preset["first_last_layers_bf16"]
    assert engines.get("bridge").spec.fp8_bf16_layers(r) == (preset["num_layers_at_start_in_bf16"],
                                                            preset["num_layers_at_end_in_bf16"]) == (1, 1)
    assert engines.get("nemo").spec.fp8_bf16_layers is None  # NeMo 1.23 runs every layer in FP8
    # megatron-core 0.16.1's own predicate (fp8_utils.is_first_last_bf16_layer: no fp8_model_init, no FP8 autocast)
    # marks the layers the memory model counts on the first and the last pipeline stage
    from megatron.core.fp8_utils import is_first_last_bf16_layer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from vdkit.planner.memory import fp8_bf16_layers

    fields = {k: preset[k] for k in ("first_last_layers_bf16", "num_layers_at_start_in_bf16",
                                     "num_layers_at_end_in_bf16", "fp8", "fp8_recipe")}
    layers = r.model.num_layers
    config = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4, **fields)
    for pp in (1, 2, 4):
        per_stage = layers // pp
        stages = [sum(is_first_last_bf16_layer(config, i) for i in range(st * per_stage, (st + 1) * per_stage))
                  for st in (0, pp - 1)]
        assert [kept for kept, _ in fp8_bf16_layers(r, pp, 1, "none")] == stages


@pytest.mark.parametrize("layout, bf16_kept, working", [
    (["parallelism.pp=1"], 2, False),  # one stage: the first and the last layer keep bf16 inputs
    (["parallelism.pp=2", "cluster.nodes=2"], 1, False),  # the worst stage holds one of them
    # partial recompute (the first 4 layers of the stage rerun): layer 0 keeps its input only and is the working set
    (["parallelism.pp=1", "parallelism.recompute=full", "parallelism.recompute_num_layers=4"], 1, True),
    (["parallelism.pp=1", "parallelism.recompute=full"], 0, True),  # every layer reruns: the working set only
])
def test_bridge_fp8_counts_its_bf16_layers_activations(monkeypatch, layout, bf16_kept, working):
    # Bridge's FP8 preset keeps layer 0 and the last layer in bf16 (megatron-core: no FP8 autocast there), so their
    # linears save bf16 inputs: each such layer kept holds a bf16 layer's bytes in place of an FP8 one's
    from vdkit.planner import memory as M
    from vdkit.planner.activations import layer_bytes

    r = compose(["model=llama2_7b", "engine=bridge", "method=pretrain", "train.precision=fp8", "parallelism.tp=2",
                 "parallelism.distributed_optimizer=true", *layout])
    p = r.parallelism
    got = M.estimate_memory(r, p.tp, p.pp, 1, True, p.recompute or "none", True)
    monkeypatch.setattr(M, "_engine_facts", lambda recipe: (False, "fused", (0, 0)))  # every layer in FP8
    all_fp8 = M.estimate_memory(r, p.tp, p.pp, 1, True, p.recompute or "none", True)
    s, b, m = r.train.seq_length, r.train.micro_batch_size, r.model
    fp8, bf16 = (layer_bytes(m, s, b, p.tp, True, "none", element=2.0, fp8=f) for f in (True, False))
    assert bf16 > fp8
    layers = m.num_layers // p.pp
    dp = data_parallel(r, p.tp, p.pp)
    in_flight = M.layers_in_flight(layers, p.pp, 1, r.train.global_batch_size // dp, 0) / layers
    extra = bf16_kept * (bf16 - fp8) * in_flight + ((bf16 - fp8) if working else 0.0)
    assert (got.activations_gb - all_fp8.activations_gb) * M.GB == pytest.approx(extra)
