"""`vdkit check` for engine=bridge: the learning-rate / weight-decay schedule as the job's setup builds it.

``ConfigContainer.validate()`` only computes the schedule's step counts; the schedule itself is built later, in
``setup_optimizer`` (``megatron/bridge/training/optim.py`` ``_get_scheduler``): megatron-core's
``OptimizerParamScheduler``, whose constructor asserts ``min_lr <= lr``, ``start_wd <= end_wd`` and, through its
first ``step(0)``, a constant weight-decay style with ``start_wd == end_wd`` (``optimizer_param_scheduler.py``
147-166, 196-198). Every rank stops there after the model is built and the base loaded. Here the same function runs
on the validated config with a one-group stand-in for the optimizer (the scheduler reads and writes nothing else).

That first step also writes each group's weight decay from the schedule (``:80``): ``optimizer.weight_decay`` is
not what trains, ``scheduler.start_weight_decay`` is. An edit of the one without the other is a defect here.

A warm-up as long as the decay is not refused by Bridge but shortened: ``ConfigContainer._calculate_scheduler_steps``
(``megatron/bridge/training/config.py`` 1678-1685) caps ``lr_warmup_steps`` at ``lr_decay_steps - 1`` with a rank-0
``warnings.warn`` only, and the job trains on another schedule than its bridge.yaml says: a defect here too.

Steps past the decay at a zero ``min_lr`` train at learning rate 0 (``optimizer_param_scheduler.py`` 237-238): a
``scheduler.lr_decay_iters`` cut short, or a ``train.train_iters`` lengthened past the rendered decay (a resumed run
extended, docs/checking-jobs.md "Hand edits and the plan"). megatron-core's own ``get_lr`` is read at every step of the
run: a defect (``_trains``).
"""
from __future__ import annotations

import math
import traceback
from types import SimpleNamespace

from vdkit.recipes.bridge.config import CONFIG_FILE
from vdkit.run.jobcheck import Report, one_line

FIX = "keep optimizer.lr >= optimizer.min_lr and the scheduler's weight decays as rendered (method.lr, method.min_lr, " \
      "method.weight_decay), or re-render the run with `vdkit render`"


def _asked_warmup(cfg):
    """(warm-up samples the config asks for, its key = value) before Bridge's cap: the three sources
    ``_calculate_scheduler_steps`` reads (config.py 1651-1668: a fraction of the decay, samples, or iterations x GBS)."""
    s, t = cfg.scheduler, cfg.train
    if s.lr_warmup_fraction is not None:
        return s.lr_warmup_fraction * s.lr_decay_steps, f"scheduler.lr_warmup_fraction={s.lr_warmup_fraction}"
    if t.train_samples is not None:
        return s.lr_warmup_samples, f"scheduler.lr_warmup_samples={s.lr_warmup_samples}"
    return s.lr_warmup_iters * t.global_batch_size, f"scheduler.lr_warmup_iters={s.lr_warmup_iters}"


def _warmup_capped(cfg, rep: Report) -> bool:
    """True (a defect in ``rep``) where validate() capped the asked warm-up at the decay's length."""
    asked, key = _asked_warmup(cfg)
    s = cfg.scheduler
    if asked < s.lr_decay_steps:
        return False
    decay = (f"scheduler.lr_decay_iters={s.lr_decay_iters}" if cfg.train.train_samples is None
             else f"scheduler.lr_decay_samples={s.lr_decay_samples}")
    rep.defect(f"{key} is not below {decay} ({asked:,.0f} warm-up samples, decay over {s.lr_decay_steps:,}): "
               f"Bridge's validate() caps the warm-up at {s.lr_decay_steps - 1:,} samples with only a rank-0 warning "
               f"(megatron/bridge/training/config.py:1678), so the job would train on another schedule than asked",
               f"{CONFIG_FILE} {key.split('=')[0]}",
               "keep the warm-up below the decay (the render writes min(method.warmup_steps, train.max_steps - 1)), "
               "or re-render the run with `vdkit render`")
    return True


