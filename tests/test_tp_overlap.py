"""TP communication overlap (vdkit.planner.tp_overlap): the step-time model prices what the rendered job does.

Bridge renders Transformer Engine's userbuffers overlap (TP >= 2 with sequence parallelism, in the container);
NeMo's rendered jobs do not. The figures below are computed by hand from the collective and GEMM shapes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from vdkit.composition.config import compose
from vdkit.planner import predict as P
from vdkit.recipes import engines

BRIDGE_70B = ["model=llama2_70b", "engine=bridge", "method=pretrain", "data=synthetic", "cluster.nodes=2"]


def _all_reduce_s(r, tp: int) -> float:
    """One TP all-reduce of a micro batch's activations, as the unoverlapped model prices it (by hand)."""
    calib = P.calibration()
    hw = P.gpu_hardware(calib, r.cluster.gpu_type)
    n = r.train.micro_batch_size * P.tokens_per_sample(r, calib)
    act = n * r.model.hidden_size * float(calib["bytes"]["activation"])
    return 2 * (tp - 1) / tp * act / (hw["nvlink_gb_s"] * 1e9) + hw["collective_latency_us"] * 1e-6


def _micro(r, tp: int, pp: int) -> int:
    dp = r.world_size // (tp * pp)
    return r.train.global_batch_size // (r.train.micro_batch_size * dp)


