"""The local launcher (``cluster.launcher=local``): local processes stand in for a job's ranks, any engine.

The interface is :mod:`vdkit.launch.launchers`'; this launcher *executes here* (:func:`run`): ``vdkit run``
and ``vdkit demo`` train through it, ``vdkit render cluster=local`` writes the run directory and no
script. One process per rank, each running the engine's ``command(plan, run_dir)`` with the
torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
MASTER_PORT). Rank 0's stdout and stderr go to ``<run_dir>/local-1.out`` and to the terminal, as
a Slurm job's go to ``slurm-<jobid>.out``; the other ranks' to ``<run_dir>/logs/rank<R>.out``; a
resumed run appends to them. When one rank fails the others are stopped (a collective would
otherwise wait forever).

The local side of the job contract (:mod:`vdkit.run.jobspec`): USR1 or TERM to this launcher (``kill``,
``timeout``, a batch system, ``kill -USR1`` to the whole process group) is passed to every rank,
and the launcher waits for them: they finish their step, checkpoint and exit 75; the launcher
returns 75 and the run continues with ``vdkit run --resume RUN_DIR``. When every rank exits 0 the
run is finished: the launcher writes the run dir's ``finished`` file, and ``--resume`` does nothing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, List, Optional

from vdkit.errors import UserError
from vdkit.run.jobspec import EXIT_REFUSED, EXIT_STOPPED, PREFLIGHT_PREFIX, STOP_SIGNALS, JobSpec
from vdkit.run.rundir import JOB_STATE_FILE, LOCAL_OUT_FILE as LOCAL_OUT

STOP_GRACE_S = 10.0
STOPPING_WAIT_S = 120.0  # after one rank stopped cleanly (exit 75), how long the others may take to follow
NAME = "local"  # this launcher's registry name (the run-dir lock names its holder by it)


# ----------------------------------------------------------------------------- the launcher interface
def check(plan, job: JobSpec) -> None:
    """Refuse an engine that does not run on this machine (it runs in its container on a cluster)."""
    if not job.runs_locally:
        raise UserError(f"engine={plan.recipe.engine.name} does not run on this machine (it runs in its "
                        "container on the cluster)", "use a Slurm cluster (e.g. cluster=xe9680) and `vdkit "
                        "render` / `vdkit submit` for it, or another engine here")


def check_host(plan) -> None:
    """What a run on this machine cannot do, before a run dir exists (:mod:`vdkit.render.prepare` asks it for
    ``vdkit run`` / ``demo`` / ``render``; ``vdkit plan`` does not: a plan is not a run).

    Without a GPU the ranks are CPU processes: FP8, a bf16 optimizer state and CPU offload mean nothing there
    (the run would silently train without them, or fail in a rank), and the model must fit the host's memory,
    not an 80 GB GPU. The bytes per parameter are the memory model's plain fp32 training (``conf/calibration/memory.yaml``
    ``megatron_bytes.fp32``: weights per parameter held, gradients + Adam states per trainable one).
    """
    if has_accelerator():
        return
    r = plan.recipe
    if r.train.precision == "fp8":
        raise UserError("train.precision=fp8 needs FP8 tensor cores (H100); this machine has no GPU, so the run "
                        "would silently train without FP8", "use train.precision=bf16 here, or render the recipe "
                        "for the cluster (vdkit render / submit)")
    if r.train.optimizer_dtype != "fp32":
        raise UserError(f"train.optimizer_dtype={r.train.optimizer_dtype} keeps Adam's state in a GPU optimizer "
                        "(Apex's distributed Adam on NeMo, Transformer Engine's FusedAdam on Bridge); this machine has "
                        "no GPU", "use train.optimizer_dtype=fp32 here, or render the recipe for the cluster "
                        "(vdkit render / submit)")
    if r.parallelism.cpu_offload:
        raise UserError("parallelism.cpu_offload=true moves GPU memory to the host; this machine has no GPU, so "
                        "there is nothing to offload", "drop parallelism.cpu_offload (or set it false) here")
    from vdkit.planner import calibration
    from vdkit.planner.arch import param_counts, trainable_params

    weight, grad, optim = (float(b) for b in calibration.memory()["megatron_bytes"]["fp32"])
    total, trainable = param_counts(r.model).total, trainable_params(r)
    per_rank = weight * total + (grad + optim) * trainable
    if r.parallelism.sharding != "none":
        per_rank /= r.world_size
    need = per_rank * r.world_size / 1e9
    have = host_memory_gb()
    if have is not None and need > 0.9 * have:
        raise UserError(f"{r.model.name} {r.method.name} needs about {need:,.0f} GB of host memory for "
                        f"{r.world_size} local rank(s) on CPU (fp32 weights, gradients and Adam states); this "
                        f"machine has {have:,.0f} GB available",
                        "run a small model here (model=tiny_llama), or render it for the cluster with vdkit render")


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


def files(plan, job: JobSpec, run_dir: Path) -> dict:
    """Nothing beyond the engine's files: the ranks are started by :func:`run`, not by a script."""
    return {}


