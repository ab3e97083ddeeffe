"""The inter-node fabric the time model assumes (vdkit.planner.interconnect): transport, adapters and the
site's measured bandwidth change the communication term, and the plan says which fabric it assumed;
and the range a fused-stack plan prints says which published rows (fine-tuning or pretraining) it comes from."""
from __future__ import annotations

import pytest

from vdkit.commands.plan import describe
from vdkit.composition.config import compose
from vdkit.planner.interconnect import interconnect
from vdkit.planner.plan import make_plan

TWO_NODES = ["engine=nemo", "model=llama2_7b", "method=sft", "cluster.nodes=2", "parallelism.tp=1", "parallelism.pp=1"]
TCP = ["cluster.transport=tcp", "cluster.ib_hcas=[]", '+cluster.env.NCCL_IB_DISABLE="1"']


def comm(*extra) -> float:
    return make_plan(compose([*TWO_NODES, *extra])).prediction.step.communication_s


def ring_gb_s(node_gb_s: float) -> float:
    """The DP ring's bus bandwidth across nodes: the node's fabric, capped by the GPU's in-node ring (the
    H100's measured 370 GB/s, conf/calibration/hf_step_time.yaml)."""
    from vdkit.planner.predict import calibration, gpu_hardware

    return min(node_gb_s, gpu_hardware(calibration(), "H100-SXM5-80GB")["nvlink_gb_s"])


def test_a_tcp_site_pays_several_times_the_eight_adapter_communication_and_says_tcp():
    ib = comm()
    assert comm(*TCP) > 5 * ib
    text = describe(make_plan(compose([*TWO_NODES, *TCP])))
    assert "  fabric      TCP: 12.5 GB/s per node" in text and "assumed" in text


def test_fewer_adapters_and_roce_cost_more_and_the_measured_figure_wins():
    eight = comm()
    four = comm("cluster.ib_hcas=[mlx5_0,mlx5_3,mlx5_4,mlx5_5]")
    assert four == pytest.approx(ring_gb_s(400) / ring_gb_s(200) * eight, rel=0.05) and four > 1.5 * eight
    roce = comm("cluster.transport=roce")
    assert eight < roce < 1.2 * eight  # Thor 2's ~45 usable of 50 GB/s per adapter
    # a site's measured all_gather_perf figure (cluster.inter_node_gb_s) replaces the adapters' datasheet rate
    assert comm("cluster.inter_node_gb_s=100") == pytest.approx(ring_gb_s(400) / 100 * eight, rel=0.05)
    f = interconnect(compose([*TWO_NODES, "cluster.inter_node_gb_s=100"]).cluster)
    assert (f.source, f.node_gb_s) == ("cluster", 100.0)


def test_one_node_crosses_no_fabric():
    plan = make_plan(compose(["engine=nemo", "model=llama2_7b", "method=lora"]))
    assert "fabric" not in describe(plan)
    tcp = make_plan(compose(["engine=nemo", "model=llama2_7b", "method=lora", *TCP]))
    assert tcp.prediction.step_seconds == pytest.approx(plan.prediction.step_seconds)


def test_the_fused_range_says_whether_it_comes_from_fine_tuning_or_pretraining_rows():
    lora = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=lora"])).prediction
    pre = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=pretrain", "data=synthetic"])).prediction
    assert "fine-tuning rows" in lora.interval_source and "unpacked" in lora.interval_source
    assert "pretraining rows" in pre.interval_source
    # each names its own rows first; both pool NVIDIA's 16 fused rows (tests/test_ranges.py), Table 4 sets neither
    assert lora.interval_source.index("fine-tuning rows") < lora.interval_source.index("pretraining rows")
    assert pre.interval_source.index("pretraining rows") < pre.interval_source.index("fine-tuning rows")
    width = lambda p: p.interval_s[1] / p.interval_s[0]  # noqa: E731
    assert width(lora) == pytest.approx(width(pre)) and width(pre) < 1.6


def test_the_dp_reduction_across_nodes_runs_at_the_nodes_fabric_bandwidth():
    # NCCL runs one ring per channel, each crossing between nodes on its own adapter: the bus bandwidth is all
    # eight adapters' 400 GB/s (capped by the in-node ring's measured 370), not one adapter's 50 GB/s per GPU
    from vdkit.planner.arch import param_counts

    plan = make_plan(compose(TWO_NODES))
    grads = 4.0 * param_counts(plan.recipe.model).total  # fp32 main gradients, TP 1 x PP 1
    ring = 2 * 15 / 16 * grads / (ring_gb_s(400) * 1e9)
    assert plan.prediction.step.parts["data_parallel_s"] == pytest.approx(ring, rel=0.02)
