"""Weights and tokenizers staged once per site, for every engine: where they are, and the one-node jobs that move them.

A cluster job runs offline (``TRANSFORMERS_OFFLINE=1``, no HF cache mounted): every tokenizer and every
weight it reads is a path on shared storage, staged once. ``model.hf_path`` is the model's staged Hugging
Face directory (weights + tokenizer; conf/model: ``/shared/models/<name>``); the conversion jobs
(Bridge's ``import_hf.sbatch``, NeMo's ``import_hf.sbatch``) read it, and so does every tokenizer that is
not the data's own (``data.tokenizer_model``). A site without a local copy may leave a hub id in
``model.hf_path`` for the conversion job alone: it then reads ``HF_TOKEN`` from ``run.secrets_file`` at
run time (never from the script) and downloads once; a training job never takes a hub id.

:func:`one_node_sbatch` writes such a job: one task on one whole node (``--exclusive --mem=0``: a 70B
conversion holds ~140 GB of bf16 weights in host memory, Bridge's ``import_ckpt`` builds the model with
``use_cpu_initialization``), in the engine's container.
"""
from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Iterable, List, Optional

from vdkit.errors import UserError

STAGED_ROOT = "/shared/models"  # where the docs and conf/model stage weights (a site may use any path)
HUB_IDS = {  # the public repositories a site stages from (docs and fix lines; never rendered into a job)
    "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf", "llama3_1_8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B-Instruct", "qwen2_5_7b": "Qwen/Qwen2.5-7B",
}
CONVERT_TIME = "04:00:00"  # a 70B conversion: reading ~140 GB and writing the result at storage speed


def is_local(path: Optional[str]) -> bool:
    """Whether ``path`` names shared storage (absolute), not a hub id."""
    return bool(path) and str(path).startswith("/")


def stage_hint(recipe) -> str:
    """The fix line for a model without a staged copy: download once on a login node, point hf_path at it."""
    hub = HUB_IDS.get(recipe.model.name, "<hub id>")
    local = f"{STAGED_ROOT}/{hub.split('/')[-1]}"
    return (f"stage it once on a login node: huggingface-cli download {hub} --local-dir {local} (gated: HF_TOKEN), "
            f"then model.hf_path={local}")


def staged_tokenizer(recipe) -> Optional[str]:
    """The tokenizer a cluster job reads, as a staged path: data.tokenizer_model, else model.hf_path when it
    is local; None when neither is (the engine refuses or finds its own, e.g. inside a converted checkpoint)."""
    if recipe.data.tokenizer_model:
        return recipe.data.tokenizer_model
    return recipe.model.hf_path if is_local(recipe.model.hf_path) else None


def require_staged_tokenizer(recipe, engine: str) -> str:
    """:func:`staged_tokenizer`, or one line saying what to stage (a hub id cannot resolve offline)."""
    tok = staged_tokenizer(recipe)
    if tok is None:
        raise UserError(f"engine={engine} on a cluster reads {recipe.model.name}'s tokenizer from a staged path, and "
                        f"model.hf_path={recipe.model.hf_path} is none (jobs run offline: a hub id cannot resolve)",
                        stage_hint(recipe) + " (or data.tokenizer_model=PATH)")
    if not is_local(tok):
        raise UserError(f"data.tokenizer_model={tok} is not an absolute path: cluster jobs read staged files",
                        "give the staged tokenizer's absolute path")
    return tok


def conversion_source(recipe) -> str:
    """What a conversion job reads: the staged model.hf_path, or a hub id with HF_TOKEN from run.secrets_file."""
    src = recipe.model.hf_path
    if is_local(src):
        return src
    if src and recipe.run.secrets_file:
        return src
    raise UserError(f"model.hf_path={src} is not a staged directory, and the conversion job has no token to download "
                    "with", stage_hint(recipe) + "; or keep the hub id and give run.secrets_file=FILE (HF_TOKEN=...)")


def one_node_sbatch(plan, job_name: str, comments: Iterable[str], image: str, mounts: Iterable[str],
                    argv: List[str], time: str = CONVERT_TIME, secrets: bool = False) -> str:
    """A one-task job on one whole node in ``image`` (``#SBATCH --exclusive --mem=0``), as sbatch text;
    ``secrets``: read run.secrets_file at run time (HF_TOKEN for a download), never written here."""
    r = plan.recipe
    q = shlex.quote
    lines = ["#!/bin/bash", *(f"# {c}" for c in comments),
             f"#SBATCH --job-name={q(job_name)}", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={r.cluster.cpus_per_task}", "#SBATCH --gpus-per-node=1",
             "#SBATCH --exclusive", "#SBATCH --mem=0", f"#SBATCH --time={time}"]
    for key in ("partition", "account", "qos", "reservation"):
        value = getattr(r.cluster, key)
        if value:
            lines.append(f"#SBATCH --{key}={q(value)}")
    lines.append("set -euo pipefail")
    if secrets and r.run.secrets_file:
        from vdkit.slurm.secrets import secrets_lines

        lines += secrets_lines(str(r.run.secrets_file))
    dirs = sorted({str(m) for m in mounts})
    lines += [f"srun --container-image={q(image)} --container-mounts={q(','.join(f'{m}:{m}' for m in dirs))} "
              f"--no-container-mount-home {shlex.join(argv)}", ""]
    return "\n".join(lines)


def parent(path: str) -> str:
    """The directory a job creates and mounts for ``path``."""
    return str(PurePosixPath(path).parent)