def require() -> None:
    """There is no scheduler to hand a run to: one line saying how to train here instead."""
    raise UserError("cluster.launcher=local has no scheduler to submit to",
                    "train here with `vdkit run ...`, or submit to a Slurm cluster (e.g. cluster=xe9680)")


def submit(run_dir: Path) -> str:
    """See :func:`require`: always refused."""
    require()
    return ""


def status(run_dir: Path) -> str:
    """RUNNING while a local job holds the run dir, else the state :func:`run` saved, else NOT_STARTED."""
    import json

    from vdkit.run.runlock import is_held

    if is_held(run_dir):
        return "RUNNING"
    from vdkit.composition.files import not_a_regular_file
    from vdkit.launch.launchers import COMPLETED, FAILED, STOPPED

    path = Path(run_dir) / JOB_STATE_FILE
    kind = not_a_regular_file(path)
    if kind == "missing":
        return "NOT_STARTED"
    fix = f"remove {path} if the run never started, or continue it with `vdkit run --resume {run_dir}`"
    if kind or path.stat().st_size > 1 << 16:  # the file vdkit writes is one short line
        raise UserError(f"{path} is {kind or 'too large'}, not the job state vdkit writes", fix)
    try:
        state = json.loads(path.read_text())[NAME]["state"]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        state = None
    if state not in (COMPLETED, FAILED, STOPPED):
        raise UserError(f"{path} is not the job state vdkit writes (damaged or edited): the run's state is unknown",
                        fix)
    return state


def run(run_dir: Path, plan, command: List[str], terminal: Optional[BinaryIO] = None) -> int:
    """Start ``plan``'s ranks (cluster.nodes x cluster.gpus_per_node processes) running ``command``; the exit code.

    Saves the outcome for :func:`status` (COMPLETED or FAILED)."""
    import json

    from vdkit.launch.launchers import COMPLETED, FAILED, STOPPED

    r = plan.recipe
    if r.run.secrets_file:  # the ranks inherit them (as a job's shell exports them); never written anywhere
        os.environ.update(read_secrets_file(r.run.secrets_file))
    rc = preflight(run_dir)
    if rc == 0:
        rc = launch_local(run_dir, r.world_size, r.cluster.gpus_per_node, terminal=terminal, command=command)
    word = COMPLETED if rc == 0 else (STOPPED if rc == EXIT_STOPPED else FAILED)  # STOPPED: `vdkit run --resume`
    state = {NAME: {"state": word, "exit_code": rc}}
    (Path(run_dir) / JOB_STATE_FILE).write_text(json.dumps(state) + "\n")
    return rc


def read_secrets_file(path: str) -> dict:
    """NAME -> value of a checked secrets file, read as data (the job script's rules, :mod:`vdkit.slurm.secrets`:
    an optional ``export``, one pair of surrounding quotes removed, no expansion). For runs started here."""
    from vdkit.rules.secrets import check_secrets_file

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


# ----------------------------------------------------------------------------- the ranks


def rank_env(rank: int, world: int, per_node: int, port: int, base: Optional[dict] = None) -> dict:
    """The environment of local rank ``rank`` (Slurm's variables removed: this is not a Slurm task)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("SLURM_")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
               LOCAL_WORLD_SIZE=str(per_node), NODE_RANK=str(rank // per_node),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    # One thread per rank unless the user says otherwise, as torchrun does: oversubscribed OpenMP
    # threads spin, and a shared 2-core box ran a tiny model 10-20x slower with 2 threads per rank.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _pump(src: BinaryIO, sinks: List[BinaryIO]) -> None:
    """Copy a child's output to every sink as it arrives (the '\r' progress updates included)."""
    fd = src.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        for s in sinks:
            s.write(chunk)
            s.flush()


def _stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _await_stop(procs: List[subprocess.Popen]):
    """One rank exited 75: wait for the others to follow; (rank, code) of one that did not, else None."""
    deadline = time.monotonic() + STOPPING_WAIT_S
    for rank, p in enumerate(procs):
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            return rank, -1
        if p.returncode != EXIT_STOPPED:
            return rank, p.returncode
    return None


def preflight(run_dir) -> int:
    """The run dir's pre-flight (vdkit.recipes.common.preflight, as the Slurm batch shell runs it before srun): 0, or its one
    line on stderr, a fault record (the recipe's: `vdkit status` shows it; never resumed by itself) and
    :data:`EXIT_REFUSED`. A run dir rendered before the pre-flight existed has none: 0."""
    from vdkit.run.faults import append_fault
    from vdkit.run.rundir import PREFLIGHT_FILE, PREFLIGHT_SCRIPT

    run_dir = Path(run_dir)
    if not (run_dir / PREFLIGHT_SCRIPT).is_file():
        return 0
    proc = subprocess.run([sys.executable, str(run_dir / PREFLIGHT_SCRIPT), str(run_dir / PREFLIGHT_FILE)],
                          capture_output=True, text=True, timeout=600)
    line = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == EXIT_REFUSED and line.startswith(PREFLIGHT_PREFIX):
        print(line, file=sys.stderr, flush=True)
        append_fault(run_dir, job=NAME, rc=EXIT_REFUSED, cause=line, why="the recipe's fault",
                     **{"continue": f"vdkit run --resume {run_dir}"})
        return EXIT_REFUSED
    if proc.returncode:  # the checker itself failed: say so, and train (the ranks check their own inputs)
        print(f"vdkit run: the pre-flight did not run (exit {proc.returncode}: {line}); the ranks start without it",
              file=sys.stderr, flush=True)
    return 0


