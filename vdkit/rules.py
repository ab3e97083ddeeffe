"""The door: every rule a composed recipe must pass before anything plans, renders or runs it.

``check_recipe(recipe)`` runs after Hydra composition (``vdkit.config.compose``), so a bad value is
one line naming the key, why and the fix, exit 2, before a run directory or a rank exists:

- numbers (:data:`DOMAINS`): every float field finite, every size positive, probabilities in
  their range, seeds in numpy's range; one table, so a new field gets its rule in one line;
- architecture per model family (:data:`FAMILIES`): what a Llama or an OPT block is built from,
  and RoPE scaling that transformers can build;
- file-path inputs that the kit itself reads (a DeepSpeed config, a local ``model.hf_path``);
- ``cluster.env``: no variable that breaks the job (PATH, UID, LD_*, SLURM_*, rendezvous
  variables, ...) and nothing that looks like a secret (those go in ``run.secrets_file``, which
  :func:`check_secrets_file` checks the same way when the file is here).

Rules on the override *syntax* (``~key``, ``hydra.*``, a key given twice, sweep syntax without
``-m``, sweeps too large to plan) are :func:`check_overrides` and :func:`check_sweep_size`.
Layout rules (TP / PP / DP) live in :mod:`vdkit.planner.plan`; field rules on names and obvious pairs in
:func:`vdkit.config.validate_fields`.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Optional, Sequence

from vdkit.errors import UserError

# ----------------------------------------------------------------------------- numbers
INF = math.inf
# key: (low, low inclusive, high, high inclusive, example fix). None values pass (optional fields).
DOMAINS = {
    "method.lr": (0, True, INF, False, "method.lr=1e-4"),  # 0: a control run that must not learn
    "method.min_lr": (0, True, INF, False, "method.min_lr=0"),
    "method.warmup_steps": (0, True, INF, False, "method.warmup_steps=50"),
    "method.weight_decay": (0, True, INF, False, "method.weight_decay=0.01"),
    "method.lora_adapter_dim": (1, True, INF, False, "method.lora_adapter_dim=32"),
    "method.lora_dropout": (0, True, 1, False, "method.lora_dropout=0.05"),
    "method.ptuning_virtual_tokens": (1, True, INF, False, "method.ptuning_virtual_tokens=10"),
    "method.ptuning_bottleneck_dim": (1, True, INF, False, "method.ptuning_bottleneck_dim=1024"),
    "method.ptuning_embedding_dim": (1, True, INF, False, "method.ptuning_embedding_dim=1024"),
    "model.num_layers": (1, True, INF, False, "model.num_layers=32"),
    "model.hidden_size": (1, True, INF, False, "model.hidden_size=4096"),
    "model.ffn_hidden_size": (1, True, INF, False, "model.ffn_hidden_size=11008"),
    "model.num_attention_heads": (1, True, INF, False, "model.num_attention_heads=32"),
    "model.num_query_groups": (1, True, INF, False, "model.num_query_groups=32"),
    "model.vocab_size": (1, True, INF, False, "model.vocab_size=32000"),
    "model.max_position_embeddings": (1, True, INF, False, "model.max_position_embeddings=4096"),
    "model.norm_eps": (0, False, 1, False, "model.norm_eps=1e-5"),
    "model.rope_base": (0, False, INF, False, "model.rope_base=10000"),
    "model.embedding_dim": (1, True, INF, False, "model.embedding_dim=null"),
    "model.pretrain_tp": (1, True, INF, False, "model.pretrain_tp=null"),
    "model.pretrain_pp": (1, True, INF, False, "model.pretrain_pp=null"),
    "cluster.gpu_memory_gb": (0, False, INF, False, "cluster.gpu_memory_gb=80"),
    "cluster.inter_node_gb_s": (0, False, INF, False, "cluster.inter_node_gb_s=null (from the adapters)"),
    "cluster.memory_overhead_gb": (0, True, INF, False, "cluster.memory_overhead_gb=null (the planner's default)"),
    "cluster.min_nodes": (1, True, INF, False, "cluster.min_nodes=1"),
    "cluster.max_nodes": (1, True, INF, False, "cluster.max_nodes=6"),
    "cluster.nodes": (1, True, INF, False, "cluster.nodes=1"),
    "cluster.time_limit_min": (1, True, INF, False, "cluster.time_limit_min=240"),
    "engine.log_every_n_steps": (1, True, INF, False, "engine.log_every_n_steps=1"),
    "engine.checkpoint_every_n_steps": (0, True, INF, False, "engine.checkpoint_every_n_steps=0 (only at the end)"),
    "train.seed": (0, True, 2 ** 32, False, "train.seed=1234"),  # numpy / torch seeds: [0, 2**32)
}


def _value(recipe, key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(recipe, section), name)


def _fmt_range(lo, lo_in, hi, hi_in) -> str:
    if hi == INF:
        return (f">= {lo:g}" if lo_in else f"> {lo:g}") if lo else ("not negative" if lo_in else "positive")
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def check_numbers(recipe) -> None:
    """Every float finite and every field of :data:`DOMAINS` in its range (one line naming the key)."""
    import dataclasses

    for sec in ("model", "method", "cluster", "data", "engine", "parallelism", "train", "run"):
        section = getattr(recipe, sec)
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                fix = DOMAINS.get(f"{sec}.{f.name}", (None,) * 4 + (f"a finite {sec}.{f.name}",))[4]
                raise UserError(f"{sec}.{f.name}={v} is not a finite number", f"use e.g. {fix}")
    for key, (lo, lo_in, hi, hi_in, fix) in DOMAINS.items():
        v = _value(recipe, key)
        if v is None or isinstance(v, bool):
            continue
        ok = (v >= lo if lo_in else v > lo) and (v <= hi if hi_in else v < hi)
        if not ok:
            raise UserError(f"{key}={v} must be {_fmt_range(lo, lo_in, hi, hi_in)}", f"use e.g. {fix}")
    m, c = recipe.method, recipe.cluster
    if m.min_lr > m.lr:
        raise UserError(f"method.min_lr={m.min_lr:g} is above method.lr={m.lr:g} (the schedule decays from lr "
                        "to min_lr)", "use method.min_lr <= method.lr, e.g. method.min_lr=0")
    if c.max_nodes < c.min_nodes:
        raise UserError(f"cluster.max_nodes={c.max_nodes} is below cluster.min_nodes={c.min_nodes}",
                        "use cluster.max_nodes >= cluster.min_nodes")
    if c.memory_overhead_gb is not None and c.memory_overhead_gb >= c.gpu_memory_gb:
        raise UserError(f"cluster.memory_overhead_gb={c.memory_overhead_gb:g} leaves nothing of the "
                        f"{c.gpu_memory_gb:g} GB GPU (cluster.gpu_memory_gb)",
                        "use a per-device overhead well below the GPU's memory, e.g. cluster.memory_overhead_gb=4")


# ----------------------------------------------------------------------------- architecture per family
# What each model family's block is built from: key -> allowed values. ``gqa: False`` means every
# attention head has its own K / V (num_query_groups == num_attention_heads).
FAMILIES = {
    "llama": {"norm": ("rmsnorm",), "activation": ("swiglu",), "position_embedding": ("rope",), "bias": (False,),
              "pre_norm": (True,), "embedding_dim": (None,)},
    "opt": {"norm": ("layernorm",), "activation": ("relu", "gelu"), "position_embedding": ("learned",),
            "rope_scaling": (None,), "gqa": (False,)},
}
# transformers' RoPE types (ROPE_INIT_FUNCTIONS) and the keys each needs besides rope_type / factor.
ROPE_TYPES = {"linear": (), "dynamic": (), "yarn": (), "longrope": ("short_factor", "long_factor"),
              "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def check_architecture(m) -> None:
    """The model's architecture fields agree with its family (``model.arch``) and its RoPE scaling."""
    family = FAMILIES.get(m.arch)
    if family is None:
        return  # an unknown arch is validate_fields' line
    for key, allowed in family.items():
        value = (m.num_query_groups != m.num_attention_heads) if key == "gqa" else getattr(m, key)
        if value not in allowed:
            what = (f"model.num_query_groups={m.num_query_groups} (grouped-query attention with "
                    f"{m.num_attention_heads} heads)" if key == "gqa" else f"model.{key}={value!r}")
            want = (f"model.num_query_groups={m.num_attention_heads}" if key == "gqa" else
                    " or ".join(f"model.{key}={'null' if a is None else str(a).lower()}" for a in allowed))
            raise UserError(f"{what} does not exist in the {m.arch} architecture of model {m.name}",
                            f"use {want}, or another model (model.arch={m.arch})")
    rs = m.rope_scaling
    if isinstance(rs, dict) and rs:  # not a mapping: validate_fields' line
        rtype = rs.get("rope_type", rs.get("type"))
        if rtype not in ROPE_TYPES:
            raise UserError(f"model.rope_scaling.rope_type={rtype!r} is not a RoPE scaling transformers builds",
                            "use one of " + ", ".join(ROPE_TYPES) + ", or model.rope_scaling=null")
        for key in ("factor",) + ROPE_TYPES[rtype]:
            if key not in rs:
                raise UserError(f"model.rope_scaling (rope_type {rtype}) has no {key}",
                                f"add it, e.g. model.rope_scaling.{key}=..., as in conf/model/llama3_1_8b.yaml")
        for key, v in rs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v) or v <= 0 or (key == "factor" and v < 1):
                raise UserError(f"model.rope_scaling.{key}={v} must be a finite number "
                                + (">= 1 (it stretches the context)" if key == "factor" else "> 0"),
                                f"use e.g. model.rope_scaling.{key}=" + ("8.0" if key == "factor" else "1.0"))


