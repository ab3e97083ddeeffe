"""vdkit.rules, module by module: each rule called directly on one composed recipe changed in one field.

The bad-input table (tests/bad_inputs/) drives the same rules through the CLI; here each module's
rules are tested where they live, with the boundary values, so a newcomer finds the rule and its test
side by side. One composition for the whole file (``base``); everything else is dataclass copies.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from vdkit.errors import UserError
from vdkit.rules import check_recipe, environment, families, numbers, overrides, paths, secrets


@pytest.fixture(scope="module")
def base():
    from vdkit.composition.config import compose

    return compose(["model=tiny_llama", "engine=reference", "data=synthetic", "cluster=local"])


def changed(recipe, key: str, value):
    """``recipe`` with ``section.field`` set to ``value`` (the schema's types are not re-checked)."""
    section, name = key.split(".", 1)
    return dataclasses.replace(recipe, **{section: dataclasses.replace(getattr(recipe, section), **{name: value})})


def one_line(exc: UserError) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# ----------------------------------------------------------------------------- numbers
def _outside(lo, lo_in, hi, hi_in, integer: bool):
    """Values just outside a domain (below it, and above it when it has a top)."""
    step = 1 if integer else 1e-9 * max(1.0, abs(lo))
    out = [lo - step if lo_in else lo]
    if hi != math.inf:
        out.append(hi if not hi_in else hi + step)
    return out


@pytest.mark.parametrize("key", sorted(numbers.DOMAINS))
def test_every_domain_refuses_its_edges_and_accepts_inside(base, key):
    lo, lo_in, hi, hi_in, fix = numbers.DOMAINS[key]
    section, name = key.split(".", 1)
    current = getattr(getattr(base, section), name)
    integer = isinstance(current, int) and not isinstance(current, bool) or (
        current is None and isinstance(lo, int) and lo >= 1)
    for bad in _outside(lo, lo_in, hi, hi_in, integer):
        with pytest.raises(UserError) as info:
            numbers.check_numbers(changed(base, key, int(bad) if integer else bad))
        assert info.value.what.startswith(f"{key}=") and fix in info.value.fix, one_line(info.value)
    inside = lo if lo_in else (lo + 1 if integer else lo + 0.5 * min(1.0, (hi - lo) if hi != math.inf else 1.0))
    numbers.check_numbers(changed(changed(base, "method.min_lr", 0.0), key, inside))  # no raise


def test_a_nan_anywhere_is_refused_by_name(base):
    with pytest.raises(UserError, match=r"method\.lr=nan is not a finite number"):
        numbers.check_numbers(changed(base, "method.lr", float("nan")))
    with pytest.raises(UserError, match=r"cluster\.gpu_memory_gb=inf"):
        numbers.check_numbers(changed(base, "cluster.gpu_memory_gb", math.inf))


def test_the_pair_rules(base):
    with pytest.raises(UserError, match="min_lr.*above method.lr"):
        numbers.check_numbers(changed(changed(base, "method.lr", 1e-5), "method.min_lr", 1e-4))
    with pytest.raises(UserError, match="max_nodes=1 is below cluster.min_nodes=2"):
        numbers.check_numbers(changed(changed(base, "cluster.min_nodes", 2), "cluster.max_nodes", 1))
    with pytest.raises(UserError, match="leaves nothing of the"):
        numbers.check_numbers(changed(changed(base, "cluster.gpu_memory_gb", 8.0), "cluster.memory_overhead_gb", 8.0))


def test_validate_fields_repeats_no_domain():
    """One home for a range: no field rule in vdkit.composition.fields compares a DOMAINS field with a number."""
    import ast
    import inspect

    from vdkit.composition import fields as field_rules

    tree = ast.parse(inspect.getsource(field_rules))
    fields = {k.split(".", 1)[1] for k in numbers.DOMAINS}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr in fields:
            if all(isinstance(c, ast.Constant) and isinstance(c.value, (int, float)) for c in node.comparators):
                found.append(f"fields.py:{node.lineno} {node.left.attr}")
    assert not found, found


# ----------------------------------------------------------------------------- families
def test_a_llama_block_is_built_from_llama_parts(base):
    families.check_architecture(base.model)  # tiny_llama is a llama
    with pytest.raises(UserError, match=r"model\.norm='layernorm' does not exist in the llama architecture"):
        families.check_architecture(dataclasses.replace(base.model, norm="layernorm"))
    with pytest.raises(UserError, match="model.activation=swiglu"):
        families.check_architecture(dataclasses.replace(base.model, activation="gelu"))


def test_opt_has_no_grouped_query_attention(base):
    opt = dataclasses.replace(base.model, arch="opt", norm="layernorm", activation="relu",
                              position_embedding="learned", num_attention_heads=4, num_query_groups=2)
    with pytest.raises(UserError, match="grouped-query attention") as info:
        families.check_architecture(opt)
    assert "model.num_query_groups=4" in info.value.fix
    families.check_architecture(dataclasses.replace(opt, num_query_groups=4))


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "ntk", "factor": 2.0}, "is not a RoPE scaling transformers builds"),
    ({"rope_type": "llama3", "factor": 8.0}, "has no low_freq_factor"),
    ({"rope_type": "linear", "factor": 0.5}, "factor=0.5 must be a finite number >= 1"),
    ({"rope_type": "linear", "factor": float("inf")}, "must be a finite number"),
])
def test_rope_scaling_is_one_transformers_builds(base, scaling, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        families.check_architecture(dataclasses.replace(base.model, rope_scaling=scaling))


def test_rope_scaling_llama3_with_its_keys_passes(base):
    families.check_architecture(dataclasses.replace(base.model, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}))


