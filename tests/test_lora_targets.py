"""LoRA's target modules (method.lora_targets, vdkit.planner.lora_targets): refused at the door in one line, the
engines that can adapt each layer, the parameters and memory each target adds, the names each stack reads."""
from __future__ import annotations

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner import lora_targets as T
from vdkit.planner.arch import trainable_params

ATTENTION = "method.lora_targets=[linear_qkv,linear_proj]"
H70, QKV70, F70 = 8192, 8192 + 2 * 1024, 28672  # Llama 2 70B: hidden, QKV's columns (8 KV groups of 128), FFN


def _one_line(overrides) -> str:
    with pytest.raises(UserError) as err:
        compose(overrides)
    line = str(err.value)
    assert "\n" not in line
    return line


def test_the_default_is_qkv_alone_and_counts_as_before():
    r = compose(["model=llama2_70b", "method=lora"])
    assert list(r.method.lora_targets) == ["linear_qkv"] and T.of(r) == ("linear_qkv",)
    assert trainable_params(r) == 80 * 32 * (H70 + QKV70)  # A (h x r) and B (r x QKV's columns), 80 layers
    assert T.of(compose(["model=llama2_70b", "method=sft", ATTENTION])) == ()  # only LoRA has targets


def test_unknown_or_repeated_names_are_refused_at_the_door():
    line = _one_line(["method=lora", "method.lora_targets=[linear_qkvv]"])
    assert "linear_qkvv" in line and "linear_proj" in line  # what, and the names that exist
    assert "each once" in _one_line(["method=lora", "method.lora_targets=[linear_qkv,linear_qkv]"])
    assert "at least one" in _one_line(["method=lora", "method.lora_targets=[]"])


def test_an_engine_that_cannot_adapt_a_layer_says_so_and_names_those_that_can():
    line = _one_line(["engine=nemo", "model=llama2_7b", "method=lora", ATTENTION])
    assert "engine=nemo" in line and "peft_config.py" in line and "engine=bridge" in line
    a2a = _one_line(["engine=megatron", "model=tiny_llama", "method=lora", "method.lora_a2a=true"])
    assert "method.lora_a2a" in a2a and "engine=bridge" in a2a


def test_each_target_adds_its_adapters_parameters():
    r = compose(["model=llama2_70b", "method=lora", "method.lora_adapter_dim=16",
                 "method.lora_targets=[linear_qkv,linear_proj,linear_fc1,linear_fc2]", "engine=bridge"])
    per_layer = 16 * ((H70 + QKV70) + (H70 + H70) + (H70 + 2 * F70) + (F70 + H70))  # fc1 gated: 2 f columns
    assert trainable_params(r) == 80 * per_layer
    # peft's separate modules (engine.lora_qkv=separate): q, k, v and gate, up each their own A
    m = r.model
    assert T.params_per_layer(m, 16, ("linear_qkv", "linear_fc1"), "separate") == 16 * (
        3 * H70 + H70 + 2 * 1024 + 2 * (H70 + F70))


def test_the_plan_holds_the_projections_adapters_and_their_optimizer_state():
    base = ["model=llama2_70b", "engine=bridge", "method=lora", "cluster.nodes=1", "parallelism.tp=4",
            "parallelism.pp=1", "train.seq_length=4096"]
    from vdkit.planner.plan import make_plan

    qkv, both = make_plan(compose(base)), make_plan(compose([*base, ATTENTION]))
    extra = 80 * 32 * (H70 + H70) / 4  # the projection's adapters on one TP rank
    grew = {k: getattr(both.memory, k) - getattr(qkv.memory, k) for k in ("weights_gb", "optimizer_gb")}
    assert grew["weights_gb"] == pytest.approx(extra * 2 / 1e9, rel=1e-6)  # bf16 adapter weights
    assert grew["optimizer_gb"] > 0 and both.prediction.step_seconds > qkv.prediction.step_seconds


def test_each_stack_reads_its_own_names():
    llama = compose(["model=llama2_7b", "engine=reference", "method=lora",
                     "method.lora_targets=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"])
    assert T.hf_modules(llama) == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    opt = compose(["model=opt_125m", "engine=reference", "method=lora", ATTENTION])
    assert T.hf_modules(opt) == ("q_proj", "k_proj", "v_proj", "out_proj")


def test_a2a_where_it_does_nothing_is_noted_in_the_plan():
    # Bridge 0.3.1 peft/utils.py 544-548 / 633-642: the all-to-all replaces only a row-parallel adapter's scatter under SP
    from vdkit.planner.plan import make_plan

    base = ["engine=bridge", "model=llama2_70b", "method=lora", "method.lora_a2a=true", "parallelism.pp=1"]
    a2a = [n for n in make_plan(compose([*base, ATTENTION, "parallelism.tp=8"])).notes if "lora_a2a" in n]
    assert a2a == []  # TP 8 with SP and the projection's adapter: the all-to-all runs
    for extra, why in ((["parallelism.tp=1", "parallelism.pp=4", ATTENTION], "TP 1"),
                       (["parallelism.tp=8", "parallelism.sequence_parallel=false", ATTENTION], "sequence parallelism is off"),
                       (["parallelism.tp=8"], "no row-parallel adapter")):
        notes = [n for n in make_plan(compose([*base, *extra])).notes if "lora_a2a" in n]
        assert len(notes) == 1 and why in notes[0] and "method.lora_a2a=false" in notes[0], (extra, notes)


def test_each_targets_split_is_megatron_cores_own_layer():
    """The TP split each target's adapter follows is the class megatron-core's layer spec builds for that linear
    (ColumnParallelLinear / RowParallelLinear), not a table typed again."""
    specs = pytest.importorskip("megatron.core.models.gpt.gpt_layer_specs")
    layer = specs.get_gpt_layer_local_spec().submodules
    built = {**vars(layer.self_attention.submodules), **vars(layer.mlp.submodules)}
    assert {n: built[n].__name__ for n in T.TARGETS} == {
        n: ("ColumnParallelLinear" if t.split == "column" else "RowParallelLinear") for n, t in T.TARGETS.items()}
