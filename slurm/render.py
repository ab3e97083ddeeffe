"""A plan -> a Slurm batch script and a run directory.

``#SBATCH`` directives come from submitit's (private, pinned 1.5.4) renderer
``submitit.slurm.slurm._make_sbatch_string``; only its defaults that would hurt are overridden
through its own ``additional_parameters`` (no ``--wckey``, ``--signal=USR1`` instead of
submitit's USR2, ``--requeue``, our log paths). The body is ours: strict shell, NCCL/IB
environment, rendezvous, secrets read at run time, one ``srun`` of the engine's command.

Every interpolated value is shell-quoted. ``#SBATCH`` values are read by sbatch's own parser,
which treats single quotes like bash but also honours backslash escapes inside them, so values
with a backslash or a control character (a newline would end the comment line) are refused.

Mount-source check on render (``check_mounts``): ``True`` checks every local source,
``False`` none, ``None`` (default, "auto") checks a path only when its top-level directory
exists on this machine: on a login node that mounts /data, a missing /data/dolly is an error;
on a laptop without /data the path is cluster storage and cannot be checked.
"""
from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Union

from vdkit.errors import UserError
from vdkit.slurm import env as slurm_env

SIGNAL_NAME = "USR1"  # Lightning's SLURM requeue signal (NeMo trains with Lightning); USR2 would kill it
SIGNAL_LEAD_S = 300  # seconds before the time limit: enough for a checkpoint save
OUTPUT_PATTERN = "slurm-%j.out"
ERROR_PATTERN = "slurm-%j.err"


def _directive(what: str, value) -> str:
    """A value for an #SBATCH line: refuse what sbatch's parser would read differently from bash."""
    text = str(value)
    if "\\" in text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise UserError(f"{what} {text!r} contains a backslash or a control character, which an #SBATCH line "
                        "cannot carry", f"choose a {what} without them")
    return text


