"""What Megatron-Bridge 0.3.1 needs to run its own loop on a CPU (gloo): applied only without CUDA.

Bridge is written for GPUs with Transformer Engine; on this machine (no CUDA, no TE) it needs a few
run-time patches, each answering one upstream line (named at each patch). Nothing
in site-packages is edited; on a GPU none of this runs. The megatron-core part (CUDA devices, RNG
state, CUDA type checks) is the megatron-core CPU shim both megatron engines share
(:mod:`vdkit.recipes.common.mcore_cpu`); the Bridge part is :data:`PATCHES`, each with the upstream
``file:line`` it answers. Pinned: :data:`TESTED` versions exactly, anything else is refused, and
``tests/test_bridge_shim.py`` fails loudly when an answered upstream line moves or changes.
megatron-core's GPTDataset loss-mask cache bug is no CPU matter: the job fixes it on GPUs too
(:func:`vdkit.recipes.bridge.job.keep_loss_mask_cache`).

The torch_dist async checkpoint writer starts a ``multiprocessing`` Manager with *spawn*
(mcore ``dist_checkpointing/strategies/filesystem_async.py:55``): a spawned child re-imports the
rank's main module (``vdkit.recipes.bridge.rank``), which applies this shim at import, so the
children run patched too.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import types

TESTED = {"megatron-bridge": "0.3.1", "megatron-core": "0.16.1"}

# (upstream file under site-packages/megatron, line, text that line holds, why we patch) - the test
# reads each line and fails when it no longer says this.
PATCHES = (
    ("bridge/peft/lora_layers.py", 20, "import transformer_engine.pytorch as te",
     "hard TE import (class TELinearAdapter(te.Linear)), reached from `import megatron.bridge`: a stub "
     "module while bridge.peft imports, removed afterwards so megatron-core still sees no TE"),
    ("bridge/peft/lora.py", 21, "import transformer_engine.pytorch as te", "the same hard import"),
    ("bridge/peft/utils.py", 37, 'TEColumnParallelLinear, HAVE_TE_COL_LINEAR = safe_import_from(',
     "safe_import_from 'succeeds' on megatron-core's MagicMock placeholders, then isinstance(m, MagicMock) "
     "raises TypeError (peft/utils.py:129): HAVE_TE forced False"),
    ("bridge/peft/module_matcher.py", 26, 'TEColumnParallelLinear, HAVE_TE_COL_LINEAR = safe_import_from(',
     "the same placeholders: HAVE_TE forced False"),
    ("bridge/training/initialize.py", 83, 'assert torch.cuda.is_available(), "Megatron requires CUDA."',
     "initialize_megatron asserts CUDA unless allow_no_cuda=True, which setup.py:136 never passes"),
    ("bridge/training/initialize.py", 139, "compile_helpers()",
     "runs `make` in megatron/core/datasets; the wheel ships helpers_cpp*.so and no Makefile: sys.exit(1)"),
    ("bridge/training/initialize.py", 678, "if torch.cuda.device_count() > 0:",
     "the model-parallel RNG tracker is seeded only with a CUDA device; without it megatron-core's "
     "tensor_parallel/random.py raises 'cuda rng state ... is not added'"),
    ("core/optimizer/distrib_optimizer.py", 642, "assert len(steps) == 1",
     "on the non-Apex/TE path the distributed optimizer reads Adam's 'step' from torch's optimizer state, "
     "which a fresh optimizer does not have yet: Bridge's resume (sharded_state_dict(is_loading=True) calls "
     "state_dict() first, :1246) fails; that call is shown step 0 (the loaded step replaces it)"),
    ("core/optimizer/distrib_optimizer.py", 940, "dst_tensors[key].copy_(tensors[key])",
     "the same non-Apex/TE path keeps Adam's 'step' among the per-parameter tensors, so loading the "
     "parameter state copies the load template's step (the step 0 shown above, :642) over the step "
     "load_state_dict just restored from the checkpoint (:823), so a resumed run's Adam restarted its bias "
     "correction (DP2 + distributed optimizer: step 4 0.2 % off). The restored step is kept"),
    ("core/optimizer/distrib_optimizer.py", 825, 's["step"] = step',
     "and that restored step is one tensor shared by every parameter, which torch's Adam increments in place "
     "once per parameter per step: each parameter gets its own copy"),
    ("bridge/training/setup.py", 164, 'start_time_tensor = torch.tensor([state.start_time], dtype=torch.double, device="cuda")',
     "device='cuda' literals (also gpt_step.py, train.py): the megatron-core shim's device mode maps them"),
)


class ShimVersionError(RuntimeError):
    """The installed Megatron-Bridge / megatron-core are not the versions this shim was tested with."""


_APPLIED = False


def needed() -> bool:
    """True without CUDA: the only case the shim applies."""
    import torch

    return not torch.cuda.is_available()


def check_versions() -> None:
    """Refuse any version other than :data:`TESTED` (the patches use private names)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist, want in TESTED.items():
        try:
            have = version(dist)
        except PackageNotFoundError:
            have = "nothing"
        if have != want:
            raise ShimVersionError(
                f"vdkit's CPU shim for Megatron-Bridge was tested with {dist}=={want}, found {have}; install "
                f"{dist}=={want} or re-validate recipes/bridge/cpu_shim.py (tests/test_bridge_shim.py)")


