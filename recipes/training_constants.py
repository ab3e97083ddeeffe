"""Optimizer and trainer constants every engine shares (NeMo 1.x's values), typed once.

The NeMo config renders them, the reference engine (and any other engine) trains with them, so
that engines differ in how they run a recipe, never in what they train.
"""
from __future__ import annotations

ADAM_BETAS = (0.9, 0.98)  # NeMo's optim.betas in megatron_gpt_finetuning_config and megatron_llama_config
GRAD_CLIP = 1.0  # NeMo's trainer.gradient_clip_val
GPU_PRECISION = "bf16-mixed"  # Lightning 2 spelling; NeMo 1.23's trainer takes it. fp8 runs inside it.
CPU_PRECISION = "32-true"  # CPUs train in fp32 (no bf16 autocast worth having on CPU)
