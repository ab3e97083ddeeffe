"""NVIDIA's NeMo containers and the Megatron-Bridge each ships: the one home of the image <-> Bridge map.

From Bridge's ``docs/releases/software-versions.md`` (tags v0.3.1 and v0.6.0): NeMo Framework 25.09 ->
Bridge 0.1.0rc3 (megatron-core 0.14), 25.11 -> 0.2.0 (0.15), 26.02 -> 0.3.0 (0.16, Transformer Engine
2.12), 26.04 -> 0.4.0 (0.17), 26.06 -> 0.5.0 (0.18). 26.02.01 is 26.02's patch release, shipping Bridge 0.3.1
(a patch of 0.3.0 on the same megatron-core 0.16; not a row of Bridge's table). The kit renders
and tests for :data:`BRIDGE_VERSION` (pinned in the ``bridge`` extra); a newer image runs a newer Bridge
whose configuration keys may differ: render for the image you run.
"""
from __future__ import annotations

IMAGES = {  # nvcr.io/nvidia/nemo:<tag> -> (Megatron-Bridge, megatron-core)
    "25.09": ("0.1.0rc3", "0.14"),
    "25.11": ("0.2.0", "0.15"),
    "26.02": ("0.3.0", "0.16"),
    "26.02.01": ("0.3.1", "0.16"),
    "26.04": ("0.4.0", "0.17"),
    "26.06": ("0.5.0", "0.18"),
}
IMAGE = "26.02.01"  # the image the bridge engine renders for (conf/engine/bridge.yaml's container)
IMAGE_TAG = f"nemo:{IMAGE}"
BRIDGE_VERSION, MCORE_VERSION = IMAGES[IMAGE]


def bridge_of(tag: str):
    """The Megatron-Bridge version NVIDIA's ``nemo:<tag>`` image ships, or None when the map has no such tag."""
    return IMAGES.get(tag.split(":")[-1], (None, None))[0]
