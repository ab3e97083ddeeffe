"""engine=megatron's step time prices the local layers it builds (vdkit.planner.local_traffic, issue 35).

The hand count of a local-spec layer's HBM traffic (every tensor each op reads and writes, forward, backward and
recomputed) equals, to the byte, a live count of the bf16 layer megatron-core 0.16.1 runs here (a dispatch mode over
every ATen op, vdkit.recipes.megatron.traffic), for GQA and plain attention, every recompute mode and frozen weights;
the forward writes at least what it saves for backward (the saved-tensor count of vdkit.recipes.megatron.activations);
and a megatron plan's step at s = 4096 carries that traffic, its s x s part equal to the count from the shapes.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import local_layer_config

from vdkit.composition.config import compose
from vdkit.planner import predict as P
from vdkit.planner.local_traffic import layer_traffic, local_step, row_length

# (seq, micro batch, hidden, heads, query groups, ffn): GQA with 2 groups, plain attention, one group (MQA)
SHAPES = {"gqa": (24, 3, 48, 6, 2, 112), "plain": (32, 1, 64, 4, 4, 96), "mqa": (16, 2, 64, 8, 1, 80)}


def _config(shape, mode):
    return local_layer_config(SHAPES[shape], mode)


def _model(shape):
    _, _, h, a, g, f = SHAPES[shape]
    return SimpleNamespace(hidden_size=h, ffn_hidden_size=f, num_attention_heads=a, num_query_groups=g)



@pytest.mark.parametrize("shape,mode,frozen", [("gqa", "none", False), ("gqa", "selective", False),
                                               ("plain", "selective", False), ("plain", "full", False),
                                               ("mqa", "none", False), ("gqa", "selective", True)])
def test_hand_count_equals_the_live_count(one_rank, shape, mode, frozen):
    from vdkit.recipes.megatron.traffic import layer_traffic as live

    s, b = SHAPES[shape][:2]
    measured = sum(live(_config(shape, mode), s, b, frozen=frozen).values())
    want = layer_traffic(_model(shape), s, b, 1, False, mode, frozen)
    # selective: autograd copies the checkpoint's input gradients only when their layout or a live reference asks
    assert want.total - want.autograd_copies <= measured <= want.total
    assert want.autograd_copies == 0 or mode == "selective"


def test_forward_writes_cover_what_it_keeps(one_rank):
    """What the forward keeps for backward (saved-tensor hooks) it wrote, or was handed (the layer's input)."""
    from vdkit.recipes.megatron.activations import block_bytes
    from vdkit.recipes.megatron.traffic import layer_traffic as live

    s, b, h = SHAPES["gqa"][:3]
    cfg = _config("gqa", "none")
    written = sum(live(cfg, s, b, forward_writes=True).values())
    kept = block_bytes(cfg, s, b)[0]
    assert kept <= written + s * b * h * 2
    assert kept > 0.25 * written  # the same tensors, not a vacuous bound
    assert layer_traffic(_model("gqa"), s, b).forward > written  # and the forward reads too


def _packed(seq, **extra):
    keys = ["engine=megatron", "model=llama2_7b", "method=sft", "data.packed=true", f"train.seq_length={seq}"]
    return compose(keys + [f"{k}={v}" for k, v in extra.items()])


def test_megatron_step_at_4096_carries_the_score_traffic(monkeypatch):
    r = _packed(4096)
    tp, pp, rc = 1, 2, "selective"
    step = P.predict_step(r, tp, pp, 1, rc, True)
    monkeypatch.setattr(P, "local_step", lambda *a, **k: None)
    without = P.predict_step(r, tp, pp, 1, rc, True)
    m, s, b = r.model, 4096, 1
    layers, micro = m.num_layers // pp, 128 // (b * 8 // (tp * pp))
    # the s x s scores per layer from the module's shapes: forward 32 S, backward 40 S, recomputed forward 32 S,
    # S = b x heads x s^2 elements; the causal mask built twice (17 s^2 each) and read three times
    scores = layers * (104 * b * m.num_attention_heads * s * s + 37 * s * s)
    hw = P.gpu_hardware(P.calibration(), r.cluster.gpu_type)
    slow = step.parts["straggler"]
    assert step.parts["local_scores_gb_per_micro_batch"] * 1e9 == pytest.approx(scores, rel=1e-12)
    assert step.parts["local_traffic_s"] == pytest.approx(
        micro * slow * layers * layer_traffic(m, s, b, tp, False, rc).total / (hw["hbm_gb_s"] * 1e9), rel=1e-12)
    added = step.total_s - without.total_s
    assert added >= (micro + pp - 1) * slow * scores / (hw["hbm_gb_s"] * 1e9)  # the bubble repeats it too
    assert step.parts["local_attention_flops_s"] > 0  # the whole square, 4 passes: more than the compute term's 3
    assert added / step.total_s > 0.25  # a quarter of the step or more: the old plan was far too fast


def test_fused_engines_get_no_local_term():
    r = compose(["engine=nemo", "model=llama2_7b", "method=sft", "data.packed=true", "train.seq_length=4096"])
    assert local_step(r, 1, 32, "selective", 0.0, 0.0) is None
    assert "local_row" not in P.predict_step(r, 2, 1, 1, "selective", True).parts


def test_an_unpacked_row_is_padded_over_the_global_batch():
    """engine=megatron pads every micro batch of a step to its longest row (recipes/megatron/data.py step_length:
    its spec's pads_rows_to), so its local layers compute on the expected longest of GBS rows, not the average."""
    from vdkit.planner.calibration import load
    from vdkit.planner.tokens import lognormal_longest

    r = compose(["engine=megatron", "model=llama2_7b", "method=sft", "train.seq_length=4096"])
    d = load("hf_step_time")["data_defaults"]
    mean = float(d["datasets"]["dolly"]["tokens_per_row"])
    assert row_length(r) == pytest.approx(lognormal_longest(mean, float(d["length_sigma"]), 128, 4096))
    assert row_length(_packed(2048)) == 2048.0



def test_unset_sequence_parallelism_is_priced_as_the_plan_resolves_it():
    """parallelism.sequence_parallel unset means on at TP > 1 (vdkit.planner.layout.effective_sp), also while the
    layout search prices TP 2: the local layers' traffic is then sequence-parallel's, not the unsplit one's."""
    base = ["engine=megatron", "model=llama2_7b", "method=sft", "data.packed=true", "train.seq_length=4096"]
    unset = local_step(compose(base), 2, 16, "none", 0.0, 0.0)
    on = local_step(compose([*base, "parallelism.sequence_parallel=true"]), 2, 16, "none", 0.0, 0.0)
    off = local_step(compose([*base, "parallelism.sequence_parallel=false"]), 2, 16, "none", 0.0, 0.0)
    assert unset == on and on != off
