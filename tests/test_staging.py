"""Weights and tokenizers staged once, for every engine (vdkit.recipes.common.staging).

Every cell of every shipped sweep, and the Bridge engine on the Table 9 and training shapes, rendered in
memory (vdkit.render.prepare, nothing written): no file of any cluster job names a Hugging Face hub id (the jobs
run offline); the conversion jobs take the whole node; a token comes from run.secrets_file at run time,
never from the script; a hub-id tokenizer is refused at the door.
"""
from __future__ import annotations

import re

import pytest

from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.planner.plan import make_plan
from vdkit.render.prepare import prepare
from vdkit.render.sweep import override_sets, plan_cells

HUB_ID = re.compile(r"\b(meta-llama|facebook|mistralai|huggingface\.co|hf\.co)/")
SWEEPS = ["table9", "table9_fast", "training", "alpaca_opt", "llama31_roce"]  # demo: this machine's local cells
BRIDGE = [("table9", ["engine=bridge"]), ("training", ["engine=bridge"])]  # Bridge's shapes (no P-tuning there)


def _rendered(sweep, extra=()):
    sets = override_sets(list(extra), False, sweep)
    for plan in plan_cells(sets, True, "render", require_fit=False):
        if not plan.feasible or (plan.recipe.engine.name == "bridge" and plan.recipe.method.name == "ptuning"):
            continue
        yield plan, prepare(plan, "/tmp/vdkit-staging-test", check_mounts=False).files


@pytest.mark.parametrize("sweep, extra", [(s, ()) for s in SWEEPS] + BRIDGE)
def test_no_rendered_cluster_job_names_a_hub_id(sweep, extra):
    cells = 0
    for plan, files in _rendered(sweep, extra):
        cells += 1
        for name, text in files.items():
            if isinstance(text, bytes):
                continue
            hit = HUB_ID.search(text)
            assert hit is None, f"{sweep} {plan.recipe.run_name} {name}: {text[max(0, hit.start() - 80):hit.end() + 40]}"
    assert cells >= 2


def test_conversion_jobs_take_the_whole_node_for_both_engines():
    for engine in ("nemo", "bridge"):
        plan = make_plan(compose([f"engine={engine}", "model=llama2_70b", "method=sft", "cluster.nodes=4"]))
        job = prepare(plan, "/tmp/vdkit-staging-test", check_mounts=False).files["import_hf.sbatch"]
        assert "#SBATCH --exclusive" in job and "#SBATCH --mem=0" in job, engine
        assert "/shared/models/Llama-2-70b-hf" in job, engine  # the staged HF copy, not a hub id
    assert "scripts/nlp_language_modeling/convert_hf_llama_to_nemo.py --in-file /shared/models/Llama-2-70b-hf " \
           "--out-file /models/llama2-70b.nemo --precision bf16" in \
           prepare(make_plan(compose(["model=llama2_70b", "method=lora", "cluster.nodes=2"])), "/tmp/x",
                   check_mounts=False).files["import_hf.sbatch"]


def test_a_hub_id_converts_only_with_the_token_read_at_run_time(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.write_text("HF_TOKEN=hf_secret_value_123\n")
    secrets.chmod(0o600)
    plan = make_plan(compose(["engine=bridge", "method=lora", "model.hf_path=meta-llama/Llama-2-7b-hf",
                              "model.megatron_path=/models/b"]))
    with pytest.raises(UserError, match="no token to download with"):
        prepare(plan, tmp_path, check_mounts=False)
    plan = make_plan(compose(["engine=bridge", "method=lora", "model.hf_path=meta-llama/Llama-2-7b-hf",
                              "model.megatron_path=/models/b", "data.tokenizer_model=/shared/models/tok",
                              f"run.secrets_file={secrets}"]))
    job = prepare(plan, tmp_path, check_mounts=False).files["import_hf.sbatch"]
    assert f"VDKIT_SECRETS_FILE={secrets}" in job and "hf_secret_value_123" not in job


def test_a_hub_id_tokenizer_is_refused_at_the_door(tmp_path):
    plan = make_plan(compose(["engine=bridge", "method=pretrain", "model.hf_path=meta-llama/Llama-2-7b-hf"]))
    with pytest.raises(UserError, match="staged path"):
        prepare(plan, tmp_path, check_mounts=False)


def test_check_mounts_checks_the_staged_tokenizer_and_the_packed_file(tmp_path):
    from vdkit.render.prepare import local_inputs

    plan = make_plan(compose(["engine=bridge", "method=pretrain", "data=synthetic"]))  # /shared: not on this machine
    with pytest.raises(UserError, match=r"model.hf_path \(the staged tokenizer\) /shared/models/Llama-2-7b-hf"):
        prepare(plan, tmp_path, check_mounts=True)
    plan = make_plan(compose(["recipe=fast", "method=lora", f"data.data_dir={tmp_path}"]))
    wanted = {what.split(" (")[0]: path for what, path, _ in local_inputs(plan, tmp_path)}
    assert wanted["packed training file"] == f"{tmp_path}/packed/llama2_7b/training.4096.npy"
    with pytest.raises(UserError, match="vdkit data pack .*training.jsonl .*training.4096.npy --tokenizer "
                                        "/shared/models/Llama-2-7b-hf --max-len 4096"):
        prepare(plan, tmp_path, check_mounts=True)
