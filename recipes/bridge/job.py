"""A Megatron-Bridge training job from a ConfigContainer YAML: what every rank runs in the container.

This file is copied into each run directory (``bridge_job.py``) and runs in NVIDIA's
``nvcr.io/nvidia/nemo:26.02.01`` image as it is (Megatron-Bridge 0.3.1): it imports nothing from vdkit. One process
per GPU (srun task); Bridge finds its rank from torchrun's or Slurm's variables.

    python bridge_job.py bridge.yaml

It loads the file with Bridge's ``ConfigContainer.from_yaml`` and runs Bridge's loop (``pretrain()``; ``finetune()``
is the same call after checking the base: the run dir's ``vdkit_preflight.py``, exit 2 without one) with its GPT
``forward_step``; vdkit's local rank (``python -m vdkit.recipes.bridge.rank``) does the same after its CPU shim.

The job contract (vdkit's, for every engine): USR1 (the launcher, before the time limit) or TERM, or the clock
passing ``VDKIT_STOP_AT`` (epoch seconds): finish the step, checkpoint, exit :data:`EXIT_STOPPED`; exit 0 only when
every step is done; started again, resume from the latest complete checkpoint. Bridge does the stopping itself -
``train.exit_signal_handler`` with ``exit_signal`` USR1 (TERM is forwarded to it) and
``train.exit_duration_in_mins`` - and exits 0 either way; this wrapper tells the two apart by the checkpointed
iteration. Bridge 0.3.1 builds its ``DistributedSignalHandler`` but never enters it (no OS handler: USR1 killed the
rank; fixed upstream in NVIDIA-NeMo/Megatron-Bridge#3823): :class:`_EnterSignalHandler` enters it as training
starts, and a stop asked for during start-up (model build, checkpoint load) is noted until then and passed on.

A weights-only end (the rendered ``checkpoint.save_optim``/``save_rng`` false: the plan expects nothing to resume
from the end's save) is Bridge's one set of flags for every save, so a stop would write weights only and the next
allocation resume without optimizer and RNG state (losses off the uninterrupted run's): :func:`weights_only_at_the_end`
keeps the full state for every save and load, and applies the rendered flags as training ends (``on_train_end``
fires after the last step only: a stop has exited before it).

Faults (vdkit's issue 27): each rank beats for the launcher's watchdog (``$VDKIT_HEARTBEAT_DIR``) through Bridge's
callbacks (:func:`heartbeat_callback`: progress and compute time after every step, ``save`` while Bridge's save
timers run) and the run dir's ``vdkit_heartbeat.py``; the process groups time out after ``$VDKIT_COLLECTIVE_TIMEOUT_S``
(:func:`collective_timeout`); the run dir's ``bridge_trust.py`` (:func:`vdkit.recipes.bridge.trust.trust_latest`) sets a
damaged latest checkpoint aside (renamed) before a resume.
Before Bridge builds its datasets, :func:`keep_loss_mask_cache` fixes megatron-core's GPTDataset loss-mask cache
(:data:`LOSS_MASK_CACHE_BUG`) where the installed megatron-core has it, on GPUs and on vdkit's CPU runs alike.
"""
import functools
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import time

EXIT_STOPPED, EXIT_REFUSED = 75, 2  # "stopped cleanly, continue me"; "the recipe's fault" (vdkit.run.jobspec; tested)
STOP_AT_ENV = "VDKIT_STOP_AT"
# The launcher's watchdog and process-group timeout (vdkit.run.faults' names; tests check they agree): each rank
# beats through the run dir's vdkit_heartbeat.py (vdkit.recipes.common.heartbeat as one file, beside this one).
HEARTBEAT_ENV, COLLECTIVE_TIMEOUT_ENV = "VDKIT_HEARTBEAT_DIR", "VDKIT_COLLECTIVE_TIMEOUT_S"
HEARTBEAT_MODULE = "vdkit_heartbeat"
TRUST_MODULE = "bridge_trust"  # checkpoints you can trust (vdkit.recipes.bridge.trust as one file, beside this one)
SAVE_TIMERS = ("save-checkpoint", "save-checkpoint-non-persistent")  # Bridge's timers around every save (train.py)


