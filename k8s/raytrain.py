"""The RayJob's entrypoint: Ray Train starts one worker per GPU, each runs the engine's rank command.

    python3 -m vdkit.k8s.raytrain --workers W --cpus-per-worker C --gpus-per-worker G \\
        --max-failures F --storage DIR -- RANK COMMAND...

KubeRay's submitter runs it on the head pod (``ray job submit -- <entrypoint>``). Ray Train's
``TorchTrainer`` places W workers (``resources_per_worker``: C CPUs and G GPUs each; a pod holds
as many workers as it has GPUs) and gives each its world rank, local rank and node rank. Each
worker runs the rank command as a child process with torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR / MASTER_PORT at worker 0), so the engine
trains exactly as under srun or ``vdkit run`` (its own process group, logs, checkpoints on the
shared run directory). Why a child process rather than the engine's loop inside the worker: the
engine's entry point owns its signals and exit code (a clean stop after a checkpoint is an exit
code), which a Ray worker thread cannot give.

A worker whose rank exits non-zero fails the worker group; ``FailureConfig(max_failures=F)``
restarts the group, and the engine resumes from its latest checkpoint. Ray's torch process group
(gloo) is left to Ray: the engine builds its own on another port.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from typing import List, Optional

# Which variables a rank gets (torchrun's names; vdkit.recipes.common.distributed reads them).
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m vdkit.k8s.raytrain",
                                description="Run a rank command on every Ray Train worker (one per GPU).")
    p.add_argument("--workers", type=int, required=True, help="Ray Train workers = ranks (world size)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0)
    p.add_argument("--gpus-per-worker", type=float, default=0.0)
    p.add_argument("--max-failures", type=int, default=0, help="worker-group restarts (each resumes from a checkpoint)")
    p.add_argument("--storage", required=True, help="Ray Train's storage path (shared by every pod)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the rank command")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no rank command after --")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    return args


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def rank_env(ctx, addr: str, port: int, cpus: float, base: Optional[dict] = None) -> dict:
    """The rank's environment: the worker's (the pod's fabric variables, Ray's visible devices) plus torchrun's."""
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(ctx.get_world_rank()), WORLD_SIZE=str(ctx.get_world_size()),
               LOCAL_RANK=str(ctx.get_local_rank()), LOCAL_WORLD_SIZE=str(ctx.get_local_world_size()),
               NODE_RANK=str(ctx.get_node_rank()), MASTER_ADDR=addr, MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))  # the rank's CPU share, as torchrun would
    return env


def _die_with_parent() -> None:
    """In the rank (Linux): SIGKILL when its Ray worker dies, so a stopped or restarted worker group leaves
    no orphan rank writing into the run directory."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_loop(config: dict) -> None:
    """One Ray Train worker: agree on worker 0's address, run the rank command, fail on a non-zero exit."""
    import ray
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    ctx = ray.train.get_context()
    endpoint = None
    if ctx.get_world_rank() == 0:
        addr = ray.util.get_node_ip_address()
        endpoint = (addr, _free_port(addr))
    addr, port = broadcast_from_rank_zero(endpoint)
    env = rank_env(ctx, addr, port, config["cpus"])
    sys.stdout.flush()
    rc = subprocess.call(config["command"], env=env, preexec_fn=_die_with_parent)
    if rc != 0:
        # A clean stop after a checkpoint (the engines' preemption exit code) or a failure: either way the
        # worker group restarts (FailureConfig) and the ranks resume from the latest checkpoint.
        raise RuntimeError(f"rank {ctx.get_world_rank()} exited with code {rc}; the worker group restarts from "
                           "the latest checkpoint while restarts remain")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init()  # the cluster the job was submitted to (RAY_ADDRESS, set by `ray job submit`)
    use_gpu = args.gpus_per_worker > 0
    resources = {"CPU": args.cpus_per_worker, **({"GPU": args.gpus_per_worker} if use_gpu else {})}
    storage = os.path.abspath(args.storage)
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"command": args.command, "cpus": args.cpus_per_worker},
        torch_config=TorchConfig(backend="gloo"),  # Ray's own group stays off the GPUs; the engine makes its own
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=RunConfig(name="vdkit", storage_path=storage, failure_config=FailureConfig(max_failures=args.max_failures)),
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray's TrainingFailedError: the last rank failure, after the restarts
        print(f"vdkit raytrain: the job failed after {args.max_failures} restart(s): {str(exc).strip().splitlines()[0]}",
              file=sys.stderr, flush=True)
        return 1
    print(f"vdkit raytrain: {args.workers} worker(s) finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
