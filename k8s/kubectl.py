"""Apply a run directory's manifest with kubectl and read its job's state back.

Needs ``kubectl`` on PATH and a kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``); without one,
one line says so (exit 2) and nothing is applied. The job is named by its manifest (namespace,
kind, name), recorded in the run directory's ``job_id.txt`` as ``namespace/kind/name``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Tuple

from vdkit.errors import UserError

KUBECTL_TIMEOUT_S = 60
# The operators' end states in the kit's words (vdkit.launch.launchers.COMPLETED / FAILED).
ENDED = {"SUCCEEDED": "COMPLETED", "Succeeded": "COMPLETED", "FAILED": "FAILED", "Failed": "FAILED",
         "STOPPED": "FAILED"}
# kind -> (kubectl resource name, jsonpath of the state KubeRay / training-operator report)
STATE_PATHS = {
    "RayJob": ("rayjobs.ray.io", "{.status.jobStatus}"),  # PENDING RUNNING SUCCEEDED FAILED STOPPED
    "PyTorchJob": ("pytorchjobs.kubeflow.org", "{.status.conditions[-1:].type}"),  # Created Running Succeeded Failed
}


def manifest_path(run_dir: Path) -> Path:
    """The run directory's manifest (rayjob.yaml or pytorchjob.yaml)."""
    from vdkit.k8s.manifests import PYTORCHJOB_FILE, RAYJOB_FILE

    for name in (RAYJOB_FILE, PYTORCHJOB_FILE):
        if (run_dir / name).is_file():
            return run_dir / name
    raise UserError(f"{run_dir} holds no Kubernetes manifest ({RAYJOB_FILE} or {PYTORCHJOB_FILE})",
                    "pass a run directory rendered on a Kubernetes cluster (cluster.launcher=kubernetes)")


def job_ref(run_dir: Path) -> Tuple[str, str, str]:
    """(namespace, kind, name) of the run directory's job, from its manifest."""
    import yaml

    doc = yaml.safe_load(manifest_path(run_dir).read_text()) or {}
    meta = doc.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(doc.get("kind")), str(meta.get("name"))


def kubeconfig(env: Optional[dict] = None) -> Optional[str]:
    """The kubeconfig kubectl would read ($KUBECONFIG's first existing file, else ~/.kube/config), or None."""
    env = os.environ if env is None else env
    for path in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if path and Path(path).expanduser().is_file():
            return str(Path(path).expanduser())
    default = Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"
    return str(default) if default.is_file() else None


def require_cluster() -> str:
    """kubectl's path, when a kubeconfig exists; UserError (one line) otherwise."""
    if kubeconfig() is None:
        raise UserError("no kubeconfig here ($KUBECONFIG or ~/.kube/config), so vdkit cannot reach a Kubernetes "
                        "cluster", "run where kubectl is configured for the cluster, or apply the run directory's "
                        "manifest there: kubectl apply -f RUN_DIR/rayjob.yaml")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise UserError("kubectl is not on PATH", "install kubectl (the cluster's minor version) and retry")
    return kubectl