def load(path):
    """Bridge's ConfigContainer from its YAML (unknown keys refused, so a typo cannot pass silently)."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.utils.config_utils import InstantiationMode

    return ConfigContainer.from_yaml(str(path), mode=InstantiationMode.STRICT)


def _beside(name: str, own: str):
    """This job's module ``own`` of vdkit's package when this file is vdkit's (its CPU rank), else the file beside this
    one - the run dir's ``name``.py (the stock image has no vdkit), or ``own``.py beside vdkit's job.py loaded by path -
    whatever sys.path holds."""
    if __package__:
        return importlib.import_module(f".{own}", __package__)
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, f"{name}.py"), os.path.join(here, f"{own}.py")):
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"bridge_job: {name}.py is not beside {__file__} (render the run dir again)")


trust = _beside(TRUST_MODULE, "trust")  # checkpoints you can trust


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


_EARLY_STOPS = []  # stop signals that came before Bridge's handler was entered


def hold_stops(forward_term: bool = True) -> None:
    """From here on USR1 is noted, not fatal (its default action kills the process): until training
    starts, when :class:`_EnterSignalHandler` passes it on to Bridge's handler. Called first thing in
    the rank's main module, so a stop asked for during start-up (imports, model build, checkpoint load)
    is kept; the main module runs again in the torch_dist writer's spawned children, which Slurm signals
    with the step: they must outlive a stop (``forward_term=False`` there: TERM still ends a child).
    ``forward_term``: TERM (Slurm at the limit, ``kill``, the local launcher) asks for the same stop."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: _EARLY_STOPS.append(signum))
    if forward_term:
        signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGUSR1))


def arm_stop(cfg) -> None:
    """The contract's stop conditions on Bridge's own mechanisms (see the module docstring)."""
    cfg.train.exit_signal_handler = True
    cfg.train.exit_signal = signal.SIGUSR1
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        hold_stops()
    stop_at = os.environ.get(STOP_AT_ENV)
    if stop_at:
        # Bridge compares (now - its start time) / 60 with this; a fraction keeps a short budget exact
        # (whole minutes would stop up to a minute late, after the launcher's lead). Never 0 (= off).
        cfg.train.exit_duration_in_mins = max((float(stop_at) - time.time()) / 60.0, 1e-3)


_STATE_FLAGS = ("save_optim", "save_rng", "load_optim", "load_rng")  # Bridge's CheckpointConfig fields


def weights_only_at_the_end(cfg) -> bool:
    """When ``cfg`` renders a weights-only end (``checkpoint.save_optim`` false): every save and load carries
    the optimizer and RNG state again - a stop's save is what the next allocation resumes from - and
    :func:`_stop_callbacks`' ``on_train_end`` writes the end's weights only. True where it did so."""
    ck = cfg.checkpoint
    if ck.save_optim or getattr(ck, "finetune", False):
        return False
    for name in _STATE_FLAGS:
        setattr(ck, name, True)
    return True


def _with(callbacks, callback):
    """``callbacks`` (None, a list or Bridge's CallbackManager) as a CallbackManager with ``callback`` added."""
    from megatron.bridge.training.callbacks import CallbackManager

    manager = callbacks if isinstance(callbacks, CallbackManager) else CallbackManager()
    if callbacks is not None and manager is not callbacks:
        manager.add(callbacks)
    manager.add(callback)
    return manager


def _stop_callbacks(callbacks, weights_only_end: bool = False):
    """``callbacks`` (None, a list or Bridge's CallbackManager) with :class:`_EnterSignalHandler` added;
    ``weights_only_end``: the save after the last step (Bridge's ``pretrain.py``) holds the weights only."""
    from megatron.bridge.training.callbacks import Callback

    class _EnterSignalHandler(Callback):
        """As training starts: enter Bridge's own DistributedSignalHandler (see the module docstring)
        and pass on a stop that came during start-up; Bridge then checkpoints after the step and leaves."""

        def on_train_start(self, context):
            context.state.signal_handler.__enter__()
            if _EARLY_STOPS:
                os.kill(os.getpid(), signal.SIGUSR1)

        def on_train_end(self, context):
            if weights_only_end:  # every step done: nothing resumes from the save that follows
                context.state.cfg.checkpoint.save_optim = context.state.cfg.checkpoint.save_rng = False

    return _with(callbacks, _EnterSignalHandler())


def start_heartbeat():
    """This rank's heartbeat (``$VDKIT_HEARTBEAT_DIR``, the launcher's watchdog reads it), started from the run
    dir's vdkit_heartbeat.py beside this file; None when the launcher asked for none."""
    if not os.environ.get(HEARTBEAT_ENV):
        return None
    try:
        module = importlib.import_module(HEARTBEAT_MODULE)  # sys.path[0]: this file's directory, the run dir
    except ImportError:
        return print(f"bridge_job: {HEARTBEAT_ENV} is set but {HEARTBEAT_MODULE}.py is not beside {__file__}: no "
                     "heartbeat (render the run dir again)", flush=True)  # None
    return module.Heartbeat.from_env(_rank())


