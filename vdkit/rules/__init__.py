"""The door: every rule a composed recipe must pass before anything plans, renders or runs it.

``check_recipe(recipe)`` runs after Hydra composition (``vdkit.composition.config.compose``), so a bad value is
one line naming the key, why and the fix, exit 2, before a run directory or a rank exists. One
module per concern:

- :mod:`.numbers`: every float field finite, every numeric field in its domain (:data:`~.numbers.DOMAINS`);
- :mod:`.families`: the architecture fields per model family (:data:`~.families.FAMILIES`) and RoPE
  scaling that transformers can build;
- :mod:`.paths`: the files the kit itself reads (a DeepSpeed config, a local ``model.hf_path``) and
  ``run.name`` / ``run.out_dir``;
- :mod:`.contradictions`: two settings that are fine alone and contradict each other (run.mode=train with
  train.val_every_n_steps above train.max_steps; a command-line cluster.gpu_type beside another GPU's stated memory);
- :mod:`.cuda_graphs`: ``train.cuda_graphs=layer`` beside what megatron-core refuses with per-layer CUDA graphs
  (full recompute, packed sequences) and a cluster without GPUs;
- :mod:`.environment`: ``cluster.env`` free of job-breaking names (PATH, UID, LD_*, SLURM_*, rendezvous
  variables, ...: the deny-list) and of secrets;
- :mod:`.secrets`: no token in any other recipe value; ``run.secrets_file``'s names and its mode;
- :mod:`.overrides`: the command line's syntax (``~key``, ``hydra.*``, a key given twice, sweep syntax
  without ``-m``) and the sweep's size; called by :mod:`vdkit.composition.config` before it composes.

A launcher's own cluster settings are its ``check_recipe`` (through :mod:`vdkit.launch.launchers`); what a
run on this machine cannot do (FP8 / offload without a GPU, the host's memory) is the local
launcher's (:func:`vdkit.launch.local.check_host`). Layout rules (TP / PP / DP) live in the planner; field
rules on names and obvious pairs in :func:`vdkit.composition.fields.validate_fields`.
"""
from __future__ import annotations

from vdkit.rules.contradictions import check_contradictions
from vdkit.rules.cuda_graphs import check_cuda_graphs
from vdkit.rules.environment import check_cluster_env
from vdkit.rules.families import check_architecture
from vdkit.rules.numbers import check_numbers
from vdkit.rules.paths import check_files, check_names
from vdkit.rules.secrets import check_secret_values, check_secrets_file


def check_launcher_settings(recipe) -> None:
    """The launcher's own cluster settings (e.g. cluster.kubernetes), through the launcher registry."""
    from vdkit.launch import launchers

    if recipe.cluster.launcher in launchers.names():  # an unknown launcher is validate_fields' line
        launchers.refuse_foreign_settings(recipe.cluster.launcher, recipe.overrides)
        launchers.get(recipe.cluster.launcher).check_recipe(recipe)


def check_values(recipe) -> None:
    """The rules on the recipe's values alone (no file is opened): what a recipe read back from a run
    directory's edited recipe.yaml must pass too (vdkit.run.rundir.load_recipe)."""
    check_numbers(recipe)
    check_contradictions(recipe)
    check_cuda_graphs(recipe)
    check_names(recipe)
    check_architecture(recipe.model)
    check_cluster_env(recipe.cluster.env)
    check_secret_values(recipe)
    check_launcher_settings(recipe)


def check_recipe(recipe) -> None:
    """Every rule of this package on a composed recipe (called by vdkit.composition.config.compose)."""
    check_values(recipe)
    check_files(recipe)
    check_secrets_file(recipe.run.secrets_file, required=False)
