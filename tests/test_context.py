"""vdkit.planner.context and the settings it governs: sequence past the trained maximum, RoPE scaling per engine,
context parallelism per engine, and that every setting reaches the prediction (none silently ignored)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan

BRIDGE = ["engine=bridge", "model.megatron_path=/models/base"]


def _plan(*overrides):
    return make_plan(compose(list(overrides)))


def test_seq_past_trained_max_plans_with_a_note_naming_rope_and_memory():
    plan = _plan("model=llama2_70b", "method=lora", "train.seq_length=8192", "cluster.nodes=2")
    note = next(n for n in plan.notes if "trained 4096" in n)
    assert "RoPE" in note and "rope_type:linear,factor:2" in note and "activations" in note
    # the memory model counts the longer rows
    short = _plan("model=llama2_70b", "method=lora", "train.seq_length=4096", "cluster.nodes=2",
                  "parallelism.tp=4", "parallelism.pp=1", "parallelism.recompute=none")
    long = _plan("model=llama2_70b", "method=lora", "train.seq_length=8192", "cluster.nodes=2",
                 "parallelism.tp=4", "parallelism.pp=1", "parallelism.recompute=none")
    # less what is not per token: the bf16 casts of NeMo's fp32 PEFT weights TE saves, one per layer (PP 1)
    from vdkit.planner.memory import saved_cast_bytes, stage_params

    casts = saved_cast_bytes(short.recipe, "bf16") * stage_params(short.recipe, 4, 1, 0)[1] / 1e9
    assert long.memory.activations_gb - casts == pytest.approx(2 * (short.memory.activations_gb - casts), rel=0.01)


def test_learned_positions_are_refused_past_their_table():
    with pytest.raises(UserError, match="learned positions"):
        compose(["model=opt_125m", "engine=reference", "train.seq_length=4096"])


@pytest.mark.parametrize("engine,model,ok", [
    ("megatron", "llama3_1_8b", True), ("bridge", "llama3_1_8b", True), ("nemo", "llama3_1_8b", False),
    ("nemo", "llama2_7b", True)])
def test_rope_scaling_per_engine(engine, model, ok):
    overrides = [f"model={model}", f"engine={engine}", "method=lora"] + (BRIDGE[1:] if engine == "bridge" else [])
    if ok:
        compose(overrides)
    else:
        with pytest.raises(UserError, match="rope_scaling type llama3.*engine=nemo"):
            compose(overrides)


def test_nemo_renders_linear_position_interpolation():
    from vdkit.recipes.nemo.config import build_config

    plan = _plan("model=llama2_7b", "method=lora", "train.seq_length=8192",
                 "model.rope_scaling={rope_type:linear,factor:2.0}")
    assert build_config(plan, "/run")["model"]["seq_len_interpolation_factor"] == 2.0


def test_megatron_builds_llama3_rope_as_transformers_does():
    """The megatron engine's GPTModel arguments give Llama 3.1's inverse frequencies (transformers' llama3)."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from vdkit.recipes.megatron.model import rope_keys

    m = compose(["model=llama3_1_8b", "engine=megatron"]).model
    head = m.hidden_size // m.num_attention_heads
    ours = RotaryEmbedding(kv_channels=head, rotary_percent=1.0, rotary_base=int(m.rope_base),
                           use_cpu_initialization=True, **rope_keys(m)).inv_freq
    cfg = LlamaConfig(hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads, rope_theta=m.rope_base,
                      rope_scaling=dict(m.rope_scaling), max_position_embeddings=m.max_position_embeddings)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    assert torch.allclose(ours.float(), theirs.float(), rtol=1e-5)
    plain = RotaryEmbedding(kv_channels=head, rotary_percent=1.0, rotary_base=int(m.rope_base),
                            use_cpu_initialization=True).inv_freq
    assert not torch.allclose(ours.float(), plain.float(), rtol=1e-3)  # the scaling is really applied


@pytest.mark.parametrize("engine,why", [("megatron", "DotProductAttention asserts context_parallel_size == 1"),
                                        ("reference", "no context parallelism")])
def test_cp_is_refused_where_the_engine_cannot(engine, why):
    with pytest.raises(UserError, match=why):
        compose(["model=llama2_7b", f"engine={engine}", "parallelism.cp=2", "train.seq_length=4096"])


def test_cp_is_refused_on_this_cpu_and_for_odd_sequences():
    with pytest.raises(UserError, match="Transformer Engine's attention"):
        compose(["model=tiny_llama", "engine=bridge", "cluster=local", "parallelism.cp=2", "method=pretrain",
                 "data=synthetic"])
    with pytest.raises(UserError, match=r"does not divide by 2 x CP = 8 \(parallelism.cp=4\)"):  # was '2 x parallelism.cp=8'
        compose(["model=llama2_7b", *BRIDGE, "parallelism.cp=4", "train.seq_length=4100"])


def test_cp_divides_the_world_and_the_activations():
    pins = ("parallelism.tp=8", "parallelism.pp=1", "parallelism.recompute=none", "data.packed=true")
    one = _plan("model=llama2_70b", "method=lora", *BRIDGE, "cluster.nodes=2", "train.seq_length=8192", *pins)
    two = _plan("model=llama2_70b", "method=lora", *BRIDGE, "cluster.nodes=2", "train.seq_length=8192", *pins,
                "parallelism.cp=2")
    assert (one.dp, two.dp) == (2, 1) and two.grad_accum == 2 * one.grad_accum
    assert two.memory.activations_gb == pytest.approx(one.memory.activations_gb / 2, rel=0.01)
    assert two.prediction.step.parts["context_parallel_s"] > 0 == one.prediction.step.parts["context_parallel_s"]
    with pytest.raises(UserError, match="TP x PP x CP must divide"):
        _plan("model=llama2_70b", "method=lora", *BRIDGE, "cluster.nodes=2", "parallelism.tp=4",
              "parallelism.pp=1", "parallelism.cp=3", "train.seq_length=8190")


def test_cp_renders_for_bridge_and_nemo_with_packing_alignment():
    from vdkit.recipes.bridge.config import _dataset, _model
    from vdkit.recipes.nemo.config import build_config

    plan = _plan("model=llama2_70b", "method=lora", *BRIDGE, "cluster.nodes=2", "train.seq_length=8192",
                 "parallelism.cp=2", "data.packed=true")
    assert _model(plan)["context_parallel_size"] == 2
    assert _dataset(plan, "/run")["packed_sequence_specs"]["pad_seq_to_mult"] == 4
    nemo = _plan("model=llama2_70b", "method=lora", "cluster.nodes=2", "train.seq_length=8192", "parallelism.cp=2")
    assert build_config(nemo, "/run")["model"]["context_parallel_size"] == 2


# ---------------------------------------------------------------- no accepted setting ignored by the prediction
BASE = ["model=llama2_7b", "method=sft", "cluster.nodes=2", *BRIDGE, "train.seq_length=8192", "data.packed=true",
        "parallelism.tp=2", "parallelism.pp=2", "parallelism.recompute=full"]
SETTINGS = {  # setting -> an override that must change the predicted step time
    "parallelism.cp": "parallelism.cp=2",
    "parallelism.recompute_num_layers": "parallelism.recompute_num_layers=4",
    "train.seq_length": "train.seq_length=4096",
    "train.precision": "train.precision=fp8",
    "cluster.gpu_type (MI300X)": "cluster=xe9680_mi300x",
    "model.rope_scaling (compute unchanged, refused nowhere)": None,
}


@pytest.mark.parametrize("name", [k for k, v in SETTINGS.items() if v])
def test_every_setting_reaches_the_prediction(name):
    extra = SETTINGS[name]
    if name.startswith("cluster.gpu_type"):
        extra = [extra, "engine.rocm_image=/shared/rocm.sqsh"]
    else:
        extra = [extra]
    base = _plan(*BASE).prediction.step_seconds
    other = _plan(*BASE, *extra).prediction.step_seconds
    assert other != pytest.approx(base, rel=1e-3), name


def test_fp8_on_engines_without_fp8_is_refused_not_ignored():
    for engine in ("reference", "megatron"):  # the door reads each engine's spec (precisions)
        with pytest.raises(UserError, match=f"train.precision=fp8: engine={engine} has no such precision .*"
                                            "use engine=nemo or engine=bridge"):
            compose(["model=tiny_llama", f"engine={engine}", "train.precision=fp8"])


def test_transformers_engine_counts_the_configured_rows_and_attention():
    """Pretraining rows are full-length; eager attention pays its score matrix, sdpa does not."""
    from vdkit.planner.tokens import micro_batch_tokens

    r = compose(["model=tiny_llama", "engine=reference", "method=pretrain", "data=synthetic", "train.seq_length=512"])
    assert micro_batch_tokens(r).padded_row == 512
    # MBS 1: at MBS 8 eager's score matrices (6 bytes x 8 x 32 heads x 8192^2 a layer, the one being recomputed
    # included) do not fit the MI300X, and an infeasible plan predicts nothing
    flash = _plan("model=llama3_1_8b", "engine=reference", "parallelism.sharding=zero3", "cluster=xe9680_mi300x",
                  "train.seq_length=8192", "data=pubmedqa_blog", "train.micro_batch_size=1")
    eager = _plan("model=llama3_1_8b", "engine=reference", "parallelism.sharding=zero3", "cluster=xe9680_mi300x",
                  "train.seq_length=8192", "data=pubmedqa_blog", "train.micro_batch_size=1", "engine.attention=eager")
    assert eager.feasible and eager.prediction.step_seconds > flash.prediction.step_seconds


def test_prediction_prints_its_range_and_basis():
    out = subprocess.run([sys.executable, "-m", "vdkit", "plan", "model=llama2_7b", "method=lora"],
                         capture_output=True, text=True, timeout=120).stdout
    assert "  range       " in out and "leave-one-out" in out
    assert "basis       physics: " in out and "fitted: " in out and "guide_stack_gb_s" in out
    plan = _plan("model=llama2_7b", "method=lora")
    lo, hi = plan.prediction.interval_s
    assert lo < plan.prediction.step_seconds < hi


def test_megatron_cores_local_attention_refuses_context_parallelism():
    """Why CP cannot run on this CPU (or in the megatron engine): the attention megatron-core builds
    without Transformer Engine asserts CP == 1 when it is constructed."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, context_parallel_size=2,
                            use_cpu_initialization=True)
    with pytest.raises(AssertionError, match="only supported by TEDotProductAttention"):
        DotProductAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


DONE_WHEN = {  # issue 26's three jobs: each plans, renders with a range, and passes `vdkit check`
    "70b-lora-seq8192-cp2-2nodes": ["model=llama2_70b", "method=lora", "train.seq_length=8192", "parallelism.cp=2",
                                    "cluster.nodes=2", "engine=bridge", "model.megatron_path=/models/llama2-70b-bridge",
                                    "data.packed=true"],
    "llama31-8b-pretrain-cp2-bridge": ["model=llama3_1_8b", "method=pretrain", "engine=bridge", "parallelism.cp=2",
                                       "train.seq_length=8192", "data=synthetic",
                                       "data.tokenizer_model=/shared/models/Llama-3.1-8B"],
    "70b-lora-mi300x-megatron": ["model=llama3_1_70b", "method=lora", "engine=megatron", "cluster=xe9680_mi300x"],
}


def test_the_issues_three_jobs_render_with_a_range_and_pass_vdkit_check(tmp_path):
    pytest.importorskip("megatron.core")  # (Bridge itself loads behind the kit's CPU shim inside `vdkit check`)
    dirs = []
    for name, overrides in DONE_WHEN.items():
        proc = subprocess.run([sys.executable, "-m", "vdkit", "render", *overrides, "--no-check-mounts",
                               "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "(range " in proc.stderr and "s/step)" in proc.stderr, proc.stderr
        dirs.append(proc.stdout.strip().splitlines()[-1])
    proc = subprocess.run([sys.executable, "-m", "vdkit", "check", *dirs], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.stdout.count("checked ") >= 6 and "defect" not in proc.stdout
