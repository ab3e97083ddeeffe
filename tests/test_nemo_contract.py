"""The rendered nemo.yaml against NeMo's own v1.23.0 YAMLs (the contract), and the traps vdkit refuses.

NeMo cannot run here; its configs can be read. For every method x model (and a few layouts):
every key vdkit sets exists in NeMo's YAML or is a listed deliberate addition, values have NeMo's
types, and the rendered file holds every key NeMo's does (it replaces NeMo's YAML).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.recipes.common.edits import kind
from vdkit.recipes.nemo import render_nemo_yaml
from vdkit.recipes.nemo.config import build_config
from vdkit.recipes.nemo.contract import DELIBERATE_ADDITIONS, WIDENED_TYPES, check_nemo_config


def _reference_dir() -> Path:
    shared = os.environ.get("VDKIT_SHARED")
    root = Path(shared) if shared else Path(__file__).resolve().parents[2] / "shared"
    return root / "reference" / "nemo-v1.23.0"


REF = _reference_dir()
# Only the tests that read NeMo's YAMLs skip without them; the trap tests below read none and always run.
needs_reference = pytest.mark.skipif(
    not (REF / "megatron_gpt_finetuning_config.yaml").is_file(),
    reason=f"NeMo's v1.23.0 reference YAMLs are not at {REF} (set VDKIT_SHARED to the shared/ folder)")

TEMPLATES = {"finetune": "megatron_gpt_finetuning_config.yaml", "pretrain": "megatron_llama_config.yaml"}
RUN_DIR = "/cluster/runs/contract"

MODELS = ["llama2_7b", "llama2_13b", "llama2_70b"]
METHODS = ["sft", "lora", "ptuning", "pretrain"]
LAYOUTS = {  # extra overrides per case; every one must still honour the contract
    "auto-1node": [],
    "auto-2nodes": ["cluster.nodes=2"],
    "fp8-full-recompute": ["train.precision=fp8", "parallelism.recompute=full"],
    "periodic-checkpoints-shared": ["engine.checkpoint_every_n_steps=10", "run.results_dir=/shared/results"],
    "fast-recipe": ["train.fused_kernels=true", "data.packed=true", "train.seq_length=4096"],
}
PINNED = [  # (model, method, overrides): interleaved pipelines and packed data
    ("llama2_13b", "sft", ["parallelism.tp=1", "parallelism.pp=4", "parallelism.vp=10"]),
    ("llama2_70b", "sft", ["cluster.nodes=2", "parallelism.tp=4", "parallelism.pp=4", "parallelism.vp=5"]),
    ("llama2_70b", "pretrain", ["cluster.nodes=2", "parallelism.tp=4", "parallelism.pp=4", "parallelism.vp=5"]),
    ("llama2_70b", "lora", ["parallelism.tp=2", "parallelism.pp=4", "parallelism.recompute=selective"]),
    ("llama2_7b", "lora", ["data.packed=true", "train.seq_length=4096"]),
    ("llama2_7b", "ptuning", ["cluster.nodes=3", "parallelism.tp=2", "parallelism.pp=2", "train.global_batch_size=120"]),
    # recipe=fast: NVIDIA's performance settings (O2, mcore distributed optimizer, precision bf16)
    ("llama2_70b", "lora", ["recipe=fast", "cluster.nodes=2"]),
    ("llama2_7b", "sft", ["recipe=fast"]),
    ("llama2_7b", "sft", ["recipe=fast", "train.optimizer_dtype=bf16"]),  # Apex's bf16 state (optim.dtype)
    ("llama2_13b", "ptuning", ["recipe=fast"]),  # unpacked: NeMo cannot pack P-tuning (conf/recipe_method/)
]


def _with_room(model, method, overrides):
    """70B pretraining's design-guide layout (TP 4 x PP 4) needs at least 2 nodes."""
    if (model, method) == ("llama2_70b", "pretrain") and not any(o.startswith("cluster.nodes=") for o in overrides):
        return ["cluster.nodes=4", *overrides]
    return overrides


CASES = [(mo, me, _with_room(mo, me, ov)) for mo in MODELS for me in METHODS for ov in LAYOUTS.values()
         if not (me in ("pretrain", "ptuning") and "data.packed=true" in ov)] + PINNED  # packing: LoRA and SFT only


def _template(method: str) -> dict:
    kind = "pretrain" if method == "pretrain" else "finetune"
    return OmegaConf.to_container(OmegaConf.load(REF / TEMPLATES[kind]), resolve=False)


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_leaves(v, key + "."))
        else:
            out[key] = v
    return out