def launch_local(run_dir, world: int, per_node: int, terminal: Optional[BinaryIO] = None,
                 command: List[str] = ()) -> int:
    """Run ``world`` ranks of ``command`` (the engine's rank argv) on this machine; 0 when all succeed
    (the run is finished). Returns :data:`EXIT_STOPPED` when the ranks stopped cleanly (a stop signal;
    resume with ``vdkit run --resume``), else the first failing rank's exit code (naming the rank on stderr)."""
    from vdkit.run.ports import free_port
    from vdkit.run.rundir import LOG_DIR
    from vdkit.run.runlock import acquire_local

    run_dir = Path(run_dir)
    terminal = terminal if terminal is not None else sys.stdout.buffer
    lock_fd = acquire_local(run_dir, NAME)  # one job at a time in a run dir, as a scheduler's script does
    (run_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = list(command)
    procs: List[subprocess.Popen] = []
    files = []
    pump = None

    def _forward(signum, frame):  # a stop signal: every rank finishes its step and checkpoints; wait for them
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for name in STOP_SIGNALS:
            signum = getattr(signal, f"SIG{name}")
            old[signum] = signal.signal(signum, _forward)
    try:
        for rank in range(world):
            out_path = run_dir / LOCAL_OUT if rank == 0 else run_dir / LOG_DIR / f"rank{rank}.out"
            fh = open(out_path, "ab")  # a resumed run appends, as a Slurm job's output does
            files.append(fh)
            if rank == 0:
                p = subprocess.Popen(cmd, env=rank_env(rank, world, per_node, port), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, cwd=run_dir, pass_fds=(lock_fd,))
                pump = threading.Thread(target=_pump, args=(p.stdout, [fh, terminal]), daemon=True)
                pump.start()
            else:
                p = subprocess.Popen(cmd, env=rank_env(rank, world, per_node, port), stdout=fh,
                                     stderr=subprocess.STDOUT, cwd=run_dir, pass_fds=(lock_fd,))
            procs.append(p)
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                rc = p.poll()
                if rc not in (None, 0, EXIT_STOPPED):
                    failed = (rank, rc)
                    break
            if failed is None and any(p.poll() == EXIT_STOPPED for p in procs):
                failed = _await_stop(procs)  # the others are leaving after the same step
            time.sleep(0.1)
        if failed is None:
            failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode), None)
        if failed is not None and all(p.returncode == EXIT_STOPPED for p in procs):
            return EXIT_STOPPED
        if failed is not None:
            _stop(procs)
            rank, rc = failed
            where = run_dir / (LOCAL_OUT if rank == 0 else f"{LOG_DIR}/rank{rank}.out")
            print(f"vdkit run: rank {rank} exited with code {rc}; see {where}", file=sys.stderr)
            return rc if rc > 0 else 1
        from vdkit.run.rundir import FINISHED_FILE

        (run_dir / FINISHED_FILE).touch()  # the job contract: a finished run never starts again
        return 0
    finally:
        _stop(procs)  # Ctrl-C or an error here: no orphaned ranks
        for signum, handler in old.items():
            signal.signal(signum, handler)
        if pump is not None:
            pump.join(timeout=5)
        for fh in files:
            fh.close()
        os.close(lock_fd)



def cancel(run_dir: Path, settle_s: float = 60.0) -> List[str]:
    """Stop the local job holding the run dir (TERM to its `vdkit run`: the ranks finish their step, checkpoint
    and stop) and wait up to ``settle_s`` for it to let go; the job stopped (``local <pid>``), or [] when none ran."""
    from vdkit.run.runlock import is_held, read_holder

    held = read_holder(run_dir)
    if held is None or held[0] != NAME or not is_held(run_dir):  # only a live holder is signalled (no reused pid)
        return []
    try:
        os.kill(int(held[1]), signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        return []
    except PermissionError:
        raise UserError(f"the local job {held[1]} holding {run_dir} belongs to another user",
                        f"ask its owner, or stop it as that user: kill -TERM {held[1]}") from None
    deadline = time.monotonic() + settle_s
    while is_held(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    if is_held(run_dir):
        raise UserError(f"the local job {held[1]} still holds {run_dir} {settle_s:.0f} s after TERM",
                        f"wait for it to checkpoint, or kill it: kill -KILL {held[1]}")
    return [f"{NAME} {held[1]}"]


def next_command(files) -> str:
    """What trains a run directory `vdkit render cluster=local` wrote (no script: the ranks start here)."""
    return "vdkit run --resume {}   (trains it here; `vdkit run ...` renders and trains in one step)"


def continue_command(run_dir: Path) -> str:
    """`vdkit run --resume RUN_DIR`: the same ranks again, from the latest checkpoint."""
    import shlex

    return f"vdkit run --resume {shlex.quote(str(run_dir))}"
