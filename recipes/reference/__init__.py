"""The reference engine: Lightning (Fabric) + transformers + peft, trains Llama-architecture models for real.

Run inside each rank as ``python -m vdkit.recipes.reference RUN_DIR``. This ``__init__`` stays free of
heavy imports: the Slurm renderer and ``vdkit run`` import it only for :func:`reference_command`.

Modules: ``distributed`` (ranks from Slurm or local env), ``data`` (tokenizer, samples, the
deterministic batch order), ``model`` (Llama from ModelCfg + peft), ``progress`` (NeMo-style
progress lines and TensorBoard), ``checkpoint`` (atomic save, resume), ``train`` (the loop).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import List, Union

from vdkit.errors import UserError

# What a rank imports, and the pyproject extra that installs it (torch-less login-node installs
# plan, render and submit; training here needs these).
RUNTIME_MODULES = ("torch", "lightning", "transformers", "peft")
EXTRA = "reference"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked package
        return False


def require_runtime() -> None:
    """Raise one line naming the extra to install when the engine's libraries are missing here."""
    missing = [m for m in RUNTIME_MODULES if not _installed(m)]
    if missing:
        raise UserError(f"the reference engine needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
                        " not installed in this Python", f"install the extra: pip install torch 'vdkit[{EXTRA}]' "
                        "(or from a checkout: pip install torch -e '.[reference]')")


def reference_command(run_dir: Union[str, Path], python: str = sys.executable) -> List[str]:
    """The command one rank runs: ``[python, -m, vdkit.recipes.reference, RUN_DIR]``."""
    return [python, "-m", "vdkit.recipes.reference", str(run_dir)]


def preflight(plan) -> None:
    """Every check the engine's ranks would make that can run here, before a run dir is written:
    its libraries, the plan (layout, batch, sequence room) and the inputs (data files, tokenizer)."""
    from vdkit.recipes.reference.data import check_inputs
    from vdkit.recipes.reference.train import check_plan

    require_runtime()
    check_plan(plan)
    check_inputs(plan.recipe)
