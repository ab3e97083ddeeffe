"""Run a rendered RayJob on a local Ray cluster as KubeRay would, inside a private network namespace.

    unshare --net --pid --fork --mount-proc python ray_submitter.py RAYJOB_YAML TEMP_DIR [--stop-after-checkpoint]

What KubeRay does with the manifest, done here with Ray's own CLI: one ``ray start --head`` with the
head group's ``rayStartParams``, one ``ray start --address`` per worker-group replica with its params
(each a node of its own, as a pod would be), then what the submitter Job runs: ``ray job submit
--submission-id ID --no-wait -- <spec.entrypoint>`` and ``ray job logs --follow``. With
``--preempt-after-checkpoint``, once the engine has written its first checkpoint every rank gets the
preemption signal (SIGUSR1, what Slurm sends before a time limit): the ranks stop cleanly after a
step, checkpoint it and exit with the clean-stop code; Ray Train's FailureConfig must restart the
worker group, which resumes from that checkpoint. Prints the job's logs and ``=== status S``; exit 0
when the job SUCCEEDED.

Test-machine limits, not the manifest's: a small object store (Ray's minimum), usage stats off.
Run it only inside its own network and PID namespace: ``ray stop`` there sees only these processes, and
the ranks found for the signal are this job's (matched by their exact command line).
"""
from __future__ import annotations

import argparse
import os
import signal
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

ADDRESS = "http://127.0.0.1:8265"
OBJECT_STORE = str(80 * 1024 * 1024)  # bytes; Ray's floor is 75 MiB


def ray_bin() -> str:
    """Ray's CLI under this Python (a wrapper script named ``ray`` in a temporary bin dir on PATH): the cluster's
    processes then run this interpreter, whatever ``ray`` a version manager's shim would pick."""
    return "ray"


def ray(*args, check=True, capture=False, timeout=240):
    argv = [ray_bin(), *args]
    proc = subprocess.run(argv, text=True, capture_output=capture, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"ray {' '.join(args[:3])} failed ({proc.returncode}): {(proc.stderr or '')[-2000:]}")
    return proc


def params(d: dict) -> list:
    return [f"--{k}={v}" for k, v in (d or {}).items()]


def rank_pids(run_dir: Path) -> list:
    """The rank processes of ``run_dir`` (``... -m vdkit.recipes.<engine> RUN_DIR``) in this PID namespace."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in argv if a]
        if "-m" in argv and argv[-1] == str(run_dir) and argv[argv.index("-m") + 1].startswith("vdkit.recipes."):
            found.append(int(proc.name))
    return sorted(found)


def wait_checkpoint(run_dir: Path, sid: str, timeout: float) -> int:
    """Block until DeepSpeed's ``latest`` names a checkpoint; its step. Fails when the job ends first."""
    latest = run_dir / "checkpoints" / "deepspeed" / "latest"
    end = time.monotonic() + timeout
    n = 0
    while time.monotonic() < end:
        if latest.is_file() and latest.read_text().strip():
            return int(latest.read_text().strip().split("=")[1])
        n += 1
        if n % 25 == 0 and job_status(sid) in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.2)
    print(ray("job", "logs", "--address", ADDRESS, sid, capture=True, check=False).stdout, flush=True)
    raise SystemExit(f"no checkpoint in {latest.parent} (job {sid}: {job_status(sid)})")


def submitter_command(ray_bin: str, sid: str, entrypoint: str) -> str:
    """The shell command KubeRay v1.7.0's submitter Job runs in K8sJobMode (controllers/ray/common/job.go,
    BuildJobSubmitCommand), the entrypoint spliced in unquoted as there (the dashboard health wait left out:
    the cluster is up here)."""
    r = shlex.quote(ray_bin)
    return (f"if ! {r} job status --address {ADDRESS} {sid} >/dev/null 2>&1 ; then "
            f"{r} job submit --address {ADDRESS} --no-wait --submission-id {sid} -- {entrypoint} ; fi ; "
            f"{r} job logs --address {ADDRESS} --follow {sid}")


def job_status(sid: str) -> str:
    from ray.job_submission import JobSubmissionClient

    try:
        return str(JobSubmissionClient(ADDRESS).get_job_status(sid).value)
    except Exception as exc:  # not submitted yet, or the dashboard is busy
        return f"UNKNOWN ({str(exc).splitlines()[0][:100]})"


def put_on_path(bin_dir: Path) -> None:
    """``ray`` and ``python3`` in ``bin_dir`` both run this interpreter; ``bin_dir`` goes first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "ray").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ray.scripts.scripts \"$@\"\n")
    (bin_dir / "ray").chmod(0o755)
    for name in ("python3", "python"):  # a script, not a link: a venv's interpreter finds its venv by its own path
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("temp_dir")
    ap.add_argument("--preempt-after-checkpoint", action="store_true")
    args = ap.parse_args()
    doc = yaml.safe_load(Path(args.manifest).read_text())
    spec = doc["spec"]
    rc = spec["rayClusterSpec"]
    run_dir = Path(rc["headGroupSpec"]["template"]["spec"]["containers"][0]["workingDir"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    put_on_path(Path(args.temp_dir) / "bin")
    common = ["--node-ip-address=127.0.0.1", f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats"]
    t0 = time.monotonic()
    ray("start", "--head", "--port=6379", f"--temp-dir={args.temp_dir}", *common, *params(rc["headGroupSpec"]["rayStartParams"]))
    for group in rc.get("workerGroupSpecs") or []:
        for _ in range(int(group["replicas"])):
            ray("start", "--address=127.0.0.1:6379", *common, *params(group["rayStartParams"]))
    print(f"=== cluster up in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        sid = f"{doc['metadata']['name']}-1"
        submit = subprocess.Popen(["bash", "-c", submitter_command(ray_bin(), sid, spec["entrypoint"])])
        if args.preempt_after_checkpoint:
            step = wait_checkpoint(run_dir, sid, 300)
            ranks = rank_pids(run_dir)
            for pid in ranks:
                os.kill(pid, signal.SIGUSR1)
            print(f"=== sent SIGUSR1 to ranks {ranks} after checkpoint step={step}", flush=True)
        submit.wait(timeout=400)
        status = job_status(sid)
        print(f"=== status {status} after {time.monotonic() - t0:.1f} s", flush=True)
        return 0 if status == "SUCCEEDED" else 1
    finally:
        ray("stop", "--force", check=False, capture=True, timeout=60)


if __name__ == "__main__":
    sys.exit(main())
