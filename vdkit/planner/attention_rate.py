"""The fused dot-product attention's share of the BF16 peak, per stack: published kernel rates, not a fit.

conf/calibration/step_time.yaml ``attention`` holds the FlashAttention-3 paper's H100 rates (arXiv 2407.08608,
head dim 128, causal forward and backward, TFLOP/s by sequence length) of the kernels each Transformer Engine
generation runs on Hopper. A step runs one forward and :data:`FLASH_BACKWARD_PASSES`
forwards' FLOPs backward, so the rate it sees is their harmonic blend, read at the tokens one GPU's kernel holds
(the attention span / CP). Where the table does not speak (another GPU or head dimension, FP8 attention, unfused
local layers, a stack without Transformer Engine) :func:`rate` returns None and the step-time model keeps the GEMM
rule (the BF16 peak x gemm_efficiency_bf16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

# FlashAttention's backward runs 5 matmuls to the forward's 2 (it recomputes Q K^T rather than keep the s x s
# probabilities): 2.5 forwards (Dao, FlashAttention-2, 2023, sec. 4.1's FLOP count). It computes dQ, dK and dV
# whatever the method: attention has no weights, so PEFT's frozen base saves none of it.
FLASH_BACKWARD_PASSES = 2.5


@dataclass(frozen=True)
class AttentionRate:
    """The attention kernels' efficiency (fraction of the GPU's BF16 peak) and what it rests on."""

    efficiency: float
    kernels: str  # a key of step_time.yaml attention.kernels
    te_version: str  # the Transformer Engine version the stack runs
    seq: float  # the tokens per kernel it was read at

    def basis(self, source: str) -> str:
        """The plan's basis line for the attention term."""
        return (f"at {self.efficiency:.3g} of the BF16 peak, its kernels' benchmarked rate ({self.kernels} kernels of "
                f"Transformer Engine {self.te_version}, at {self.seq:,.0f} tokens per GPU: {source})")


def _version(text: str) -> Tuple[int, ...]:
    """'1.10' -> (1, 10, 0): versions compare numerically ('1.4' < '1.10'; a bare major '1' is 1.0.0)."""
    parts = [int(p) for p in str(text).split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def _named(text: str) -> str:
    """engine.transformer_engine as given: a full version as pip reports it (1.10.0, 1.6.0rc2) - a bare 1.10 reaches
    the config as the number 1.1, so two parts are refused rather than misread. Returns its major.minor.patch."""
    import re

    got = re.match(r"^(\d+)\.(\d+)\.(\d+)", str(text))
    if not got:
        from vdkit.errors import UserError

        raise UserError(f"engine.transformer_engine={text!r} is not a full Transformer Engine version (a bare "
                        "1.10 reads as the number 1.1)",
                        "write it as pip reports it, e.g. engine.transformer_engine=1.10.0")
    return ".".join(got.groups())


def te_version(recipe) -> Optional[str]:
    """The Transformer Engine version ``recipe``'s job runs: engine.transformer_engine (UserError unless a full
    version such as 1.10.0), else the major version of
    its engine's image (conf/calibration/memory.yaml ``transformer_engine_major``; None: not named there)."""
    if recipe.engine.transformer_engine is not None:
        return _named(recipe.engine.transformer_engine)
    from vdkit.planner.calibration import memory

    major = memory()["transformer_engine_major"].get(recipe.engine.name)
    return None if major is None else str(major)


def check_renders(recipe) -> None:
    """Render / submit / run: engine.transformer_engine plans the attention of a stack the job must really run. A
    version whose major differs from the one the engine's code runs on (memory.yaml ``transformer_engine_major``:
    Bridge 0.3.1 needs TE 2.x, NeMo 1.23 runs TE 1.x) would price kernels no job of that engine runs: one line."""
    named = recipe.engine.transformer_engine
    if named is None:
        return
    from vdkit.planner.calibration import memory

    major = memory()["transformer_engine_major"].get(recipe.engine.name)
    if major is not None and int(_named(named).split(".")[0]) != int(major):
        from vdkit.errors import UserError

        raise UserError(f"engine.transformer_engine={named} plans Transformer Engine {named}'s attention kernels, but "
                        f"engine={recipe.engine.name} runs on Transformer Engine {major}.x: the plan would not be the job's",
                        "drop engine.transformer_engine to render (it plans published runs on their own stack), or name "
                        f"the {major}.x version your engine.container_image runs")


def _interp(xs, ys, x: float) -> float:
    """``ys`` read at ``x`` between the measured ``xs`` on a log scale, held at the ends (numpy.interp)."""
    import numpy as np  # here, not at import: the CLI's start-up path plans without it

    return float(np.interp(math.log(x), [math.log(v) for v in xs], [float(y) for y in ys]))


def blended_tflops(table: dict, kernels: str, seq: float) -> float:
    """TFLOP/s a step's attention runs at: one forward and FLASH_BACKWARD_PASSES forwards' FLOPs backward at the
    kernels' published rates at ``seq`` tokens, blended harmonically (time adds, not rates)."""
    bwd = FLASH_BACKWARD_PASSES
    k = table["kernels"][kernels]
    fwd_rate = _interp(table["seq_lengths"], k["forward"], seq)
    bwd_rate = _interp(table["seq_lengths"], k["backward"], seq)
    return (1.0 + bwd) / (1.0 / fwd_rate + bwd / bwd_rate)


def rate(recipe, calib: dict, peak_tflops_bf16: float, seq: float) -> Optional[AttentionRate]:
    """The attention's efficiency for ``recipe`` (kernels of its stack, at ``seq`` tokens per GPU), or None where
    step_time.yaml ``attention`` does not describe it (the caller keeps the GEMM rule)."""
    from vdkit.planner.activations import attention_precision
    from vdkit.planner.memory import layer_kernels

    table = calib["attention"]
    m = recipe.model
    version = te_version(recipe)  # first: a malformed engine.transformer_engine is refused on every plan
    if (version is None or attention_precision(recipe) != "bf16" or recipe.cluster.gpu_type not in table["gpus"]
            or m.hidden_size // m.num_attention_heads != int(table["head_dim"])
            or layer_kernels(recipe) != "fused"):
        return None
    entries = [e for e in table["transformer_engine"] if _version(e["te_from"]) <= _version(version)]
    if not entries:
        return None
    kernels = max(entries, key=lambda e: _version(e["te_from"]))["kernels"]
    return AttentionRate(blended_tflops(table, kernels, seq) / peak_tflops_bf16, kernels, version, seq)