def _gemm_s(r, tp: int) -> dict:
    """One pass of each of a layer's GEMMs on one GPU at the fitted efficiency (the straggler included), by hand."""
    calib = P.calibration()
    hw = P.gpu_hardware(calib, r.cluster.gpu_type)
    n = r.train.micro_batch_size * P.tokens_per_sample(r, calib)
    rate = hw["peak_tflops_bf16"] * 1e12 * P.fitted(calib)["gemm_efficiency_bf16"] / P.straggler(r.world_size, hw)
    h, f = r.model.hidden_size, r.model.ffn_hidden_size
    kv = r.model.num_query_groups * (h // r.model.num_attention_heads)
    return {"qkv": 2 * n * h * (h + 2 * kv) / tp / rate, "proj": 2 * n * h * h / tp / rate,
            "fc1": 2 * n * h * 2 * f / tp / rate, "fc2": 2 * n * f * h / tp / rate}


LENT = 16 / (132 - 16)  # a pipeline / bulk kernel's 16 SMs of the H100's 132: its GEMM takes 132 / 116 as long


def test_bridge_tp4_sequence_parallel_exposes_the_pipelined_last_chunk_and_the_lent_sms():
    # 70B at TP 4: every GEMM outlasts the collective beside it, so of a layer's 4 all-reduces (8 AG / RS of
    # half an all-reduce each) only the two forward RSs' last quarter is exposed (pipeline, 4 splits: the last
    # chunk's RS follows the last GEMM chunk): 2 x 1/2 x 1/4 = 1/4 all-reduce of 4, i.e. 1/16 of the whole;
    # plus the GEMMs beside the pipeline / bulk kernels (proj, fc2 forward; QKV, fc1 dgrad and wgrad) on 116 SMs.
    r = compose(BRIDGE_70B)
    tp, pp = 4, 4
    assert engines.get("bridge").tp_comm_overlap(r, tp)
    step = P.predict_step(r, tp, pp, 1, "none", True)
    ar, g = _all_reduce_s(r, tp), _gemm_s(r, tp)
    assert 0.75 * g["proj"] > ar / 2  # the premise: the shortest window outlasts half an all-reduce
    micro, layers = _micro(r, tp, pp), r.model.num_layers // pp
    whole = micro * layers * 4 * ar
    lent = micro * layers * (g["proj"] + g["fc2"] + 2 * (g["qkv"] + g["fc1"])) * LENT
    assert step.parts["tensor_parallel_s"] == pytest.approx(whole / 16 + lent, rel=1e-6)
    assert step.parts["tensor_parallel_sm_margin_s"] == pytest.approx(lent, rel=1e-6)
    assert step.parts["tensor_parallel_overlapped_s"] == pytest.approx(whole * 15 / 16, rel=1e-6)
    assert step.parts["tensor_parallel_s"] < whole


def test_bridge_lora_prices_the_adapters_gathers_and_the_frozen_weights_nccl_reduce_scatters():
    # LoRA on linear_qkv: TE gathers the QKV input with NCCL (the norm output goes to the adapter: 1/2 AR), the
    # adapter gathers its own input forward and reduce-scatters its gradient backward (Bridge's peft/utils.py with
    # the overlap on: 2 x 1/2 AR), and the pipelined RSs' last quarter (1/4 AR). The frozen QKV and fc1 weights run
    # no wgrad GEMM, and the rendered job has the bulk overlaps off (tp_comm_bulk_wgrad / _dgrad false: TE 2.12 would
    # otherwise never reduce-scatter their input gradient), so TE reduce-scatters it with NCCL after the dgrad GEMM,
    # nothing beside it: 2 x 1/2 AR exposed. 11/4 of the layer's 4 all-reduces, 11/16 of the whole. Only proj and
    # fc2's forward GEMMs lend SMs (the pipeline RS kernels).
    r = compose(["model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=1",
                 "train.seq_length=8192", "train.global_batch_size=8", "train.micro_batch_size=1"])
    step = P.predict_step(r, 4, 1, 1, "none", True)
    g = _gemm_s(r, 4)
    micro = _micro(r, 4, 1)
    whole = micro * r.model.num_layers * 4 * _all_reduce_s(r, 4)
    lent = micro * r.model.num_layers * (g["proj"] + g["fc2"]) * LENT
    assert step.parts["tensor_parallel_s"] == pytest.approx(whole * 11 / 16 + lent, rel=1e-6)
    assert step.parts["tensor_parallel_sm_margin_s"] == pytest.approx(lent, rel=1e-6)
    # hidden: fc1's input AG (1/2), the pipelined RSs' first three quarters (3/4), the dgrad AGs (1): 9/16 of the whole
    assert step.parts["tensor_parallel_overlapped_s"] == pytest.approx(whole * 9 / 16, rel=1e-6)


def test_nemo_fine_tuning_counts_its_tp_collectives_whole():
    r = compose(["model=llama2_70b", "method=lora", "cluster.nodes=1"])
    assert r.engine.name == "nemo" and not engines.get("nemo").tp_comm_overlap(r, 4)
    step = P.predict_step(r, 4, 1, 1, "none", False)
    assert step.parts["tensor_parallel_overlapped_s"] == 0.0
    assert step.parts["tensor_parallel_s"] == pytest.approx(_micro(r, 4, 1) * r.model.num_layers * 4
                                                            * _all_reduce_s(r, 4), rel=1e-9)


@pytest.mark.parametrize("extra, overlaps", [
    (["parallelism.tp=2", "parallelism.pp=1"], True),
    (["parallelism.tp=2", "parallelism.pp=1", "parallelism.sequence_parallel=false"], False),
    # turned off with sequence parallelism on: what a NeMo 2 job without its overlap callback runs (Cisco's 8B TP 2)
    (["parallelism.tp=2", "parallelism.pp=1", "parallelism.tp_comm_overlap=false"], False),
    (["parallelism.tp=1", "parallelism.pp=1"], False)])
def test_the_engines_answer_is_the_rendered_bridge_yaml(extra, overlaps):
    from vdkit.planner.plan import make_plan
    from vdkit.recipes import bridge
    from vdkit.recipes.bridge.config import bridge_config

    plan = make_plan(compose(["engine=bridge", "model=llama2_7b", "method=pretrain", "data=synthetic", *extra]))
    cfg = bridge_config(plan, "/r", "/r/checkpoints", in_container=bridge.in_container(plan))
    assert engines.get("bridge").tp_comm_overlap(plan.recipe, plan.tp) is overlaps
    assert ("comm_overlap" in cfg) is overlaps
    assert (plan.prediction.step.parts["tensor_parallel_overlapped_s"] > 0) is overlaps


def test_the_plan_prints_the_tp_share_as_exposed_and_hidden():
    # the plan's TP line adds up: exposed = collectives outlasting their GEMMs + the SMs' price (in the
    # communication term), hidden beside it (in no term); NeMo's counted whole
    from vdkit.commands.plan import describe
    from vdkit.planner.plan import make_plan

    plan = make_plan(compose(["model=llama2_70b", "engine=bridge", "method=lora", "data=synthetic", "cluster.nodes=1",
                              "train.seq_length=8192", "train.global_batch_size=8", "train.micro_batch_size=1",
                              "parallelism.tp=4", "parallelism.pp=1"]))
    q = plan.prediction.step.parts
    line = next(x for x in describe(plan).splitlines() if x.strip().startswith("TP comm"))
    assert f"{q['tensor_parallel_s']:.3g} s/step exposed" in line
    assert f"{q['tensor_parallel_s'] - q['tensor_parallel_sm_margin_s']:.3g} collectives" in line
    assert f"{q['tensor_parallel_sm_margin_s']:.3g} GEMM time lost" in line
    assert f"{q['tensor_parallel_overlapped_s']:.3g} s/step hidden" in line
    assert "not sent" not in line  # the rendered LoRA job sends every input-gradient reduce-scatter
    nemo = make_plan(compose(["model=llama2_70b", "method=lora", "cluster.nodes=1", "parallelism.tp=4",
                              "parallelism.pp=1"]))
    assert "counted whole" in next(x for x in describe(nemo).splitlines() if x.strip().startswith("TP comm"))


MLPERF_UB = "parallelism.tp_comm_overlap_cfg=h100_h12288_tp4_mbs2_seqlen2048"  # NVIDIA's GPT3 175B MLPerf settings


def test_a_runs_own_userbuffers_settings_price_its_sm_margins_and_ring_reduce_scatter():
    # The MLPerf file (conf/tp_overlap/): bulk overlaps keep every SM (set_sm_margin 0: no price on the QKV / fc1
    # dgrad and wgrad GEMMs), proj's RS a 4-split pipeline whose kernel holds 24 SMs (proj forward on 132 - 24),
    # fc2's RS a ring beside the last 3 of 4 GEMM chunks with a 1-SM kernel (fc2 forward on 131). 70B at TP 4: every
    # window outlasts its collective, so only proj's last RS quarter is exposed: 1/2 x 1/4 of one all-reduce of 4.
    r = compose(BRIDGE_70B + [MLPERF_UB])
    tp, pp = 4, 4
    step = P.predict_step(r, tp, pp, 1, "none", True)
    ar, g = _all_reduce_s(r, tp), _gemm_s(r, tp)
    assert 0.75 * g["proj"] > ar / 2 and 0.75 * g["fc2"] > ar / 2  # the premise, as above
    micro, layers = _micro(r, tp, pp), r.model.num_layers // pp
    whole = micro * layers * 4 * ar
    lent = micro * layers * (g["proj"] * 24 / (132 - 24) + g["fc2"] * 1 / (132 - 1))
    assert step.parts["tensor_parallel_sm_margin_s"] == pytest.approx(lent, rel=1e-6)
    assert step.parts["tensor_parallel_s"] == pytest.approx(whole / 32 + lent, rel=1e-6)
    assert step.parts["tensor_parallel_overlapped_s"] == pytest.approx(whole * 31 / 32, rel=1e-6)
    # against Transformer Engine's defaults (the test above): the same collectives, 16 SMs lent by 6 GEMM kinds
    default = P.predict_step(compose(BRIDGE_70B), tp, pp, 1, "none", True)
    assert default.parts["tensor_parallel_sm_margin_s"] > 5 * step.parts["tensor_parallel_sm_margin_s"]


def test_the_rendered_userbuffers_settings_are_what_bridge_hands_transformer_engine():
    """bridge.yaml's comm_overlap.tp_comm_overlap_cfg, built by Bridge's own loader, is its TransformerLayerTPOverlapCfg
    whose asdict (what CommOverlapConfig.setup gives TE's initialize_ub as ub_cfgs) holds the file's settings."""
    import dataclasses

    from omegaconf import OmegaConf

    from vdkit.composition.conftree import tp_overlap_source
    from vdkit.planner.plan import make_plan
    from vdkit.recipes import bridge
    from vdkit.recipes.bridge.config import bridge_config
    from vdkit.recipes.bridge.runcheck import _import_bridge

    plan = make_plan(compose(BRIDGE_70B + [MLPERF_UB, "parallelism.tp=4", "parallelism.pp=4"]))
    cfg = bridge_config(plan, "/r", "/r/checkpoints", in_container=bridge.in_container(plan))
    _import_bridge()
    from megatron.bridge.training.comm_overlap import TransformerLayerTPOverlapCfg
    from megatron.bridge.utils.instantiate_utils import instantiate

    built = instantiate(OmegaConf.create(cfg["comm_overlap"]["tp_comm_overlap_cfg"]))
    assert isinstance(built, TransformerLayerTPOverlapCfg)
    given = dataclasses.asdict(built)
    for gemm, setting in tp_overlap_source("h100_h12288_tp4_mbs2_seqlen2048").items():
        assert {k: given[gemm][k] for k in setting} == setting, gemm


def test_a_userbuffers_file_is_checked_at_the_door(tmp_path, monkeypatch):
    from vdkit.errors import UserError

    with pytest.raises(UserError) as e:
        compose(BRIDGE_70B + ["parallelism.tp_comm_overlap_cfg=nope"])
    assert "conf/tp_overlap/" in e.value.what and "h100_h12288_tp4_mbs2_seqlen2048" in e.value.fix
    with pytest.raises(UserError) as e:  # NeMo's rendered jobs run no userbuffers overlap to set it in
        compose(["model=llama2_70b", "method=pretrain", "cluster.nodes=2", MLPERF_UB])
    assert "engine=nemo renders no userbuffers" in e.value.what and "engine=bridge" in e.value.fix
    with pytest.raises(UserError, match="TP communication overlap is off"):  # a setting that would do nothing
        compose(BRIDGE_70B + [MLPERF_UB, "parallelism.tp=1"])
    # a file that gives a GEMM a method Transformer Engine does not run it with, or lacks a key its method needs
    import shutil

    from vdkit.composition import conftree

    conf = tmp_path / "conf"
    shutil.copytree(conftree.conf_dir(), conf)
    monkeypatch.setattr(conftree, "conf_dir", lambda: conf)
    good = (conf / "tp_overlap" / "h100_h12288_tp4_mbs2_seqlen2048.yaml").read_text()
    bad = conf / "tp_overlap" / "bad.yaml"
    bad.write_text(good.replace("qkv_fprop:\n  method: ring_exchange", "qkv_fprop:\n  method: pipeline"))
    with pytest.raises(UserError, match=r"qkv_fprop.method='pipeline'; Transformer Engine runs qkv_fprop as ring_exchange"):
        conftree.tp_overlap_source("bad")
    bad.write_text(good.replace("  num_sm: 4\n  cga_size: 2\n  set_sm_margin: 0\n\nqkv_wgrad", "  num_sm: 4\n\nqkv_wgrad"))
    with pytest.raises(UserError, match=r"qkv_dgrad \(bulk\) lacks cga_size, set_sm_margin"):
        conftree.tp_overlap_source("bad")


UB_FILES = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "tp_overlap").glob("*.yaml"))