def _accepts_anything(nemo_value) -> bool:
    """null, ??? (mandatory) and ${...} interpolations in NeMo's YAML do not fix a type."""
    return nemo_value is None or nemo_value == "???" or (isinstance(nemo_value, str) and "${" in nemo_value)


def _plan(model, method, overrides):
    return make_plan(compose([f"model={model}", f"method={method}", *overrides]))


def contract_violations(cfg: dict, template: dict) -> list:
    """Every key of ``cfg`` that NeMo's ``template`` does not know, or whose type differs."""
    nemo = _leaves(template)
    problems = []
    for key, value in _leaves(cfg).items():
        if key in nemo:
            expected = nemo[key]
            if _accepts_anything(expected):
                continue
            if key in WIDENED_TYPES:
                ok = type(value) in WIDENED_TYPES[key]
            else:  # exact: bool is not int, int is not float (val_check_interval 2 vs 2.0 differ in NeMo)
                ok = kind(value) == kind(expected)
            if not ok:
                problems.append(f"{key}: {kind(value)} {value!r}, NeMo has {kind(expected)} {expected!r}")
        elif key in DELIBERATE_ADDITIONS:
            if type(value) not in DELIBERATE_ADDITIONS[key].types:
                problems.append(f"{key}: {type(value).__name__}, listed as {DELIBERATE_ADDITIONS[key].types}")
        elif any(_accepts_anything(nemo.get(key[:i])) and key[:i] in nemo
                 for i in range(len(key)) if key[i] == "."):
            continue  # below a key NeMo leaves open (null): any structure goes
        else:
            problems.append(f"{key}: not in NeMo's YAML and not a deliberate addition")
    return problems


@needs_reference
@pytest.mark.parametrize("model,method,overrides", CASES,
                         ids=[f"{mo}-{me}-{'_'.join(ov) or 'auto'}" for mo, me, ov in CASES])
def test_rendered_config_honours_nemo_contract(model, method, overrides):
    plan = _plan(model, method, overrides)
    text = render_nemo_yaml(plan, RUN_DIR)  # runs check_nemo_config too
    # Read back the way NeMo's Hydra reads it, so YAML typing (1e-05, null, bools) is part of the test.
    cfg = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    assert cfg == build_config(plan, RUN_DIR)
    template = _template(method)
    assert contract_violations(cfg, template) == []
    missing = set(_leaves(template)) - set(_leaves(cfg))
    assert not missing, f"the rendered config replaces NeMo's YAML but lacks {sorted(missing)}"


@needs_reference
def test_contract_checker_catches_unknown_keys_and_wrong_types():
    """The checker itself must be able to fail (else the contract test above proves nothing)."""
    plan = _plan("llama2_7b", "lora", [])
    cfg = build_config(plan, RUN_DIR)
    template = _template("lora")
    bad = copy.deepcopy(cfg)
    bad["trainer"]["val_check_interval"] = float(bad["trainer"]["val_check_interval"])  # epoch fraction in NeMo
    bad["model"]["megatron_amp_O2"] = 1
    bad["model"]["peft"]["lora_tuning"]["adapter_dimm"] = 32
    bad["model"]["optim"]["lr"] = "1e-4"
    problems = contract_violations(bad, template)
    assert len(problems) == 4, problems
    assert any("adapter_dimm" in p and "not in NeMo" in p for p in problems)


@needs_reference
def test_every_deliberate_addition_is_really_absent_from_nemo_and_explained():
    """A listed addition that NeMo's finetuning or llama YAML already has, or without a why, is stale."""
    finetune, llama = _leaves(_template("lora")), _leaves(_template("pretrain"))
    for key, addition in DELIBERATE_ADDITIONS.items():
        assert key not in finetune or key not in llama, f"{key} is in both NeMo YAMLs: not an addition"
        assert len(addition.why) > 20 and addition.types


# ----------------------------------------------------------------------------- traps
def _lora_cfg():
    plan = _plan("llama2_7b", "lora", [])
    return plan, build_config(plan, RUN_DIR)


def _refused(cfg, plan, match):
    with pytest.raises(UserError, match=match) as info:
        check_nemo_config(cfg, plan)
    assert "\n" not in str(info.value)
    return info.value


def test_trap_file_names_must_be_a_list():
    plan, cfg = _lora_cfg()
    cfg["model"]["data"]["train_ds"]["file_names"] = "/data/dolly/training.jsonl"
    _refused(cfg, plan, "file_names must be a non-empty list")
    plan, cfg = _lora_cfg()
    cfg["model"]["data"]["validation_ds"]["file_names"] = []
    _refused(cfg, plan, "validation_ds.file_names must be a non-empty list")


