"""Paths a recipe names, at the door: the files the kit itself reads (a DeepSpeed config, a userbuffers
config) and ``run.name`` / ``run.out_dir``, which become directories."""
from __future__ import annotations

from vdkit.errors import UserError


def check_files(recipe) -> None:
    """File inputs the kit reads itself: a DeepSpeed config, a userbuffers config (parsed here)."""
    p = recipe.parallelism
    if p.deepspeed_config:
        # The reader lives with the engine that uses it; it refuses a missing file, a non-mapping, stage != 3.
        from vdkit.composition.conftree import deepspeed_config_source

        try:
            deepspeed_config_source(p.deepspeed_config)
        except UserError as exc:
            if "parallelism.deepspeed_config" in exc.what:
                raise
            raise UserError(f"parallelism.deepspeed_config={p.deepspeed_config}: {exc.what}", exc.fix) from None
    if p.tp_comm_overlap_cfg:  # a conf/tp_overlap/ file: every GEMM, a method TE runs it with, that method's keys
        from vdkit.composition.conftree import tp_overlap_source

        gemms = tp_overlap_source(p.tp_comm_overlap_cfg)
        atomic = sorted(g for g, s in gemms.items() if s.get("atomic_gemm") and s.get("method") != "bulk")
        if atomic and recipe.train.precision != "fp8":  # TE's initialize_ub: "Atomic GEMM overlap supported only for FP8 GEMM."
            raise UserError(f"parallelism.tp_comm_overlap_cfg={p.tp_comm_overlap_cfg} runs {', '.join(atomic)} as atomic GEMMs, "
                            f"which Transformer Engine's userbuffers set-up refuses without FP8 (train.precision="
                            f"{recipe.train.precision}): the job would stop at start-up",
                            "use train.precision=fp8, a file without atomic_gemm, or parallelism.tp_comm_overlap_cfg=null")
        if p.tp == 1 or p.sequence_parallel is False:  # userbuffers overlap TP collectives of a sequence-parallel job only
            raise UserError(f"parallelism.tp_comm_overlap_cfg={p.tp_comm_overlap_cfg} is set but TP communication overlap "
                            "is off (it needs TP >= 2 with sequence parallelism)",
                            "set parallelism.tp >= 2 with parallelism.sequence_parallel on, or parallelism.tp_comm_overlap_cfg=null")
        if not p.tp_comm_overlap:  # the file configures an overlap the recipe turns off
            raise UserError(f"parallelism.tp_comm_overlap_cfg={p.tp_comm_overlap_cfg} is set but "
                            "parallelism.tp_comm_overlap=false turns TP communication overlap off",
                            "drop parallelism.tp_comm_overlap_cfg, or set parallelism.tp_comm_overlap=true")
    # A local model.hf_path is a mount like data.data_dir: checked by render / run under the --check-mounts
    # rule (vdkit.render.prepare.check_local_paths, the engine's `inputs`), never by plan or composition.


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