# ----------------------------------------------------------------------------- files the kit reads
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


# ----------------------------------------------------------------------------- environment and secrets
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the job's shell, srun, the container runtime or the rendezvous set: exporting one breaks the
# job (PATH= and srun is not found; UID= is read-only in bash and ends the script; SLURM_* lie to srun).
DENIED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "UID", "EUID", "PPID", "GROUPS", "IFS", "PWD",
                "OLDPWD", "HOSTNAME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "TMPDIR",
                "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                "NCCL_IB_HCA"}
DENIED_PREFIXES = ("LD_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "PMI_", "OMPI_", "TORCHELASTIC_",
                   "BASH_FUNC_", "VDKIT_")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
SECRET_VALUE = re.compile(r"(^hf_[A-Za-z0-9]{20,}$|^gh[pousr]_[A-Za-z0-9]{20,}$|^sk-[A-Za-z0-9_-]{20,}$|"
                          r"^(AKIA|ASIA)[A-Z0-9]{16}$|^xox[abpr]-|^glpat-|-----BEGIN)")


def denied_name(name: str) -> Optional[str]:
    """Why exporting ``name`` would break the job (None: it is fine)."""
    if not ENV_NAME.match(name):
        return "is not a shell variable name (letters, digits and _, not starting with a digit)"
    if name in DENIED_NAMES or name.startswith(DENIED_PREFIXES):
        return ("is set by the shell, Slurm, the container or the rendezvous; exporting it breaks the job "
                "(e.g. PATH= and srun is not found, UID= ends the batch script)")
    return None


