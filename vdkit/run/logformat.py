"""The log format every engine writes and validation reads: NeMo 1.x's metric names.

Engines print NeMo 1.x progress updates (Lightning's TQDM bar with these metrics) and write the
same names as TensorBoard scalars; :mod:`vdkit.validation.text_log` and :mod:`vdkit.validation.tensorboard_events` parse them. One home for the
names, so a writer and the parser cannot drift apart.
"""
from __future__ import annotations


TIMING_KEY = "train_step_timing in s"  # seconds of one optimizer step (NeMo's TimingCallback)
LOSS_KEY = "reduced_train_loss"  # the step's loss, averaged over data-parallel ranks
LR_KEY = "lr"
GLOBAL_STEP_KEY = "global_step"  # 0-based: n - 1 after n steps
CONSUMED_SAMPLES_KEY = "consumed_samples"  # n x GBS after n steps