def signal_lead_s(time_limit_min: int) -> int:
    """Seconds before the time limit at which the job's steps get the requeue signal."""
    return max(1, min(SIGNAL_LEAD_S, time_limit_min * 60 // 4))


def engine_command(plan, run_dir) -> List[str]:
    """The argv that srun runs on every task, from the engine's own module."""
    name = plan.recipe.engine.name
    if name == "nemo":
        from vdkit.recipes.nemo import nemo_command

        argv = nemo_command(plan, Path(run_dir))
    elif name == "reference":
        from vdkit.recipes.reference import reference_command

        argv = reference_command(Path(run_dir))
    else:  # config validation already refuses this; keep the error clear if it ever changes
        raise UserError(f"engine.name={name!r} has no launch command", "use engine=nemo or engine=reference")
    return [str(a) for a in argv]


def sbatch_parameters(plan, run_dir) -> dict:
    """The keyword arguments for submitit's renderer (resources, names, log paths)."""
    r = plan.recipe
    c = r.cluster
    run_dir = str(run_dir)
    extra: Dict[str, object] = {
        "output": _directive("run directory", f"{run_dir}/{OUTPUT_PATTERN}"),
        "error": _directive("run directory", f"{run_dir}/{ERROR_PATTERN}"),
        "signal": f"{SIGNAL_NAME}@{signal_lead_s(c.time_limit_min)}",
        "requeue": True,
    }
    if c.reservation:
        extra["reservation"] = _directive("cluster.reservation", c.reservation)
    params = dict(
        job_name=_directive("job name (run.name)", r.run_name),
        nodes=c.nodes,
        # Lightning wants one task per GPU (ntasks-per-node == trainer.devices); no --gpus-per-task:
        # it confines each rank to one GPU and blocks CUDA IPC over NVLink.
        ntasks_per_node=c.gpus_per_node,
        gpus_per_node=c.gpus_per_node,
        cpus_per_task=c.cpus_per_task,
        exclusive=True,
        mem="0",  # all of each node's memory; submitit's mem_gb=0 would render "0GB"
        time=c.time_limit_min,
        wckey=None,  # submitit forces --wckey=submitit otherwise; sites that enforce wckeys reject it
        additional_parameters=extra,
    )
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value:
            params[key] = _directive(f"cluster.{key}", value)
    # Optional chaining (e.g. "singleton" with exp_manager.resume_if_exists); read defensively so
    # that a ClusterCfg without the field renders as before.
    dependency = c.dependency
    if dependency:
        params["dependency"] = _directive("cluster.dependency", dependency)
    return params


def body_lines(plan, run_dir) -> List[str]:
    """The script's setup lines (everything before srun)."""
    r = plan.recipe
    q = shlex.quote
    lines = ["set -euo pipefail", ""]
    lines.append(f"# NCCL over native InfiniBand, from cluster {r.cluster.name}")
    lines += [slurm_env.export_line(k, v) for k, v in slurm_env.job_env(plan).items()]
    lines += ["", "# Rendezvous at the first node"] + slurm_env.rendezvous_lines()
    if r.run.secrets_file:
        lines += [
            "",
            "# Secrets (HF_TOKEN, WANDB_API_KEY, ...) are read at run time; their values are never written here",
            f"VDKIT_SECRETS_FILE={q(str(r.run.secrets_file))}",
            'if [ ! -r "$VDKIT_SECRETS_FILE" ]; then',
            '  echo "vdkit: cannot read run.secrets_file $VDKIT_SECRETS_FILE" >&2',
            "  exit 1",
            "fi",
            'set -a; source "$VDKIT_SECRETS_FILE"; set +a',
        ]
    lines += [""]
    if r.run.results_dir:
        lines.append(f"mkdir -p {q(str(r.run.results_dir))}")
    lines.append(f"cd {q(str(run_dir))}")
    return lines


# One dead rank ends the step (and the job) instead of leaving the others in a collective until NCCL's
# timeout; the rest get 60 s to exit after the first task ends (NeMo-Run's srun practice).
SRUN_FLAGS = ("--kill-on-bad-exit=1", "--wait=60")


def needs_mpi(plan) -> bool:
    """Whether the job bootstraps through PMI: only NeMo's userbuffers TP overlap does, and vdkit does not
    enable it (recipes/nemo_contract.PRETRAIN_DEPARTURES); ranks read Slurm's variables otherwise."""
    return False


def srun_argv(plan, run_dir) -> List[str]:
    """The whole srun command line as argv: srun flags, pyxis flags (nemo), the engine command.

    ``--mpi=<cluster.mpi>`` only where the job needs a PMI bootstrap (:func:`needs_mpi`)."""
    r = plan.recipe
    argv = ["srun", *SRUN_FLAGS]
    if needs_mpi(plan) and r.cluster.mpi != "none":
        argv.append(f"--mpi={r.cluster.mpi}")
    if r.engine.name == "nemo":
        names = list(slurm_env.job_env(plan)) + list(slurm_env.RENDEZVOUS_VARS)
        argv += slurm_env.pyxis_args(plan, run_dir, names)
    return argv + engine_command(plan, run_dir)


def _srun_text(argv: List[str]) -> str:
    """srun's flags one per line (readable diffs), the engine command on the last line."""
    n = 1
    while n < len(argv) and argv[n].startswith("--"):
        n += 1
    head, tail = argv[:n], argv[n:]
    parts = [shlex.quote(head[0])] + ["  " + shlex.quote(a) for a in head[1:]] + ["  " + shlex.join(tail)]
    return " \\\n".join(parts)


def sbatch_text(plan, run_dir: Union[str, Path]) -> str:
    """The launch.sbatch text for ``plan`` running in ``run_dir`` (a pure function of both)."""
    from submitit.slurm.slurm import _make_sbatch_string

    run_dir = str(run_dir)
    params = sbatch_parameters(plan, run_dir)
    return _make_sbatch_string(command=_srun_text(srun_argv(plan, run_dir)), folder=run_dir,
                               setup=body_lines(plan, run_dir), use_srun=False, **params)


# ----------------------------------------------------------------------------- checks on render
def _is_local(path: Path) -> bool:
    """Auto mode: a path is on this machine when its top-level directory exists here."""
    path = Path(path).expanduser()
    if not path.is_absolute():
        return True
    parts = path.parts
    return len(parts) > 1 and Path(parts[0], parts[1]).exists()


def check_local_paths(plan, check_mounts: Optional[bool] = None) -> None:
    """Refuse a missing data dir, base model (file or its dir) or squashfs image on this machine."""
    if check_mounts is False:
        return
    r = plan.recipe
    wanted = []  # (what, path, must be a dir)
    if r.data.data_dir:
        wanted.append(("data.data_dir", r.data.data_dir, True))
    if r.engine.name == "nemo":
        if r.model.nemo_path and r.method.name != "pretrain":
            wanted.append(("the directory of model.nemo_path", str(PurePosixPath(r.model.nemo_path).parent), True))
            wanted.append(("model.nemo_path", r.model.nemo_path, False))
        image = r.engine.container_image or ""
        if image.startswith("/") or image.startswith("./"):
            wanted.append(("engine.container_image", image, False))
    for what, path, is_dir in wanted:
        p = Path(path).expanduser()
        if check_mounts is None and not _is_local(p):
            continue
        ok = p.is_dir() if is_dir else p.exists()
        if not ok:
            raise UserError(f"{what} {path} does not exist on this machine",
                            f"create it, point {what.split()[-1]} elsewhere, or pass --no-check-mounts "
                            "when rendering away from the cluster's storage")


def render_files(plan, run_dir) -> Dict[str, str]:
    """The engine's files for a run directory: launch.sbatch, plus nemo.yaml for engine=nemo."""
    from vdkit.rundir import NEMO_CONFIG_FILE, SBATCH_FILE

    files = {SBATCH_FILE: sbatch_text(plan, run_dir)}
    if plan.recipe.engine.name == "nemo":
        from vdkit.recipes.nemo import render_nemo_yaml

        files[NEMO_CONFIG_FILE] = render_nemo_yaml(plan, Path(run_dir))
    return files


def preflight(plan, out_dir: Optional[Union[str, Path]] = None, check_mounts: Optional[bool] = None) -> None:
    """Every check render_run makes, writing nothing: lets a sweep refuse a bad cell before any is written.

    The files are rendered in memory against the run directory's likely path (the name is only
    used for validation; render_run picks the real one).
    """
    from vdkit.plan import require_feasible
    from vdkit.rundir import safe_dir_name

    require_feasible(plan)
    check_local_paths(plan, check_mounts)
    base = Path(out_dir if out_dir is not None else plan.recipe.run.out_dir).expanduser().absolute()
    render_files(plan, base / safe_dir_name(plan.recipe.run_name))


def render_run(plan, out_dir: Optional[Union[str, Path]] = None, check_mounts: Optional[bool] = None) -> Path:
    """Validate ``plan``, render its files and write a new run directory; returns its path.

    Raises UserError (and writes no run directory) for an infeasible plan, a missing local
    mount source, an image pyxis cannot read, or a value a script cannot carry.
    """
    from vdkit.plan import require_feasible
    from vdkit.rundir import create_run_dir, reserve_run_dir

    require_feasible(plan)
    check_local_paths(plan, check_mounts)
    run_dir = reserve_run_dir(plan.recipe, out_dir)
    files = render_files(plan, run_dir)
    return create_run_dir(plan, files, run_dir=run_dir)