def check_cluster_env(env: dict) -> None:
    """``cluster.env`` is written in clear into launch.sbatch and recipe.yaml: no job-breaking name, no secret."""
    for name, value in (env or {}).items():
        why = denied_name(str(name))
        if why:
            raise UserError(f"cluster.env.{name} {why}", f"drop cluster.env.{name}; the kit sets what the job needs")
        if SECRET_NAME.search(str(name)) or SECRET_VALUE.search(str(value)):
            raise UserError(f"cluster.env.{name} looks like a secret, and cluster.env is written in clear into "
                            "launch.sbatch, recipe.yaml and overrides.txt",
                            f"put {name}=... in a file only you can read and pass run.secrets_file=PATH")


# A token inside any other value (a path segment, a run name, a site option) or credentials in a URL or
# image reference (user:password@host): every recipe value is written in clear into the run directory.
EMBEDDED_SECRET = re.compile(r"((?<![A-Za-z0-9])(hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|glpat-[A-Za-z0-9_-]{20,}"
                             r"|xox[abpr]-[A-Za-z0-9-]{10,}|(AKIA|ASIA)[A-Z0-9]{16})(?![A-Za-z0-9])"
                             r"|-----BEGIN|^([a-z][a-z0-9+.-]*://)?[^\s/@:]+:[^\s/@]+@(?!sha256:)[^\s/@]+)")