@pytest.mark.parametrize("name", UB_FILES)
def test_every_userbuffers_file_loads_through_bridges_own_config_class(name):
    """Each conf/tp_overlap/ file, as the Bridge engine renders it (recipes/bridge/userbuffers.py), is built by Bridge's
    own instantiate into its TransformerLayerTPOverlapCfg, whose asdict (TE's ub_cfgs) holds every setting of the file;
    no setting is an unresolved interpolation (the submitters' files read theirs from the environment)."""
    import dataclasses

    from omegaconf import OmegaConf

    from recipes.bridge.userbuffers import ub_overlap_cfg
    from vdkit.composition.conftree import tp_overlap_source
    from vdkit.recipes.bridge.runcheck import _import_bridge

    _import_bridge()
    from megatron.bridge.training.comm_overlap import TransformerLayerTPOverlapCfg
    from megatron.bridge.utils.instantiate_utils import instantiate

    source = tp_overlap_source(name)
    assert all(isinstance(v, (int, str)) and "$" not in str(v) for s in source.values() for v in s.values())
    built = instantiate(OmegaConf.create(ub_overlap_cfg(name)))
    assert isinstance(built, TransformerLayerTPOverlapCfg)
    given = dataclasses.asdict(built)
    for gemm, setting in source.items():  # Bridge's class per method stands for the method (no field of its own)
        assert {k: given[gemm][k] for k in setting if k != "method"} == {
            k: v for k, v in setting.items() if k != "method"}, gemm


