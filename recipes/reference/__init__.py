"""The reference engine: Lightning (Fabric) + transformers + peft, trains Llama-architecture models for real.

Run inside each rank as ``python -m vdkit.recipes.reference RUN_DIR``. This ``__init__`` stays free of
heavy imports: the Slurm renderer and ``vdkit run`` import it only for :func:`reference_command`.

Modules: ``distributed`` (ranks from Slurm or local env), ``data`` (tokenizer, samples, the
deterministic batch order), ``model`` (Llama from ModelCfg + peft), ``progress`` (NeMo-style
progress lines and TensorBoard), ``checkpoint`` (atomic save, resume), ``train`` (the loop).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Union


def reference_command(run_dir: Union[str, Path], python: str = sys.executable) -> List[str]:
    """The command one rank runs: ``[python, -m, vdkit.recipes.reference, RUN_DIR]``."""
    return [python, "-m", "vdkit.recipes.reference", str(run_dir)]
