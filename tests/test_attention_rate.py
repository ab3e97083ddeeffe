"""The attention's own rate per stack (vdkit.planner.attention_rate) and the CP ring priced as exposed
(vdkit.planner.collectives.cp_ring_s)."""
import copy
from types import SimpleNamespace

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner import attention_rate as A
from vdkit.planner import predict as P
from vdkit.planner.collectives import cp_ring_s

PEAK = 989.0  # H100 BF16 dense TFLOP/s (step_time.yaml hardware)


def _ring_recipe(gpus_per_node=8):
    # head dim 128, 8 KV groups: K / V dimension 1024
    model = SimpleNamespace(num_query_groups=8, hidden_size=1024, num_attention_heads=8)
    return SimpleNamespace(model=model, cluster=SimpleNamespace(gpus_per_node=gpus_per_node))


# this GPU's K and V at n = 8192 tokens, CP 2, TP 1, bf16: 2 x 4096 x 1024 x 2 B = 16,777,216 B; at 100 GB/s 167.77 us
HOP = 16_777_216 / 100e9


def test_a_ring_hop_shorter_than_its_steps_kernel_costs_only_its_latency():
    r = _ring_recipe()
    # kernels of 1 ms forward, 2.5 ms backward hide every 168 us hop: left, one latency per hop (1 forward, 2 backward)
    assert cp_ring_s(r, 8192, 1, 2, 1, 0.0, 100.0, 50.0, 1e-6, 2.0, 1e-3, 2.5e-3) == pytest.approx(3e-6)
    assert cp_ring_s(r, 8192, 1, 2, 1, 0.0, 100.0, 50.0, 0.0, 2.0, 1e-3, 2.5e-3) == 0.0


def test_a_ring_hop_longer_than_its_steps_kernel_costs_the_excess():
    r = _ring_recipe()
    # forward: 167.77 - 100 us exposed; backward (K, V then dK, dV, each alone at CP 2) under 250 us: hidden
    assert cp_ring_s(r, 8192, 1, 2, 1, 0.0, 100.0, 50.0, 0.0, 2.0, 1e-4, 2.5e-4) == pytest.approx(HOP - 1e-4)
    # CP 4 (n = 16384: the same chunk), no kernel to hide under: every hop whole - 3 forward, backward 1 + 2 + 2 + 1 chunks
    assert cp_ring_s(r, 16384, 1, 4, 1, 0.0, 100.0, 50.0, 0.0, 2.0) == pytest.approx(9 * HOP)
    # backward middle steps carry K, V and dK, dV: 2 hops' bytes against one kernel (335.5 us vs 300 us)
    assert cp_ring_s(r, 16384, 1, 4, 1, 0.0, 100.0, 50.0, 0.0, 2.0, 1.2e-4, 3e-4) == pytest.approx(
        3 * (HOP - 1.2e-4) + 2 * (2 * HOP - 3e-4))
    # TP x CP beyond a node: every step waits on the fabric's hop (50 GB/s: twice as long)
    wide = cp_ring_s(_ring_recipe(gpus_per_node=2), 16384, 1, 4, 1, 0.0, 100.0, 50.0, 0.0, 2.0)
    assert wide == pytest.approx(18 * HOP)


def _blend(fwd, bwd):
    return 3.5 / (1 / fwd + 2.5 / bwd) / PEAK


def test_the_attention_rate_is_its_stacks_published_kernels():
    """FlashAttention-3 paper, H100 head dim 128: FA2's column 319 / 310 TFLOP/s at 4K (TE 1.x before 1.10), cuDNN's
    518 / 499 (TE 1.10 on); forward + 2.5 x backward FLOPs: 0.316 and 0.510 of the 989 TFLOP/s peak."""
    calib = P.calibration()
    base = ["model=llama2_7b", "engine=bridge", "method=pretrain", "data=synthetic", "train.seq_length=4096"]
    old = A.rate(compose([*base, "engine.transformer_engine=1.4.0"]), calib, PEAK, 4096)
    new = A.rate(compose([*base, "engine.transformer_engine=1.10.0"]), calib, PEAK, 4096)
    assert (old.kernels, new.kernels) == ("flash2", "cudnn9")
    assert old.efficiency == pytest.approx(_blend(319, 310)) == pytest.approx(0.3159, abs=1e-4)
    assert new.efficiency == pytest.approx(_blend(518, 499)) == pytest.approx(0.5099, abs=1e-4)
    # between measured lengths: on a log scale (6K: halfway from 4K to 8K); beyond them: held
    mid = A.rate(compose(base), calib, PEAK, 4096 * 2 ** 0.5)
    assert mid.efficiency == pytest.approx(_blend((518 + 529) / 2, (499 + 518) / 2))
    assert A.rate(compose(base), calib, PEAK, 1 << 20).efficiency == pytest.approx(_blend(539, 516))
    # the engine's image's TE when the run names none (Bridge: TE 2, memory.yaml transformer_engine_major)
    assert A.rate(compose(base), calib, PEAK, 4096).kernels == "cudnn9"


@pytest.mark.parametrize("extra", [["train.precision=fp8", "train.fp8_attention=true"], ["cluster=xe9680_mi300x"],
                                   ["engine=megatron"]])