# ----------------------------------------------------------------------------- paths
def test_a_deepspeed_config_is_read_at_the_door(base, tmp_path):
    with pytest.raises(UserError, match="parallelism.deepspeed_config"):
        paths.check_files(changed(base, "parallelism.deepspeed_config", str(tmp_path / "ds.json")))


@pytest.mark.parametrize("name", ["", "  ", "..", "a/b", "x\0y"])
def test_run_name_is_a_plain_name(base, name):
    with pytest.raises(UserError, match="is not a plain name"):
        paths.check_names(changed(base, "run.name", name))


def test_run_out_dir_is_not_empty(base):
    with pytest.raises(UserError, match="run.out_dir is empty"):
        paths.check_names(changed(base, "run.out_dir", " "))
    paths.check_names(changed(base, "run.name", "llama2_7b_lora.try-2"))


# ----------------------------------------------------------------------------- environment
@pytest.mark.parametrize("name", ["PATH", "UID", "LD_PRELOAD", "SLURM_NTASKS", "MASTER_PORT", "VDKIT_X", "PMI_RANK"])
def test_job_breaking_names_are_denied(name):
    assert "breaks the job" in environment.denied_name(name)


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", ""])
def test_names_a_shell_cannot_export_are_denied(name):
    assert "not a shell variable name" in environment.denied_name(name)


def test_harmless_names_pass():
    assert environment.denied_name("NCCL_IB_GID_INDEX") is None and environment.denied_name("HF_HOME") is None


def test_cluster_env_refuses_a_denied_name_and_a_secret():
    environment.check_cluster_env({"NCCL_NVLS_ENABLE": "0"})
    with pytest.raises(UserError, match="cluster.env.LD_PRELOAD"):
        environment.check_cluster_env({"LD_PRELOAD": "/x.so"})
    with pytest.raises(UserError, match="looks like a secret") as info:
        environment.check_cluster_env({"WANDB_API_KEY": "abc"})
    assert "run.secrets_file" in info.value.fix
    with pytest.raises(UserError, match="cluster.env.HUB looks like a secret"):
        environment.check_cluster_env({"HUB": "hf_" + "a" * 30})


# ----------------------------------------------------------------------------- secrets
@pytest.mark.parametrize("key, value", [
    ("model.hf_path", "/models/hf_" + "A" * 34 + "/llama"),
    ("engine.container_image", "user:hunter2@registry.example.com/nemo:24.01"),
    ("data.data_dir", "https://bob:pw@example.com/data"),
    ("run.name", "-----BEGIN RSA PRIVATE KEY"),
])
def test_a_token_in_any_recipe_value_is_refused(base, key, value):
    with pytest.raises(UserError, match=key.replace(".", r"\.") + " looks like it holds a secret"):
        secrets.check_secret_values(changed(base, key, value))


