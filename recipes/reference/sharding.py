"""Data-parallel strategies of the reference engine: DDP, FSDP full-shard, DeepSpeed ZeRO-3.

``parallelism.sharding`` picks one; each is the library's own machinery:

- ``none``: Lightning Fabric's ``DDPStrategy`` (gloo on CPU, NCCL / RCCL on GPU).
- ``fsdp``: torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) applied by Fabric's
  ``ModelParallelStrategy`` - one unit per decoder block (the model's own ``_no_split_modules``,
  e.g. ``OPTDecoderLayer``, what the HF Trainer's ``fsdp="full_shard auto_wrap"`` wraps), then the
  root; parameters resharded after forward (full shard). On GPU a ``MixedPrecisionPolicy``
  computes in bf16 over fp32 shards and reduces in fp32 (the HF Trainer's ``--bf16`` with FSDP).
  Why not Fabric's ``FSDPStrategy``: it refuses a CPU accelerator and wraps FSDP1, which needs an
  accelerator device in torch 2.13 ("FSDP needs a non-CPU accelerator device"); FSDP2 runs on
  CPU over gloo, so the same code path is tested here and runs on GPUs.
- ``zero3``: DeepSpeed's own engine (``deepspeed.initialize``) with a ZeRO stage-3 config:
  ``parallelism.deepspeed_config`` (a file in conf/deepspeed/, e.g. the blog's settings, or a
  path), its ``"auto"`` values filled from the recipe as transformers' DeepSpeed integration
  fills them (:func:`resolve_deepspeed_config`). Why not Fabric's ``DeepSpeedStrategy``: it
  refuses anything but a CUDA accelerator; DeepSpeed itself runs ZeRO-3 on CPU (its CPU
  accelerator falls back to gloo). :class:`DeepSpeedFabric` gives the training loop the few
  Fabric calls it makes, backed by the DeepSpeed engine.

Checkpoints: DDP and FSDP write the kit's own ``step=N.ckpt`` (full state: FSDP gathers it with
torch's ``get_state_dict(full_state_dict=True)``); ZeRO-3 writes DeepSpeed's checkpoint directory
(``checkpoints/deepspeed/<tag>`` with its ``latest`` file) and resumes from it.
"""
from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import List, Optional

from vdkit.composition.conftree import deepspeed_config_source
from vdkit.recipes.common.checkpoint import KEEP
from vdkit.errors import UserError

DEEPSPEED_SUBDIR = "deepspeed"


# ----------------------------------------------------------------------------- DeepSpeed config
def resolve_deepspeed_config(plan, cuda: bool, grad_clip: float, betas, source: Optional[dict] = None) -> dict:
    """The DeepSpeed config for ``plan``: the source's settings, ``"auto"`` filled from the recipe.

    Batch: ``train_micro_batch_size_per_gpu`` = MBS, ``gradient_accumulation_steps`` = the plan's,
    ``train_batch_size`` = GBS; a value the source fixes must agree with the recipe. Precision: bf16
    on GPU for ``train.precision`` bf16 / fp8, fp32 on CPU (to compare with DDP), never fp16.
    Buckets (transformers' rules): ``reduce_bucket_size`` h^2, ``stage3_prefetch_bucket_size``
    0.9 h^2, ``stage3_param_persistence_threshold`` 10 h. Gradient clipping: the engine's.
    Optimizer: AdamW with the method's lr / weight decay and the engine's betas (torch's AdamW on
    CPU), unless the source names one. CPU offload of parameters and optimizer when asked.
    """
    r = plan.recipe
    cfg = copy.deepcopy(source if source is not None else deepspeed_config_source(r.parallelism.deepspeed_config))
    t, h = r.train, r.model.hidden_size
    want = {"train_micro_batch_size_per_gpu": t.micro_batch_size, "gradient_accumulation_steps": plan.grad_accum,
            "train_batch_size": t.global_batch_size}
    for key, value in want.items():
        given = cfg.get(key, "auto")
        if given != "auto" and int(given) != value:
            raise UserError(f"the DeepSpeed config fixes {key}={given}, the recipe needs {value} "
                            f"(MBS {t.micro_batch_size} x DP {plan.dp} x accumulation {plan.grad_accum} = GBS "
                            f"{t.global_batch_size})",
                            f"set train.global_batch_size={t.micro_batch_size * plan.dp * int(given)}"
                            if key == "gradient_accumulation_steps" else f"set {key} to \"auto\" in the file")
        cfg[key] = value
    bf16 = cuda and t.precision in ("bf16", "fp8")
    cfg["bf16"] = {**(cfg.get("bf16") or {}), "enabled": bf16}
    cfg["fp16"] = {**(cfg.get("fp16") or {}), "enabled": False}
    if cfg.get("gradient_clipping", "auto") == "auto":
        cfg["gradient_clipping"] = grad_clip
    zero = cfg.setdefault("zero_optimization", {})
    for key, value in (("reduce_bucket_size", h * h), ("stage3_prefetch_bucket_size", int(0.9 * h * h)),
                       ("stage3_param_persistence_threshold", 10 * h)):
        if zero.get(key) == "auto":
            zero[key] = value
    if r.parallelism.cpu_offload:
        zero.setdefault("offload_param", {"device": "cpu", "pin_memory": True})
        zero.setdefault("offload_optimizer", {"device": "cpu", "pin_memory": True})
    if "optimizer" not in cfg:
        params = {"lr": r.method.lr, "betas": list(betas), "eps": 1e-8, "weight_decay": r.method.weight_decay}
        if not cuda:
            params["torch_adam"] = True  # no fused CUDA kernel here: torch.optim.AdamW
        cfg["optimizer"] = {"type": "AdamW", "params": params}
    leftover = [k for k, v in _walk(cfg) if v == "auto"]
    if leftover:
        raise UserError(f"the DeepSpeed config leaves {', '.join(leftover)} as \"auto\", which vdkit cannot fill",
                        "give those keys values in the file")
    return cfg


