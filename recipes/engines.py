"""The engine registry: ``engine.name`` -> the module that runs it, read through its :class:`EngineSpec`.

Adding an engine takes three things and nothing else:

1. ``conf/engine/<name>.yaml`` with ``name: <name>`` (plus any EngineCfg values it wants);
2. a module (e.g. ``recipes/<name>/__init__.py``) ending with ``SPEC = EngineSpec(...)``
   (:mod:`vdkit.recipes.spec`: its functions and its capabilities, typed and checked when built);
3. one line in :data:`REGISTRY`: ``"<name>": "vdkit.recipes.<name>"``.

``config`` (what ``engine.name`` may be, and what the engine's spec holds: :func:`check_recipe`),
``vdkit render`` / ``submit`` / ``run`` all go through :func:`get`; nothing else branches on an engine's
name. What an engine returns reaches the launcher (:mod:`vdkit.launch.launchers`) as a
:class:`vdkit.run.jobspec.JobSpec`: launchers never import an engine.

Keep an engine module's top level light (standard library, vdkit.errors / rundir / jobspec / recipes.spec):
the Slurm renderer, ``vdkit plan`` and ``vdkit --help`` import it; import torch & co. inside the training code.
"""
from __future__ import annotations

import importlib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from vdkit.errors import EngineCannot, UserError
from vdkit.recipes.spec import EngineSpec

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
    """A registered engine: its module and the :class:`~vdkit.recipes.spec.EngineSpec` it declares."""

    def __init__(self, name: str, module: ModuleType):
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, EngineSpec):
            raise TypeError(f"engine module {module.__name__} has no SPEC (a vdkit.recipes.spec.EngineSpec)")
        if spec.name != name:
            raise TypeError(f"engine module {module.__name__} is registered as {name!r} but its SPEC is named {spec.name!r}")
        self.name, self.module, self.spec = name, module, spec

    def command(self, plan, run_dir) -> List[str]:
        return [str(a) for a in self.spec.command(plan, Path(run_dir))]

    def files(self, plan, run_dir) -> Dict[str, object]:
        fn = self.spec.files
        return dict(fn(plan, Path(run_dir))) if fn else {}

    def check(self, plan) -> None:
        vendors = self.gpu_vendors
        c = plan.recipe.cluster
        from vdkit.launch import launchers

        if not launchers.executes_here(c.launcher) and c.gpu_vendor not in vendors:
            raise UserError(f"engine={self.name} runs an image built for {'/'.join(vendors)} GPUs and cluster "
                            f"{c.name} has {c.gpu_vendor} GPUs", "use an engine built for them (engine=reference runs the "
                            "cluster's own image, cluster.container_image), or a cluster of that vendor")
        if self.spec.check:
            self.spec.check(plan)

    def finished_line(self, plan) -> Optional[str]:
        fn = self.spec.finished_line
        return fn(plan) if fn else None

    def notes(self, recipe) -> List[str]:
        """What the plan says about this engine's run of ``recipe`` (e.g. a fine-tune on seeded weights)."""
        fn = self.spec.notes
        return [str(n) for n in fn(recipe)] if fn else []

    def fp32_params(self, recipe) -> bool:
        """Whether the engine's rendered model of ``recipe`` keeps fp32 parameters under bf16 / fp8 mixed precision
        (NeMo 1.23 without megatron_amp_O2); the memory model counts their bytes (vdkit.planner.memory)."""
        fn = self.spec.fp32_params
        return bool(fn(recipe)) if fn else False

    def tp_comm_overlap(self, recipe, tp: int) -> bool:
        """Whether the engine's rendered job of ``recipe`` at TP ``tp`` overlaps its tensor-parallel collectives with
        the GEMMs (Transformer Engine's userbuffers); the step-time model prices it (vdkit.planner.tp_overlap)."""
        fn = self.spec.tp_comm_overlap
        return bool(fn(recipe, tp)) if fn else False

    def inputs(self, plan) -> List[Tuple[str, str, bool]]:
        fn = self.spec.inputs
        return list(fn(plan)) if fn else []

    def preflight(self, plan, run_dir) -> List[Tuple[str, str, str]]:
        """The engine's pre-flight needs (what, path, kind); from :meth:`inputs` when it declares none."""
        fn = self.spec.preflight
        if fn is not None:
            return [(str(w), str(p), str(k)) for w, p, k in fn(plan, Path(run_dir))]
        return [(w, str(p), "dir" if is_dir else "file") for w, p, is_dir in self.inputs(plan)]

    def check_runs(self, run_dirs) -> list:
        """One :class:`vdkit.run.jobcheck.Report` per run directory (``vdkit check``); timed here."""
        import time

        from vdkit.run.jobcheck import Report

        fn = self.spec.check_runs
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

    def require_runtime(self) -> None:
        """One line naming the extra when a module the ranks import is missing here."""
        require_modules(self.spec.runtime_modules, self.spec.extra, self.name)

    def local_check(self, plan) -> None:
        self.require_runtime()
        if self.spec.local_check:
            self.spec.local_check(plan)

    def resume_check(self, plan, run_dir) -> None:
        if self.spec.resume_check:
            self.spec.resume_check(plan, Path(run_dir))

    def env(self, plan, run_dir=None) -> Dict[str, str]:
        fn = self.spec.env
        if fn is None:
            return {}
        import inspect

        takes_dir = len(inspect.signature(fn).parameters) > 1
        got = fn(plan, Path(run_dir)) if (takes_dir and run_dir is not None) else fn(plan)
        return {str(k): str(v) for k, v in got.items()}

    def container(self, plan, run_dir):
        fn = self.spec.container
        return fn(plan, Path(run_dir)) if fn else None

    # the spec's capabilities, under the names the launchers, planner and context rules read
    gpu_vendors = property(lambda self: self.spec.gpu_vendors)
    catches_stop_signals = property(lambda self: self.spec.catches_stop_signals)
    step_time_regime = property(lambda self: self.spec.step_time_regime)
    runs_locally = property(lambda self: self.spec.runs_locally)
    needs_pmi = property(lambda self: self.spec.needs_pmi)
    rope_scaling = property(lambda self: self.spec.rope_scaling)
    mcore_rope = property(lambda self: self.spec.mcore_rope)
    context_parallel = property(lambda self: self.spec.context_parallel)
    no_context_parallel = property(lambda self: self.spec.no_context_parallel)
    writes_heartbeat = property(lambda self: self.spec.writes_heartbeat)
    no_peft_interleaving = property(lambda self: self.spec.no_peft_interleaving)
    data_parallel_only = property(lambda self: self.spec.data_parallel_only)
    config_files = property(lambda self: self.spec.config_files)


def get(name: str) -> Engine:
    """The engine registered as ``name`` (its module imported and its spec checked now); UserError for an unknown name."""
    if name not in REGISTRY:
        raise UserError(f"engine.name={name!r} is not an engine", "use engine=" + " or engine=".join(REGISTRY))
    return Engine(name, importlib.import_module(REGISTRY[name]))


def specs() -> Tuple[EngineSpec, ...]:
    """Every registered engine's spec, in registry order."""
    return tuple(get(n).spec for n in REGISTRY)


def check_recipe(recipe) -> None:
    """The door: refuse in one line a recipe the engine's spec does not hold (model family and fields, method,
    sharding, precision), naming the engines whose specs do. Composition calls it for every recipe."""
    from vdkit.recipes.spec import refusal

    spec = get(recipe.engine.name).spec
    if refusal(recipe, spec, ()) is None:  # the usual case: the other engines are not imported
        return
    what, fix = refusal(recipe, spec, [s for s in specs() if s.name != spec.name])
    raise EngineCannot(what, fix)


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