def test_an_image_digest_is_not_a_password(base):
    secrets.check_secret_values(changed(base, "engine.container_image", "nvcr.io/nvidia/nemo@sha256:" + "a" * 64))


def _secrets_file(tmp_path, text: str, mode: int = 0o600):
    f = tmp_path / "secrets.env"
    f.write_text(text)
    f.chmod(mode)
    return str(f)


def test_secrets_file_mode_is_yours_alone(tmp_path):
    secrets.check_secrets_file(_secrets_file(tmp_path, "HF_TOKEN=x\n"), required=True)
    path = _secrets_file(tmp_path, "HF_TOKEN=x\n", 0o640)
    with pytest.raises(UserError, match="has mode 0640: it is open to its group") as info:
        secrets.check_secrets_file(path, required=True)
    assert info.value.fix.startswith("chmod 600 ")


def test_secrets_file_lines_never_echo_a_value(tmp_path):
    with pytest.raises(UserError, match="line 2: PATH is set by the shell"):
        secrets.check_secrets_file(_secrets_file(tmp_path, "# mine\nexport PATH=/x\n"), required=True)
    with pytest.raises(UserError, match="line 1: line 1 is not a NAME=value line") as info:  # a bare token
        secrets.check_secrets_file(_secrets_file(tmp_path, "hf_" + "b" * 40 + "\n"), required=True)
    assert "hf_b" not in str(info.value)


def test_a_missing_secrets_file_is_the_clusters_unless_required(tmp_path):
    secrets.check_secrets_file(str(tmp_path / "absent"), required=False)
    with pytest.raises(UserError, match="does not exist"):
        secrets.check_secrets_file(str(tmp_path / "absent"), required=True)
    with pytest.raises(UserError, match="is not a regular file"):
        secrets.check_secrets_file(str(tmp_path), required=True)


# ----------------------------------------------------------------------------- overrides
@pytest.mark.parametrize("line, multirun, words", [
    (["~model"], False, "deleting a config group or key is refused"),
    (["hydra.run.dir=/tmp"], False, "does not run as a Hydra app"),
    (["model=tiny_llama", "model=llama2_7b"], False, "model is given twice"),
    (["cluster.nodes=1,2"], False, "but -m was not given"),
    (["model=glob(*)"], True, "glob() sweeps are not supported"),
    (["recipe_method=fast_lora"], False, "recipe_method is chosen by recipe= and method="),
])
def test_override_syntax_vdkit_would_misread(line, multirun, words):
    with pytest.raises(UserError) as info:
        overrides.check_overrides(line, multirun=multirun)
    assert words in one_line(info.value)


def test_good_override_lines_pass():
    overrides.check_overrides(["model=llama2_7b", "cluster.nodes=1,2"], multirun=True)
    overrides.check_overrides(["model=tiny_llama", "model=llama2_7b"], duplicates=False)


def test_sweep_size_is_counted_before_expansion():
    overrides.check_sweep_size(["cluster.nodes=range(1,7)", "model=a,b,c"])  # 18 cells
    with pytest.raises(UserError, match="more than the 256"):
        overrides.check_sweep_size(["train.seed=range(0,1000000000)"])
    with pytest.raises(UserError, match="has 272"):
        overrides.check_sweep_size(["a=range(0,17)", "b=range(0,16)"])  # the product, not the sum
    overrides.check_cell_count(overrides.MAX_CELLS, "x")
    with pytest.raises(UserError, match="257 cells"):
        overrides.check_cell_count(overrides.MAX_CELLS + 1, "--sweep x")


# ----------------------------------------------------------------------------- the package's entry
def test_check_recipe_runs_every_module(base):
    check_recipe(base)
    for key, value, words in (("method.lr", -1.0, "method.lr"), ("model.norm", "layernorm", "llama architecture"),
                              ("run.name", "a/b", "plain name"), ("cluster.env", {"UID": "0"}, "cluster.env.UID"),
                              ("engine.container_image", "ghp_" + "c" * 36, "holds a secret")):
        with pytest.raises(UserError, match=words):
            check_recipe(changed(base, key, value))