def _walk(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _walk(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


# ----------------------------------------------------------------------------- FSDP2
def block_classes(model) -> tuple:
    """The decoder-block classes to shard one by one: the transformers model's ``_no_split_modules``."""
    base = model
    while not hasattr(base, "_no_split_modules") or base._no_split_modules is None:
        nxt = getattr(base, "base_model", None) or getattr(base, "model", None)
        if nxt is None or nxt is base:
            break
        base = nxt
    names = set(getattr(base, "_no_split_modules", None) or ())
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        raise UserError(f"cannot find the decoder blocks of {type(model).__name__} to shard",
                        "use a transformers causal-LM model (Llama, OPT)")
    return tuple(found)


def fsdp_parallelize(model, mesh, cuda: bool, offload: bool):
    """FSDP2 full shard: each decoder block its own unit, then the root (torch's ``fully_shard``)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh["data_parallel"], "reshard_after_forward": True}
    if cuda:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks = block_classes(model)
    for module in model.modules():
        if isinstance(module, blocks):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


# ----------------------------------------------------------------------------- strategies
def make_fabric(plan, dist, grad_clip: float, betas):
    """The rank's distributed runtime: a Fabric (none / fsdp) or a :class:`DeepSpeedFabric` (zero3)."""
    import functools
    import os
    import warnings

    import torch
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import DDPStrategy, ModelParallelStrategy

    from vdkit.recipes.common.training_constants import CPU_PRECISION, GPU_PRECISION

    from datetime import timedelta

    from vdkit.run.faults import collective_timeout_s

    kind = plan.recipe.parallelism.sharding
    cuda = torch.cuda.is_available()
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores between this node's ranks, as torchrun does
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_world_size))
    if kind == "zero3":
        return DeepSpeedFabric(plan, dist, cuda, grad_clip, betas)
    # Our cluster environment reads Slurm's variables itself; Lightning's srun hint does not apply.
    warnings.filterwarnings("ignore", message=".*The `srun` command is available.*")
    backend = "nccl" if cuda else "gloo"
    nodes = max(dist.world_size // dist.local_world_size, 1)
    env = make_cluster_environment(dist)
    if kind == "fsdp":
        parallelize = functools.partial(fsdp_parallelize, cuda=cuda, offload=plan.recipe.parallelism.cpu_offload)
        strategy = ModelParallelStrategy(parallelize, data_parallel_size=dist.world_size, tensor_parallel_size=1,
                                         process_group_backend=backend,
                                         timeout=timedelta(seconds=collective_timeout_s()))
        precision = CPU_PRECISION  # fp32 shards; FSDP2's MixedPrecisionPolicy does the bf16 compute on GPU
        plugins = [env]
    else:
        strategy = "auto" if dist.world_size == 1 else DDPStrategy(
            cluster_environment=env, process_group_backend=backend,
            timeout=timedelta(seconds=collective_timeout_s()),  # the launcher's, from the plan (vdkit.run.faults)
            # The models' only buffers are constants every rank builds alike (RoPE's inv_freq): DDP's broadcast of
            # them before every forward is a collective that would make each rank wait for the slowest there,
            # hiding a straggler's compute time (vdkit.recipes.common.heartbeat.ComputeClock).
            broadcast_buffers=False)
        precision = GPU_PRECISION if cuda else CPU_PRECISION  # fp8 recipes train in bf16 here
        plugins = None
    fabric = Fabric(accelerator="cuda" if cuda else "cpu", devices=dist.local_world_size, num_nodes=nodes,
                    strategy=strategy, precision=precision, plugins=plugins)
    fabric.launch()  # processes exist already: this only joins the process group
    return fabric


class _StepThroughEngine:
    """The optimizer the loop sees under ZeRO-3: DeepSpeed's, stepped by the engine itself."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def param_groups(self):
        return self.engine.optimizer.param_groups

    def step(self):
        pass  # the engine stepped at the accumulation boundary (DeepSpeedFabric.backward)

    def zero_grad(self, set_to_none: bool = True):
        pass  # the engine zeroes its partitioned gradients after each step


class DeepSpeedFabric:
    """The Fabric calls the training loop makes, backed by one DeepSpeed ZeRO-3 engine.

    The loop calls ``backward(loss / micro_batches)`` once per micro batch: the engine accumulates
    (its gradient_accumulation_steps is the plan's) and steps, with its own gradient clipping, at
    the boundary; ``clip_gradients``, ``optimizer.step`` and ``zero_grad`` are then no-ops.
    """

    def __init__(self, plan, dist, cuda: bool, grad_clip: float, betas):
        import torch
        import torch.distributed as tdist

        from vdkit.recipes.common.known_warnings import silence

        silence("deepspeed")  # torch's deprecation of the collectives DeepSpeed calls, once per all-gather
        if not cuda:  # say it, so that DeepSpeed does not warn it "was unable to detect" a GPU
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        self.plan, self.dist, self.cuda = plan, dist, cuda
        self.config = resolve_deepspeed_config(plan, cuda, grad_clip, betas)
        if cuda:
            torch.cuda.set_device(dist.local_rank)
        self.device = torch.device("cuda", dist.local_rank) if cuda else torch.device("cpu")
        if not tdist.is_initialized():
            tdist.init_process_group("nccl" if cuda else "gloo",
                                     init_method=f"tcp://{dist.master_addr}:{dist.master_port}",
                                     rank=dist.rank, world_size=dist.world_size)
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")  # adopts the group above
        self.engine = None
        self.global_rank = dist.rank
        self.world_size = dist.world_size

    def hf_config(self):
        """transformers' handle that makes from_pretrained load straight into ZeRO-3 partitions."""
        from transformers.integrations import HfDeepSpeedConfig

        return HfDeepSpeedConfig(self.config)

    def setup_module(self, model):
        self._model = model
        return model

    def setup_optimizers(self, _unused=None):
        """Build the engine (DeepSpeed's optimizer from the config); returns the loop's optimizer."""
        import deepspeed

        params = [p for p in self._model.parameters() if p.requires_grad]
        self.engine, _, _, _ = deepspeed.initialize(model=self._model, model_parameters=params, config=self.config)
        return _StepThroughEngine(self.engine)

    @property
    def module(self):
        return self.engine

    def backward(self, loss):
        self.engine.backward(loss, scale_wrt_gas=False)  # the loop already divided by the micro batches
        self.engine.step()  # bookkeeping between micro batches; the optimizer step at the boundary

    def no_backward_sync(self, module, enabled: bool = True):
        return contextlib.nullcontext()  # ZeRO-3 reduces partitions itself at the boundary

    def clip_gradients(self, module, optimizer, max_norm: float):
        return None  # the config's gradient_clipping, applied by the engine's step

    def all_reduce(self, tensor, reduce_op: str = "mean"):
        import torch
        import torch.distributed as tdist

        t = tensor.detach().clone().to(self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t / self.world_size if reduce_op == "mean" else t

    def barrier(self):
        import torch.distributed as tdist

        tdist.barrier()


# ----------------------------------------------------------------------------- checkpoints
def save_state(kind: str, fabric, model, optimizer, ckpt_dir: Path, step: int, meta: dict) -> None:
    """Write a checkpoint of ``step`` (a collective for fsdp / zero3; rank 0 writes for none / fsdp)."""
    from vdkit.recipes.reference import checkpoint as ckpt
    from vdkit.recipes.reference.model import trainable_state

    if kind == "zero3":
        where = Path(ckpt_dir) / DEEPSPEED_SUBDIR
        fabric.engine.save_checkpoint(str(where), tag=f"step={step}", client_state={"step": step, **meta})
        fabric.barrier()  # every rank's shards of this tag are on disk before older tags go
        if fabric.global_rank == 0:
            prune_deepspeed_tags(where, KEEP)
        return
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        model_sd, optim_sd = trainable_state(model), optimizer.state_dict()
    if fabric.global_rank == 0:
        ckpt.save(ckpt_dir, step, {"model": model_sd, "optimizer": optim_sd, "step": step, **meta})


def remove_partial_deepspeed(where: Path) -> list:
    """DeepSpeed writes a tag's directory, then ``latest``: a tag directory that ``latest`` does not name
    and whose step is past it is what a killed save left. Removed on resume; returns what was removed."""
    import re
    import shutil

    latest_file = Path(where) / "latest"
    if not Path(where).is_dir():
        return []
    named = latest_file.read_text().strip() if latest_file.is_file() else ""
    done = int(m.group(1)) if (m := re.fullmatch(r"step=(\d+)", named)) else -1
    removed = []
    for p in Path(where).iterdir():
        m = re.fullmatch(r"step=(\d+)", p.name)
        if p.is_dir() and m and p.name != named and int(m.group(1)) > done:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def prune_deepspeed_tags(where: Path, keep: int) -> List[Path]:
    """Remove all but the newest ``keep`` DeepSpeed tags (``step=N`` directories) in ``where``, never the one
    ``latest`` names: ZeRO-3 checkpoints hold the whole optimizer state, as the other strategies' do, and
    are pruned like theirs (vdkit.recipes.common.checkpoint.KEEP). Returns what was removed."""
    import re
    import shutil

    try:
        latest = (where / "latest").read_text().strip()
    except OSError:
        latest = None
    tags = sorted(((int(m.group(1)), p) for p in where.iterdir()
                   if p.is_dir() and (m := re.fullmatch(r"step=(\d+)", p.name))), key=lambda t: t[0])
    removed = []
    for _, old in tags[:-keep] if keep > 0 else tags:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


def load_state(kind: str, fabric, model, optimizer, ckpt_dir: Path):
    """Resume from the latest checkpoint in ``ckpt_dir``: (its path, its step), or (None, 0)."""
    from vdkit.recipes.reference import checkpoint as ckpt
    from vdkit.recipes.reference.model import load_trainable_state

    if kind == "zero3":
        where = Path(ckpt_dir) / DEEPSPEED_SUBDIR
        if fabric.global_rank == 0:
            remove_partial_deepspeed(where)
        fabric.barrier()
        if not (where / "latest").is_file():
            return None, 0
        path, client = fabric.engine.load_checkpoint(str(where))
        if path is None:
            raise UserError(f"DeepSpeed could not load the checkpoint in {where}",
                            "move the damaged checkpoint directory away; the run restarts from step 0")
        return Path(path), int(client["step"])
    found = trusted_latest(ckpt_dir, fabric)
    if found is None:
        return None, 0
    state = ckpt.load(found)
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        load_trainable_state(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
    return found, int(state["step"])


def trusted_latest(ckpt_dir: Path, fabric):
    """The newest verified checkpoint (rank 0 checks the one file every rank reads; damaged ones set aside)."""
    import torch

    from vdkit.recipes.common import trust
    from vdkit.recipes.common.checkpoint import checkpoints

    leader = fabric.global_rank == 0
    return trust.trusted_latest(
        ckpt_dir, lambda: checkpoints(ckpt_dir), lambda p: trust.check(p) if leader else None,
        lambda flag: float(fabric.all_reduce(torch.tensor(float(flag)), reduce_op="sum")) > 0,
        leader, fabric.barrier, lambda line: print(line, flush=True))


def make_cluster_environment(d):
    """A Lightning ClusterEnvironment that reports exactly ``d`` (a vdkit.recipes.common.distributed.DistEnv;
    processes are created outside)."""
    from lightning.fabric.plugins.environments import ClusterEnvironment

    class VdkitEnvironment(ClusterEnvironment):
        """Ranks from vdkit's own resolution; Lightning must not launch or renumber processes."""

        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:
            return d.master_addr

        @property
        def main_port(self) -> int:
            return d.master_port

        @staticmethod
        def detect() -> bool:
            return True

        def world_size(self) -> int:
            return d.world_size

        def set_world_size(self, size: int) -> None:
            if size != d.world_size:
                raise UserError(f"Lightning computed world size {size}, the environment says {d.world_size}",
                                "make cluster.nodes x cluster.gpus_per_node match the tasks started")

        def global_rank(self) -> int:
            return d.rank

        def set_global_rank(self, rank: int) -> None:
            pass  # ours is authoritative (checked against world size above)

        def local_rank(self) -> int:
            return d.local_rank

        def node_rank(self) -> int:
            return d.node_rank

    return VdkitEnvironment()