def _leaves(data, prefix: str = ""):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from _leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], data


def check_secret_values(recipe) -> None:
    """No recipe value (outside cluster.env, checked by its own rule) may carry a token or credentials:
    recipe.yaml, plan.json, overrides.txt and the launcher's script hold them in clear."""
    for key, value in _leaves(recipe.to_dict()):
        if key.startswith("cluster.env.") or not isinstance(value, str):
            continue
        if EMBEDDED_SECRET.search(value):
            raise UserError(f"{key} looks like it holds a secret (a token or user:password@), and every recipe value "
                            "is written in clear into recipe.yaml, plan.json, overrides.txt and the job script",
                            "keep secrets out of the recipe: put NAME=value lines in a file only you can read and "
                            "pass run.secrets_file=PATH (a registry login: the container runtime's credentials)")


def check_secrets_file(path: Optional[str], required: bool) -> None:
    """``run.secrets_file``: a private (:func:`check_secrets_file_mode`), readable regular file of
    ``NAME=value`` lines with harmless names.

    ``required``: the file must exist here (``vdkit run``, ``--check-mounts``); otherwise a path
    that does not exist here is the cluster's and is checked by the job.
    """
    if not path:
        return
    p = Path(path)
    if not p.exists():
        if required:
            raise UserError(f"run.secrets_file {path} does not exist", "create it (NAME=value lines, mode 600) or "
                            "drop run.secrets_file")
        return
    if not p.is_file():
        raise UserError(f"run.secrets_file {path} is not a regular file", "point it at a file of NAME=value lines")
    check_secrets_file_mode(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"run.secrets_file {path} cannot be read: {exc.strerror}",
                        "make it readable by you (chmod 600)") from None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        name = s[len("export "):].lstrip() if s.startswith("export ") else s
        name = name.split("=", 1)[0].strip()
        why = denied_name(name) if "=" in s else "is not a NAME=value line"
        if why:
            # the line number, never the line: it may hold the secret itself
            shown = name if ENV_NAME.match(name) or "=" in s and len(name) < 40 else f"line {n}"
            raise UserError(f"run.secrets_file {path} line {n}: {shown} {why}",
                            "keep only the secrets' own NAME=value lines (e.g. HF_TOKEN=..., WANDB_API_KEY=...)")


def check_secrets_file_mode(path: str) -> None:
    """Refuse a secrets file of yours that its group or other users can read or write (mode & 0o077).

    Refused, not warned about, as ssh refuses a private key that is "too open" (it ignores the key
    and says "Permissions 0644 for '...' are too open"): the tokens in it (HF, W&B) are as good as
    a password, a warning scrolls past while the job runs with them anyway, and every other unsafe
    input is refused at the door in one line with its fix (exit 2). Also as ssh, only a file you own
    is checked: one another user owns (a team's token file kept by its owner) is theirs to protect,
    and ``chmod`` is not yours to run on it. The line names the file and its mode, never a value.
    """
    import shlex
    import stat

    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or not mode & 0o077:
        return
    who = " and ".join(w for w, bits in (("its group", 0o070), ("other users", 0o007)) if mode & bits)
    raise UserError(f"run.secrets_file {path} has mode {mode:04o}: it is open to {who}, and the tokens in it "
                    "must be yours alone",
                    f"chmod 600 {shlex.quote(str(path))}")


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


