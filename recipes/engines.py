"""The engine registry: ``engine.name`` -> the module that runs it. Standard library only.

Adding an engine takes three things and nothing else:

1. ``conf/engine/<name>.yaml`` with ``name: <name>`` (plus any EngineCfg values it wants);
2. a module (e.g. ``recipes/<name>/__init__.py`` or ``recipes/<name>.py``) providing the interface below;
3. one line in :data:`REGISTRY`: ``"<name>": "vdkit.recipes.<name>"``.

``config`` (what ``engine.name`` may be), ``vdkit render`` / ``submit`` / ``run`` all go through
:func:`get`; nothing else branches on an engine's name. What an engine returns reaches the launcher
(:mod:`vdkit.launchers`) as a :class:`vdkit.jobspec.JobSpec`: launchers never import an engine.

The interface (module-level names; only ``command`` is required, the rest default as shown).
``plan`` is a :class:`vdkit.schema.Plan` (``plan.recipe`` the resolved Recipe); ``run_dir`` the run
directory's absolute :class:`~pathlib.Path` (it may not exist yet: renderers need its final path):

``command(plan, run_dir) -> list[str]``  (required)
    The argv every rank runs (under ``srun``, or as a local process under ``vdkit run``). Ranks
    find their rank / world size from Slurm's or torchrun's variables
    (``vdkit.recipes.common.distributed.resolve_dist_env`` reads both).
``files(plan, run_dir) -> dict[str, str | bytes]``  (default ``{}``)
    Extra files for the run directory, name -> content (names from :mod:`vdkit.rundir`, e.g.
    ``NEMO_CONFIG_FILE``). Rendered in memory for every cell before anything is written; raise
    :class:`vdkit.errors.UserError` for anything the engine cannot run. ``recipe.yaml``,
    ``plan.json`` and ``overrides.txt`` are written for every engine, the launcher's files
    (``launch.sbatch`` on Slurm) for every run.
``CONFIG_FILES: tuple[str, ...]``  (default ``()``)
    The run-dir files a person may edit (the engine's config, e.g. ``nemo.yaml``): ``check_runs`` holds them to
    the stack's types and the command line's value rules. ``vdkit check`` compares every other rendered file
    with the kit's render byte for byte before anything runs (:mod:`vdkit.rendercheck`).
``NO_PEFT_INTERLEAVING: str``  (default ``""``: it can)
    Why the engine's stack cannot run an interleaved pipeline (VP > 1) with a PEFT method; the planner then
    never picks one (:func:`vdkit.planner.layout.layout_violations`).
``check(plan) -> None``  (default: accept)
    Refuse (UserError) a plan this engine cannot execute: a layout, method, model or data kind it
    lacks. Pure (no I/O); runs for every cell of render / submit / run before anything is written.
``inputs(plan) -> list[tuple[str, str, bool]]``  (default ``[]``)
    Local inputs the job reads: ``(what, path, must_be_dir)``; ``what`` names the recipe key.
    Checked before rendering under the ``--check-mounts`` rule (auto: only where the path's
    top-level directory exists here). ``data.data_dir`` and a squashfs container image are added
    for every engine; list only what is the engine's own (e.g. the base-model file).
``check_runs(run_dirs) -> list[vdkit.jobcheck.Report]``  (default: each says it has no check)
    ``vdkit check``: run what each rendered job runs, in the engine's own library, as far as this CPU
    goes (configs built and validated by the stack, the model on the meta device, the first batch);
    one call for all run directories of this engine (one import of the stack).
``local_check(plan) -> None``  (default: accept)
    The checks before training on this machine (``vdkit run``): data files, tokenizer, ...
``resume_check(plan, run_dir) -> None``  (default: accept)
    Before a stopped run continues here in its own run directory (``vdkit run --resume``): refuse
    (UserError) the engine's files there that its stack would refuse - a person may have edited them
    since render - before any rank starts. Import the stack only here, where it is needed.
``env(plan[, run_dir]) -> dict[str, str]``  (default ``{}``)
    Variables every rank needs beyond the cluster's NCCL / rendezvous set, exported before srun
    (e.g. ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor parallelism; the reference engine's offline
    Hugging Face settings, with HF_HOME under the run's results root).
``container(plan, run_dir) -> vdkit.jobspec.Container | None``  (default ``None``: host Python)
    The image and mounts when ranks run in a container; pyxis flags are the Slurm renderer's job.
    :func:`standard_mounts` gives the usual list (data dir, results dir, run dir).
``CATCHES_STOP_SIGNALS: bool``  (default ``True``)
    Whether the ranks catch USR1 / TERM and stop cleanly (the job contract, :mod:`vdkit.jobspec`;
    the kit's engines do, through :mod:`vdkit.recipes.preemption`). ``False``: the engine stops by
    its own clock (NeMo's ``max_time_per_run``) and the launcher never signals it.
``finished_line(plan) -> str | None``  (default ``None``)
    For engines whose ranks exit 0 on a clean stop too (Lightning's ``max_time``): the text rank 0
    prints when every step is done. ``None``: exit 0 means finished, exit 75 stopped.
``GPU_VENDORS: tuple[str, ...]``  (default ``("nvidia", "amd")``)
    The GPU vendors the engine's image is built for; a cluster of another vendor
    (``cluster.gpu_vendor``) is refused at the door, in one line.
``RUNTIME_MODULES: tuple[str, ...]`` and ``EXTRA: str``  (default ``()`` / ``""``)
    What a rank imports and the pyproject extra that installs it. Before training on this machine
    (``local_check``) a missing one is one line naming the extra, not a rank's traceback.
``RUNS_LOCALLY: bool``  (default ``False``)
    Whether ``vdkit run`` (the local launcher) may start ``command`` as local processes on this machine.
``STEP_TIME_REGIME: str``  (default ``"unfused"``)
    Which step-time model describes the engine's stack (:mod:`vdkit.planner.predict`): ``"unfused"``
    (NeMo / Megatron's defaults; NVIDIA's fused path when the rendered config is NVIDIA's), ``"fused"``
    (always NVIDIA's fused path: a stack that renders NVIDIA's performance settings, e.g. Megatron-Bridge's
    recipes), ``"hf"`` (:mod:`vdkit.planner.predict_hf`: eager Hugging Face + DDP / FSDP / ZeRO-3).
``WRITES_HEARTBEAT: bool``  (default ``False``)
    Whether the ranks write the launcher's heartbeat (:mod:`vdkit.recipes.heartbeat`); the launcher's
    hang watchdog runs only for engines that do.
``ROPE_SCALING: tuple[str, ...]``  (default ``()``)
    The RoPE scaling types (``model.rope_scaling``'s ``rope_type``) the engine's model code builds; another
    is refused at the door (:mod:`vdkit.context`). ``MCORE_ROPE: bool`` (default ``False``): its llama3
    scaling is megatron-core's, whose low / high frequency factors are fixed.
``CONTEXT_PARALLEL: bool`` and ``NO_CONTEXT_PARALLEL: str``  (default ``False`` / a generic reason)
    Whether the engine's stack splits a sequence across ranks (``parallelism.cp``), and why not.
``NEEDS_PMI: bool``  (default ``False``)
    Whether the ranks bootstrap through PMI (Slurm then adds ``srun --mpi=<cluster.mpi>``); the
    kit's engines read the launcher's variables instead.

Keep an engine module's top level light (standard library, vdkit.errors / rundir / jobspec): the
Slurm renderer and ``vdkit --help`` paths import it; import torch & co. inside the training code.
"""
from __future__ import annotations

