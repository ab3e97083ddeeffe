"""Optimizer and trainer constants every engine shares, typed once.

The NeMo config renders them, the kit's own engines train with them, so that engines differ in how
they run a recipe, never in what they train. Adam's betas depend on the method: fine-tuning takes
NeMo 1.x's (:data:`ADAM_BETAS`), pretraining NVIDIA's Llama 2 launcher's (conf/nvidia/llama2_pretrain.yaml,
which the NeMo engine renders for pretraining): :func:`adam_betas`.
"""
from __future__ import annotations

from typing import Tuple

ADAM_BETAS = (0.9, 0.98)  # NeMo's optim.betas in megatron_gpt_finetuning_config and megatron_llama_config
GRAD_CLIP = 1.0  # NeMo's trainer.gradient_clip_val
GPU_PRECISION = "bf16-mixed"  # Lightning 2 spelling; NeMo 1.23's trainer takes it. fp8 runs inside it.
CPU_PRECISION = "32-true"  # CPUs train in fp32 (no bf16 autocast worth having on CPU)


def adam_betas(recipe) -> Tuple[float, float]:
    """Adam's (beta1, beta2) for ``recipe``: NVIDIA's pretraining betas for method=pretrain, NeMo's otherwise."""
    if recipe.method.name == "pretrain":
        from vdkit.composition.config import nvidia_pretrain_tables

        b1, b2 = nvidia_pretrain_tables()["common"]["model.optim.betas"]
        return float(b1), float(b2)
    return ADAM_BETAS
