"""Paths a recipe names, at the door: the files the kit itself reads (a DeepSpeed config, a local
``model.hf_path``) and ``run.name`` / ``run.out_dir``, which become directories."""
from __future__ import annotations

import os
from pathlib import Path

from vdkit.errors import UserError

def looks_like_path(value: str) -> bool:
    """A hub id is ``org/name``; a local path starts with /, ./, ../ or ~ (or exists here)."""
    v = str(value)
    return v.startswith(("/", "./", "../", "~")) or os.path.exists(v)


def check_files(recipe) -> None:
    """File inputs the kit reads itself: a DeepSpeed config (parsed here) and a local ``model.hf_path``."""
    p = recipe.parallelism
    if p.deepspeed_config:
        # The reader lives with the engine that uses it; it refuses a missing file, a non-mapping, stage != 3.
        from vdkit.conftree import deepspeed_config_source

        try:
            deepspeed_config_source(p.deepspeed_config)
        except UserError as exc:
            if "parallelism.deepspeed_config" in exc.what:
                raise
            raise UserError(f"parallelism.deepspeed_config={p.deepspeed_config}: {exc.what}", exc.fix) from None
    hf = recipe.model.hf_path
    if hf and looks_like_path(hf):
        from vdkit.files import on_this_machine

        path = Path(os.path.expanduser(hf))
        # Checked where it can be, as render checks mount sources: /shared/models on a laptop is cluster storage.
        if on_this_machine(path) and not path.is_dir():
            raise UserError(f"model.hf_path={hf} is " + ("a file, not a model directory" if path.exists() else
                                                          "not a directory on this machine"),
                            "point it at a directory with config.json and the weights, or a hub id like "
                            "facebook/opt-125m, or model.hf_path=null for random weights")


def check_names(recipe) -> None:
    """run.name becomes a directory and a job name; run.out_dir a directory: neither may be empty or a path trick."""
    name = recipe.run.name
    if name is not None and (not str(name).strip() or str(name).strip(".") == "" or "/" in str(name)
                             or "\0" in str(name)):
        raise UserError(f"run.name={name!r} is not a plain name (it names the run directory and the Slurm job)",
                        "use letters, digits, '.', '_' or '-', e.g. run.name=llama2_7b_lora_try2, or leave it unset")
    if not str(recipe.run.out_dir or "").strip():
        raise UserError("run.out_dir is empty (the run directories would land in the current directory)",
                        "use run.out_dir=runs (the default) or another directory")
