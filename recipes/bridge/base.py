"""Which Megatron-Bridge checkpoint a fine-tuning run loads, and whether its render chains the HF import first.

Read by the render (``config.py``, the engine's files) and by the conversion job (``convert.py``): one home,
standard library only at import, so neither imports the other.
"""
from __future__ import annotations


def default_base(recipe) -> str:
    """Where the import writes a model's Bridge checkpoint when ``model.megatron_path`` is not set: beside the
    staged HF weights (``/shared/models/<model>-bridge``), once per site and model."""
    from vdkit.recipes.common import staging

    return f"{staging.STAGED_ROOT}/{recipe.model.name}-bridge"


def chains_import(recipe, in_container: bool) -> bool:
    """Whether the render chains the conversion before training: a cluster fine-tuning run from staged HF weights
    (``model.hf_path``) with no ``model.megatron_path`` given, on a launcher that runs jobs first (Slurm). The run dir's ``import_hf.sbatch`` then runs first
    and training waits on it (``--dependency=afterok``, :data:`vdkit.run.rundir.FIRST_FILE`)."""
    from vdkit.launch.launchers import runs_first

    return (in_container and recipe.method.name != "pretrain" and not recipe.model.megatron_path
            and bool(recipe.model.hf_path) and runs_first(recipe.cluster.launcher))


def base_checkpoint(recipe, in_container: bool):
    """The Bridge checkpoint a fine-tuning run loads: ``model.megatron_path``, else (when the render chains the
    import) :func:`default_base`; None when there is none."""
    if recipe.method.name == "pretrain":
        return None
    return default_base(recipe) if chains_import(recipe, in_container) else recipe.model.megatron_path