def read_secrets_file(path: str) -> dict:
    """NAME -> value of a checked secrets file, read as data (the job script's rules: an optional
    ``export``, one pair of surrounding quotes removed, no expansion). For runs started here."""
    check_secrets_file(path, required=True)
    out = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        s = line.rstrip("\r").strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("export "):
            s = s[len("export "):].lstrip()
        name, value = s.split("=", 1)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def check_launcher_settings(recipe) -> None:
    """The launcher's own cluster settings (e.g. cluster.kubernetes), through the launcher registry."""
    from vdkit import launchers

    if recipe.cluster.launcher in launchers.names():  # an unknown launcher is validate_fields' line
        launchers.get(recipe.cluster.launcher).check_recipe(recipe)


def check_recipe(recipe) -> None:
    """Every rule of this module on a composed recipe (called by vdkit.config.compose)."""
    check_numbers(recipe)
    check_names(recipe)
    check_architecture(recipe.model)
    check_cluster_env(recipe.cluster.env)
    check_secret_values(recipe)
    check_files(recipe)
    check_launcher_settings(recipe)
    check_secrets_file(recipe.run.secrets_file, required=False)


# ----------------------------------------------------------------------------- override syntax
MAX_CELLS = 256  # a sweep larger than this is a typo (range(0,10000)), not a plan: say so before composing