def test_trap_probabilities_must_match_files_and_sum_to_one():
    plan, cfg = _lora_cfg()
    cfg["model"]["data"]["train_ds"]["file_names"].append("/data/dolly/more.jsonl")
    _refused(cfg, plan, "one entry per file")
    plan, cfg = _lora_cfg()
    cfg["model"]["data"]["train_ds"]["concat_sampling_probabilities"] = None
    _refused(cfg, plan, "one entry per file")
    plan, cfg = _lora_cfg()
    cfg["model"]["data"]["train_ds"]["concat_sampling_probabilities"] = [0.5]
    _refused(cfg, plan, "summing to 1")


def test_trap_packed_needs_micro_batch_one():
    plan = _plan("llama2_7b", "lora", ["data.packed=true"])
    cfg = build_config(plan, RUN_DIR)
    check_nemo_config(cfg, plan)  # MBS 1: fine
    cfg["model"]["micro_batch_size"] = 2
    _refused(cfg, plan, "packed sequences need micro batch size 1")
    with pytest.raises(UserError, match="micro_batch_size=1"):  # and the recipe cannot ask for it at all
        compose(["data.packed=true", "train.micro_batch_size=2"])


def test_trap_devices_must_equal_tasks_per_node():
    plan, cfg = _lora_cfg()
    cfg["trainer"]["devices"] = 4
    _refused(cfg, plan, "tasks per node")
    plan, cfg = _lora_cfg()
    cfg["trainer"]["num_nodes"] = 2
    _refused(cfg, plan, "cluster.nodes")


def test_trap_max_steps_must_be_positive_and_validation_outside_the_timing():
    for bad in (0, -1, 50.0):
        plan, cfg = _lora_cfg()
        cfg["trainer"]["max_steps"] = bad
        _refused(cfg, plan, "max_steps")
    plan = _plan("llama2_7b", "lora", ["run.mode=timing"])
    cfg = build_config(plan, RUN_DIR)
    cfg["trainer"]["val_check_interval"] = 10
    _refused(cfg, plan, "inside the measured steps")
    plan, cfg = _lora_cfg()  # run.mode=train: validation every N steps is the point
    cfg["trainer"]["val_check_interval"] = 0
    _refused(cfg, plan, "inside the measured steps")


def test_trap_gbs_multiple_of_mbs_times_dp():
    plan, cfg = _lora_cfg()  # DP 8
    cfg["model"]["global_batch_size"] = 100
    _refused(cfg, plan, "not a multiple of micro_batch_size x DP = 1 x 8")


def test_trap_ptuning_min_lr_with_pipeline_parallel():
    plan = _plan("llama2_7b", "ptuning", ["parallelism.pp=2", "method.min_lr=1e-5"])
    with pytest.raises(UserError, match="min_lr 0.0 for prompt learning"):
        render_nemo_yaml(plan, RUN_DIR)
    render_nemo_yaml(_plan("llama2_7b", "ptuning", ["method.min_lr=1e-5"]), RUN_DIR)  # PP 1: allowed
    render_nemo_yaml(_plan("llama2_7b", "ptuning", ["parallelism.pp=2"]), RUN_DIR)  # min_lr 0.0: allowed


def test_trap_missing_nemo_path_for_fine_tuning():
    for method in ("sft", "lora", "ptuning"):
        plan = _plan("llama2_7b", method, ["model.nemo_path=null"])
        with pytest.raises(UserError, match="model.nemo_path is not set"):
            render_nemo_yaml(plan, RUN_DIR)
    render_nemo_yaml(_plan("llama2_7b", "pretrain", ["model.nemo_path=null"]), RUN_DIR)  # pretrain: none needed


def test_trap_sequence_parallel_without_tensor_parallel():
    """The door refuses the pin (vdkit.rules.contradictions) and the plan never asks it at TP 1
    (vdkit.planner.plan.effective_sp); a config that says it anyway is refused."""
    plan = _plan("llama2_7b", "lora", ["parallelism.tp=1"])
    cfg = build_config(plan, RUN_DIR)
    assert cfg["model"]["sequence_parallel"] is False
    cfg["model"]["sequence_parallel"] = True
    _refused(cfg, plan, "sequence_parallel=true with TP 1")


def test_trap_optimizer_disagrees_with_distributed_optimizer():
    plan = _plan("llama2_7b", "sft", ["parallelism.distributed_optimizer=false"])
    with pytest.raises(UserError, match="method.optimizer=fused_adam"):
        render_nemo_yaml(plan, RUN_DIR)
    render_nemo_yaml(_plan("llama2_7b", "sft", ["parallelism.distributed_optimizer=false",
                                                "method.optimizer=fused_adam"]), RUN_DIR)


