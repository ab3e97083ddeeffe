"""Known-harmless library warnings: silenced by category and message, everything else still prints."""
import re
import warnings

import pytest

from vdkit.recipes.common import known_warnings
from vdkit.recipes.common.known_warnings import KNOWN, silence

# The messages as the pinned libraries print them (seen in `vdkit run` output: torch 2.13, transformers 5.23,
# peft 0.21, DeepSpeed 0.19, megatron-core 0.16.1, Megatron-Bridge 0.3.1), one per entry.
SEEN = {
    "deepspeed": ["`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
                  "`torch.distributed.all_gather_single` instead."],
    "peft": ["`is_gradient_checkpointing` is deprecated and will be removed in v6. Use `is_activation_checkpointing` "
             "instead."],
    "megatron": ["Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
                 "Apex is not installed. Falling back to Torch Norm",
                 "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.",
                 "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
                 "`torch.distributed.reduce_scatter_single` instead.",
                 "If you are using transformer_engine as the transformer implementation, the core_attn is from "
                 "transformer_engine and may be the fused version.",
                 "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute "
                 "won't be populated during autograd.backward()."],
    "bridge": ["transformers version 5.23.0 is not tested with nvidia-modelopt and may cause issues. Please install "
               "recommended version with `pip install nvidia-modelopt[hf]` if working with HF models.",
               "The legacy GroupedMLP will be deprecated in Megatron-Core v0.12.0. Please update the "
               "TransformerEngine to version>=1.7.0 and use TEGroupedMLP."],
    "megatron-cpu": ["When using async grad allreduce it is recommended to set the environment variable "
                     "CUDA_DEVICE_MAX_CONNECTIONS to 1 for maximum speedup"],
}
ALSO_SEEN = {  # a second message an entry covers
    "megatron-cpu": ["When using sequence parallelism it is recommended to set the environment variable "
                     "CUDA_DEVICE_MAX_CONNECTIONS to 1 for maximum speedup"],
}


def emitted(group, message, category):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence(group)
        warnings.warn(message, category)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("group", sorted(KNOWN))
def test_each_entry_silences_what_the_library_prints(group):
    assert len(SEEN[group]) == len(KNOWN[group])
    for (category, _pattern, why), message in zip(KNOWN[group], SEEN[group]):
        assert why, "say why it is harmless"
        assert emitted(group, message, category) == [], message
    for message in ALSO_SEEN.get(group, []):
        assert emitted(group, message, UserWarning) == [], message


@pytest.mark.parametrize("group", sorted(KNOWN))
def test_nothing_else_is_silenced(group):
    for (category, _pattern, _why), message in zip(KNOWN[group], SEEN[group]):
        assert emitted(group, message, DeprecationWarning if category is FutureWarning else FutureWarning) == [message]
        assert emitted(group, "a different " + message, category) == ["a different " + message]
        assert emitted(group, "something else went wrong", category) == ["something else went wrong"]


def test_no_blanket_pattern():
    for entries in KNOWN.values():
        for category, pattern, _why in entries:
            assert category is not Warning and len(pattern) >= 15 and not re.fullmatch(r"[.*]*", pattern)


def test_filters_are_added_not_reset():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        before = list(warnings.filters)
        known_warnings.silence("peft")
        assert warnings.filters[len(warnings.filters) - len(before):] == before