def _parse(overrides: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None  # compose reports Hydra's own message


def check_overrides(overrides: Sequence[str], multirun: bool = False, duplicates: bool = True) -> None:
    """Override syntax that Hydra accepts but vdkit would silently mis-read.

    ``~key`` (deleting falls back to the schema's defaults, e.g. ``~model`` became llama2_7b),
    ``hydra.*`` (vdkit composes, it does not run as a Hydra app: hydra.run.dir / hydra.job.chdir do
    nothing), a key given twice (one is dropped), sweep syntax without ``-m``, ``glob()`` /
    ``interval()`` (no finite list of cells here).
    """
    parsed = _parse(overrides)
    if parsed is None:
        return
    seen = {}
    for raw, o in zip(overrides, parsed):
        key = o.get_key_element().lstrip("+~")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise UserError(f"{key}: vdkit composes its config with Hydra but does not run as a Hydra app, so "
                            "hydra.* settings have no effect",
                            "drop it; --out DIR chooses where run directories go")
        if o.is_delete():
            raise UserError(f"{raw}: deleting a config group or key is refused (vdkit would silently fall back to "
                            "the schema's default, e.g. ~model became llama2_7b)",
                            "choose an option instead, e.g. model=tiny_llama, or set the key to null")
        name = key.split("@", 1)[0]
        if name == "recipe_method":  # conf/config.yaml picks it from recipe and method
            raise UserError(f"{raw}: recipe_method is chosen by recipe= and method= (conf/recipe_method/"
                            "<recipe>_<method>.yaml), not on the command line",
                            "choose recipe=NAME and method=NAME, and override single keys, e.g. data.packed=false")
        if duplicates and name in seen:
            raise UserError(f"{name} is given twice ({seen[name]} and {raw}); one would be silently dropped",
                            f"give {name} once" + (" (a comma list with -m sweeps it)" if multirun else ""))
        seen[name] = raw
        if o.is_sweep_override():
            text = str(raw).split("=", 1)[1] if "=" in str(raw) else str(raw)
            for fn in ("glob(", "interval("):
                if text.lstrip().startswith(fn):
                    raise UserError(f"{raw}: {fn[:-1]}() sweeps are not supported by vdkit's sweeps "
                                    "(no finite list of cells)",
                                    f"list the values with commas and -m, e.g. -m {key}=a,b"
                                    + (f" (options: vdkit plan --cfg lists keys; conf/{key}/ holds the {key} options)"
                                       if "." not in key else ""))
            if not multirun:
                raise UserError(f"{raw} is a sweep (several values for {name}), but -m was not given",
                                f"add -m to plan every value, or quote a literal comma: {name}='a,b'")


def check_sweep_size(overrides: Sequence[str], limit: int = MAX_CELLS) -> None:
    """Refuse a ``-m`` product of more than ``limit`` cells before it is expanded (range(0,10**9) included)."""
    parsed = _parse(overrides)
    if parsed is None:
        return
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    cells = 1
    for o in parsed:
        if not o.is_sweep_override():
            continue
        v = o.value()
        if isinstance(v, RangeSweep):
            start, stop, step = v.start, v.stop, v.step or 1
            n = max(0, math.ceil((stop - start) / step)) if step else 0
        elif isinstance(v, ChoiceSweep):
            n = len(v.list)
        else:
            continue
        cells *= max(n, 1)
        if cells > limit:
            raise UserError(f"the sweep has {cells:,}+ cells, more than the {limit} vdkit plans in one command "
                            f"(from {o.input_line})",
                            "narrow the lists (e.g. range(0,8)), or run several smaller sweeps")


def check_cell_count(n: int, what: str, limit: int = MAX_CELLS) -> None:
    """Refuse ``n`` expanded cells above ``limit`` (a named sweep times the command line's lists)."""
    if n > limit:
        raise UserError(f"{what} has {n:,} cells, more than the {limit} vdkit plans in one command",
                        "narrow the comma lists / range() you added, or run several smaller sweeps")


# ----------------------------------------------------------------------------- a run on this machine
def has_accelerator() -> bool:
    """A CUDA or ROCm device node exists here (no torch import: the door stays fast)."""
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd"))


def host_memory_gb() -> Optional[float]:
    """MemAvailable of this machine in GB (None where /proc/meminfo cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return None


# fp32 training on a CPU: weights 4 B per parameter held; gradients 4 + Adam m, v 8 per trainable one.
CPU_BYTES_WEIGHT, CPU_BYTES_TRAINABLE = 4, 12


def check_local_run(plan) -> None:
    """What a local run (``vdkit run`` / ``demo``) on this machine cannot do, before a run dir exists.

    Without a GPU the ranks are CPU processes: FP8 and CPU offload mean nothing there (the run would
    silently train without them), and the model must fit the host's memory, not an 80 GB GPU.
    """
    if has_accelerator():
        return
    r = plan.recipe
    if r.train.precision == "fp8":
        raise UserError("train.precision=fp8 needs FP8 tensor cores (H100); this machine has no GPU, so the run "
                        "would silently train without FP8", "use train.precision=bf16 here, or render the recipe "
                        "for the cluster (vdkit render / submit)")
    if r.parallelism.cpu_offload:
        raise UserError("parallelism.cpu_offload=true moves GPU memory to the host; this machine has no GPU, so "
                        "there is nothing to offload", "drop parallelism.cpu_offload (or set it false) here")
    from vdkit.planner.arch import param_counts, trainable_params

    total, trainable = param_counts(r.model).total, trainable_params(r)
    per_rank = CPU_BYTES_WEIGHT * total + CPU_BYTES_TRAINABLE * trainable
    if r.parallelism.sharding != "none":
        per_rank /= r.world_size
    need = per_rank * r.world_size / 1e9
    have = host_memory_gb()
    if have is not None and need > 0.9 * have:
        raise UserError(f"{r.model.name} {r.method.name} needs about {need:,.0f} GB of host memory for "
                        f"{r.world_size} local rank(s) on CPU (fp32 weights, gradients and Adam states); this "
                        f"machine has {have:,.0f} GB available",
                        "run a small model here (model=tiny_llama), or render it for the cluster with vdkit render")
