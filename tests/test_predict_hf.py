"""The step-time model's transformers-engine regime (vdkit.planner.predict_hf) and the tokens it computes on
(vdkit.planner.tokens): collator padding counted from the data, the stack's synchronisation rules, the
hardware constants' sources, and the seeds' published cells it predicts."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest

from vdkit.composition.config import compose
from vdkit.render.sweep import sweep_cells
from vdkit.validation.tables import PLAN_ONLY
from vdkit.planner.plan import make_plan
from vdkit.planner.predict_hf import constants, predict_hf_step
from vdkit.planner.tokens import expected_longest, lognormal_longest, micro_batch_tokens, stats_path, write_stats

OPT = ["engine=reference", "parallelism.sharding=fsdp", "method=sft", "data=alpaca", "model=opt_6_7b",
       "train.micro_batch_size=4", "train.global_batch_size=256", "train.seq_length=512", "parallelism.recompute=none"]


def test_expected_longest_row_is_the_order_statistic_of_the_histogram():
    hist = {10: 1, 20: 1, 30: 2}  # F(10)=1/4, F(20)=1/2, F(30)=1
    # longest of 2 rows drawn at random: P(10)=1/16, P(20)=1/4-1/16, P(30)=1-1/4
    assert expected_longest(hist, 2, 1000) == pytest.approx(10 / 16 + 20 * 3 / 16 + 30 * 12 / 16)
    assert expected_longest(hist, 1, 1000) == pytest.approx(22.5)  # one row: the mean
    assert expected_longest(hist, 2, 25) == pytest.approx(10 / 16 + 20 * 3 / 16 + 25 * 12 / 16)  # truncation
    rng = random.Random(1)
    lengths = [int(rng.lognormvariate(4.5, 0.5)) for _ in range(20000)]
    mean = sum(lengths) / len(lengths)
    from vdkit.planner.tokens import histogram

    # the planner's default (log-normal) agrees with the exact histogram of log-normal data
    assert lognormal_longest(mean, 0.5, 4, 10**6) == pytest.approx(expected_longest(histogram(lengths), 4, 10**6), rel=0.02)
    assert lognormal_longest(mean, 0.5, 1, 10**6) == pytest.approx(mean, rel=0.01)


def test_tokens_per_micro_batch_come_from_the_data_stats_file_when_there_is_one(tmp_path):
    train = tmp_path / "training.jsonl"
    train.write_text("")
    recipe = compose(OPT + [f"data.data_dir={tmp_path}"])
    default = micro_batch_tokens(recipe)
    assert "planner default for alpaca" in default.source and default.mean_row == pytest.approx(114.7)
    assert default.tokens > 4 * default.mean_row  # padding to the longest of 4 rows costs tokens
    write_stats(train, [50] * 90 + [600] * 10, "test tokenizer")
    assert stats_path(train).is_file()
    counted = micro_batch_tokens(recipe)
    assert str(stats_path(train)) in counted.source and counted.mean_row == pytest.approx(105)
    # rows cut at seq 512: the longest of 4 is 512 with probability 1 - 0.9^4
    assert counted.padded_row == pytest.approx(50 * 0.9 ** 4 + 512 * (1 - 0.9 ** 4))
    step = predict_hf_step(recipe)
    assert step.parts["tokens_per_micro_batch"] == pytest.approx(counted.tokens)
    assert step.tokens_per_step == pytest.approx(256 * 105)  # throughput counts real tokens, not padding


def test_data_stats_plan_writes_the_histogram_the_planner_reads(tmp_path, capsys):
    from helpers import make_rows, word_level_tokenizer, write_rows
    from vdkit.cli import main

    rows = make_rows()
    f = write_rows(tmp_path / "training.jsonl", rows)
    tok = word_level_tokenizer(tmp_path / "tokenizer.json")
    assert main(["data", "stats", str(f), "--tokenizer", str(tok), "--plan"]) == 0
    doc = json.loads(stats_path(f).read_text())
    want = {}
    for r in rows:  # BOS + words of "{input} {output}" + EOS
        n = len(r["input"].split()) + len(r["output"].split()) + 2
        want[str(n)] = want.get(str(n), 0) + 1
    assert doc["histogram"] == dict(sorted(want.items(), key=lambda kv: int(kv[0]))) and doc["rows"] == len(rows)
    assert main(["data", "stats", str(f), "--plan"]) == 2  # no tokenizer: one clear line, nothing written
    assert "--tokenizer" in capsys.readouterr().err


def test_fsdp_reduces_once_per_step_zero3_every_micro_batch():
    fsdp = compose(OPT)
    zero3 = dataclasses.replace(fsdp, parallelism=dataclasses.replace(fsdp.parallelism, sharding="zero3"))
    one_f = predict_hf_step(dataclasses.replace(fsdp, train=dataclasses.replace(fsdp.train, global_batch_size=32)))
    eight_f = predict_hf_step(fsdp)
    eight_z = predict_hf_step(zero3)
    one_z = predict_hf_step(dataclasses.replace(zero3, train=dataclasses.replace(zero3.train, global_batch_size=32)))
    per_step = lambda s: s.communication_s  # noqa: E731
    # ZeRO-3's communication grows with the micro batches; FSDP's reduce-scatter is paid once per step
    assert per_step(eight_z) == pytest.approx(8 * per_step(one_z), rel=1e-9)
    assert per_step(eight_f) < 8 * per_step(one_f)
    # compute scales with the micro batches, but for the no_sync accumulation paid on all but a step's first
    traffic = lambda s: s.parts["gradient_traffic_micro_batch_s"]  # noqa: E731
    assert eight_f.compute_s - 8 * traffic(eight_f) == pytest.approx(8 * (one_f.compute_s - traffic(one_f)))
    assert traffic(eight_f) > traffic(one_f)


def test_communication_is_hidden_by_longer_micro_batches_and_exposed_by_slow_links():
    base = compose(["engine=reference", "parallelism.sharding=zero3", "method=sft", "data=pubmedqa_blog",
                    "model=llama3_1_8b", "cluster=xe9680_mi300x", "cluster.nodes=2", "train.seq_length=1024",
                    "train.micro_batch_size=1", "train.global_batch_size=16"])
    small = predict_hf_step(base)
    big = predict_hf_step(dataclasses.replace(base, train=dataclasses.replace(base.train, micro_batch_size=24,
                                                                             global_batch_size=384)))
    assert small.communication_s / small.total_s > big.communication_s / big.total_s
    slow = dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, inter_node_gb_s=10.0))
    assert predict_hf_step(slow).communication_s > 3 * small.communication_s
    tcp = compose(["engine=reference", "parallelism.sharding=zero3", "model=llama3_1_8b",
                   "cluster=xe9680_mi300x_noroce", "cluster.nodes=2", "cluster.inter_node_gb_s=null",
                   "train.seq_length=1024", "train.micro_batch_size=1", "train.global_batch_size=16"])
    # TCP without a measured bandwidth: the stated sockets default (one 100 GbE port, 12.5 GB/s per node), slower
    # than the blog cluster's 39 and with TCP's latency, and the plan says the figure is assumed
    measured = dataclasses.replace(tcp, cluster=dataclasses.replace(tcp.cluster, inter_node_gb_s=39.0))
    assert predict_hf_step(tcp).communication_s > 2.5 * predict_hf_step(measured).communication_s
    plan = make_plan(tcp)
    assert dict(plan.prediction.basis)["communication"].startswith("assumed: the tcp fabric")


def test_mi300x_constants_are_datasheet_and_measured_figures():
    gpus = constants()["gpus"]
    mi, h100 = gpus["MI300X-192GB"], gpus["H100-SXM5-80GB"]
    assert mi["peak_tflops_bf16"] == 1307.4 and mi["hbm_gb_s"] == 5300 and mi["intra_node_gb_s"] == 336
    assert mi["mamf_tflops_bf16"] / mi["peak_tflops_bf16"] < 0.65 < h100["mamf_tflops_bf16"] / h100["peak_tflops_bf16"]


def test_every_seed_cell_gets_a_prediction_and_opt_30b_none():
    for table in ("alpaca_opt", "llama31_roce"):
        for cell in sweep_cells(table, PLAN_ONLY):
            plan = make_plan(compose(cell))
            if plan.recipe.model.name == "opt_30b":
                assert not plan.feasible and plan.prediction is None
                continue
            assert plan.feasible and plan.prediction is not None, cell
            assert plan.prediction.step.parts["regime"] == "hf"
            assert any(n.startswith("tokens: ") for n in plan.notes)


def test_plan_prints_the_published_figure_of_its_cell(capsys):
    from vdkit.cli import main
    from vdkit.validation.citation import published_for

    assert main(["plan", "model=llama2_7b", "method=lora", "cluster.gpus_per_node=4"]) == 0
    out = capsys.readouterr().out
    plan = make_plan(compose(["model=llama2_7b", "method=lora", "cluster.gpus_per_node=4"]))
    mine = plan.prediction.minutes
    assert f"published   Table 9: 102 min for 1000 steps; predicted {mine:,.1f} min ({mine / 102:.2f}x the published)" in out
    blog = sweep_cells("llama31_roce", PLAN_ONLY)[2]  # 8B, 2 nodes, RoCE
    fig = published_for(compose(blog))
    assert fig.text == "1071.2 s per epoch" and fig.minutes == pytest.approx(1071.2 / 60)
    assert published_for(compose(sweep_cells("alpaca_opt", PLAN_ONLY)[-1])).text == "out of memory"
    # not a published configuration (packed data, the fast recipe): no figure printed
    assert published_for(compose(["model=llama2_7b", "method=lora", "cluster.gpus_per_node=4", "recipe=fast"])) is None


def test_each_engine_picks_its_regime_in_one_place():
    """The regime is the engine spec's own step_time_regime, read through the registry."""
    from vdkit.planner.predict import _fused_path, regime

    assert regime(compose(["engine=reference"])) == "hf" and regime(compose(["engine=nemo"])) == "unfused"
    assert regime(compose(["engine=bridge"])) == "fused"  # NVIDIA's current stack: the fused-path constants
    # the transformers engine with plain DDP is predicted by the HF regime too, not by NeMo's
    ddp = make_plan(compose(["engine=reference", "model=opt_1_3b", "data=alpaca", "method=sft",
                             "train.micro_batch_size=4", "train.global_batch_size=256", "train.seq_length=512"]))
    assert ddp.prediction.step.parts["regime"] == "hf" and ddp.runner_up is None
    guide = compose(["model=llama2_7b", "method=lora"])
    assert not _fused_path(guide) and _fused_path(compose(["model=llama2_7b", "method=lora", "recipe=fast"]))