def heartbeat_callback(beat):
    """A Bridge callback that reports each step to ``beat`` (a vdkit heartbeat: progress and compute time after every
    optimizer step, phase ``save`` while Bridge's save timers run, a validation step counts as progress)."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    clock = sys.modules[type(beat).__module__].ComputeClock(torch.cuda.is_available())  # the heartbeat's own module
    class _Heartbeat(Callback):
        started = time.monotonic()

        def on_train_start(self, context):
            clock.wrap_config(context.model[0].config)  # Bridge's finalize_model_grads (training/setup.py)
            # Bridge brackets every save with these timers (train.py save_checkpoint_and_time): a long save is
            # no hang. Made here with the log level Bridge asks them with (0), so the same objects are wrapped.
            for name in SAVE_TIMERS:
                timer = context.state.timers(name, log_level=0)
                timer.start = _around(timer.start, lambda: beat.saving(True), None)
                timer.stop = _around(timer.stop, None, lambda: beat.saving(False))

        def on_train_step_start(self, context):
            self.started = time.monotonic()
            clock.start()

        def on_train_step_end(self, context):  # fired before Bridge counts the step (train.py: step += 1 after)
            beat.progress(context.state.train_state.step + 1, time.monotonic() - self.started, clock.seconds())

        def on_eval_step_end(self, context):
            beat.progress(beat.step, beat.step_ms / 1000.0)

        def on_train_end(self, context):
            beat.saving(True)  # every step done: the end's save follows (pretrain.py), then the exit

    return _Heartbeat()


def _around(fn, before, after):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if before:
            before()
        out = fn(*args, **kwargs)
        if after:
            after()
        return out
    return wrapped


def collective_timeout(cfg) -> None:
    """The launcher's process-group timeout (``$VDKIT_COLLECTIVE_TIMEOUT_S``, from the plan: longer than its
    watchdog's limits) as Bridge's ``dist.distributed_timeout_minutes`` (whole minutes, rounded up)."""
    try:
        seconds = float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, ""))
    except ValueError:
        return
    if seconds > 0:
        cfg.dist.distributed_timeout_minutes = max(1, int(-(-seconds // 60)))


# megatron-core 0.16.1's GPTDataset loss-mask cache (NVIDIA/Megatron-LM#1711; fix proposed upstream in #6981). The
# one home of this fact: (file under site-packages/megatron, line, text that line holds, why), the lines that
# make the bug; keep_loss_mask_cache patches only where GPTDataset.__getitem__ still holds both texts, and
# tests/test_bridge_shim.py fails when the pinned megatron-core's line moves or changes.
LOSS_MASK_CACHE_BUG = (
    ("core/datasets/gpt_dataset.py", 263, "self.cached_loss_mask = loss_mask",
     "with cacheable masks (no reset_position_ids / reset_attention_mask / eod_mask_loss) the first sample's "
     "loss mask IS the cached one, not a copy"),
    ("core/datasets/gpt_dataset.py", 272, "loss_mask[labels == self._pad_token_id] = 0.0",
     "so this in-place write leaves that sample's pad positions zeroed in the cache, and every later sample's "
     "mask (a clone of it, :268) masks them too: the loss depends on which sample a process read first, so a run "
     "resumed at another sample trains on other masks (vdkit's Slurm continuation test: 94 of 222 resumed steps' "
     "losses differed). The fix: after the caching call the cache holds the all-ones mask :747 made"),
)


def keep_loss_mask_cache() -> bool:
    """Fix megatron-core's GPTDataset loss-mask cache (:data:`LOSS_MASK_CACHE_BUG`) in this process, where the
    installed megatron-core has the bug; True when the fix is in place (idempotent), False where it is not needed.

    Wraps ``GPTDataset.__getitem__``: after the call that fills the cache, the cache gets a fresh all-ones mask
    (cacheable means eod_mask_loss is off, so the mask megatron-core made before the pad write was all ones); the
    first sample keeps its own mask. Applied before Bridge builds its datasets; DataLoader workers are forked and
    inherit it. Rank 0 says in one line whether it patched."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    getitem = GPTDataset.__getitem__
    if getattr(getitem, "_keeps_loss_mask_cache", False):
        return True
    version = getattr(sys.modules.get("megatron.core"), "__version__", "?")
    where = ", ".join(f"{rel}:{line}" for rel, line, _text, _why in LOSS_MASK_CACHE_BUG)
    try:
        lines = {line.strip() for line in inspect.getsource(getitem).splitlines()}
        why = "GPTDataset.__getitem__ no longer has the loss-mask cache bug"
    except (OSError, TypeError):  # no source to check: leave megatron-core as it is
        lines, why = set(), "GPTDataset.__getitem__'s source cannot be read to check for the loss-mask cache bug"
    if not all(text in lines for _rel, _line, text, _why in LOSS_MASK_CACHE_BUG):
        if _rank() == 0:
            print(f"bridge_job: megatron-core {version}: {why} ({where}): not patched", flush=True)
        return False

    @functools.wraps(getitem)
    def getitem_keeping_cache(self, idx):
        caching = self.masks_and_position_ids_are_cacheable and not self.masks_and_position_ids_are_cached
        out = getitem(self, idx)
        if caching:  # a new tensor: the one cached so far is the first sample's own mask, returned in `out`
            self.cached_loss_mask = self.cached_loss_mask.new_ones(self.cached_loss_mask.shape)
        return out

    getitem_keeping_cache._keeps_loss_mask_cache = True
    GPTDataset.__getitem__ = getitem_keeping_cache
    if _rank() == 0:
        print(f"bridge_job: megatron-core {version}: patched GPTDataset's loss-mask cache ({where}): every sample's "
              "loss mask masks its own pad labels only", flush=True)
    return True


