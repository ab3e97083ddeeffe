"""The CPU shim for megatron-core: pinned, applied only without CUDA, and still fitting megatron-core.

Each check runs in a fresh interpreter: the shim patches torch.cuda for the life of a process.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("megatron.core")


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_shim_applies_to_the_pinned_version_and_answers_what_megatron_asks():
    proc = _py("""
        import warnings; warnings.simplefilter("ignore")
        import torch
        assert not torch.cuda.is_available()
        from vdkit.recipes.common import mcore_cpu as cpu_shim
        assert cpu_shim.apply() is True and cpu_shim.apply() is True   # once, idempotent
        # 1. CUDA devices in tensor factories, .to() and .cuda() land on the CPU
        assert torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
        assert torch.empty(3, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu" and torch.ones(2).to("cuda").device.type == "cpu"
        # 2. megatron's RNG tracker works on the CPU generator
        from megatron.core.tensor_parallel import random as r
        r.get_cuda_rng_tracker().add("x", 7)
        with r.get_cuda_rng_tracker().fork("x"):
            a = torch.rand(3)
        # 3. the CUDA type checks (grad clipping, distributed optimizer) are answered
        assert torch.ones(1).type() == "torch.cuda.FloatTensor"
        assert torch.ones(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert torch.ones(1, dtype=torch.long).type() == "torch.LongTensor"
        # 4. synchronize is a no-op
        torch.cuda.synchronize()
        print("OK")
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_shim_refuses_another_megatron_core_version_loudly():
    proc = _py("""
        import importlib.metadata as md
        real = md.version
        md.version = lambda name: "0.99.0" if name == "megatron-core" else real(name)
        from vdkit.recipes.common import mcore_cpu as cpu_shim
        try:
            cpu_shim.apply()
        except cpu_shim.ShimVersionError as exc:
            print("REFUSED", exc)
    """)
    assert "REFUSED" in proc.stdout and "0.16.1" in proc.stdout and "0.99.0" in proc.stdout, proc.stderr[-2000:]


def test_the_cuda_spots_the_shim_answers_are_still_in_megatron_core():
    """If an upgrade removes these, the shim may be dead weight or wrong: re-validate it (and its pin)."""
    import importlib.util
    from importlib.metadata import version
    from pathlib import Path

    from vdkit.recipes.common.mcore_cpu import TESTED_VERSION

    assert version("megatron-core") == TESTED_VERSION, "megatron-core changed: re-validate recipes/common/mcore_cpu.py"
    root = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0])
    spots = {"optimizer/clip_grads.py": "torch.cuda.FloatTensor", "optimizer/distrib_optimizer.py": "torch.cuda.FloatTensor",
             "pipeline_parallel/schedules.py": 'device="cuda"', "tensor_parallel/random.py": "def _get_cuda_rng_state",
             "pipeline_parallel/p2p_communication.py": "torch.cuda.current_device()"}
    for rel, needle in spots.items():
        assert needle in (root / rel).read_text(), f"{rel} no longer has {needle!r}"
