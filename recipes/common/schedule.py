"""The learning-rate schedule every engine the kit runs itself uses (NeMo's CosineAnnealing)."""
from __future__ import annotations

import math


def lr_at(step: int, method, max_steps: int) -> float:
    """NeMo's CosineAnnealing: linear warm-up, then cosine from method.lr down to method.min_lr."""
    warm = method.warmup_steps
    if step < warm:
        return method.lr * (step + 1) / (warm + 1)
    span = max(max_steps - warm, 1)
    frac = min((step - warm) / span, 1.0)
    return method.min_lr + 0.5 * (method.lr - method.min_lr) * (1 + math.cos(math.pi * frac))
