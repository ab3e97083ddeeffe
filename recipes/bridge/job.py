"""A Megatron-Bridge training job from a ConfigContainer YAML: what every rank runs in the container.

This file is copied into each run directory (``bridge_job.py``) and runs in NVIDIA's
``nvcr.io/nvidia/nemo:26.02.01`` image as it is (Megatron-Bridge 0.3.1): it imports nothing from
vdkit. One process per GPU (srun task); Bridge finds its rank from torchrun's or Slurm's variables.

    python bridge_job.py bridge.yaml

It loads the file with Bridge's own ``ConfigContainer.from_yaml`` and runs Bridge's own loop:
``finetune()`` when there is a base model to start from (``checkpoint.pretrained_checkpoint``),
else ``pretrain()``, with Bridge's GPT ``forward_step``. vdkit's local runner (``python -m
vdkit.recipes.bridge``) calls :func:`load` and :func:`run` the same way, after its CPU shim.
"""
import sys


def load(path):
    """Bridge's ConfigContainer from its YAML (unknown keys refused, so a typo cannot pass silently)."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.utils.config_utils import InstantiationMode

    return ConfigContainer.from_yaml(str(path), mode=InstantiationMode.STRICT)


def run(cfg, callbacks=None):
    """Bridge's own loop on ``cfg``: fine-tuning from a base model, else pretraining."""
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    # finetune() is exactly this assertion plus pretrain() (training/finetune.py); pretrain() is
    # called directly so that callbacks can be passed.
    if cfg.peft is not None and cfg.checkpoint.pretrained_checkpoint is None and cfg.checkpoint.load is None:
        raise SystemExit("bridge_job: LoRA needs checkpoint.pretrained_checkpoint (a Bridge checkpoint of the base model)")
    pretrain(cfg, forward_step, callbacks=callbacks)


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bridge_job.py BRIDGE_YAML", file=sys.stderr)
        return 2
    run(load(args[0]))
    return 0


if __name__ == "__main__":  # the torch_dist async writer spawns children that re-import this file
    sys.exit(main())