def run(cfg, callbacks=None, beat=None) -> int:
    """Bridge's own loop on ``cfg``; returns 0 when every step is done, EXIT_STOPPED after a clean stop.
    ``beat``: this rank's heartbeat (:func:`start_heartbeat`), told of every step."""
    if cfg.peft is not None and cfg.checkpoint.pretrained_checkpoint is None and cfg.checkpoint.load is None:
        raise SystemExit("bridge_job: LoRA needs checkpoint.pretrained_checkpoint (a Bridge checkpoint of the base model)")
    try:  # the pre-flight's checks: the run dir's copy beside this file (sys.path[0]) in the container, else vdkit's
        check = importlib.import_module("vdkit_preflight")
    except ImportError:
        check = importlib.import_module("vdkit.recipes.common.preflight")
    refused = check.bridge_base_refused(cfg)  # before Bridge builds anything: a fine-tune never trains random weights
    if refused:
        if _rank() == 0:
            print(f"bridge_job: {refused}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    from megatron.bridge.training.gpt_step import forward_step  # after the guard: a refusal saves the import's minute
    from megatron.bridge.training.pretrain import pretrain
    save = cfg.checkpoint.save
    if save and _rank() == 0:
        trust.trust_latest(save, lambda line: print(line, flush=True))
    arm_stop(cfg)
    collective_timeout(cfg)
    if beat is not None:
        callbacks = _with(callbacks, heartbeat_callback(beat))
    keep_loss_mask_cache()  # before pretrain() builds the datasets
    weights_only_end = weights_only_at_the_end(cfg)
    stopped = False
    try:
        pretrain(cfg, forward_step, callbacks=_stop_callbacks(callbacks, weights_only_end))
    except SystemExit as exc:  # Bridge's stop: checkpoint written, then sys.exit(0); the end returns
        if exc.code not in (0, None):
            raise
        stopped = True
    # A timing run (save_interval 0) writes no checkpoint at its end: only a stop tells the two apart.
    if stopped and save and trust.checkpointed_iteration(save) < cfg.train.train_iters:
        print(f"bridge_job: stopped after iteration {trust.checkpointed_iteration(save)} of {cfg.train.train_iters} "
              f"(checkpoint written); exit {EXIT_STOPPED}: continue the run", flush=True)
        return EXIT_STOPPED
    return 0


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bridge_job.py BRIDGE_YAML", file=sys.stderr)
        return 2
    beat = start_heartbeat()  # first: start-up (imports, model build, checkpoint load) is watched too
    try:
        cfg = load(args[0])
    except ImportError:  # the image lacks Bridge: not the file's fault, so not reported as a refused edit
        raise
    except Exception as exc:  # noqa: BLE001 - a hand-edited file Bridge refuses: one line, not a traceback
        return refused(args[0], exc)
    return run(cfg, beat=beat)


def refused(path, exc) -> int:
    """One line (rank 0) for a bridge.yaml Bridge's loader refuses (a syntax error, a misspelt key, a wrong
    type); exit 2 (EXIT_REFUSED), which the batch shell reads as the recipe's fault and does not restart."""
    if _rank() == 0:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"bridge_job: Bridge's ConfigContainer.from_yaml refuses {path}: {detail[:800]} (fix: correct the key "
              "or value it names, or re-render the run with `vdkit render`; `vdkit check RUN_DIR` finds this before "
              "a job is queued)", file=sys.stderr, flush=True)
    return 2


if __name__ in ("__main__", "__mp_main__"):  # __mp_main__: a torch_dist writer's child re-importing this file
    hold_stops(forward_term=__name__ == "__main__")
if __name__ == "__main__":
    sys.exit(main())
