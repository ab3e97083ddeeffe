"""`vdkit check` for engine=bridge: the run dir's own ``bridge_job.py`` on its ``bridge.yaml``, as far as a CPU goes.

In one process for every bridge run directory (Megatron-Bridge is imported once, under the CPU shim
:mod:`.cpu_shim`), per run directory:

1. the job's own loader (``bridge_job.py``'s ``load``: Bridge's ``ConfigContainer.from_yaml``, strict); then the
   file's hand edits against the kit's render of the run (:mod:`.edits`): a value of a type Bridge's dataclass
   field does not declare, a count <= 0 (the loader takes both);
2. Bridge's own pre-initialisation path, ``runtime_config_update`` (mixed-precision preset resolved and
   applied to the model / optimizer / DDP configs, data-parallel size, ``ConfigContainer.validate()``)
   with the job's world size (the plan's GPUs). Kernels only the container has (Transformer Engine's
   fused RoPE, Apex / TE gradient-accumulation fusion, ...) are switched off for this step and named;
3. the rule Megatron-LM applies at start-up that Bridge 0.3.1 does not: FP8 parameter gather needs the
   distributed optimizer (Megatron-LM ``megatron/training/arguments.py``; not in the megatron-core wheel); TP
   communication overlap with a frozen base (PEFT) that Transformer Engine 2.12 would leave un-reduced
   (:mod:`.runcheck_tp_overlap`);
4. the model provider instantiated on the meta device at TP = PP = 1 (no memory), its parameter count
   against the plan's (:func:`vdkit.planner.arch.param_counts`);
5. checkpoint retention (a bounded number kept: Bridge's ``most_recent_k`` defaults to keep-all), and what Bridge
   will load from where - base, resume, optimizer / RNG state - against what the method and the kit's restart need
   (:mod:`.loadcheck`);
6. the tokenizer with Bridge's ``build_tokenizer`` under ``TRANSFORMERS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``
   (as the job runs) where the path is on this machine; a hub id is a defect, a cluster path "not
   checked here"; the tokenizer type and path Bridge takes and the model's vocabulary (:mod:`.loadcheck`);
7. fine-tuning with the data here: Bridge's fine-tuning dataset built from the staged JSONL and the first
   micro-batch collated by its own ``collate_fn``: the tokens it holds beside the plan's assumption; Bridge's chat
   dataset (Instruct models, :mod:`.chat`) training the prompt too (a template without ``{% generation %}``) is a defect.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import time
from pathlib import Path

from vdkit.run.jobcheck import Report, check_each, one_line

HUB_ID_FIX = "stage the tokenizer once (huggingface-cli download ID --local-dir /shared/...) and set data.tokenizer_model=PATH"


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _world_size(n: int):
    """Bridge's get_world_size_safe as the job sees it (the plan's GPUs), without starting n processes."""
    import megatron.bridge.training.config as bcfg

    real = bcfg.get_world_size_safe
    bcfg.get_world_size_safe = lambda: n
    try:
        yield
    finally:
        bcfg.get_world_size_safe = real


def _import_bridge() -> None:
    """Megatron-Bridge importable in this process: the CPU shim where there is no CUDA (DeepSpeed, which Bridge's
    imports reach, told it is on a CPU only while Bridge imports: it would log a failed GPU detection)."""
    from vdkit.recipes.bridge import cpu_shim

    if cpu_shim.needed():
        with _env(DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu")):
            cpu_shim.apply()
            import megatron.bridge.training.config  # noqa: F401 (imported while DeepSpeed is told)


def _job_module(run_dir: Path):
    """The run dir's own bridge_job.py, imported as a module (its __main__ block does not run)."""
    from vdkit.run.rundir import BRIDGE_JOB_FILE

    spec = importlib.util.spec_from_file_location(f"bridge_job_check_{abs(hash(str(run_dir)))}", run_dir / BRIDGE_JOB_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _versions() -> str:
    from importlib.metadata import version

    return f"Megatron-Bridge {version('megatron-bridge')}, megatron-core {version('megatron-core')}"


def check_runs(run_dirs, render) -> list:
    """One Report per run directory (see the module docstring). ``render``: the engine's bridge.yaml renderer
    (:func:`vdkit.recipes.bridge.render_bridge_yaml`), for the hand-edit comparison."""
    _import_bridge()  # once, here; each run dir's process makes its own gloo group (_check)
    stack = _versions()
    return check_each(run_dirs, stack, lambda run_dir, rep: _check(run_dir, rep, render), "Megatron-Bridge",
                      "bridge.yaml")


class Refused(Exception):
    """Bridge's own code refuses a run dir's bridge.yaml: ``step`` (which of Bridge's functions), ``error`` (its
    message, one line) and ``fix``."""

    def __init__(self, step: str, error: str, fix: str):
        super().__init__(f"{step} refuses bridge.yaml: {error}")
        self.step, self.error, self.fix = step, error, fix


def load(run_dir: Path):
    """Step 1: the run dir's bridge.yaml through its own bridge_job.py's loader (Bridge's
    ``ConfigContainer.from_yaml``, strict: a syntax error, an unknown key or class is refused); Refused if not."""
    from vdkit.composition.files import not_a_regular_file
    from vdkit.recipes.bridge.config import CONFIG_FILE

    from vdkit.run.rundir import BRIDGE_JOB_FILE

    for name in (CONFIG_FILE, BRIDGE_JOB_FILE):  # opened as they are: a FIFO would block the door for ever
        kind = not_a_regular_file(run_dir / name)
        if kind:
            raise Refused("the kit's reader", f"{run_dir / name} is {kind}, not a file",
                          f"re-render the run (vdkit render) or put the rendered {name} back")
    try:
        job = _job_module(run_dir)
    except Exception as exc:  # an edited bridge_job.py: its syntax error or failed import, in one line
        raise Refused(f"the run dir's {BRIDGE_JOB_FILE}", one_line(exc),
                      f"re-render the run (vdkit render) or put the rendered {BRIDGE_JOB_FILE} back") from None
    try:
        return job.load(run_dir / CONFIG_FILE)
    except Exception as exc:
        raise Refused("Bridge's ConfigContainer.from_yaml", one_line(exc),
                      "re-render the run (vdkit render) or correct the key it names") from None


def validate(cfg, plan) -> list:
    """Step 2 on a loaded ``cfg`` (changed in place): Bridge's ``runtime_config_update`` and
    ``ConfigContainer.validate()`` at the plan's world size, with the kernels only the container has switched off
    and, without Transformer Engine here, its FusedAdam answered as the image's (cpu_shim.image_fused_adam) - each
    returned by name; Refused if Bridge refuses (a value of the wrong type, a layout it cannot run)."""
    from vdkit.recipes.bridge.config import FUSIONS
    from megatron.bridge.training.config import runtime_config_update

    te_only = [k for k in FUSIONS if getattr(cfg.model, k, False)]
    for k in te_only:
        setattr(cfg.model, k, False)
    from vdkit.recipes.bridge import cpu_shim

    image_te = cfg.optimizer.use_precision_aware_optimizer and importlib.util.find_spec("transformer_engine") is None
    try:
        with _world_size(plan.recipe.cluster.nodes * plan.recipe.cluster.gpus_per_node), \
                (cpu_shim.image_fused_adam() if image_te else contextlib.nullcontext()):
            runtime_config_update(cfg)
    except Exception as exc:
        raise Refused("Bridge's runtime_config_update / ConfigContainer.validate()", one_line(exc),
                      "change the setting it names (vdkit plan shows the layout)") from None
    return te_only + (["Transformer Engine's FusedAdam (use_precision_aware_optimizer: checked against TE "
                       f"{cpu_shim.IMAGE_TE_VERSION}'s signature)"] if image_te else [])


def check_resume(run_dir: Path, plan, render) -> None:
    """Steps 1 and 2 for a run dir about to run here (`vdkit run --resume`: its bridge.yaml may have been edited
    since it was rendered): Refused, as `vdkit check` would report it, before any rank starts; an edit of a wrong
    type or count (:mod:`.edits`, ``render`` as there) a UserError naming the first (and how many more)."""
    from vdkit.errors import UserError
    from vdkit.recipes.bridge import edits

    _import_bridge()
    cfg = load(run_dir)
    defects, _changed = edits.compare(run_dir, plan, render)
    if defects:
        more = f" ({len(defects) - 1} more: `vdkit check {run_dir}` lists each)" if len(defects) > 1 else ""
        raise UserError(defects[0].what + more, f"{defects[0].fix}; the ranks would run on it")
    from vdkit.recipes.bridge.runcheck_tp_overlap import defect

    frozen = defect(cfg)  # before validate(): Bridge's setup without TE here switches the overlap off
    if frozen:
        raise UserError(frozen[0], f"{frozen[2]}; the ranks would run on it")
    validate(cfg, plan)


def _check(run_dir: Path, rep: Report, render) -> None:
    from vdkit.launch import launchers
    from vdkit.recipes.common.mcore_cpu import single_rank_model_parallel

    single_rank_model_parallel()  # this run dir's own process (jobcheck.isolated): its own gloo group
    from vdkit.recipes.bridge.config import CONFIG_FILE
    from vdkit.run.rundir import load_plan

    plan = load_plan(run_dir)
    on_cluster = not launchers.executes_here(plan.recipe.cluster.launcher)
    try:
        cfg = load(run_dir)
    except Refused as no:
        rep.defect(str(no), CONFIG_FILE, no.fix)
        return
    rep.checked(f"{CONFIG_FILE} loads with the job's own loader (ConfigContainer.from_yaml, strict): "
                f"{type(cfg.model).__name__}, dataset {type(cfg.dataset).__name__}")
    from vdkit.recipes.bridge import edits

    if not edits.check(run_dir, plan, rep, render):  # a wrong type or count: Bridge's loader took it, no step further
        return
    full = copy.deepcopy(cfg)
    try:
        te_only = validate(cfg, plan)
    except Refused as no:
        rep.defect(str(no), CONFIG_FILE, no.fix)
        return
    mp = cfg.mixed_precision
    dtype = "fp16" if getattr(mp, "fp16", False) else "bf16" if getattr(mp, "bf16", False) else "fp32"
    fp8 = bool(getattr(mp, "fp8", None))
    rep.checked(f"Bridge's runtime_config_update + validate(): world {plan.recipe.cluster.nodes * plan.recipe.cluster.gpus_per_node}"
                f", TP {cfg.model.tensor_model_parallel_size} PP {cfg.model.pipeline_model_parallel_size} DP "
                f"{cfg.data_parallel_size}, mixed precision {'fp8 ' + str(mp.fp8_recipe) if fp8 else dtype}"
                f", distributed optimizer {cfg.optimizer.use_distributed_optimizer}, scheduler {cfg.scheduler.lr_decay_style} "
                f"over {cfg.scheduler.lr_decay_iters} steps")
    if te_only:
        rep.not_here(f"Transformer Engine / Apex kernels ({', '.join(te_only)}): on for the job, off for this CPU check (the container has them)")
    from vdkit.recipes.common.edits import other_seq_length

    other = other_seq_length("model.seq_length", cfg.model.seq_length, plan.recipe.train.seq_length)  # = dataset's
    if other:
        rep.defect(other[0], f"{CONFIG_FILE} model.seq_length / dataset.seq_length", other[1])
    if cfg.data_parallel_size != plan.dp:
        rep.defect(f"Bridge computes DP {cfg.data_parallel_size}, the plan DP {plan.dp}", "model.*_parallel_size",
                   "re-render: bridge.yaml and plan.json disagree")
    if cfg.ddp.fp8_param_gather and not cfg.optimizer.use_distributed_optimizer:
        rep.defect("FP8 parameter gather without the distributed optimizer: Megatron-LM refuses it at start-up "
                   "(megatron/training/arguments.py: --fp8-param-gather needs the distributed optimizer or FSDP)",
                   f"mixed_precision {getattr(mp, 'fp8_recipe', '?')} with optimizer.use_distributed_optimizer=false",
                   "use the distributed optimizer (parallelism.distributed_optimizer=true) or a preset without fp8_param_gather")
    if not rep.defects and (dtype, fp8) != ("bf16", plan.recipe.train.precision == "fp8"):  # plans: bf16 (fp8 in it)
        rep.defect(f"mixed_precision resolves to {dtype}{' + fp8' if fp8 else ''} (Bridge's preset, training/"
                   f"mixed_precision.py), the plan's train.precision is {plan.recipe.train.precision} (bf16"
                   f"{' + fp8' if plan.recipe.train.precision == 'fp8' else ''}): its memory, step time and time limit "
                   "are not this job's", f"{CONFIG_FILE} mixed_precision", "keep the rendered preset, or plan another "
                   "precision with train.precision and re-render")
    _fp8_attention(full, cfg, rep)
    from vdkit.recipes.bridge import cuda_graphs, runcheck_arch, runcheck_sched, runcheck_tp_overlap

    runcheck_arch.check(full.model, plan, run_dir, render, rep)  # RoPE / norm edits the parameter count cannot see

    runcheck_sched.check(cfg, rep)  # the schedule setup_optimizer builds (megatron-core's asserts, the weight decay)
    runcheck_tp_overlap.check(full, rep)  # TP overlap with a frozen base: the input gradients summed over TP
    # (the graphs' rules before the provider asserts)
    if not cuda_graphs.check(full, cfg, plan, rep) or not _microbatches(cfg, plan, rep):
        return
    _checkpoint(full, plan, on_cluster, rep)
    from vdkit.recipes.bridge import loadcheck

    loadcheck.decisions(full, plan, rep)
    tok = _tokenizer(cfg, on_cluster, rep)
    loadcheck.tokenizer_line(full, plan, tok, rep)
    _model(cfg, plan, tok, rep)
    from vdkit.recipes.bridge import runcheck_data

    runcheck_data.first_batch(cfg, plan, tok, rep)  # the tokenizer on the cluster: a byte-level stand-in


def _fp8_attention(asked, cfg, rep: Report) -> None:
    """FP8 attention as the ranks will hold it: ``asked`` the config as loaded, ``cfg`` after Bridge's own
    runtime_config_update. Its mixed-precision setup copies fp8_dot_product_attention onto the model
    (mixed_precision.py:125-143), so a model-level value the preset does not carry is silently reset; and
    megatron-core hands it to Transformer Engine only inside an FP8 recipe (fp8_utils.py:563, model.fp8 set)."""
    from vdkit.recipes.bridge.config import FP8_ATTENTION

    wanted, ran, fp8 = (bool(getattr(asked.model, FP8_ATTENTION, False)), bool(getattr(cfg.model, FP8_ATTENTION, False)),
                        getattr(cfg.model, "fp8", None))
    if wanted and not ran:
        rep.defect(f"model.{FP8_ATTENTION}=true is reset to false by Bridge's mixed-precision setup "
                   "(mixed_precision.py:125-143 copies the preset's value onto the model): attention would run BF16",
                   f"model.{FP8_ATTENTION}", "set it in mixed_precision: vdkit render ... train.precision=fp8 "
                   "train.fp8_attention=true writes it there")
    elif ran and not fp8:
        rep.defect(f"{FP8_ATTENTION}=true without FP8 (model.fp8 is null): megatron-core builds no FP8 recipe, so "
                   "Transformer Engine never sees fp8_dpa (fp8_utils.py:563) and attention runs BF16",
                   f"mixed_precision.{FP8_ATTENTION}", "use train.precision=fp8 with train.fp8_attention=true")
    elif ran:
        rep.checked(f"Bridge's mixed-precision setup leaves {FP8_ATTENTION}=true on the model, FP8 recipe "
                    f"{cfg.model.fp8_recipe} (fp8_dpa for Transformer Engine)")


def _microbatches(cfg, plan, rep: Report) -> bool:
    """Megatron-core's micro-batch calculator as Bridge starts it (training/initialize.py:107, the resolved DP):
    its divisibility asserts (num_microbatches_calculator.py:340), and the count against the plan's accumulation."""
    from megatron.core.num_microbatches_calculator import (get_num_microbatches, init_num_microbatches_calculator,
                                                            unset_num_microbatches_calculator)

    t = cfg.train
    try:
        init_num_microbatches_calculator(0, t.rampup_batch_size, t.global_batch_size, t.micro_batch_size,
                                         cfg.data_parallel_size, t.decrease_batch_size_if_needed)
        n = get_num_microbatches()
    except (AssertionError, ValueError, TypeError, ZeroDivisionError) as exc:
        rep.defect(f"megatron-core's init_num_microbatches_calculator (Bridge's training/initialize.py:107; "
                   f"megatron/core/num_microbatches_calculator.py) refuses GBS {t.global_batch_size}, MBS "
                   f"{t.micro_batch_size}, DP {cfg.data_parallel_size}: {one_line(exc) if str(exc) else 'AssertionError'}",
                   "train.global_batch_size / train.micro_batch_size", "a global batch divisible by micro batch x DP "
                   "(vdkit plan shows the layout), or re-render")
        return False
    finally:
        unset_num_microbatches_calculator()
    line = (f"megatron-core's micro-batch calculator as Bridge starts it: GBS {t.global_batch_size} = MBS "
            f"{t.micro_batch_size} x DP {cfg.data_parallel_size} x {n} micro-batches; plan {plan.grad_accum}")
    if n == plan.grad_accum:
        rep.checked(line)
        return True
    rep.defect(line, "train.global_batch_size / train.micro_batch_size", "re-render: bridge.yaml and plan.json disagree")
    return False


def _peft(cfg, plan, model, rep: Report) -> None:
    """Bridge's own PEFT (``cfg.peft``, e.g. peft/lora.py LoRA) applied to the meta model as setup does
    (peft/base.py ``__call__``: freeze everything, then transform each module its matcher names): the trainable
    parameters against the plan's. A ``target_modules`` that matches no module raises nothing in Bridge: the base
    is frozen and nothing trains."""
    from vdkit.planner.arch import trainable_params

    peft = cfg.peft
    if peft is None:
        return
    from vdkit.recipes.common.lora_init import both_zero

    zero = both_zero(getattr(peft, "lora_A_init_method", None), getattr(peft, "lora_B_init_method", None),
                     "peft.lora_A_init_method", "peft.lora_B_init_method", "bridge.yaml")
    if zero:
        rep.defect(*zero)
        return
    peft(model, training=True)
    got = sum(p.numel() for p in model.parameters() if p.requires_grad)
    want = trainable_params(plan.recipe)
    name = type(peft).__name__
    line = (f"Bridge's {name} (peft.target_modules {list(getattr(peft, 'target_modules', []) or [])}) applied to the meta "
            f"model: {got:,} trainable parameters, plan {want:,}")
    if got == want:
        rep.checked(line)
    elif got == 0:
        rep.defect(line + f" - its matcher names no module of {type(model).__name__}: the base is frozen and nothing "
                   "trains (Bridge raises nothing)", "peft.target_modules", "name modules the model has (linear_qkv, "
                   "linear_proj, linear_fc1, linear_fc2), or re-render")
    else:
        rep.defect(line + " - another adapter than planned", "peft.target_modules / peft.dim",
                   "align them with the plan (method.lora_targets, method.lora_adapter_dim), or re-render")


def _model(cfg, plan, tok, rep: Report) -> None:
    """The provider on the meta device at TP = PP = 1: parameter count against the plan's. The vocabulary
    as Bridge's setup sets it (setup.py _validate_and_set_vocab_size) from the tokenizer, or from the
    plan's model where the tokenizer is not here."""
    import torch
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from vdkit.planner.arch import param_counts
    from vdkit.recipes.common.mcore_cpu import local_block_spec

    m = copy.deepcopy(cfg.model)
    vocab = tok.vocab_size if tok is not None else plan.recipe.model.vocab_size
    m.vocab_size, m.should_pad_vocab = _validate_and_set_vocab_size(m.vocab_size, vocab)
    m.tensor_model_parallel_size = m.pipeline_model_parallel_size = m.context_parallel_size = 1
    m.virtual_pipeline_model_parallel_size, m.sequence_parallel = None, False
    m.use_cpu_initialization, m.perform_initialization = True, False
    m.transformer_layer_spec = local_block_spec
    m.finalize()
    t = time.perf_counter()
    with torch.device("meta"):
        model = m.provide(pre_process=True, post_process=True)
    got = sum(p.numel() for p in model.parameters())
    want = param_counts(plan.recipe.model).total
    line = (f"{type(cfg.model).__name__}.provide() on the meta device (TP=PP=1, {time.perf_counter() - t:.1f} s): "
            f"{got:,} parameters, plan {want:,}" + ("" if tok is not None else f" (vocab {vocab} from the plan's model)"))
    if got == want:
        rep.checked(line)
    else:
        rep.defect(line + " - the model Bridge builds is not the one planned", "model (bridge.yaml model section)",
                   "align the model config with the plan (vdkit plan) and re-render")
        return
    with torch.device("meta"):
        _peft(cfg, plan, model, rep)


def _checkpoint(cfg, plan, on_cluster: bool, rep: Report) -> None:
    c = cfg.checkpoint
    steps = cfg.train.train_iters
    saves = (steps // c.save_interval if c.save_interval else 0) if c.save else 0
    keep = c.most_recent_k
    rep.checked(f"checkpoints: {c.ckpt_format} to {c.save}, every {c.save_interval or '-'} steps ({saves} in "
                f"{steps} steps), keep {'all' if keep in (-1, None) else keep}, async_save {c.async_save}")
    if on_cluster and keep in (-1, None) and saves > 2:
        gb = plan.checkpoint_gb or 0
        rep.defect(f"{saves} checkpoints of {gb:,.0f} GB kept ({saves * gb:,.0f} GB): Bridge's most_recent_k=-1 keeps every one",
                   f"checkpoint.most_recent_k, save_interval={c.save_interval}", "keep a bounded number (most_recent_k) and save at the plan's cadence")
    if c.pretrained_checkpoint and not Path(c.pretrained_checkpoint).exists():
        rep.not_here(f"base checkpoint {c.pretrained_checkpoint} (checkpoint.pretrained_checkpoint): cluster storage")


def _is_hub_id(name: str) -> bool:
    return not name.startswith(("/", ".")) and not Path(name).exists() and name.count("/") == 1


def _tokenizer(cfg, on_cluster: bool, rep: Report):
    """Bridge's build_tokenizer, offline as the job runs; None where it cannot be built here."""
    name = str(cfg.tokenizer.tokenizer_model or "")
    if _is_hub_id(name):
        rep.defect(f"tokenizer {name} is a hub id: the job runs with TRANSFORMERS_OFFLINE=1 and no HF cache mounted, "
                   "so it cannot resolve", "tokenizer.tokenizer_model (data.tokenizer_model / model.hf_path)", HUB_ID_FIX)
        return None
    if not Path(name).exists():
        rep.not_here(f"tokenizer {name} (tokenizer.tokenizer_model): cluster storage")
        return None
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    with _env(TRANSFORMERS_OFFLINE=1, HF_HUB_OFFLINE=1):
        try:
            tok = build_tokenizer(cfg.tokenizer)
        except Exception as exc:
            rep.defect(f"Bridge's build_tokenizer fails offline on {name}: {one_line(exc)}", "tokenizer.tokenizer_model",
                       HUB_ID_FIX)
            return None
    rep.checked(f"tokenizer {name}: Bridge's build_tokenizer offline, vocab {tok.vocab_size}")
    return tok
