"""A hand-edited ``nemo.yaml`` held to what NeMo 1.23 reads, before the (slow) NeMo probe: `vdkit check`.

NeMo's scripts run with ``--config-path=<run dir> --config-name=nemo.yaml``, so the edited file is the whole
config NeMo composes, and its Hydra config is not struct: an unknown key is ignored in silence, a wrong type
or a nonsense count fails (or misbehaves) on the cluster, hours into a queue. The reference is what the kit
renders from the run's own recipe.yaml and plan.json (:func:`vdkit.recipes.nemo.render_nemo_yaml`, the same
function render uses): it holds every key of NeMo 1.23's own config for the script (tests/test_nemo_contract.py
reads NeMo's YAMLs and asserts it), plus the keys the kit adds on purpose
(:data:`vdkit.recipes.nemo.contract.DELIBERATE_ADDITIONS`, with their types). Against it:

- a key neither has -> refused, with the nearest known key (difflib);
- a value whose type differs from the rendered one (bool / int / float / str / list / mapping; an int where a
  float is rendered is fine, as is anything where the render has null) -> refused;
- a count NeMo needs positive (:data:`POSITIVE`) that is <= 0 -> refused;
- everything else (a new lr, another path) is accepted, and the keys that differ are listed.

Pure Python on the kit's side (yaml + omegaconf, as NeMo loads the file); no NeMo import. The comparison itself
is :mod:`vdkit.recipes.common.edits`, the one the bridge engine uses too; NeMo's knowledge stays here.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from vdkit.recipes.common import edits as common
from vdkit.recipes.common.edits import FIX_RERENDER
from vdkit.recipes.common.training_constants import CPU_PRECISION, GPU_PRECISION
from vdkit.recipes.nemo.runcheck.venv import NEMO_VERSION
from vdkit.run.rundir import NEMO_CONFIG_FILE as NEMO_CONFIG_FILE_NAME

# Keys (the last part of a dotted key, wherever it sits) whose value NeMo 1.23 / Lightning 2.0.7 need > 0, besides
# Megatron's sizes (common.MEGATRON_POSITIVE).
# trainer.max_steps: Lightning takes -1 (no limit), but NeMo 1.23 sizes its datasets from it:
# megatron_gpt_sft_model.py _build_dataset raises "Trainer max_steps must be set to a positive integer" for
# <= 0, and megatron_gpt_model.py asks for max_steps x GBS (negative) pretraining samples. val_check_interval:
# Lightning takes an int > 0 or a fraction in (0, 1]. The rest are sizes and counts (0 or less cannot build).
POSITIVE = common.MEGATRON_POSITIVE | frozenset({
    "devices", "num_nodes", "max_steps", "val_check_interval",
    "encoder_seq_length", "max_position_embeddings", "max_seq_length",
    "adapter_dim", "virtual_tokens", "bottleneck_dim", "embedding_dim",
})
# The numbers the command line holds to a range (common.Range; any *dropout key is a probability anyway).
RANGES = {"optim.lr": common.domain("method.lr"), "sched.min_lr": common.domain("method.min_lr"),
          "optim.weight_decay": common.domain("method.weight_decay"),
          "sched.warmup_steps": common.domain("method.warmup_steps"),
          "adapter_dim": common.domain("method.lora_adapter_dim")}
POSITIVE_WHY = {"max_steps": " (it sizes its datasets from it: Lightning's -1, no limit, fails there)"}
# Input paths besides the datasets' file_names (every *.file_names key): what the pre-flight and the mounts cover.
INPUT_KEYS = frozenset({"model.restore_from_path", "model.data.data_prefix", "model.tokenizer.model"})
INPUT_FIX = ("set the recipe's input (model.nemo_path, data.data_dir / data.train_files / data.validation_files / "
             "data.test_files, data.tokenizer_model)")
# Lightning's Timer (NeMo's StatelessTimer) reads a string duration with this pattern, else refuses it
# (lightning/pytorch/callbacks/timer.py:92, `Timer(duration=...)`): DD:HH:MM:SS.
TIMER_DURATION = r"(\d+):(\d\d):(\d\d):(\d\d)"
STACK = "NeMo " + ".".join(NEMO_VERSION.split(".")[:2])  # "NeMo 1.23", as its release names it


def _load(path: Path) -> dict:
    """nemo.yaml as NeMo reads it: OmegaConf's YAML loader (1e-4 is a float there), interpolations resolved.
    ValueError (one line) for a file NeMo could not compose."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vdkit.composition.files import load_yaml

    load_yaml(path, "NeMo config")  # size, aliases, FIFOs, syntax: the kit's bounded reader refuses first
    try:
        cfg = OmegaConf.load(path)
        data = OmegaConf.to_container(cfg, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ValueError(" ".join(str(exc).split()).split(" full_key:")[0]) from None
    if not isinstance(data, dict):
        raise ValueError("it is not a mapping of sections (trainer, exp_manager, model)")
    return data


def compare(run_dir: Path, render) -> Tuple[List[Tuple[str, str, str]], List[str]]:
    """The edits of ``run_dir/nemo.yaml`` against the kit's render of the run's own recipe and plan
    (``render(plan, run_dir)``: the engine's :func:`vdkit.recipes.nemo.render_nemo_yaml`, passed in so that this
    package, which the engine module imports, never imports it back).

    Returns (defects as (what, setting, fix), the keys whose value differs from the render). UserError
    (one line) for a recipe.yaml / plan.json the kit cannot read.
    """
    import yaml

    from vdkit.errors import UserError
    from vdkit.recipes.nemo.contract import DELIBERATE_ADDITIONS, WIDENED_TYPES
    from vdkit.run.rundir import NEMO_CONFIG_FILE, RECIPE_FILE, load_plan

    path = Path(run_dir) / NEMO_CONFIG_FILE
    try:  # a missing file, a FIFO, a directory: load_yaml's one line, never an open that blocks
        nested = _load(path)
        edited = common.flat(nested)
    except UserError as exc:
        return [(exc.what, NEMO_CONFIG_FILE, exc.fix or FIX_RERENDER)], []
    except ValueError as exc:
        return [(f"NeMo cannot compose {path}: {exc}", NEMO_CONFIG_FILE, f"correct the file, {FIX_RERENDER}")], []
    plan = load_plan(run_dir)
    try:
        rendered = common.flat(yaml.safe_load(render(plan, Path(run_dir).absolute())))
    except UserError as exc:
        return [(f"the kit cannot render this run's NeMo config to compare with: {exc.what}", RECIPE_FILE,
                 exc.fix or FIX_RERENDER)], []
    known = {**{k: (common.kind(v),) for k, v in rendered.items()},
             **{k: tuple(sorted({common.kind(t()) for t in a.types})) for k, a in DELIBERATE_ADDITIONS.items()
                if k not in rendered}}
    for k, types in WIDENED_TYPES.items():
        known[k] = tuple(sorted({common.kind(t()) for t in types}))

    def expect(key: str):
        if common.under_open(key, rendered):
            return common.OPEN  # below a key the render leaves null (open): any structure goes
        if key not in known:
            return None
        return common.OPEN if "null" in known[key] else common.Expect(known[key])

    defects, changed, removed = common.compare(
        path, edited, rendered, expect, stack=STACK, fix=FIX_RERENDER, positive=POSITIVE, positive_why=POSITIVE_WHY,
        unknown=f"{STACK} ignores it silently", known=known, ranges=RANGES)
    defects = [tuple(d) for d in defects]
    sections = [k for k in removed if "." not in k]
    if sections:  # NeMo's script reads cfg.trainer / cfg.exp_manager / cfg.model: it stops at once without one
        many = len(sections) > 1
        defects.append((f"{path} has no {', '.join(sections)} {'sections' if many else 'section'}: {STACK}'s script "
                        f"reads {'them' if many else 'it'}", sections[0],
                        f"restore it, {FIX_RERENDER}"))
    if not defects and (changed or removed):
        keys = [k for k in rendered if k in INPUT_KEYS or k.endswith(".file_names")]
        defects += ([tuple(d) for d in common.moved_input(edited, rendered, keys, STACK, INPUT_FIX,
                                                               strict={"model.restore_from_path"})]
                    or [tuple(d) for d in common.moved_output(edited, rendered, OUTPUT_KEYS, STACK, FIX_RERENDER)]
                    or _other_precision(edited, rendered)
                    or _clean_stop(edited, rendered) or _traps(nested, plan))
    return defects, changed + [f"{k} (removed)" for k in removed]


# Where NeMo writes the run's checkpoints and logs (common.moved_output); exp_manager's check_resume follows dirpath
# (exp_manager.py:358-366). Not exp_dir: with explicit_log_dir set, as rendered, NeMo ignores it (get_log_dir).
OUTPUT_KEYS = ("exp_manager.checkpoint_callback_params.dirpath", "exp_manager.explicit_log_dir")


# NeMo 1.23's torch_dtype_from_precision (nlp/parts/utils_funcs.py:43-55), which MegatronBaseModel builds the model in
# (megatron_base_model.py:125); any other value is its ValueError, the NeMo probe's line.
# The Lightning 2 spellings are the kit's constants' (training_constants: one home for "bf16-mixed" / "32-true").
DTYPES = {"bf16": "bf16", GPU_PRECISION: "bf16", "16": "fp16", "16-mixed": "fp16", "32": "fp32", CPU_PRECISION: "fp32"}


def _other_precision(edited: dict, rendered: dict) -> List[Tuple[str, str, str]]:
    """``trainer.precision`` edited to another dtype than the render's (the plan's): ``32`` on a bf16 plan loaded and
    passed, and the job ran in fp32 - twice the weights' and activations' bytes, several times the step time the plan's
    memory, time limit and cadence were made for. ``bf16`` for ``bf16-mixed`` is the same dtype and passes."""
    key = "trainer.precision"
    got, want = (DTYPES.get(str(d.get(key))) for d in (edited, rendered))
    if got is None or want is None or got == want:
        return []
    return [(f"{key}={edited[key]!r} in {NEMO_CONFIG_FILE_NAME} makes NeMo build the model in {got} "
             f"(torch_dtype_from_precision, utils_funcs.py:43), the plan's is {want} (rendered {rendered[key]!r}): its "
             "memory, step time and time limit are not this job's", key,
             f"keep {rendered[key]!r}, or plan another precision with train.precision, {FIX_RERENDER}")]


def _clean_stop(edited: dict, rendered: dict) -> List[Tuple[str, str, str]]:
    """``exp_manager.max_time_per_run``, NeMo's StatelessTimer (a Lightning ``Timer``): the job contract's clean stop
    before the allocation's limit. A string not DD:HH:MM:SS is the Timer's refusal at start-up (its pattern,
    :data:`TIMER_DURATION`: importing Lightning here would cost seconds); longer than the render's (the plan's stop
    lead), or gone, and Slurm kills the job before it saves."""
    import re

    from vdkit.run.rundir import NEMO_CONFIG_FILE

    def seconds(text: str):
        m = re.fullmatch(TIMER_DURATION, str(text).strip())
        return m and ((int(m[1]) * 24 + int(m[2])) * 60 + int(m[3])) * 60 + int(m[4])

    key = "exp_manager.max_time_per_run"
    asked, mine = edited.get(key), rendered.get(key)
    if mine is None or asked == mine:
        return []
    if asked is None:
        return [(f"{key} is gone from {NEMO_CONFIG_FILE}: NeMo would not stop before the allocation's limit, which "
                 "kills it without a checkpoint (the plan's clean stop)", key, f"put back {key}: {mine}, {FIX_RERENDER}")]
    if seconds(asked) is None:
        return [(f"{key}={asked!r}: Lightning's Timer (NeMo's StatelessTimer) refuses it at start-up: not a duration "
                 "in the format DD:HH:MM:SS (lightning/pytorch/callbacks/timer.py)", key,
                 f"DD:HH:MM:SS, at most the rendered {mine}, {FIX_RERENDER}")]
    if seconds(asked) > seconds(mine):
        return [(f"{key}={asked} is longer than the plan's {mine} (the allocation less its stop lead and start-up): "
                 "Slurm would kill the job at its time limit before NeMo stops and saves", key,
                 f"at most {mine}, {FIX_RERENDER}")]
    return []


def _traps(cfg: dict, plan) -> List[Tuple[str, str, str]]:
    """The traps the render refuses (:func:`vdkit.recipes.nemo.contract.check_nemo_config`, which the render runs
    on what it writes), run on the edited file: an edit of the right type can still be one NeMo or Lightning
    refuses at start-up (trainer.devices against srun's tasks, an eval batch its sampler cannot split, a
    val_check_interval above max_steps, min_lr above lr) or a run the plan was not made for (another sequence
    length). The first trap, one line."""
    from vdkit.errors import UserError
    from vdkit.recipes.nemo.contract import check_nemo_config
    from vdkit.run.rundir import NEMO_CONFIG_FILE

    try:
        check_nemo_config(cfg, plan, registry_probe=True)
    except UserError as exc:
        fix = f"{exc.fix}, {FIX_RERENDER}" if exc.fix else FIX_RERENDER
        return [(f"{exc.what} (in {NEMO_CONFIG_FILE}, edited)", getattr(exc, "setting", "") or NEMO_CONFIG_FILE, fix)]
    return []


def check(run_dir: Path, report, render) -> bool:
    """Add the comparison's lines to ``report`` (:class:`vdkit.run.jobcheck.Report`); True when the file may go on
    to NeMo's own code (no defect). ``render``: as for :func:`compare`."""
    from vdkit.recipes.common import steps_edit
    from vdkit.run.rundir import NEMO_CONFIG_FILE, load_plan

    defects, changed = compare(run_dir, render)
    if not defects:
        defects = _over_base(run_dir, changed)
    if not common.report([common.Defect(*d) for d in defects], changed, report, NEMO_CONFIG_FILE,
                         f"known to {STACK}, of the rendered type"):
        return False
    steps = (_load(Path(run_dir) / NEMO_CONFIG_FILE).get("trainer") or {}).get("max_steps")  # Lightning stops there
    return steps_edit.check(load_plan(run_dir), run_dir, f"{NEMO_CONFIG_FILE} trainer.max_steps", steps, report)


# NeMo 1.23 GPT model keys the base .nemo's own config holds (megatron_gpt_config.yaml): what its weights were trained
# as. A fine-tune's file does not carry them; merge_cfg_with copies every model key of the file over the restored config
# (nlp_adapter_mixins.py:452-454), so an added one is a different model: another RoPE, norm or activation trains the
# base's weights under another function with nothing refusing it, a size fails their load on the GPUs.
BASE_FIXED = frozenset({
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "max_position_embeddings", "position_embedding_type", "rotary_base", "rotary_percentage",
    "seq_len_interpolation_factor", "layernorm_epsilon", "normalization", "activation", "bias",
    "share_embeddings_and_output_weights", "make_vocab_size_divisible_by", "transformer_block_type",
    "normalize_attention_scores", "apply_query_key_layer_scaling", "headscale"})


def _over_base(run_dir: Path, changed) -> List[Tuple[str, str, str]]:
    """A fine-tune's nemo.yaml that sets a :data:`BASE_FIXED` model key: one line (the first such key)."""
    from vdkit.run.rundir import NEMO_CONFIG_FILE

    model = _load(Path(run_dir) / NEMO_CONFIG_FILE).get("model") or {}
    if "peft" not in model:
        return []
    for key in changed:
        name = key[len("model."):] if key.startswith("model.") else None
        if name in BASE_FIXED:
            return [(f"{key}={model.get(name)!r} in {NEMO_CONFIG_FILE} overrides the base .nemo's own value: NeMo "
                     "1.23's merge_cfg_with copies every model key of the file over the restored config "
                     "(nlp_adapter_mixins.py:452-454), so the job would fine-tune "
                     f"{model.get('restore_from_path')}'s weights as another model than they were trained as",
                     key, f"remove {key} (the base's config holds it), or re-render")]
    return []