def _te_stub() -> types.ModuleType:
    """A ``transformer_engine`` package whose classes nothing is an instance of and that cannot be built."""

    class _Absent:
        def __init__(self, *a, **k):
            raise RuntimeError("Transformer Engine is not installed (vdkit's CPU stub)")

    te = types.ModuleType("transformer_engine")
    te.__path__ = []  # a package, so `import transformer_engine.pytorch` resolves
    pt = types.ModuleType("transformer_engine.pytorch")
    pt.Linear = type("Linear", (_Absent,), {})
    pt.LayerNormLinear = type("LayerNormLinear", (_Absent,), {})
    pt.ops = types.SimpleNamespace(Sequential=_Absent)
    te.pytorch = pt
    return te


_STUBBED_IMPORTERS = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")


def _import_bridge_peft() -> None:
    """Import ``megatron.bridge`` with a TE stub handed to the two bridge.peft modules that need one.

    Only their ``import transformer_engine.pytorch`` gets the stub (never put in sys.modules): every
    other module, megatron-core's included, still finds no Transformer Engine and takes its non-TE path."""
    if "megatron.bridge.peft.lora" in sys.modules:
        return
    import builtins

    stub, real_import = _te_stub(), builtins.__import__

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        if (name == "transformer_engine" or name.startswith("transformer_engine.")) and level == 0 \
                and (globals or {}).get("__name__") in _STUBBED_IMPORTERS:
            return stub
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = importer
    try:
        import megatron.bridge  # noqa: F401  (reaches peft via models/conversion/peft_bridge.py)
        import megatron.bridge.peft.lora  # noqa: F401
    finally:
        builtins.__import__ = real_import