def test_tile_and_wave_quantization_cost_small_gemms_only():
    from vdkit.planner.predict_hf import _gemm_s, _quantization

    assert _quantization(128 * 11, 256 * 12, [128, 256], 132) == pytest.approx(1.0)  # 132 tiles: one full wave
    assert _quantization(128 * 19, 256 * 7, [128, 256], 132) == pytest.approx(133 / 264)  # one tile into a 2nd wave
    assert _quantization(100, 256, [128, 256], 132) == pytest.approx(100 / 128 / 132)  # one padded tile
    big = _gemm_s(8192, 8192, 8192, 792e12, 3.35e12, [128, 256], 132)
    assert big == pytest.approx(2 * 8192 ** 3 / 792e12 / _quantization(8192, 8192, [128, 256], 132))
    assert big < 1.1 * 2 * 8192 ** 3 / 792e12  # a large GEMM runs near the measured rate


def test_plan_json_carries_the_published_figure(capsys):
    from vdkit.cli import main

    assert main(["plan", "--json", "model=llama2_70b", "method=lora", "cluster.nodes=2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["published"] == {"table": "Table 9", "figure": "487 min for 1000 steps", "minutes_for_target_steps": 487.0}
    assert main(["plan", "--json", "model=llama2_70b", "method=lora", "cluster.nodes=2", "recipe=fast"]) == 0
    assert json.loads(capsys.readouterr().out)["published"] is None


@pytest.mark.parametrize("text", ["{not json", '{"histogram": {}}', '{"histogram": {"x": 3}}', '[1, 2]',
                                  '{"histogram": {"0": 5}}'])
def test_a_broken_token_histogram_is_one_clear_line(tmp_path, capsys, text):
    from vdkit.cli import main

    (tmp_path / "training.jsonl").write_text("")
    stats_path(tmp_path / "training.jsonl").write_text(text)
    assert main(["plan"] + OPT + [f"data.data_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "not a token histogram" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_gradient_traffic_follows_each_stacks_rules():
    """FSDP pays its flat-gradient copy every micro batch and the no_sync accumulation on all but a step's
    first; ZeRO-3 copies into its bucket and accumulates nothing; the terms are HBM bytes, not fractions."""
    calib = constants()
    stack = calib["stack"]
    hbm = calib["gpus"]["H100-SXM5-80GB"]["hbm_gb_s"] * 1e9
    fsdp = compose(OPT)  # 8 micro batches per step
    one = dataclasses.replace(fsdp, train=dataclasses.replace(fsdp.train, global_batch_size=32))  # 1 micro batch
    from vdkit.planner.arch import param_counts

    params = param_counts(fsdp.model).total
    copy_b = stack["gradient_copy_bytes_per_param"]["fsdp"]
    acc_b = stack["accumulate_gradient_bytes_per_param"]["fsdp"]
    assert predict_hf_step(fsdp).parts["gradient_traffic_micro_batch_s"] == pytest.approx(
        (copy_b + acc_b * 7 / 8) * params / hbm)
    assert predict_hf_step(one).parts["gradient_traffic_micro_batch_s"] == pytest.approx(copy_b * params / hbm)
    zero3 = dataclasses.replace(fsdp, parallelism=dataclasses.replace(fsdp.parallelism, sharding="zero3"))
    assert predict_hf_step(zero3).parts["gradient_traffic_micro_batch_s"] == pytest.approx(
        stack["gradient_copy_bytes_per_param"]["zero3"] * params / hbm)
    # the white paper's stack (torch 2.0 FSDP defaults, transformers 4.26.1) prefetches in backward
    assert stack["backward_prefetch"] == {"fsdp": True, "zero3": True}


def test_plans_near_the_gpus_memory_say_the_allocator_cost_is_left_out():
    from vdkit.planner.sharded import MEMORY_PRESSURE_NOTE

    share = {}
    for table in ("alpaca_opt", "llama31_roce"):
        for cell in sweep_cells(table, PLAN_ONLY):
            plan = make_plan(compose(cell))
            assert (MEMORY_PRESSURE_NOTE in plan.notes) == (plan.feasible and plan.borderline)
            if plan.feasible:
                share[(plan.recipe.model.name, plan.recipe.cluster.nodes)] = \
                    plan.memory.total_gb / plan.recipe.cluster.gpu_memory_gb
    # the two runs whose published times are superlinear against their neighbours (OPT-13B vs 6.7B: 2.8x the
    # time for 1.9x the parameters; 70B on 1 node vs 2: 2.5x) are the two nearest the card's memory: 93 % and
    # 91 % of the GPU's reported total (with the sold 80 / 192 taken as GB they were inside the 10 % band)
    assert set(sorted(share, key=share.get)[-2:]) == {("opt_13b", 1), ("llama3_1_70b", 1)}
    assert all(share[k] > 0.85 for k in (("opt_13b", 1), ("llama3_1_70b", 1)))


@pytest.mark.parametrize("table", ["table9", "training", "alpaca_opt", "llama31_roce"])
def test_a_plan_that_departs_from_the_published_run_is_not_cited_as_it(table):
    """Every sweep cell of a published table is cited with its figure; the same cell with another
    sequence length, batch or (where the table's key does not name it) fine-tuning method is a different
    run, and gets no published figure."""
    from vdkit.validation.citation import published_for
    from vdkit.validation.tables import load_published

    pub = load_published(table)
    cited = 0
    for cell in sweep_cells(table, PLAN_ONLY):
        recipe = compose(cell)
        fig = published_for(recipe)
        if fig is None:  # a sweep cell the source has no figure for
            continue
        cited += 1
        assert fig.table == pub["cited_as"]
        seq, mbs = recipe.train.seq_length, recipe.train.micro_batch_size
        changes = [f"train.seq_length={seq // 2}", f"train.micro_batch_size={mbs * 2}"]
        if "method" not in pub["key"]:  # e.g. the white paper's OPT runs are full fine-tuning: LoRA is another run
            changes.append("method=lora" if recipe.method.name != "lora" else "method=sft")
        for change in changes:
            other = [o for o in cell if not o.startswith(change.split("=")[0] + "=")]
            assert published_for(compose([*other, change])) is None, (cell, change)
    assert cited >= len(pub["cells"]) - 1


def test_the_floor_note_holds_for_every_published_run_of_its_stack():
    """FSDP plans of the transformers regime say their prediction is a floor; that is only true while the regime
    predicts every published timed FSDP run faster than published: the white paper's OPT cells and
    hf_step_time.yaml's cross-checks (other people's runs of the seed's code on A100s). ZeRO-3 plans (the MI300X
    blog, predicted within a few tens of per cent either side) carry no such note."""
    from vdkit.planner.sharded import FLOOR_NOTE, FLOOR_STACKS
    from vdkit.validation.tables import load_published

    assert FLOOR_STACKS == ("fsdp",)
    checked = []
    for table, unit in (("alpaca_opt", "minutes"), ("llama31_roce", "seconds")):
        for cell, pub in zip(sweep_cells(table, PLAN_ONLY), load_published(table)["cells"]):
            plan = make_plan(compose(cell))
            fsdp = plan.recipe.parallelism.sharding == "fsdp"
            assert (FLOOR_NOTE in plan.notes) == (fsdp and plan.prediction is not None), cell
            if fsdp and pub.get(unit) and plan.prediction is not None:
                checked.append((cell, plan.prediction.minutes, pub[unit]))
    base = [o for o in sweep_cells("alpaca_opt", PLAN_ONLY)[0] if not o.startswith(("model=", "model.hf_path="))]
    for run in constants()["cross_checks"]:
        plan = make_plan(compose(base + list(run["overrides"])))
        assert FLOOR_NOTE in plan.notes
        checked.append((run["name"], plan.prediction.minutes, run["minutes"]))
    assert len(checked) == 2 + 2  # OPT-6.7B and 13B, two A100 runs
    not_below = [(name, round(pred, 1), pub) for name, pred, pub in checked if pred >= pub]
    assert not not_below, f"the regime no longer predicts these below their published time: {not_below}"
