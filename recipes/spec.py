"""What an engine is: its functions and what it can build, as one typed, frozen :class:`EngineSpec`.

Each engine module ends with ``SPEC = EngineSpec(...)`` (in the spirit of torchtitan's ``TrainSpec``);
the registry (:mod:`vdkit.recipes.engines`) reads it and nothing else. A spec is checked when it is
built - at registration - so a misspelt capability is a ``TypeError`` (an unknown keyword), and a model
field the spec neither maps, ignores nor refuses is a ``TypeError`` naming the field: adding a field to
:class:`vdkit.composition.schema.ModelCfg` makes every engine say what it does with it before anything runs.

The door (:func:`refusal`, asked by composition through the registry) refuses a recipe the spec does not
hold in one line naming the field or capability and the engines that have it. Standard library only at
import (``vdkit plan`` stays torch-free); the kit's vocabularies come from :mod:`vdkit.composition.schema` (below both).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple

from vdkit.composition.schema import LORA_DEFAULT_TARGETS, LORA_TARGETS

HOOKS = ("files", "check", "inputs", "preflight", "check_runs", "local_check", "resume_check", "env", "container",
         "finished_line", "make_base", "notes", "fp32_params", "fp8_bf16_layers", "tp_comm_overlap")  # the optional functions; ``command`` is required


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine: its functions and its capabilities as data (see docs/architecture.md, "Adding an engine").

    Functions (``plan`` a :class:`vdkit.composition.plan_types.Plan`, ``run_dir`` the run directory's Path):

    - ``command(plan, run_dir) -> list[str]``: the argv every rank runs (required);
    - ``files(plan, run_dir) -> dict``: extra run-directory files, name -> content (their names in ``run_dir_files``);
    - ``check(plan)``: refuse (UserError) what the stack cannot run beyond the capabilities below; pure;
    - ``inputs(plan) -> [(what, path, must_be_dir)]``: the engine's own local inputs (mount check);
    - ``preflight(plan, run_dir) -> [(what, path, kind)]``: what the job's pre-flight (:mod:`vdkit.recipes.common.preflight`,
      on the cluster before any rank builds a model) checks beyond the common set; default: ``inputs`` as dir / file;
    - ``check_runs(run_dirs) -> [vdkit.run.jobcheck.Report]``: ``vdkit check``, one stack import for all;
    - ``local_check(plan)``: before training on this machine (data, tokenizer); ``runtime_modules`` first;
    - ``resume_check(plan, run_dir)``: before a stopped run continues in its run directory;
    - ``env(plan[, run_dir]) -> dict``: variables every rank needs beyond the cluster's;
    - ``container(plan, run_dir) -> vdkit.run.jobspec.Container | None``: the image and mounts (None: host Python);
    - ``finished_line(plan) -> str | None``: for ranks that exit 0 on a clean stop too, what rank 0 prints when done;
    - ``make_base(recipe, directory) -> path``: a seeded toy base checkpoint at ``base_model_key`` (the demo);
    - ``notes(recipe) -> [str]``: lines the plan (and the render) says about the engine's run, e.g. seeded weights;
    - ``fp32_params(recipe) -> bool``: its rendered model keeps fp32 parameters under bf16 / fp8 mixed precision
      (NeMo 1.23 without megatron_amp_O2), which the memory model counts (:mod:`vdkit.planner.memory`);
    - ``fp8_bf16_layers(recipe) -> (start, end)``: with ``train.precision=fp8``, how many decoder layers at the start
      and at the end of the model its render keeps in bf16 (no FP8 autocast: their linears save bf16 inputs), which
      the memory model counts (:mod:`vdkit.planner.memory`); absent: every layer computes in FP8;
    - ``tp_comm_overlap(recipe, tp) -> bool``: its rendered job laid out at TP ``tp`` overlaps the tensor-parallel
      collectives with the GEMMs (Transformer Engine's userbuffers), which the step-time model prices
      (:mod:`vdkit.planner.tp_overlap`); absent: it does not.
    """

    name: str  # engine.name
    summary: str  # one line: what the engine runs (`vdkit list engines`)
    command: Callable
    files: Optional[Callable] = None
    check: Optional[Callable] = None
    inputs: Optional[Callable] = None
    preflight: Optional[Callable] = None
    check_runs: Optional[Callable] = None
    local_check: Optional[Callable] = None
    resume_check: Optional[Callable] = None
    env: Optional[Callable] = None
    container: Optional[Callable] = None
    finished_line: Optional[Callable] = None
    make_base: Optional[Callable] = None  # (recipe, directory) -> path: a seeded toy base for base_model_key (the demo)
    notes: Optional[Callable] = None  # (recipe) -> [str]: the plan's notes about this engine's run
    fp32_params: Optional[Callable] = None  # (recipe) -> bool: fp32 parameters under mixed precision (memory model)
    fp8_bf16_layers: Optional[Callable] = None  # (recipe) -> (start, end): layers kept bf16 under FP8 (memory model)
    tp_comm_overlap: Optional[Callable] = None  # (recipe, tp) -> bool: TP collectives overlapped with GEMMs (step time)
    # --- the model: every ModelCfg field is in exactly one of maps / ignores / refuses
    families: Tuple[str, ...]  # model.arch values it builds
    maps: Mapping[str, str]  # model field -> where it lands in the stack (built exactly, any value)
    ignores: Mapping[str, str] = field(default_factory=dict)  # model field -> why this engine never reads it
    refuses: Mapping[str, str] = field(default_factory=dict)  # model field -> why a non-default value is refused
    # --- what it runs
    methods: Tuple[str, ...]  # method.name values
    shardings: Tuple[str, ...] = ("none",)  # parallelism.sharding values
    # under parallelism.sharding=none, plain data parallelism only (torch DDP): no TP / PP and no distributed optimizer
    # (every rank holds all optimizer state); the planner's automatic layout is TP 1 x PP 1 and never shards the state
    data_parallel_only: bool = False
    # its train.precision=fp8 gathers FP8 parameters through the distributed optimizer: the planner turns that on when
    # parallelism.distributed_optimizer is unset, and the engine's check refuses it set false
    fp8_needs_distributed_optimizer: bool = False
    precisions: Tuple[str, ...]  # train.precision values
    # method.lora_targets layers its LoRA can adapt (vdkit.planner.lora_targets; default: QKV alone)
    lora_targets: Tuple[str, ...] = LORA_DEFAULT_TARGETS
    no_lora_targets: str = "its stack adapts QKV only"  # why not the others (when not)
    lora_a2a: bool = False  # whether it renders method.lora_a2a (the row-parallel adapters' all-to-all)
    optimizer_dtypes: Tuple[str, ...] = ("fp32",)  # train.optimizer_dtype values it renders
    swiglu_input_dtypes: Tuple[str, ...] = ("bf16",)  # train.swiglu_input_dtype values it renders
    context_parallel: bool  # whether parallelism.cp > 1 splits a sequence in its stack
    no_context_parallel: str = "its stack has no context parallelism"  # why not (when not)
    fp8_attention: bool = False  # whether it renders train.fp8_attention (FP8 dot-product attention)
    no_fp8_attention: str = "its stack renders no FP8 dot-product attention"  # why not (when not)
    cuda_graphs: Tuple[str, ...] = ("none",)  # train.cuda_graphs values it renders (per-layer CUDA graphs)
    no_cuda_graphs: str = "its stack captures no CUDA graphs"  # why not "layer" (when not)
    rope_scaling: Tuple[str, ...]  # model.rope_scaling rope_type values its model code builds
    # why its stack cannot run an interleaved pipeline (VP > 1) with PEFT ("": it can); the planner never picks one
    no_peft_interleaving: str = ""
    mcore_rope: bool = False  # its llama3 scaling is megatron-core's (fixed low / high frequency factors)
    step_time_regime: str  # vdkit.planner.predict: unfused | fused | hf
    # the decoder layers it builds on a GPU, whose saved activations the memory model counts (vdkit.planner
    # .activations): fused (Transformer Engine + flash attention) | local (megatron-core's local spec: unfused
    # attention keeps its softmax) | hf (transformers' layers with engine.attention sdpa / eager)
    layer_kernels: str = "fused"
    # how its collator pads unpacked fine-tuning rows: to the longest row of each micro batch (micro_batch) or every
    # micro batch of a step to the step's longest row (global_batch); the local layers' step-time term
    # (vdkit.planner.local_traffic) prices the rows a local-kernel engine builds from it
    pads_rows_to: str = "micro_batch"
    # the host read-backs its training loop makes that empty the GPU's queue (names from
    # vdkit.composition.schema.LOOP_DRAINS): the step-time model prices the ops issued after each in series with the
    # GPU (vdkit.planner.host_time drain_terms, step_time.yaml host.drain); () : its loop has none the model prices
    loop_drains: Tuple[str, ...] = ()
    # --- how it runs
    run_dir_files: Tuple[str, ...] = ()  # the files ``files`` adds to a run directory (names from vdkit.run.rundir)
    # the run-dir files a person may edit (its config): `vdkit check` holds them to the stack's types and the value
    # rules; every other rendered file is compared with the kit's render byte for byte (vdkit.render.rendercheck)
    config_files: Tuple[str, ...] = ()
    gpu_vendors: Tuple[str, ...]  # cluster.gpu_vendor values its image is built for
    images: Tuple[str, ...] = ()  # engine.* keys naming its images (their values: conf/engine/<name>.yaml)
    stack: Mapping[str, str]  # library -> the version the engine is written and tested against
    runtime_modules: Tuple[str, ...] = ()  # what a rank imports (checked before training here)
    extra: str = ""  # the pyproject extra that installs runtime_modules
    runs_locally: bool  # `vdkit run` may start its ranks as processes here
    catches_stop_signals: bool = True  # ranks stop cleanly on USR1 / TERM (False: by their own clock)
    writes_heartbeat: bool  # ranks write the launcher's heartbeat (hang watchdog)
    needs_pmi: bool = False  # ranks bootstrap through PMI (srun --mpi=<cluster.mpi>)
    base_model_key: Optional[str] = None  # model.* key fine-tuning reads its base weights from, when it needs one

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise TypeError naming the first thing this spec gets wrong (its registration fails)."""
        from vdkit.composition import schema
        from vdkit.composition.schema import LAYER_KERNELS, ROW_PADDINGS, STEP_TIME_REGIMES as REGIMES, ModelCfg

        who = f"engine spec {self.name!r}"

        def bad(why):
            raise TypeError(f"{who}: {why}")

        if not self.name or not self.name.isidentifier():
            bad("name must be an identifier")
        if not callable(self.command):
            bad("command is not callable")
        for hook in HOOKS:
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                bad(f"{hook} is neither None nor callable")
        fields = [f.name for f in dataclasses.fields(ModelCfg)]
        said = {"maps": self.maps, "ignores": self.ignores, "refuses": self.refuses}
        for kind, got in said.items():
            unknown = sorted(set(got) - set(fields))
            if unknown:
                bad(f"{kind} names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not a model "
                    "field (vdkit.composition.schema.ModelCfg)")
        twice = sorted(f for f in fields if sum(f in got for got in said.values()) > 1)
        if twice:
            bad(f"model field(s) {', '.join(twice)} named in more than one of maps / ignores / refuses")
        missing = [f for f in fields if not any(f in got for got in said.values())]
        if missing:
            bad(f"model field(s) {', '.join(missing)} neither mapped, ignored nor refused: say what the engine "
                "does with each (maps / ignores / refuses)")
        for key, allowed in (("families", schema.ARCHS), ("methods", schema.METHODS), ("shardings", schema.SHARDINGS),
                             ("precisions", schema.PRECISIONS), ("gpu_vendors", schema.GPU_VENDORS),
                             ("optimizer_dtypes", schema.OPTIMIZER_DTYPES),
                             ("swiglu_input_dtypes", schema.SWIGLU_INPUT_DTYPES), ("cuda_graphs", schema.CUDA_GRAPHS),
                             ("loop_drains", schema.LOOP_DRAINS), ("lora_targets", LORA_TARGETS)):
            value = getattr(self, key)
            if isinstance(value, str) or not isinstance(value, tuple):
                bad(f"{key} must be a tuple of names, not {value!r}")
            odd = [v for v in value if v not in allowed]
            if odd:
                bad(f"{key} names {odd}, not among {allowed}")
        if self.step_time_regime not in REGIMES:
            bad(f"step_time_regime={self.step_time_regime!r} is not one of {', '.join(REGIMES)}")
        if self.layer_kernels not in LAYER_KERNELS:
            bad(f"layer_kernels={self.layer_kernels!r} is not one of {', '.join(LAYER_KERNELS)}")
        if self.pads_rows_to not in ROW_PADDINGS:
            bad(f"pads_rows_to={self.pads_rows_to!r} is not one of {', '.join(ROW_PADDINGS)}")
        for key in ("rope_scaling", "run_dir_files", "config_files", "images", "runtime_modules"):
            if not isinstance(getattr(self, key), tuple):
                bad(f"{key} must be a tuple")
        if self.base_model_key is not None and self.base_model_key not in fields:
            bad(f"base_model_key={self.base_model_key!r} is not a model field")
        if self.make_base and not self.base_model_key:
            bad("make_base without the base_model_key it fills")
        if self.runtime_modules and not self.extra:
            bad("runtime_modules without the extra that installs them")

    # ------------------------------------------------------------------ what it holds
    def holds(self, key: str, value) -> bool:
        """Whether this engine accepts ``value`` for the recipe key ``key`` (the door's keys, :data:`DOOR`)."""
        return value in getattr(self, DOOR[key][0])

    def model_refusal(self, model) -> Optional[str]:
        """Why this engine cannot build ``model`` (a ModelCfg or a subclass with more fields), or None."""
        if model.arch not in self.families:
            return f"model.arch={model.arch} (model {model.name}): engine={self.name} builds {'/'.join(self.families)}"
        for f in dataclasses.fields(model):
            if f.name in self.maps or f.name in self.ignores:
                continue
            value = getattr(model, f.name)
            if value == _default(f):
                continue
            why = self.refuses.get(f.name, "its spec does not map this field")
            return f"model.{f.name}={_word(value)} (model {model.name}): engine={self.name} does not build it ({why})"
        return None

    def table_row(self) -> dict:
        """The capabilities as plain data (`vdkit list engines --json`)."""
        out = {"name": self.name, "summary": self.summary}
        for f in dataclasses.fields(self):
            if f.name in ("name", "summary", "command") + HOOKS:
                continue
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v
        return out


# recipe key -> (the spec's field, the capability's words in a refusal)
DOOR = {"method.name": ("methods", "method"), "parallelism.sharding": ("shardings", "sharding"),
        "train.precision": ("precisions", "precision"),
        "train.optimizer_dtype": ("optimizer_dtypes", "optimizer state dtype"),
        "train.swiglu_input_dtype": ("swiglu_input_dtypes", "dtype for the SwiGLU input it saves")}


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _word(value) -> str:
    return str(value).lower() if isinstance(value, bool) else "null" if value is None else str(value)


def refusal(recipe, spec: EngineSpec, others) -> Optional[tuple]:
    """``(what, fix)`` when ``spec`` cannot run ``recipe``, else None; ``others`` every registered spec (to name
    the engines that can)."""
    m = recipe.model
    why = spec.model_refusal(m)
    if why:
        can = [s.name for s in others if s.model_refusal(m) is None]
        return why, (("use engine=" + " or engine=".join(can)) if can else "no registered engine builds it: "
                     "add it to an engine's spec (docs/architecture.md)") + ", or another model"
    for key, (attr, word) in DOOR.items():
        section, name = key.split(".")
        value = getattr(getattr(recipe, section), name)
        if value not in getattr(spec, attr):
            can = [s.name for s in others if value in getattr(s, attr)]
            return (f"{key}={value}: engine={spec.name} has no such {word} (its {attr}: {', '.join(getattr(spec, attr))})",
                    ("use engine=" + " or engine=".join(can) + ", or " if can else "use ")
                    + " or ".join(f"{key}={v}" for v in getattr(spec, attr)))
    odd = [t for t in recipe.method.lora_targets if t not in spec.lora_targets] if recipe.method.name == "lora" else []
    if odd:
        can = [s.name for s in others if not set(recipe.method.lora_targets) - set(s.lora_targets)]
        return (f"method.lora_targets names {', '.join(odd)}: engine={spec.name} cannot put LoRA there "
                f"({spec.no_lora_targets})", ("use engine=" + " or engine=".join(can) + ", or " if can else "use ")
                + "method.lora_targets=[" + ",".join(spec.lora_targets) + "]")
    if recipe.method.name == "lora" and recipe.method.lora_a2a and not spec.lora_a2a:
        can = [s.name for s in others if s.lora_a2a]
        return (f"method.lora_a2a=true: engine={spec.name} renders no all-to-all for LoRA's row-parallel adapters",
                ("use engine=" + " or engine=".join(can) + ", or " if can else "use ") + "method.lora_a2a=false")
    if recipe.train.fp8_attention and not spec.fp8_attention:
        can = [s.name for s in others if s.fp8_attention]
        return (f"train.fp8_attention=true: engine={spec.name} cannot run FP8 attention ({spec.no_fp8_attention})",
                ("use engine=" + " or engine=".join(can) + ", or " if can else "use ") + "train.fp8_attention=false")
    if recipe.parallelism.tp_comm_overlap_cfg and spec.tp_comm_overlap is None:
        can = [s.name for s in others if s.tp_comm_overlap is not None]
        return (f"parallelism.tp_comm_overlap_cfg={recipe.parallelism.tp_comm_overlap_cfg}: engine={spec.name} renders "
                "no userbuffers TP communication overlap to set it in",
                ("use engine=" + " or engine=".join(can) + ", or " if can else "use ") + "parallelism.tp_comm_overlap_cfg=null")
    g = recipe.train.cuda_graphs
    if g not in spec.cuda_graphs:
        from vdkit.composition.schema import CUDA_GRAPHS

        can = [s.name for s in others if g in s.cuda_graphs]
        return ((f"train.cuda_graphs={g}: engine={spec.name} cannot capture CUDA graphs ({spec.no_cuda_graphs})"
                 if g in CUDA_GRAPHS else f"train.cuda_graphs={g} is not a CUDA-graph setting"),
                ("use engine=" + " or engine=".join(can) + ", or " if can else "use ")
                + " or ".join(f"train.cuda_graphs={v}" for v in (spec.cuda_graphs if g in CUDA_GRAPHS else CUDA_GRAPHS)))
    return None
