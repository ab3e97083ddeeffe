"""NeMo 1.23's ranks beat for the launcher's watchdog: a Lightning callback, installed through Lightning's entry points.

NeMo's example scripts build their Trainer themselves (``MegatronTrainerBuilder(cfg).create_trainer()``): no
config key adds a callback. Lightning adds to every Trainer the callbacks that a factory registered under the
entry-point group ``pytorch_lightning.callbacks_factory`` returns (pytorch_lightning/trainer/connectors/
callback_connector.py ``on_trainer_init``; lightning_fabric/utilities/registry.py ``_load_external_callbacks``).
So the run dir holds :data:`CALLBACK_DIR`: this module, the heartbeat (vdkit.recipes.common.heartbeat as one file) and a
distribution's metadata naming :func:`pytorch_lightning_callbacks`; each rank's command puts that directory on
``PYTHONPATH`` (vdkit.recipes.nemo). This file runs in NVIDIA's image without vdkit: it imports the standard
library, Lightning and the heartbeat beside it, and nothing when no heartbeat was asked for.

What it reports: progress after every optimizer step (``trainer.global_step``; NeMo's Megatron models run a
global batch's micro batches inside one training_step), a validation batch as progress, phase ``save`` from
Lightning's ``on_save_checkpoint`` until the next batch starts and after the last step (NeMo's ``on_train_end``
writes the ``-last`` checkpoint and the ``.nemo``); ``exit`` as the process leaves Python.
"""
import os
import time

CALLBACK_DIR = "nemo_callbacks"  # in the run dir, on the ranks' PYTHONPATH
DIST_NAME = "vdkit_nemo_heartbeat"  # the distribution (metadata only) that declares the entry points
ENTRY_POINTS = {"pytorch_lightning.callbacks_factory": "pytorch_lightning_callbacks",  # NeMo 1.23 (pytorch_lightning)
                "lightning.pytorch.callbacks_factory": "lightning_callbacks"}  # the unified package, alike
HEARTBEAT_MODULE = "vdkit_heartbeat"  # vdkit.recipes.common.heartbeat.STANDALONE_NAME (tests check they agree)

_BEAT = []  # this process's heartbeat, once started (one per process, however many Trainers it builds)


def _beat():
    if not _BEAT:
        from vdkit_heartbeat import Heartbeat  # beside this file, on PYTHONPATH

        # Lightning's SLURMEnvironment: the global rank is SLURM_PROCID (torchrun's RANK elsewhere)
        _BEAT.append(Heartbeat.from_env(int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))))
    return _BEAT[0]


def _callbacks(base):
    beat = _beat() if os.environ.get("VDKIT_HEARTBEAT_DIR") else None
    return [] if beat is None else [_callback_class(base)(beat)]


def pytorch_lightning_callbacks():
    """Entry point (``pytorch_lightning.callbacks_factory``): the heartbeat callback, or none without a launcher's
    ``$VDKIT_HEARTBEAT_DIR``."""
    from pytorch_lightning import Callback

    return _callbacks(Callback)


def lightning_callbacks():
    """Entry point (``lightning.pytorch.callbacks_factory``): as :func:`pytorch_lightning_callbacks`."""
    from lightning.pytorch import Callback

    return _callbacks(Callback)


def _callback_class(base):
    class VdkitHeartbeat(base):
        """Tells this rank's heartbeat of every step, validation batch and save (see the module docstring)."""

        def __init__(self, beat):
            self.beat, self.started = beat, time.monotonic()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.beat.phase == "save":
                self.beat.saving(False)
            self.started = time.monotonic()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.beat.progress(trainer.global_step, time.monotonic() - self.started)

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self.beat.progress(self.beat.step, self.beat.step_ms / 1000.0)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            self.beat.saving(True)

        def on_train_end(self, trainer, pl_module):
            self.beat.saving(True)

    return VdkitHeartbeat
