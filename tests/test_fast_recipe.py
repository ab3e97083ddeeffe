"""The fast recipe: the guide's samples, packed, fused kernels, the model's layout - at least 10x sooner."""
import math

import pytest
from omegaconf import OmegaConf

from vdkit.composition.config import compose
from vdkit.render.sweep import load_sweep, sweep_cells
from vdkit.planner.plan import make_plan
from vdkit.validation import report, tables

GUIDE_SAMPLES = 1000 * 128  # Table 9: 1000 steps of GBS 128, one Dolly sample per sequence


@pytest.fixture(scope="module")
def predictions():
    """(model, GPUs, method) -> (predicted minutes, guide's recipe; fast recipe, same samples): the planned table."""
    return {(c.model, c.gpus, c.method): (c.predicted, c.predicted_fast) for c in report.build("table9").cells}


def test_fast_recipe_trains_on_the_guides_samples():
    plan = make_plan(compose(["recipe=fast"]))
    r, step = plan.recipe, plan.prediction.step
    assert r.data.packed and r.train.fused_kernels and r.train.micro_batch_size == 1
    # target_steps (conf/recipe/fast.yaml) = the fewest whole steps that cover the guide's samples
    assert r.train.target_steps == math.ceil(GUIDE_SAMPLES / step.samples_per_step)
    # and each step carries about the guide's 128 samples (the optimizer sees comparable batches)
    assert 0.9 * 128 <= step.samples_per_step <= 1.2 * 128


def test_the_guide_recipe_is_the_default():
    r = compose([])
    assert not r.data.packed and not r.train.fused_kernels and r.train.global_batch_size == 128


def test_the_fast_recipe_is_for_customization_only():
    from vdkit.errors import UserError

    with pytest.raises(UserError, match="data.packed=true is for fine-tuning data"):
        compose(["recipe=fast", "method=pretrain"])


def test_table9_fast_has_every_table9_cell():
    fast = load_sweep("table9_fast")
    # the same timing runs as table9, with only the recipe changed
    assert fast["base"] == [*load_sweep("table9")["base"], "recipe=fast"]
    assert fast["cells"] == load_sweep("table9")["cells"]


def test_fast_is_at_least_ten_times_sooner_in_every_published_cell_per_method(predictions):
    """Per method, since the methods get there differently: LoRA and SFT pack ~34 samples into a row;
    P-tuning stays unpacked (NeMo cannot pack it) with the guide's batches and gains from the fused path alone."""
    published = {(c["model"], c["gpus"], c["method"]): c["minutes"] for c in tables.load_published("table9")["cells"]}
    timed = {k: v for k, v in published.items() if v is not None}
    assert len(timed) == 19
    for method in ("lora", "ptuning", "sft"):
        cells = {k: v for k, v in timed.items() if k[2] == method}
        assert cells, method
        for key, minutes in cells.items():
            guide, fast = predictions[key]
            assert guide is not None and fast is not None, key
            assert minutes / fast >= 10, f"{key}: published {minutes} min, fast predicted {fast:.1f} min"
    # the guide's N/A cells: 70B SFT on 8 GPUs cannot run in either recipe; on 16 it fits the H100's 85.5 GB
    # (81,559 MiB) in the borderline band, so both recipes predict it (the guide published no time)
    assert predictions[("llama2_70b", 8, "sft")] == (None, None)
    assert None not in predictions[("llama2_70b", 16, "sft")]


def test_the_fast_recipe_leaves_ptuning_unpacked_at_nemos_defaults():
    """NeMo swaps a sequence's first virtual_tokens embeddings for the prompt's: a packed row would lose
    its first sample's first tokens and prompt no other sample. recipe=fast keeps P-tuning unpacked
    (conf/recipe_method/fast_ptuning.yaml) with the guide's batches and samples, and refuses it packed."""
    from vdkit.errors import UserError

    plan = make_plan(compose(["recipe=fast", "method=ptuning"]))
    r = plan.recipe
    assert not r.data.packed and r.train.fused_kernels and r.parallelism.distributed_optimizer
    assert (r.train.micro_batch_size, r.train.global_batch_size, r.train.seq_length) == (1, 128, 2048)
    assert plan.prediction.step.samples_per_step * r.train.target_steps == GUIDE_SAMPLES
    # the command line still wins over the recipe's per-method values
    assert compose(["recipe=fast", "method=ptuning", "train.micro_batch_size=2"]).train.micro_batch_size == 2
    for cell in sweep_cells("table9_fast"):
        assert compose(cell).data.packed == ("method=ptuning" not in cell), cell
    with pytest.raises(UserError, match="data.packed=true with method=ptuning"):
        compose(["recipe=fast", "method=ptuning", "data.packed=true"])