def test_each_mlperf_gpt3_row_names_the_userbuffers_file_its_submitter_loaded():
    """The independent set's MLPerf GPT3 rows price the settings their run loaded: every row whose submission ships its
    tp_overlap file names the kit's copy of it, a file whose header cites that round's results repository; Oracle's
    (no conf/ in its submission) keep Transformer Engine's defaults."""
    import yaml

    from vdkit.composition import conftree

    rows = yaml.safe_load((Path(__file__).parents[1] / "benchmarks" / "independent_runs.yaml").read_text())["runs"]
    repos = {"mlperf30_gpt3": "training_results_v3.0", "mlperf31_gpt3": "training_results_v3.1",
             "mlperf40_gpt3": "training_results_v4.0", "mlperf41_gpt3": "training_results_v4.1"}
    gpt3 = [r for r in rows if r.get("source") in repos]
    assert len(gpt3) == 20
    for row in gpt3:
        named = [o.split("=", 1)[1] for o in row["overrides"] if o.startswith("parallelism.tp_comm_overlap_cfg=")]
        if "(Oracle)" in row["name"]:
            assert not named, row["name"]
            continue
        assert len(named) == 1 and named[0].startswith(row["source"]), row["name"]
        header = (conftree.conf_dir() / "tp_overlap" / f"{named[0]}.yaml").read_text().split("\n\n")[0]
        assert repos[row["source"]] in header, row["name"]