def test_trap_interleaved_pipeline_needs_micro_batches_multiple_of_pp():
    plan = _plan("llama2_13b", "sft", ["parallelism.tp=1", "parallelism.pp=4", "parallelism.vp=10"])
    cfg = build_config(plan, RUN_DIR)
    check_nemo_config(cfg, plan)
    cfg["model"]["global_batch_size"] = 2 * 6  # DP 2: 6 micro batches, not a multiple of PP 4
    _refused(cfg, plan, "multiple of PP=4")


def test_trap_pretrain_data_prefix_and_tokenizer():
    plan = _plan("llama2_7b", "pretrain", [])
    cfg = build_config(plan, RUN_DIR)
    cfg["model"]["data"]["data_prefix"] = ["/data/pile/my-llama_00_text_document"]
    _refused(cfg, plan, r"\[weight, path")
    cfg = build_config(plan, RUN_DIR)
    cfg["model"]["tokenizer"]["model"] = None
    _refused(cfg, plan, "tokenizer.model is not set")


@pytest.mark.parametrize("overrides,match", [
    (["data=synthetic"], "data.data_dir is not set"),
    (["data.data_dir=data/dolly"], "not an absolute path"),
    (["data.validation_files=[]"], "data.validation_files is empty"),
    (["model.nemo_path=models/llama2-7b.nemo"], "model.nemo_path=models/llama2-7b.nemo is not an absolute path"),
    (["run.results_dir=shared/results"], "run.results_dir=shared/results is not an absolute path"),
])
def test_recipe_values_nemo_cannot_take_are_one_line_errors(overrides, match):
    from omegaconf import OmegaConf

    from vdkit.composition.config import recipe_from_dict

    # Composition makes paths absolute (issue 12, item 10); a recipe.yaml edited by hand is not composed,
    # so the NeMo renderer still refuses a relative path it would hand to every node.
    paths = [o for o in overrides if o.split("=")[0] in ("data.data_dir", "model.nemo_path", "run.results_dir")]
    plan = _plan("llama2_7b", "lora", [o for o in overrides if o not in paths])
    if paths:
        data = OmegaConf.to_container(OmegaConf.merge(plan.recipe.to_dict(), OmegaConf.from_dotlist(paths)))
        plan = make_plan(recipe_from_dict(data))
    with pytest.raises(UserError, match=match) as info:
        render_nemo_yaml(plan, RUN_DIR)
    assert "\n" not in str(info.value) and "fix:" in str(info.value)


# ----------------------------------------------------------------------------- NVIDIA's recipe
from vdkit.recipes.nemo.contract import (NOT_IN_NEMO_1_23, NVIDIA_PRETRAIN_BY_SIZE,  # noqa: E402
                                         PRETRAIN_DEPARTURES, nvidia_pretrain_settings)