def _run(argv: List[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"{' '.join(argv[:3])} did not answer in {KUBECTL_TIMEOUT_S} s",
                        "check the cluster is reachable: kubectl cluster-info") from None
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(f"{' '.join(argv[:3])} failed: {why[-1] if why else 'exit ' + str(proc.returncode)}",
                        "see kubectl's message; is the operator (KubeRay / training-operator) installed?")
    return proc.stdout


def apply(run_dir: Path) -> str:
    """``kubectl apply -f MANIFEST``; records and returns ``namespace/kind/name``."""
    from vdkit.run.rundir import JOB_ID_FILE

    path = manifest_path(run_dir)
    kubectl = require_cluster()
    ns, kind, name = job_ref(run_dir)
    _run([kubectl, "apply", "-f", str(path)])
    ref = f"{ns}/{kind}/{name}"
    with open(run_dir / JOB_ID_FILE, "a") as fh:
        fh.write(ref + "\n")
    return ref


def dry_run(run_dir: Path) -> str:
    """``kubectl apply --dry-run=server -f MANIFEST``: kubectl's one-line answer; nothing is created."""
    kubectl = require_cluster()
    out = _run([kubectl, "apply", "--dry-run=server", "-f", str(manifest_path(run_dir))]).strip()
    return out.splitlines()[-1] if out else "accepted"


def describe(kind: str, raw: str) -> str:
    """The kit's state word for an operator's state: COMPLETED / FAILED when it ended, else its own word
    upper-cased; the operator's spelling follows in parentheses (``COMPLETED (RayJob SUCCEEDED)``)."""
    word = ENDED.get(raw, raw.upper() or "UNKNOWN")
    return f"{word} ({kind} {raw or 'no state yet'})"


def job_state(run_dir: Path) -> str:
    """The job's state, read with kubectl (see :func:`describe`)."""
    ns, kind, name = job_ref(run_dir)
    kubectl = require_cluster()
    resource, path = STATE_PATHS[kind]
    return describe(kind, _run([kubectl, "get", "-n", ns, resource, name, "-o", f"jsonpath={path}"]).strip())


def delete(run_dir: Path) -> List[str]:
    """``kubectl delete -f MANIFEST --ignore-not-found``: the job and its pods; returns ``[namespace/kind/name]``."""
    kubectl = require_cluster()
    ns, kind, name = job_ref(run_dir)
    _run([kubectl, "delete", "--ignore-not-found", "-f", str(manifest_path(run_dir))])
    return [f"{ns}/{kind}/{name}"]


# kind -> the pods' selector: KubeRay's submitter Job carries the RayJob's name; the training operator labels pods
LOG_SELECTORS = {"RayJob": "job-name={name}", "PyTorchJob": "training.kubeflow.org/job-name={name}"}


def logs_argv(run_dir: Path, follow: bool = False) -> List[str]:
    """The ``kubectl logs`` command line of the run's pods (every container, each line prefixed by its pod)."""
    kubectl = require_cluster()
    ns, kind, name = job_ref(run_dir)
    argv = [kubectl, "logs", "-n", ns, "-l", LOG_SELECTORS[kind].format(name=name), "--prefix", "--all-containers",
            "--tail=-1"]
    return argv + (["-f"] if follow else [])


RUN_LABEL = "vdkit/run"  # every pod of a run carries it (vdkit.k8s.manifests.pod_template)


def preflight_refusal(run_dir: Path) -> str:
    """The job's pre-flight refusal as its one line, read from the run's pods (the init container
    ``preflight`` terminated with the refusal code, now or before a restart), else ''.

    Neither operator ends the job on it: training-operator v1 counts restarts toward ``backoffLimit`` only in pods that
    are Running (``pkg/core/job.go`` ``PastBackoffLimit``), and a pod whose init container fails stays Pending, so under
    ``OnFailure`` the kubelet restarts a refused pre-flight for ever; KubeRay's head pod restarts it likewise. So
    `vdkit status` says so (and the cancel), where Slurm records it as the recipe's fault."""
    from vdkit.run.jobspec import EXIT_REFUSED
    from vdkit.k8s.manifests import PREFLIGHT_CONTAINER

    ns, _kind, name = job_ref(run_dir)
    raw = _run([require_cluster(), "get", "pods", "-n", ns, "-l", f"{RUN_LABEL}={name}", "-o", "json"])
    try:
        pods = json.loads(raw).get("items") or []
    except (ValueError, AttributeError):
        return ""
    for pod in pods:
        for status in ((pod.get("status") or {}).get("initContainerStatuses") or []):
            if status.get("name") != PREFLIGHT_CONTAINER:
                continue
            for state in (status.get("state"), status.get("lastState")):
                ended = (state or {}).get("terminated") or {}
                if ended.get("exitCode") == EXIT_REFUSED:
                    lines = [ln.strip() for ln in str(ended.get("message") or "").splitlines() if ln.strip()]
                    pod_name = (pod.get("metadata") or {}).get("name", "?")
                    return lines[-1] if lines else f"pod {pod_name}: the pre-flight exited {EXIT_REFUSED}"
    return ""