def test_nemo_2407s_70b_row_names_the_userbuffers_file_its_launcher_script_loaded():
    """The NeMo 24.07 Llama 3 70B row (TP 4 with sequence parallelism) ran NeMo-Framework-Launcher's
    examples/training/llama/h100/llama3_70b_fp8.sh, which loads ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192: the row
    prices the kit's copy of it (its header cites the script), not Transformer Engine's defaults."""
    import yaml

    from vdkit.composition import conftree
    from vdkit.planner import tp_overlap

    rows = yaml.safe_load((Path(__file__).parents[1] / "benchmarks" / "independent_runs.yaml").read_text())["runs"]
    (row,) = [r for r in rows if r["name"] == "Llama 3 70B pretrain FP8 64 GPUs seq 8192 CP2"]
    assert "parallelism.tp_comm_overlap_cfg=h100_fp8_h8192_tp4_mbs1_seqlen8192" in row["overrides"]
    header = (conftree.conf_dir() / "tp_overlap" / "h100_fp8_h8192_tp4_mbs1_seqlen8192.yaml").read_text().split("\n\n")[0]
    assert "llama3_70b_fp8.sh" in header and "tag 24.07" in header
    ub = tp_overlap.settings(compose(row["overrides"]))
    assert (ub["qkv_dgrad"]["num_sm"], ub["proj_fprop"]["num_sm"], ub["fc2_fprop"]["method"]) == (4, 24, "pipeline")


def test_nvidias_70b_pretraining_rows_take_their_launcher_file_where_the_engine_renders_it():
    """step_time.yaml's anchors: the 70B pre-training rows ran llama2_70b.yaml's tuned userbuffers file, which the
    Bridge table (bench_prediction.py) applies; the fit's plan (the kit's NeMo engine, no userbuffers) refuses it."""
    from vdkit.errors import UserError
    from vdkit.planner import tp_overlap

    runs = {r["name"]: r for r in P.calibration()["anchors"]["runs"]}
    for name in ("70B pretrain BF16 64 GPUs", "70B pretrain FP8 64 GPUs"):
        extra = list(runs[name]["bridge_overrides"])
        assert extra == ["parallelism.tp_comm_overlap_cfg=h100_h8192_tp4_mbs1_seqlen4096"]
        ub = tp_overlap.settings(compose([*runs[name]["overrides"], "engine=bridge", *extra]))
        assert (ub["fc2_fprop"]["method"], ub["fc2_fprop"]["num_sm"], ub["qkv_wgrad"]["set_sm_margin"]) == ("pipeline", 16, 0)
        with pytest.raises(UserError, match="engine=nemo renders no userbuffers"):
            compose([*runs[name]["overrides"], *extra])
