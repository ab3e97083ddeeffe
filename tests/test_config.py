"""Every shipped config composes and validates; the schema refuses what it should, in one line."""
import os

import pytest

from vdkit.composition.config import compose, conf_dir, group_options
from vdkit.render.sweep import override_sets, sweep_cells
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan

GROUPS = ("model", "method", "cluster", "data", "engine", "parallelism")


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes_and_validates(group):
    options = group_options(group)
    assert options, f"conf/{group}/ is empty"
    for option in options:
        extra = []
        if group == "data" and option == "pile":
            extra = ["method=pretrain"]
        if group == "model" and option == "tiny_llama":
            extra = ["cluster=local", "engine=reference", "data=synthetic"]
        if group == "model" and option.startswith(("llama3", "tiny_llama3")):  # llama3 RoPE: not in NeMo 1.23
            extra = ["engine=megatron"]
        if group == "model" and option == "opt_350m":  # projected embeddings, post-norm: only transformers' OPT
            extra = ["engine=reference"]
        if group == "model" and option == "qwen2_5_7b":  # Q/K/V biases: not in NeMo 1.23 (its spec refuses qkv_bias)
            extra = ["engine=megatron"]
        r = compose([f"{group}={option}", *extra])
        if group != "parallelism":  # parallelism options are layouts, not named sections
            assert getattr(r, group).name == option
        _assert_consistent(make_plan(r))


def _assert_consistent(plan) -> None:
    """A plan fits exactly when its memory is within the GPU's, and an infeasible one says by how much."""
    cap = plan.recipe.cluster.gpu_memory_gb
    assert plan.feasible == (plan.memory.total_gb <= cap), (plan.memory.total_gb, cap, plan.reason)
    if plan.feasible:
        assert plan.reason is None and plan.recipe.world_size == plan.dp * plan.tp * plan.pp * plan.recipe.parallelism.cp
    else:
        assert plan.reason and "GB" in plan.reason and f"{cap:g} GB" in plan.reason, plan.reason


def test_defaults_are_the_design_guide_ones():
    r = compose([])
    assert (r.train.micro_batch_size, r.train.global_batch_size) == (1, 128)
    assert (r.train.max_steps, r.train.target_steps) == (50, 1000)
    p = compose(["method=pretrain"])
    assert (p.train.global_batch_size, p.train.seq_length, p.data.name) == (144, 4096, "pile")
    assert (p.model.pretrain_tp, p.model.pretrain_pp) == (2, 1)
    r70 = compose(["method=pretrain", "model=llama2_70b"])
    assert (r70.model.pretrain_tp, r70.model.pretrain_pp) == (4, 4)


def test_llama_dimensions_are_the_model_cards():
    dims = {m: compose([f"model={m}"]).model for m in ("llama2_7b", "llama2_13b", "llama2_70b")}
    assert (dims["llama2_7b"].num_layers, dims["llama2_7b"].hidden_size, dims["llama2_7b"].ffn_hidden_size) == (32, 4096, 11008)
    assert (dims["llama2_13b"].num_layers, dims["llama2_13b"].hidden_size, dims["llama2_13b"].num_attention_heads) == (40, 5120, 40)
    m70 = dims["llama2_70b"]
    assert (m70.num_layers, m70.hidden_size, m70.ffn_hidden_size, m70.num_attention_heads, m70.num_query_groups) == (80, 8192, 28672, 64, 8)


def test_clusters_have_their_adapters():
    assert len(compose(["cluster=xe9680"]).cluster.ib_hcas) == 8
    assert len(compose(["cluster=xe9680_4nic"]).cluster.ib_hcas) == 4


def test_common_override_keys_work():
    r = compose(["model=llama2_13b", "method=sft", "cluster=xe9680", "data=alpaca", "engine=reference",
                 "cluster.nodes=2", "cluster.gpus_per_node=4", "parallelism.tp=2", "parallelism.pp=2",
                 "train.micro_batch_size=2", "train.global_batch_size=64", "train.max_steps=7",
                 "train.seq_length=1024", "run.name=my job"])
    assert (r.cluster.nodes, r.cluster.gpus_per_node, r.world_size) == (2, 4, 8)
    assert (r.parallelism.tp, r.parallelism.pp) == (2, 2)
    assert (r.train.micro_batch_size, r.train.global_batch_size, r.train.max_steps, r.train.seq_length) == (2, 64, 7, 1024)
    assert r.run_name == "my job"