@pytest.mark.parametrize("cell", [c for c in sweep_cells("table9_fast")
                                  if "model=llama2_70b" not in c or "method=sft" not in c][::5])
def test_table9_fast_renders(cell, tmp_path):
    from vdkit.recipes.nemo import render_nemo_yaml

    plan = make_plan(compose(cell))
    assert plan.feasible
    model = OmegaConf.to_container(OmegaConf.create(render_nemo_yaml(plan, tmp_path)), resolve=True)["model"]
    if "method=ptuning" in cell:  # unpacked, NeMo's P-tuning defaults
        assert "packed_sequence" not in model["data"]["train_ds"]
        assert model["data"]["train_ds"]["max_seq_length"] == 2048 and model["global_batch_size"] == 128
        assert model["micro_batch_size"] == 1
    else:
        assert model["data"]["train_ds"]["packed_sequence"] is True
        assert all(f.endswith(".npy") for f in model["data"]["train_ds"]["file_names"])  # NeMo 1.23 np.loads them
        assert model["data"]["train_ds"]["max_seq_length"] == 4096 and model["global_batch_size"] == 4
    assert model["bias_activation_fusion"] is True and model["use_flash_attention"] is True


def test_report_shows_published_predicted_guide_and_fast_side_by_side():
    # The planned table (no run directories) plans the published cells, the guide's recipe and the fast one.
    table = report.build("table9")
    cell = next(c for c in table.cells if (c.model, c.gpus, c.method) == ("llama2_7b", 4, "lora"))
    assert cell.published == 102 and cell.predicted and cell.predicted_fast
    assert cell.predicted_fast * 10 <= cell.published
    from vdkit.validation.table_output import cell_dict, to_markdown

    md = to_markdown(table)
    assert "predicted for the fast recipe" in md
    assert f"102 / {cell.predicted:.3g} / {cell.predicted_fast:.3g}" in md
    d = cell_dict(table, cell)
    assert d["predicted_minutes"] and d["predicted_fast_minutes"]


def test_a_reported_cell_is_predicted_by_its_runs_plan_json(tmp_path):
    """With run directories, a cell's prediction is its run's plan.json's: nothing is planned at report time."""
    import json

    from helpers import make_run
    from vdkit.run.rundir import PLAN_FILE

    run = make_run(tmp_path, ["model=llama2_7b", "method=lora", "cluster.gpus_per_node=4"])
    data = json.loads((run / PLAN_FILE).read_text())
    step = data["prediction"]["step"]  # what the run was rendered with, whatever the planner says today
    step.update(compute_s=0.75, overhead_s=0.0, communication_s=0.0, bubble_s=0.0, optimizer_s=0.0)
    (run / PLAN_FILE).write_text(json.dumps(data))
    ran = next(c for c in report.build("table9", [run]).cells if (c.model, c.gpus, c.method) == ("llama2_7b", 4, "lora"))
    assert ran.predicted == pytest.approx(0.75 * 1000 / 60) and ran.predicted_fast is None


@pytest.mark.parametrize("sweep", ["table9", "table9_fast"])
def test_a_prediction_predicts_what_is_rendered(sweep, tmp_path):
    """The step-time model predicts recipe=fast on NVIDIA's fused path (its constants come from NVIDIA's
    runs); the rendered config must then carry NVIDIA's performance settings, and the guide's recipe
    (predicted on NeMo's unfused stack) must not."""
    from vdkit.planner.predict import _fused_path
    from vdkit.recipes.nemo import render_nemo_yaml
    from vdkit.recipes.nemo.performance import PERFORMANCE_SETTINGS

    cells = [c for c in sweep_cells(sweep) if "model=llama2_70b" not in c or "method=sft" not in c][::4]
    for cell in cells:
        plan = make_plan(compose(cell))
        cfg = OmegaConf.to_container(OmegaConf.create(render_nemo_yaml(plan, tmp_path)), resolve=True)
        model, trainer = cfg["model"], cfg["trainer"]
        nvidia = (model["megatron_amp_O2"] is True and trainer["precision"] == PERFORMANCE_SETTINGS["trainer.precision"]
                  and model["optim"]["name"] == PERFORMANCE_SETTINGS["model.optim.name"] == "distributed_fused_adam"
                  and model.get("bias_activation_fusion") is True and model.get("use_flash_attention") is True)
        assert _fused_path(plan.recipe) == nvidia == (sweep == "table9_fast"), cell
        if sweep == "table9":  # NeMo's fine-tuning defaults, as the design guide ran them
            assert model["megatron_amp_O2"] == (not plan.recipe.is_peft) and trainer["precision"] == "bf16-mixed"