def _dotted(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("model,nodes", [("llama2_7b", 1), ("llama2_13b", 2), ("llama2_70b", 6)])
def test_pretraining_is_nvidias_recipe_except_the_listed_departures(model, nodes):
    plan = _plan(model, "pretrain", [f"cluster.nodes={nodes}"])
    cfg = OmegaConf.to_container(OmegaConf.create(render_nemo_yaml(plan, RUN_DIR)), resolve=True)
    nvidia = nvidia_pretrain_settings(model)
    assert nvidia, f"no NVIDIA settings for {model}"
    differ = []
    for key, value in nvidia.items():
        rendered = _dotted(cfg, key) if key != "model.ub_tp_comm_overlap" else cfg["model"].get("ub_tp_comm_overlap")
        same = rendered == value or (isinstance(value, float) and rendered == pytest.approx(value))
        if not same:
            differ.append(key)
    unexplained = [k for k in differ if k not in PRETRAIN_DEPARTURES]
    assert not unexplained, f"rendered values differ from NVIDIA's without a listed reason: {unexplained}"
    for key in NOT_IN_NEMO_1_23:
        assert key.split(".", 1)[1] not in cfg["model"]


def test_70b_pretraining_on_six_nodes_has_nvidias_pipeline_and_optimizer_settings():
    plan = _plan("llama2_70b", "pretrain", ["cluster.nodes=6"])
    model = OmegaConf.to_container(OmegaConf.create(render_nemo_yaml(plan, RUN_DIR)), resolve=True)["model"]
    assert model["virtual_pipeline_model_parallel_size"] > 1
    assert model["overlap_p2p_comm"] is True and model["batch_p2p_comm"] is False
    assert model["gradient_accumulation_fusion"] is True
    assert model["bias_activation_fusion"] is True and model["bias_dropout_add_fusion"] is True
    assert model["gc_interval"] == 100 and model["use_flash_attention"] is True
    assert model["init_method_std"] == NVIDIA_PRETRAIN_BY_SIZE["llama2_70b"]["model.init_method_std"] == 0.008944
    assert model["optim"]["betas"] == [0.9, 0.95]
    assert model["optim"]["lr"] == 1.5e-4 and model["optim"]["sched"]["min_lr"] == 1e-5
    assert model["optim"]["overlap_grad_sync"] is True and model["optim"]["overlap_param_sync"] is True
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"]) == (4, 4)  # the guide's
    assert model["global_batch_size"] == 144


def test_every_departure_names_a_reason_and_a_real_nvidia_key():
    keys = set().union(*(nvidia_pretrain_settings(m) for m in NVIDIA_PRETRAIN_BY_SIZE))
    for key, why in PRETRAIN_DEPARTURES.items():
        assert key in keys and len(why) > 15


def test_fine_tuning_keeps_the_design_guides_settings_unless_the_fast_recipe_asks():
    guide = build_config(_plan("llama2_7b", "sft", []), RUN_DIR)["model"]
    assert guide["optim"]["betas"] == [0.9, 0.98]  # NeMo's default, as the design guide ran
    assert "gradient_accumulation_fusion" not in guide and "gc_interval" not in guide
    fast = build_config(_plan("llama2_7b", "sft", ["train.fused_kernels=true"]), RUN_DIR)["model"]
    assert fast["gradient_accumulation_fusion"] is True and fast["use_flash_attention"] is True
    lora = build_config(_plan("llama2_7b", "lora", ["train.fused_kernels=true"]), RUN_DIR)["model"]
    assert "gradient_accumulation_fusion" not in lora  # needs O2 main gradients: full-parameter only


def test_only_the_tests_that_read_nemo_yamls_may_skip_without_them():
    """An outside checkout has no ../shared: the trap tests must still run there (issue 12, item 17)."""
    import inspect
    import sys

    module = sys.modules[__name__]
    assert not getattr(module, "pytestmark", None), "a module-wide skip would hide the trap tests"
    for name, fn in vars(module).items():
        if not name.startswith("test_") or not callable(fn):
            continue
        marked = any(m.name == "skipif" for m in getattr(fn, "pytestmark", []))
        reads = "_template(" in inspect.getsource(fn) and name != "test_only_the_tests_that_read_nemo_yamls_may_skip_without_them"
        assert marked == reads, f"{name}: {'skips without reading' if marked else 'reads without the skip'}"


def test_nvidias_published_runs_are_fitted_at_the_layout_their_launcher_ran():
    """The examples README's Llama 2 70B BF16 row (Feb 2024, nemo:24.01: launcher 24.01's llama2_70b.yaml) ran VP 20;
    the launcher's VP 5 came with 24.09. A fitted row pinned at another VP fits the step time of a pipeline that did
    not run."""
    from vdkit.planner.predict import calibration
    from vdkit.recipes.nemo.contract import nvidia_pretrain_at

    key = "model.virtual_pipeline_model_parallel_size"
    assert [nvidia_pretrain_at("llama2_70b", key, t) for t in ("23.08.03", "24.01", "24.07", "24.09", "24.12")] == \
        [20, 20, 20, 5, 5]
    assert NVIDIA_PRETRAIN_BY_SIZE["llama2_70b"][key] == nvidia_pretrain_at("llama2_70b", key, "24.12")
    rows = {r["name"]: r["overrides"] for r in calibration()["anchors"]["runs"]}
    assert f"parallelism.vp={nvidia_pretrain_at('llama2_70b', key, '24.01')}" in rows["70B pretrain BF16 64 GPUs"]
    # The table's by_size is one release's (the newest): every value that changed agrees with by_launcher there.
    from vdkit.composition.config import nvidia_pretrain_tables
    for model, changed in nvidia_pretrain_tables()["by_launcher"].items():
        for knob in changed:
            assert NVIDIA_PRETRAIN_BY_SIZE[model].get(knob) == nvidia_pretrain_at(model, knob, "24.12"), (model, knob)
    # The 13B row of the same README ran launcher 24.01's llama2_13b.yaml: TP 2 PP 1 (TP 1 PP 4 from 24.03.01).
    for knob, name in (("model.tensor_model_parallel_size", "tp"), ("model.pipeline_model_parallel_size", "pp")):
        assert f"parallelism.{name}={nvidia_pretrain_at('llama2_13b', knob, '24.01')}" in rows["13B pretrain BF16 16 GPUs"]
