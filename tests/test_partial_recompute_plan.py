"""The planner recomputes only what memory needs: full recompute of the fewest layers per stage
(megatron's block method, ``recompute_num_layers``) when keeping every layer does not leave the headroom;
and NVIDIA's published layouts that ran without recompute plan without it."""
import pytest

from vdkit.composition.config import compose
from vdkit.planner.calibration import HEADROOM
from vdkit.planner.memory import estimate_memory
from vdkit.planner.plan import make_plan

# NVIDIA's Megatron-Bridge preset for Llama 3 8B (recipes/llama/llama3.py llama3_8b_pretrain_config:
# TP1 PP1 CP2, no recompute, bf16) on one XE9680, GBS 128
LLAMA3_8B = ["model=llama3_1_8b", "model.rope_scaling=null", "engine=bridge", "method=pretrain", "data=synthetic",
             "cluster.nodes=1", "train.seq_length=8192", "train.global_batch_size=128", "parallelism.tp=1",
             "parallelism.pp=1", "parallelism.cp=2"]
# NVIDIA's 70B pretraining layout (64 GPUs, TP4 PP4 VP5 CP2, FP8; NeMo 24.07 performance summary), no recompute
LLAMA3_70B = ["model=llama3_1_70b", "model.rope_scaling=null", "engine=bridge", "method=pretrain", "data=synthetic",
              "cluster.nodes=8", "cluster.max_nodes=8", "train.seq_length=8192", "train.precision=fp8",
              "train.global_batch_size=128", "parallelism.tp=4", "parallelism.pp=4", "parallelism.vp=5",
              "parallelism.cp=2"]


def _memory(r, n):
    p = r.parallelism
    return estimate_memory(r.with_parallelism(recompute_num_layers=n), p.tp, p.pp, p.vp, bool(p.sequence_parallel),
                           "full", bool(p.distributed_optimizer)).total_gb


def test_recomputes_only_the_layers_memory_needs():
    plan = make_plan(compose(LLAMA3_8B))
    r = plan.recipe
    n, layers = r.parallelism.recompute_num_layers, r.model.num_layers
    assert r.parallelism.recompute == "full" and n is not None and 0 < n < layers
    usable = r.cluster.gpu_memory_gb * (1 - HEADROOM)
    assert _memory(r, n) <= usable < _memory(r, n - 1) if n > 1 else _memory(r, n) <= usable
    assert plan.memory.total_gb == _memory(r, n)


def test_partial_recompute_is_faster_than_recomputing_every_layer():
    partial = make_plan(compose(LLAMA3_8B))
    every = make_plan(compose(LLAMA3_8B + ["parallelism.recompute=full"]))
    assert every.recipe.parallelism.recompute_num_layers is None
    assert partial.prediction.step.total_s < every.prediction.step.total_s


def test_nvidia_70b_layout_plans_without_recompute():
    assert make_plan(compose(LLAMA3_70B)).recipe.parallelism.recompute == "none"


def _preset_note(plan):
    return [n for n in plan.notes if "NVIDIA's" in n and "llama3.py" in n]


def test_nvidia_preset_is_scored_beside_the_planners_choice():
    # 8B on 8 GPUs, layout left to the planner: NVIDIA's TP1 PP1 CP2 is weighed and the departure explained
    auto = [o for o in LLAMA3_8B if not o.startswith(("parallelism.tp", "parallelism.pp"))]
    plan = make_plan(compose(auto))
    (note,) = _preset_note(plan)
    assert "TP 1 x PP 1 x CP 2" in note and ("GB per GPU" in note or "slower" in note)


def test_the_preset_itself_is_named_as_such():
    (note,) = _preset_note(make_plan(compose(LLAMA3_70B)))
    assert note.startswith("this is NVIDIA's published layout")


def test_interleaved_layouts_recompute_only_the_layers_per_chunk_memory_needs():
    """VP > 1 (megatron-core applies recompute_num_layers to each model chunk: tests/test_activation_memory.py
    measures it): NVIDIA's 70B TP4 PP4 VP5 in bf16 without CP on 64 GPUs keeps 2 of each chunk's 4 layers
    instead of recomputing all 80 (the planner skipped partial recompute with VP > 1), and it is faster."""
    base = [o for o in LLAMA3_70B if not o.startswith(("train.precision=", "parallelism.cp="))]
    plan = make_plan(compose(base))
    p = plan.recipe.parallelism
    assert (p.vp, p.recompute, p.recompute_num_layers) == (5, "full", 2) and plan.feasible
    usable = plan.recipe.cluster.gpu_memory_gb * (1 - HEADROOM)
    assert plan.memory.total_gb <= usable
    every = make_plan(compose(base + ["parallelism.recompute=full"]))
    assert every.recipe.parallelism.recompute_num_layers is None
    assert plan.prediction.step_seconds < every.prediction.step_seconds


def _nvidia_row(name):
    from vdkit.planner.calibration import load

    return next(r for r in load("step_time")["anchors"]["runs"] if r["name"] == name)["overrides"]


def test_nvidia_70b_sft_fp8_plans_without_recompute_with_its_bf16_optimizer_state():
    # NeMo-Framework-Launcher examples/peft/llama/h100/70b_2node.sh (TP4 PP4 VP20, no recompute) runs
    # conf/peft/llama/sft.yaml's distributed Adam with bf16 state and gradient buffer: 2 + 4 bytes per parameter as
    # the kit's NeMo renders it (DP 1: nothing to shard them over) where fp32 state is 4 + 10 and needs recompute
    row = _nvidia_row("70B SFT FP8 16 GPUs")
    assert "train.optimizer_dtype=bf16" in row
    plan = make_plan(compose(row))
    assert plan.recipe.parallelism.recompute == "none" and plan.dp == 1
    assert plan.memory.total_gb <= plan.recipe.cluster.gpu_memory_gb * (1 - HEADROOM)
    fp32 = make_plan(compose([o for o in row if o != "train.optimizer_dtype=bf16"]))
    assert fp32.recipe.parallelism.recompute == "full"
    assert plan.memory.gradients_gb == fp32.memory.gradients_gb / 2
    assert plan.memory.optimizer_gb == pytest.approx(fp32.memory.optimizer_gb * 4 / 10)  # bf16 m + v; remainder + fp32 m + v


def test_bf16_optimizer_state_is_refused_where_no_engine_renders_it():
    from vdkit.errors import UserError

    base = ["model=llama2_7b", "train.optimizer_dtype=bf16"]
    with pytest.raises(UserError, match="optimizer state dtype"):
        compose(base + ["engine=megatron", "method=sft"])
    with pytest.raises(UserError, match="optimizer state dtype"):
        compose(base + ["method=sft", "train.optimizer_dtype=fp16"])
    with pytest.raises(UserError, match="distributed_optimizer"):
        make_plan(compose(base + ["method=lora"]))