import importlib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from vdkit.errors import UserError

# engine.name -> module. One line per engine; the order is the order `--help` / errors list them.
REGISTRY: Dict[str, str] = {
    "nemo": "vdkit.recipes.nemo",
    "reference": "vdkit.recipes.reference",
    "megatron": "vdkit.recipes.megatron",
    "bridge": "vdkit.recipes.bridge",
}


def names() -> Tuple[str, ...]:
    """Every registered engine name."""
    return tuple(REGISTRY)


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked package (or its parent)
        return False


def require_modules(modules, extra: str, engine: str) -> None:
    """Raise one line naming the pyproject extra when any of ``modules`` is not importable here."""
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise UserError(f"engine={engine} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                        "not installed in this Python",
                        f"install the extra: pip install torch 'vdkit[{extra}]' (from a checkout: "
                        f"pip install torch -e '.[{extra}]')")


class Engine:
    """An engine module behind the interface above, with the optional parts defaulted."""

    def __init__(self, name: str, module: ModuleType):
        self.name, self.module = name, module
        if not callable(getattr(module, "command", None)):
            raise TypeError(f"engine module {module.__name__} has no command(plan, run_dir)")

    def command(self, plan, run_dir) -> List[str]:
        return [str(a) for a in self.module.command(plan, Path(run_dir))]

    def files(self, plan, run_dir) -> Dict[str, object]:
        fn = getattr(self.module, "files", None)
        return dict(fn(plan, Path(run_dir))) if fn else {}

    def check(self, plan) -> None:
        vendors = self.gpu_vendors
        c = plan.recipe.cluster
        from vdkit import launchers

        if not launchers.executes_here(c.launcher) and c.gpu_vendor not in vendors:
            raise UserError(f"engine={self.name} runs an image built for {'/'.join(vendors)} GPUs and cluster "
                            f"{c.name} has {c.gpu_vendor} GPUs", "use an engine built for them (engine=reference runs the "
                            "cluster's own image, cluster.container_image), or a cluster of that vendor")
        fn = getattr(self.module, "check", None)
        if fn:
            fn(plan)

    @property
    def gpu_vendors(self) -> Tuple[str, ...]:
        return tuple(getattr(self.module, "GPU_VENDORS", ("nvidia", "amd")))

    @property
    def no_peft_interleaving(self) -> str:
        return str(getattr(self.module, "NO_PEFT_INTERLEAVING", ""))

    @property
    def config_files(self) -> Tuple[str, ...]:
        return tuple(getattr(self.module, "CONFIG_FILES", ()))

    @property
    def catches_stop_signals(self) -> bool:
        return bool(getattr(self.module, "CATCHES_STOP_SIGNALS", True))

    def finished_line(self, plan) -> Optional[str]:
        fn = getattr(self.module, "finished_line", None)
        return fn(plan) if fn else None

    def inputs(self, plan) -> List[Tuple[str, str, bool]]:
        fn = getattr(self.module, "inputs", None)
        return list(fn(plan)) if fn else []

    def check_runs(self, run_dirs) -> list:
        """One :class:`vdkit.jobcheck.Report` per run directory (``vdkit check``); timed here."""
        import time

        from vdkit.jobcheck import Report

        fn = getattr(self.module, "check_runs", None)
        if fn is None:
            out = []
            for d in run_dirs:
                r = Report(Path(d), f"engine={self.name}")
                r.not_here(f"engine={self.name} has no executable check")
                out.append(r)
            return out
        start = time.perf_counter()
        reports = list(fn([Path(d) for d in run_dirs]))
        if reports and not any(r.seconds for r in reports):
            for r in reports:
                r.seconds = (time.perf_counter() - start) / len(reports)
        return reports

    def local_check(self, plan) -> None:
        require_modules(getattr(self.module, "RUNTIME_MODULES", ()), getattr(self.module, "EXTRA", ""), self.name)
        fn = getattr(self.module, "local_check", None)
        if fn:
            fn(plan)

    def resume_check(self, plan, run_dir) -> None:
        fn = getattr(self.module, "resume_check", None)
        if fn:
            fn(plan, Path(run_dir))

    def env(self, plan, run_dir=None) -> Dict[str, str]:
        fn = getattr(self.module, "env", None)
        if fn is None:
            return {}
        import inspect

        takes_dir = len(inspect.signature(fn).parameters) > 1
        got = fn(plan, Path(run_dir)) if (takes_dir and run_dir is not None) else fn(plan)
        return {str(k): str(v) for k, v in got.items()}

    def container(self, plan, run_dir):
        fn = getattr(self.module, "container", None)
        return fn(plan, Path(run_dir)) if fn else None

    @property
    def step_time_regime(self) -> str:
        return str(getattr(self.module, "STEP_TIME_REGIME", "unfused"))

    @property
    def runs_locally(self) -> bool:
        return bool(getattr(self.module, "RUNS_LOCALLY", False))

    @property
    def needs_pmi(self) -> bool:
        return bool(getattr(self.module, "NEEDS_PMI", False))

    @property
    def rope_scaling(self) -> Tuple[str, ...]:
        return tuple(getattr(self.module, "ROPE_SCALING", ()))

    @property
    def mcore_rope(self) -> bool:
        return bool(getattr(self.module, "MCORE_ROPE", False))

    @property
    def context_parallel(self) -> bool:
        return bool(getattr(self.module, "CONTEXT_PARALLEL", False))

    @property
    def no_context_parallel(self) -> str:
        return str(getattr(self.module, "NO_CONTEXT_PARALLEL", "its stack has no context parallelism"))

    @property
    def writes_heartbeat(self) -> bool:
        return bool(getattr(self.module, "WRITES_HEARTBEAT", False))