# megatron-core's OptimizerConfig.__post_init__ asks Transformer Engine, with use_precision_aware_optimizer on
# (train.optimizer_dtype=bf16), for its version (optimizer/optimizer_config.py:383, is_te_min_version: a TypeError
# without TE) and for FusedAdam's signature (:388-402); neither exists on this CPU. The image's Transformer Engine
# (nemo:26.02.01: TE 2.12) has them: transformer_engine/pytorch/optimizers/fused_adam.py:111-130 takes these keywords.
IMAGE_TE_VERSION = "2.12"
IMAGE_FUSED_ADAM_KEYWORDS = ("master_weights", "master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                             "use_decoupled_grad", "store_param_remainders")


@contextlib.contextmanager
def image_fused_adam():
    """While Bridge validates a config on a machine without Transformer Engine: megatron-core's optimizer config
    sees the image's TE version and FusedAdam signature (:data:`IMAGE_FUSED_ADAM_KEYWORDS`), so its own checks of
    the precision-aware optimizer (Adam, the distributed optimizer, TE's FusedAdam) run. Only
    ``megatron.core.optimizer.optimizer_config`` is answered; nothing can build the stand-in."""
    import builtins

    from megatron.core.optimizer import optimizer_config
    from packaging.version import Version

    def fused_adam(self, params, *, master_weights=False, master_weight_dtype=None, exp_avg_dtype=None,
                   exp_avg_sq_dtype=None, use_decoupled_grad=False, store_param_remainders=False, **kw):
        raise RuntimeError("Transformer Engine's FusedAdam is not installed (vdkit's check-time stand-in)")

    leaf = types.ModuleType("transformer_engine.pytorch.optimizers")
    leaf.FusedAdam = type("FusedAdam", (), {"__init__": fused_adam})
    real_import, real_min = builtins.__import__, optimizer_config.is_te_min_version

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        if name == leaf.__name__ and (globals or {}).get("__name__") == optimizer_config.__name__:
            return leaf
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = importer
    _patch(optimizer_config, "is_te_min_version", lambda v, check_equality=True: (
        Version(IMAGE_TE_VERSION) >= Version(v) if check_equality else Version(IMAGE_TE_VERSION) > Version(v)))
    try:
        yield
    finally:
        builtins.__import__ = real_import
        optimizer_config.is_te_min_version = real_min


def _patch(obj, name, value):
    getattr(obj, name)  # AttributeError: the name this shim replaces is gone (a new version)
    setattr(obj, name, value)


def apply() -> bool:
    """Apply once in this process when there is no CUDA; returns whether the shim is active.

    ShimVersionError for other versions; AttributeError when a patched name is gone."""
    global _APPLIED
    if _APPLIED:
        return True
    if not needed():
        return False
    check_versions()
    from vdkit.recipes.common import mcore_cpu
    from vdkit.recipes.common.known_warnings import silence

    # before the first megatron import: its optional-kernel notices fire at import (each with its reason there)
    silence("megatron", "megatron-cpu", "bridge")
    mcore_cpu.apply()  # CUDA devices -> CPU, RNG state, CUDA type checks (megatron-core 0.16.1)
    _import_bridge_peft()
    import torch
    from megatron.bridge.peft import module_matcher as pmatch
    from megatron.bridge.peft import utils as putils
    from megatron.bridge.training import initialize as binit
    from megatron.bridge.training import setup as bsetup

    _patch(putils, "HAVE_TE", False)
    _patch(pmatch, "HAVE_TE", False)
    _patch(bsetup, "initialize_megatron", functools.partial(binit.initialize_megatron, allow_no_cuda=True))

    def compile_helpers():  # the shipped extension is what `make` would build
        import megatron.core.datasets.helpers_cpp  # noqa: F401  (ImportError: really missing)

    _patch(binit, "compile_helpers", compile_helpers)
    seed = binit._set_random_seed

    @functools.wraps(seed)
    def set_random_seed(seed_, data_parallel_random_init=False, te_rng_tracker=False, inference_rng_tracker=False,
                        use_cudagraphable_rng=False, *, pg_collection):
        seed(seed_, data_parallel_random_init, te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng,
             pg_collection=pg_collection)
        # what initialize.py:678-693 does with a CUDA device (the tracker runs on the CPU generator here)
        from megatron.core import tensor_parallel
        from megatron.core.utils import get_pg_rank

        s = seed_ + 100 * torch.distributed.get_group_rank(pg_collection.pp, torch.distributed.get_rank())
        if data_parallel_random_init:
            s += 10 * torch.distributed.get_group_rank(pg_collection.dp, torch.distributed.get_rank())
        tensor_parallel.model_parallel_cuda_manual_seed(
            s, te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng, tp_rank=get_pg_rank(pg_collection.tp),
            ep_rank=get_pg_rank(pg_collection.ep), etp_rank=get_pg_rank(pg_collection.expt_tp))

    _patch(binit, "_set_random_seed", set_random_seed)
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    state_dict = DistributedOptimizer.state_dict

    @functools.wraps(state_dict)
    def fresh_state_dict(self):
        inner = self.optimizer
        if any("step" in st for st in inner.state.values()):
            return state_dict(self)
        # Not stepped yet (a resume is about to load into it): the non-TE branch only reads 'step' from
        # the inner state dict's "state"; show it step 0 for this call, leave the real state empty (the
        # load then allocates and fills it exactly as on a GPU).
        plain = inner.state_dict

        def with_step():
            out = plain()
            out["state"] = {0: {"step": torch.tensor(0.0)}}
            return out

        inner.state_dict = with_step
        try:
            return state_dict(self)
        finally:
            del inner.state_dict

    _patch(DistributedOptimizer, "state_dict", fresh_state_dict)
    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    @functools.wraps(set_states)
    def keep_restored_step(self, model_param, tensors):
        if "step" in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group, order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state[self.optimizer.param_groups[group]["params"][order]]
            if state.get("step") is not None:  # restored by load_state_dict from the checkpoint's param groups
                state["step"] = state["step"].detach().clone()  # this parameter's own counter
                tensors = {**tensors, "step": state["step"]}
        return set_states(self, model_param, tensors)

    _patch(DistributedOptimizer, "_set_main_param_and_optimizer_states", keep_restored_step)
    # CUDA streams (model_provider.py:708-722 builds DDP on a side stream): torch's CPU streams,
    # which are no-ops with the same methods; the caching allocator's calls have nothing to do.
    _patch(torch.cuda, "Stream", torch.cpu.Stream)
    _patch(torch.cuda, "current_stream", lambda device=None: torch.cpu.current_stream())
    _patch(torch.cuda, "stream", torch.cpu.stream)
    _patch(torch.cuda, "empty_cache", lambda: None)
    # The CPU generator doubles as the "CUDA" one (mcore_cpu), so the tracker's fork sees the CPU
    # state change and says so at every fork (mcore tensor_parallel/random.py:265): expected here.
    import logging

    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    _APPLIED = True
    return True
