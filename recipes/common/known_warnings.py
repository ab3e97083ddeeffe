"""Warnings the pinned libraries print in a rank that say nothing a user can act on, silenced at their source.

Each entry is (category, message regex, why it is harmless); the regex matches from the start of the
message (Python's rule for warning filters). :func:`silence` installs one
``warnings.filterwarnings("ignore", ...)`` per entry - by category *and* message, never a blanket
ignore - so any other warning still prints. An engine calls it for the groups it triggers before it
imports or calls the library. Standard library only.

Why a filter is needed even for a warning Python would print "once": libraries that change the
warning filters (Lightning does, in ``catch_warnings`` blocks, every step) reset Python's
once-per-location memory, so a deprecation inside a collective printed 41 times in a 10-step ZeRO-3
run, inside its progress bar.
"""
from __future__ import annotations

import warnings
from typing import Dict, Tuple, Type

Entry = Tuple[Type[Warning], str, str]

# torch 2.13 renamed two collectives; DeepSpeed's ZeRO-3 and megatron-core's distributed optimizer call the old
# names, which still run: only those libraries can change the call.
OLD_COLLECTIVES: Entry = (FutureWarning,
                          r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
                          "the library calls torch's older collective names; torch 2.13 still runs them")

KNOWN: Dict[str, Tuple[Entry, ...]] = {
    # DeepSpeed 0.16-0.19 (parallelism.sharding=zero3)
    "deepspeed": (OLD_COLLECTIVES,),
    # transformers 5 + peft (the reference engine's LoRA / P-tuning)
    "peft": (
        (FutureWarning, r"`is_gradient_checkpointing` is deprecated",
         "peft's PeftModel reads transformers' old property name; transformers 5 still answers it"),
    ),
    # megatron-core 0.16 anywhere
    "megatron": (
        (UserWarning, r"Transformer Engine and Apex are not installed",
         "optional fused kernels: megatron-core falls back to torch's optimizer and norms, which the engine "
         "is written against"),
        (UserWarning, r"Apex is not installed", "as above: torch's norm is the fallback"),
        (UserWarning, r"full scope is deprecated", "megatron-core's own default cuda_graph_scope; no CUDA graphs"),
        OLD_COLLECTIVES,
        (UserWarning, r"If you are using transformer_engine as the transformer implementation, the core_attn",
         "advice for Transformer Engine layers; the engine builds megatron-core's local (torch) layers, where "
         "selective recompute of core attention is what the plan asks for"),
        (UserWarning, r"The \.grad attribute of a Tensor that is not a leaf Tensor",
         "megatron-core's grad-buffer checks read .grad of non-leaf views; the engine's gradients are in "
         "the buffers"),
    ),
    # Megatron-Bridge 0.3.1 (engine=bridge), on top of "megatron"
    "bridge": (
        (UserWarning, r"transformers version \S+ is not tested with nvidia-modelopt",
         "Bridge imports nvidia-modelopt (quantisation / distillation, which the engine does not use) at "
         "import; its tested transformers pin lags the installed transformers 5"),
        (UserWarning, r"The legacy GroupedMLP will be deprecated",
         "megatron-core's TE spec provider, imported by Bridge, speaks of MoE layers; the engine's Llama "
         "models have none"),
    ),
    # megatron-core 0.16 on a CPU (gloo): CUDA-only advice
    "megatron-cpu": (
        (UserWarning, r"When using (async grad allreduce|sequence parallelism) it is recommended to set the "
                      r"environment variable CUDA_DEVICE_MAX_CONNECTIONS",
         "a CUDA stream setting (the engine exports it for GPU jobs); a CPU has no CUDA streams"),
    ),
}


def silence(*groups: str) -> None:
    """Ignore the known-harmless warnings of ``groups`` (keys of :data:`KNOWN`) in this process."""
    for group in groups:
        for category, pattern, _why in KNOWN[group]:
            warnings.filterwarnings("ignore", message=pattern, category=category)
