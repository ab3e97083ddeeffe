"""The megatron engine: megatron-core's GPTModel, parallel state, schedules and optimizer, for real.

Run inside each rank as ``python -m vdkit.recipes.megatron RUN_DIR``. This ``__init__`` stays free of
heavy imports (torch, megatron): the Slurm renderer and ``vdkit run`` import it for
:func:`megatron_command` only.

Modules: ``cpu_shim`` (what megatron-core 0.16.1 needs on a CPU; pinned), ``model`` (Llama as
GPTModel chunks, LoRA, P-tuning, layout-independent initial weights), ``data`` (micro batches from
the kit's samples), ``train`` (the loop), ``checkpoint`` (per-rank, atomic, resume), ``memory``
(measured vs planned bytes per rank: memory.json). Logs are the reference engine's NeMo-style
progress lines and TensorBoard scalars (recipes/reference/progress.py).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Union

MODULE = "vdkit.recipes.megatron"


def megatron_command(run_dir: Union[str, Path], python: str = sys.executable) -> List[str]:
    """The command one rank runs: ``[python, -m, vdkit.recipes.megatron, RUN_DIR]``."""
    return [python, "-m", MODULE, str(run_dir)]
