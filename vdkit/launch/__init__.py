"""The launcher registry, the local launcher and the fabric's NCCL / RCCL variables every launcher sets."""
