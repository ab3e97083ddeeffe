"""train.cuda_graphs=layer: per-layer CUDA graphs rendered for Bridge as megatron-core 0.16.1 runs them, refused at the
door where megatron-core or the engine cannot, seen by `vdkit check` after Bridge's own setup, counted in the memory."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan

# MLPerf's graphed layout (NVIDIA v4.1 8 nodes: TP 4 CP 2, one micro batch of 8192 tokens)
MLPERF = ["model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=8", "cluster.max_nodes=8",
          "train.seq_length=8192", "train.precision=fp8", "train.global_batch_size=8", "parallelism.tp=4",
          "parallelism.pp=1", "parallelism.cp=2", "parallelism.distributed_optimizer=true",
          "parallelism.recompute=none"]
SMALL = ["model=llama2_7b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=1",
         "model.megatron_path=/shared/base"]


def test_bridge_renders_megatron_cores_per_layer_graphs_only_when_asked():
    from vdkit.recipes.bridge import env
    from vdkit.recipes.bridge.config import bridge_config
    from vdkit.recipes.bridge.cuda_graphs import GRAPH_ENV

    on, off = (make_plan(compose(SMALL + [f"train.cuda_graphs={v}"])) for v in ("layer", "none"))
    cfg_on, cfg_off = (bridge_config(p, "/runs/r", "/runs/r/checkpoints") for p in (on, off))
    assert (cfg_on["model"]["cuda_graph_impl"], cfg_on["model"]["use_te_rng_tracker"]) == ("transformer_engine", True)
    assert not {"cuda_graph_impl", "use_te_rng_tracker"} & set(cfg_off["model"])
    # a graph replays fixed shapes: unpacked rows padded to seq_length
    assert cfg_on["dataset"]["dataset_kwargs"]["pad_to_max_length"] is True
    assert "pad_to_max_length" not in cfg_off["dataset"]["dataset_kwargs"]
    assert GRAPH_ENV.items() <= env(on).items() and not set(GRAPH_ENV) & set(env(off))


@pytest.mark.parametrize("extra, expect", [
    (["engine=nemo"], "NeMo 1.23's GPT models have no CUDA-graph setting"),
    (["engine=megatron", "model=tiny_llama", "data=dolly"], "never captures or replays CUDA graphs"),
    (["parallelism.recompute=full"], "full recompute"),
    (["parallelism.recompute=full", "parallelism.recompute_num_layers=4"], "full recompute"),
    (["data=dolly", "data.packed=true"], "packed_seq_params"),
    (["cluster=local", "model=tiny_llama"], "no GPUs"),
])
def test_the_door_refuses_what_cannot_graph(extra, expect):
    with pytest.raises(UserError) as e:
        compose([o for o in SMALL if not o.startswith("engine=")] + ["engine=bridge", *extra,
                                                                      "train.cuda_graphs=layer"])
    assert expect in str(e.value)


def test_an_unknown_setting_names_the_ones_there_are():
    with pytest.raises(UserError) as e:
        compose(SMALL + ["train.cuda_graphs=full"])
    assert "train.cuda_graphs=full is not a CUDA-graph setting" in str(e.value)
    assert "train.cuda_graphs=none or train.cuda_graphs=layer" in e.value.fix


def test_the_planner_never_picks_full_recompute_beside_graphs():
    """70B LoRA on one node needs recompute; with per-layer graphs the planner weighs none / selective only."""
    from vdkit.planner.plan import candidate_layouts

    cell = ["model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=1",
            "model.megatron_path=/shared/base", "train.seq_length=4096"]
    eager = candidate_layouts(compose(cell), None, None, None, None, None, False)
    r = compose(cell + ["train.cuda_graphs=layer"])
    graphed = candidate_layouts(r, None, None, None, None, None, False)
    assert any(c.recompute == "full" for c in eager)
    assert graphed and {c.recompute for c in graphed} <= {"none", "selective"}


def test_memory_counts_each_graphed_layers_static_input_and_mask():
    """megatron-core's TE capture keeps, per layer (PP 1: one micro batch, no reuse), a bf16 hidden_states input of
    seq/CP/TP x b x h and a bool b x seq/CP x seq causal mask; plus one shared gradient buffer and the RoPE table."""
    off, on = (make_plan(compose(MLPERF + [f"train.cuda_graphs={v}"])) for v in ("none", "layer"))
    L, h, seq, cp, tp = 80, 8192, 8192, 2, 4
    s = seq / cp
    per_layer = 2 * (s / tp) * h + s * seq  # 16.8 MB + 33.6 MB
    extra = L * per_layer + 2 * (s / tp) * h + 4 * s * (h // 64)
    assert (on.memory.activations_gb - off.memory.activations_gb) * 1e9 == pytest.approx(extra)
    assert any("per-layer CUDA graphs" in n and f"{extra / 1e9:.2f} GB" in n and "workload dependent" in n
               for n in on.notes)
    assert not any("CUDA graphs" in n for n in off.notes)


def test_vdkit_check_reads_what_bridges_setup_leaves(tmp_path):
    """The rendered bridge.yaml through the job's loader and Bridge's runtime_config_update: megatron-core reads
    transformer_engine with the TE RNG tracker on; the provider field off (Bridge would assert at model build) is a
    defect in one line."""
    from vdkit.cli import main
    from vdkit.recipes.bridge import cuda_graphs, runcheck
    from vdkit.run.jobcheck import DEFECT, Report
    from vdkit.run.rundir import load_plan

    assert main(["render", *SMALL, "train.cuda_graphs=layer", "--out", str(tmp_path), "--no-check-mounts"]) == 0
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    runcheck._import_bridge()
    plan = load_plan(run_dir)
    cfg = runcheck.load(run_dir)
    planted = copy.deepcopy(cfg)
    asked = copy.deepcopy(cfg)
    runcheck.validate(cfg, plan)
    rep = Report(run_dir)
    assert cuda_graphs.check(asked, cfg, plan, rep)
    assert "cuda_graph_impl=transformer_engine" in rep.lines[-1][1] and "the whole layer" in rep.lines[-1][1]
    planted.model.use_te_rng_tracker = False
    runcheck.validate(planted, plan)
    bad = Report(run_dir)
    assert not cuda_graphs.check(planted, planted, plan, bad)
    assert bad.lines[-1][0] == DEFECT and "gpt_provider.py:213" in bad.lines[-1][1]
    # graphs switched on by hand in an eager render: its environment lacks NCCL_GRAPH_REGISTER=0
    eager = dataclasses.replace(plan, recipe=compose(SMALL))
    edited = Report(run_dir)
    assert not cuda_graphs.check(asked, cfg, eager, edited)
    assert "rendered eager" in edited.lines[-1][1] and "NCCL_GRAPH_REGISTER=0" in edited.lines[-1][1]