def get(name: str) -> Engine:
    """The engine registered as ``name`` (its module imported now); UserError for an unknown name."""
    if name not in REGISTRY:
        raise UserError(f"engine.name={name!r} is not an engine", "use engine=" + " or engine=".join(REGISTRY))
    return Engine(name, importlib.import_module(REGISTRY[name]))


# ----------------------------------------------------------------------------- helpers for engines
def standard_mounts(plan, run_dir, extra: Optional[List[Tuple[str, str]]] = ()) -> Tuple[Tuple[str, str], ...]:
    """(what, path) a containerised job mounts: data.data_dir, ``extra``, run.results_dir, the run dir.

    Duplicates are dropped (first occurrence wins); paths are mounted at the same place inside.
    """
    r = plan.recipe
    found = []
    if r.data.data_dir:
        found.append(("data.data_dir", str(PurePosixPath(r.data.data_dir))))
    found += [(w, str(PurePosixPath(p))) for w, p in (extra or ())]
    if r.run.results_dir:
        found.append(("run.results_dir", str(PurePosixPath(r.run.results_dir))))
    found.append(("the run directory", str(run_dir)))
    seen, out = set(), []
    for what, path in found:
        if path not in seen:
            seen.add(path)
            out.append((what, path))
    return tuple(out)