def test_where_no_rate_is_published_the_gemm_rule_stays(extra):
    r = compose(["model=llama2_7b", "engine=bridge", "method=pretrain", "data=synthetic", *extra])
    assert A.rate(r, P.calibration(), PEAK, 4096) is None


def test_a_two_part_version_is_refused_not_misread():
    r = compose(["engine=bridge", "engine.transformer_engine='1.10'"])
    with pytest.raises(UserError, match="1.10.0"):
        A.te_version(r)


def test_the_step_prices_attention_at_the_stacks_rate_from_step_time_yaml():
    """Hand-computed: Llama 2 7B, 4096 tokens, TP 1 on 8 GPUs, TE 1.4: the attention kernels run
    3.5 x 4 x 32 x 4096 x 4096 x (1 + 128 / 4096) / 2 FLOPs a token; a micro batch of 4096 tokens at 0.316 of 989
    TFLOP/s takes 0.0508 s, x the 8-GPU straggler 1.0142: 0.0515 s."""
    r = compose(["model=llama2_7b", "engine=bridge", "method=pretrain", "data=synthetic", "train.seq_length=4096",
                 "cluster.nodes=1", "engine.transformer_engine=1.4.0"])
    step = P.predict_step(r, 1, 1)
    flops = 3.5 * 4 * 32 * 4096 * 4096 * (1 + 128 / 4096) / 2 * 4096
    seconds = flops * P.straggler(8, P.gpu_hardware(P.calibration(), r.cluster.gpu_type)) / (PEAK * 1e12 * _blend(319, 310))
    assert seconds == pytest.approx(0.0515, abs=1e-4)
    assert step.parts["attn_flops_s"] / step.parts["attn_eff"] == pytest.approx(seconds, rel=1e-6)
    # one home: the rate comes from step_time.yaml attention - halve the published rates there and the term doubles
    calib = copy.deepcopy(P.calibration())
    for k in calib["attention"]["kernels"]["flash2"].values():
        k[:] = [x / 2 for x in k]
    slow = P.predict_step(r, 1, 1, calib=calib)
    assert slow.parts["attn_eff"] == pytest.approx(step.parts["attn_eff"] / 2)
    gemm = step.parts["flops_s"] / P.fitted()["gemm_efficiency_bf16"]
    micro = step.parts["multiplier"]
    assert slow.compute_s / micro - gemm == pytest.approx(2 * (step.compute_s / micro - gemm), rel=1e-6)


def test_an_engine_without_a_named_version_takes_its_images_major():
    """NeMo 1.23's image runs TE 1 (memory.yaml transformer_engine_major): the kernels of TE 1.0 .. 1.9."""
    r = compose(["model=llama2_7b", "method=pretrain"])
    assert (A.te_version(r), A.rate(r, P.calibration(), PEAK, 4096).kernels) == ("1", "flash2")


def test_the_nemo_job_runs_the_attention_kernels_its_plan_prices():
    """engine=nemo's image runs TE 1.2+, which would pick cuDNN's attention on H100; the plan prices TE 1's flash-attn 2
    rate, so the render turns cuDNN's off as NVIDIA's launcher did for that image (NVTE_FUSED_ATTN=0)."""
    from vdkit.planner.plan import make_plan
    from vdkit.recipes import nemo

    plan = make_plan(compose(["engine=nemo", "model=llama2_7b", "method=pretrain", "cluster.nodes=1"]))
    got = A.rate(plan.recipe, P.calibration(), PEAK, 4096)
    assert got is not None and got.kernels == "flash2"
    assert nemo.env(plan)["NVTE_FUSED_ATTN"] == "0"


def test_each_independent_row_prices_attention_on_the_te_its_image_ran():
    """benchmarks/independent_runs.yaml: every row whose attention rate applies (BF16 attention on Hopper) names the
    Transformer Engine its image ran, except those whose image runs the Bridge image's TE 2 (bridge_perf, mlperf51_8b)
    and Oracle's v4.1 GPT3 rows (an early-access image whose TE was not read). The NeMo 24.07 container's rows
    (nemo2407, nemo2412) ran TE 1.8.0.dev0 with cuDNN's attention off (NVTE_FUSED_ATTN: 0): flash-attn 2's rate."""
    import yaml

    from helpers import BENCH, bench_module
    from vdkit.planner.activations import attention_precision

    runs = bench_module("independent_runs")
    calib = P.calibration()
    untagged = set()
    for row in yaml.safe_load((BENCH / "independent_runs.yaml").read_text())["runs"]:
        r = runs._compose(row)
        if attention_precision(r) != "bf16" or r.cluster.gpu_type not in calib["attention"]["gpus"]:
            continue
        if r.engine.transformer_engine is None:
            untagged.add(row["name"] if row["source"].startswith("mlperf41") else row["source"])
        if row["source"] in ("nemo2407", "nemo2412"):
            assert A.te_version(r) == "1.8.0" and A.rate(r, calib, PEAK, 4096).kernels == "flash2", row["name"]
    assert untagged == {"bridge_perf", "mlperf51_8b", "MLPerf GPT3 175B 192 nodes TP4 PP8 VP4 MBS2 (Oracle)",
                        "MLPerf GPT3 175B 384 nodes TP4 PP8 VP4 MBS2 (Oracle)"}