def check(cfg, rep: Report) -> bool:
    """Bridge's ``_get_scheduler`` on ``cfg`` (after :func:`vdkit.recipes.bridge.runcheck.validate`); its line into
    ``rep``. False when the job's setup would refuse the schedule or validate() capped its warm-up."""
    from megatron.bridge.training.optim import _get_scheduler

    if _warmup_capped(cfg, rep):
        return False

    group = {}
    try:
        sched = _get_scheduler(cfg.optimizer, cfg.scheduler, SimpleNamespace(param_groups=[group]))
    except Exception as exc:  # megatron-core's asserts carry no message: name the assert and the values it holds
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"`{frame.line}` ({frame.filename.split('site-packages/')[-1]}:{frame.lineno})"
        rep.defect(f"megatron-core's OptimizerParamScheduler (built by Bridge's setup_optimizer, training/optim.py "
                   f"_get_scheduler) refuses the schedule: {one_line(exc)} at {where} on lr "
                   f"{cfg.optimizer.lr}, min_lr {cfg.optimizer.min_lr}, init lr {cfg.scheduler.lr_warmup_init}, weight "
                   f"decay {cfg.scheduler.start_weight_decay} -> {cfg.scheduler.end_weight_decay} "
                   f"({cfg.scheduler.weight_decay_incr_style}); every rank stops there at start-up",
                   f"{CONFIG_FILE} optimizer.* / scheduler.*", FIX)
        return False
    asked = cfg.optimizer.weight_decay
    if not math.isclose(group["weight_decay"], asked, rel_tol=1e-9, abs_tol=0.0):
        rep.defect(f"optimizer.weight_decay={asked} is not what trains: megatron-core's scheduler sets every "
                   f"parameter group's weight decay from scheduler.start_weight_decay / end_weight_decay "
                   f"({sched.start_wd} -> {sched.end_wd}) at each step (optimizer_param_scheduler.py:80)",
                   f"{CONFIG_FILE} optimizer.weight_decay",
                   "set scheduler.start_weight_decay and end_weight_decay to it too, or re-render with "
                   "method.weight_decay (`vdkit render`)")
        return False
    if not _trains(cfg, sched, rep):
        return False
    rep.checked(f"schedule built as the job's setup builds it (Bridge's _get_scheduler, megatron-core's "
                f"OptimizerParamScheduler): lr {sched.init_lr} -> {sched.max_lr} over {sched.lr_warmup_steps} "
                f"warm-up samples, {cfg.scheduler.lr_decay_style} to {sched.min_lr} at {sched.lr_decay_steps}; "
                f"weight decay {sched.start_wd}")
    return True


def _trains(cfg, sched, rep: Report) -> bool:
    """megatron-core's own ``get_lr`` at each of the run's steps (``num_steps`` counts samples: step x GBS): a run that
    goes on past its decay at ``min_lr`` 0 trains those steps at learning rate 0 (``optimizer_param_scheduler.py:237``:
    past the decay, ``min_lr``), nothing refusing it - ``scheduler.lr_decay_iters: 5`` of 50, or ``train.train_iters``
    edited up from the rendered 50 (the render writes lr_decay_iters = the plan's steps). NeMo (its CosineAnnealing's
    max_steps from trainer.max_steps) and the megatron / reference engines (``recipes/common/schedule.py`` on the run's
    own count) decay over an edited count instead. Step 0 at 0 is the warm-up's first (``lr_warmup_init`` 0)."""
    steps, gbs = int(cfg.train.train_iters or 0), int(cfg.train.global_batch_size or 0)
    saved = sched.num_steps
    try:
        zero = []
        for step in range(1, steps):
            sched.num_steps = step * gbs
            if sched.get_lr({}) == 0.0:
                zero.append(step)
    finally:
        sched.num_steps = saved
    if not zero:
        return True
    decay = cfg.scheduler.lr_decay_iters
    rep.defect(f"train.train_iters={steps} runs past scheduler.lr_decay_iters={decay}: megatron-core's get_lr holds "
               f"every step after the decay at optimizer.min_lr={cfg.optimizer.min_lr} (optimizer_param_scheduler.py:237), "
               f"so the last {len(zero)} steps train nothing (from step {zero[0]} on: {len(zero)} of the run's {steps} "
               "steps at learning rate 0)", f"{CONFIG_FILE} scheduler.lr_decay_iters / optimizer.min_lr",
               f"set scheduler.lr_decay_iters={steps} (resuming a saved run, also "
               "scheduler.override_opt_param_scheduler=true: megatron-core asserts the checkpoint's decay length "
               "otherwise, optimizer_param_scheduler.py:326) or keep a min_lr above 0, or re-plan with `vdkit render "
               f"... train.max_steps={steps}`")
    return False
