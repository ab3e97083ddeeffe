"""A LoRA adapter whose two factors both start at zero never trains: one rule for every engine's check.

LoRA adds ``scale * B(A x)``. With A = 0 and B = 0 the gradient of B is ``grad ⊗ (A x) = 0`` and that of A is
``(Bᵀ grad) ⊗ x = 0``: both stay zero for ever, the base is frozen, and the run's loss never moves - while the
trainable count matches the plan. The stacks take ``zero`` for either factor (Megatron-Bridge 0.3.1
``peft/utils.py:585-594``, NeMo 1.23 ``parallel_adapters.py:206-215``), so nothing refuses the pair.
"""
from __future__ import annotations

from typing import Optional, Tuple

ZERO = "zero"


def both_zero(a_init, b_init, a_key: str, b_key: str, where: str) -> Optional[Tuple[str, str, str]]:
    """(what, setting, fix) when ``a_init`` and ``b_init`` (the two factors' init method names) are both zero."""
    if str(a_init).lower() != ZERO or str(b_init).lower() != ZERO:
        return None
    return (f"{a_key} and {b_key} are both {ZERO!r} in {where}: LoRA's two factors start at zero, so each one's "
            "gradient is the other times something (B: grad x (A x), A: B^T grad x x), both stay zero and, the base "
            "frozen, nothing trains", f"{a_key} / {b_key}",
            "start one factor random (the render's: the input factor xavier, the output factor zero), or re-render")