@pytest.mark.parametrize("overrides, words", [
    (["cluster.nodess=2"], "nodess"),                     # unknown key
    (["cluster.nodes=two"], "converted to Integer"),      # wrong type
    (["model=llama3_8b"], "model="),                      # bad group option, lists the good ones
    (["+foo=1"], "'foo' not in"),                         # + smuggled past the schema
    (["+cluster.wckey=x"], "'wckey' not in"),
    (["cluster.nodes=7"], "outside 1-6"),
    (["model=opt_125m", "engine=reference", "train.seq_length=4096"], "exceeds"),
    (["train.max_steps=0"], "must be > 0"),
    (["data.packed=true", "train.micro_batch_size=2", "train.global_batch_size=128"], "micro_batch_size=1"),
    (["method=pretrain", "data=dolly"], "does not suit"),
])
def test_bad_input_is_one_clear_line(overrides, words):
    with pytest.raises(UserError) as err:
        compose(overrides)
    text = str(err.value)
    assert words in text and "\n" not in text and "fix:" in text


def test_sweeps_table9_has_exactly_the_published_cells():
    cells = sweep_cells("table9")
    assert len(cells) == 24  # 8 rows x LoRA / P-tuning / SFT
    gpus = {}
    for cell in cells:
        r = compose(cell)
        gpus.setdefault(r.model.name, set()).add(r.world_size)
        if r.world_size == 4:
            assert r.cluster.gpus_per_node == 4 and r.cluster.nodes == 1
    assert gpus == {"llama2_7b": {4, 8, 16}, "llama2_13b": {4, 8, 16}, "llama2_70b": {8, 16}}


def test_multirun_is_a_cartesian_product_and_extra_overrides_reach_every_sweep_cell():
    sets = override_sets(["model=llama2_7b,llama2_13b", "cluster.nodes=1,2,3"], multirun=True)
    assert len(sets) == 6
    assert {(compose(s).model.name, compose(s).cluster.nodes) for s in sets} == {
        (m, n) for m in ("llama2_7b", "llama2_13b") for n in (1, 2, 3)}
    cells = override_sets(["engine=reference"], sweep="training")
    assert all(compose(c).engine.name == "reference" for c in cells)


def test_every_sweep_cell_composes_and_plans():
    infeasible = {}
    for sweep in group_options("sweep"):
        for cell in sweep_cells(sweep):
            plan = make_plan(compose(cell))
            _assert_consistent(plan)
            r = plan.recipe
            if not plan.feasible:
                infeasible.setdefault(sweep, set()).add((r.model.name, r.world_size, r.method.name))
    # exactly the cells the sources print N/A or out of memory for: 70B SFT (Table 9), OPT-30B (white paper)
    assert infeasible["table9"] == {("llama2_70b", 8, "sft")}  # on 16 GPUs: 76.8 of the H100's 85.5 GB
    assert infeasible["alpaca_opt"] == {("opt_30b", 8, "sft")}


def test_unknown_sweep_is_an_error():
    with pytest.raises(UserError, match="no sweep named"):
        sweep_cells("table99")


def test_conf_dir_is_the_checkout():
    assert (conf_dir() / "config.yaml").is_file()


def test_every_path_is_made_absolute_once_at_composition(tmp_path, monkeypatch):
    """Issue 12, item 10: relative paths resolve against the directory vdkit ran in, not the job's cwd."""
    from vdkit.composition.config import PATH_FIELDS

    monkeypatch.chdir(tmp_path)
    r = compose(["engine=reference", "model=tiny_llama", "data=dolly", "run.results_dir=results",
                 "run.secrets_file=conf/../secrets.env", "data.data_dir=data/dolly", "run.out_dir='~/runs'",
                 "data.tokenizer_model=tok.model", "model.nemo_path=m.nemo", "model.megatron_path=base",
                 "engine.container_image=./nemo.sqsh"])
    assert r.run.results_dir == str(tmp_path / "results") and r.run.secrets_file == str(tmp_path / "secrets.env")
    assert r.data.data_dir == str(tmp_path / "data/dolly") and r.run.out_dir == os.path.expanduser("~/runs")
    assert r.data.tokenizer_model == str(tmp_path / "tok.model") and r.model.nemo_path == str(tmp_path / "m.nemo")
    assert r.engine.container_image == str(tmp_path / "nemo.sqsh") and r.model.megatron_path == str(tmp_path / "base")
    assert all(os.path.isabs(getattr(getattr(r, s), k)) for s, k in PATH_FIELDS)
    assert compose(["engine.container_image='nvcr.io#nvidia/nemo:24.01'"]).engine.container_image == \
        "nvcr.io#nvidia/nemo:24.01"  # an image name is not a path
