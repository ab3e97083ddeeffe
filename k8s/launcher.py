"""The Kubernetes launcher (``cluster.launcher=kubernetes``): a RayJob or PyTorchJob, applied with kubectl.

The interface is :mod:`vdkit.launch.launchers`'; the site's facts are ``cluster.kubernetes``
(:mod:`vdkit.k8s.settings`), the manifests :mod:`vdkit.k8s.manifests`' (pure functions of the plan
and the engine's job request), apply and state :mod:`vdkit.k8s.kubectl`'s.

``check`` refuses what cannot run (settings, secrets file, an image without Ray for a RayJob);
``files`` writes ``rayjob.yaml`` or ``pytorchjob.yaml`` after checking the paths the pods must see
and the manifest's invariants; ``require`` / ``submit`` / ``test`` / ``status`` need kubectl and a
kubeconfig (one line says so otherwise). Continuation (a clean stop after a checkpoint) is rendered
into the manifest: Ray Train's FailureConfig and the RayJob's backoffLimit, or the PyTorchJob's
OnFailure restart policy and backoffLimit (:mod:`vdkit.k8s.manifests`).

Standard library at import time (PyYAML when rendering); nothing here imports an engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

from vdkit.errors import UserError

NAME = "kubernetes"
SETTINGS = "kubernetes"  # the cluster key this launcher alone reads (cluster.kubernetes): vdkit.launch.launchers.settings_key


def _settings(plan):
    from vdkit.k8s.settings import settings

    return settings(plan.recipe.cluster)


def manifest(plan, job, run_dir) -> dict:
    """The job's manifest as data (RayJob or PyTorchJob, by ``cluster.kubernetes.job_kind``)."""
    from vdkit.k8s import manifests
    from vdkit.k8s.settings import object_name

    s = _settings(plan)
    name = object_name(Path(run_dir).name)
    build = manifests.rayjob if s.job_kind == "rayjob" else manifests.pytorchjob
    return build(plan, job, run_dir, name, s)


def check_recipe(recipe) -> None:
    """At composition: ``cluster.kubernetes`` read and checked (vdkit.k8s.settings), so `vdkit plan`
    refuses a bad site setting as render does."""
    from vdkit.k8s.settings import settings

    settings(recipe.cluster)


def check(plan, job, run_dir=None) -> None:
    """The site settings, the paths the pods must see, the image, and the manifest's invariants."""
    from vdkit.k8s import invariants, manifests

    s = _settings(plan)
    c = plan.recipe.cluster
    if plan.recipe.run.secrets_file:
        raise UserError("run.secrets_file is a file the Slurm job reads; a Kubernetes job takes its secrets "
                        "from a Secret", "kubectl create secret generic NAME --from-env-file=FILE, then "
                        "cluster.kubernetes.secret=NAME (and drop run.secrets_file)")
    if s.job_kind == "rayjob" and job.container is not None and job.container.image_key == "engine.container_image":
        raise UserError(f"this engine runs in its own image ({job.container.image_key}={job.container.image}), "
                        "which has no Ray; a RayJob (cluster.kubernetes.job_kind=rayjob) runs the site's Ray image",
                        "use a cluster whose kubernetes.job_kind is pytorchjob (e.g. cluster=k8s_h100)")
    if c.gpu_type != "cpu" and c.gpus_per_node < 1:
        raise UserError("cluster.gpus_per_node must be at least 1", "use cluster.gpus_per_node=8")
    if run_dir is not None:
        manifests.check_paths(plan, job, run_dir, s)
        invariants.check(manifest(plan, job, run_dir), plan)
    else:
        manifests.pod_image(job, s)


def files(plan, job, run_dir) -> Dict[str, str]:
    """The run directory's manifest: ``rayjob.yaml`` or ``pytorchjob.yaml`` (plain YAML, no Helm)."""
    from vdkit.k8s import invariants, manifests
    from vdkit.k8s.settings import KUBERAY_VERSION, TRAINING_OPERATOR_VERSION

    check(plan, job, run_dir)
    doc = manifest(plan, job, run_dir)
    invariants.check(doc, plan)
    if doc["kind"] == "RayJob":
        header = (f"KubeRay {KUBERAY_VERSION} RayJob for run {Path(run_dir).name}, rendered by vdkit.\n"
                  "Apply: kubectl apply -f rayjob.yaml   (or: vdkit submit; state: vdkit status RUN_DIR)\n"
                  "Logs:  kubectl logs -n NAMESPACE -f job/NAME   (the submitter Job follows `ray job logs`)")
        return {manifests.RAYJOB_FILE: manifests.to_yaml(doc, header)}
    header = (f"Kubeflow training-operator {TRAINING_OPERATOR_VERSION} PyTorchJob for run {Path(run_dir).name}, "
              "rendered by vdkit.\nApply: kubectl apply -f pytorchjob.yaml   (or: vdkit submit; state: vdkit status RUN_DIR)")
    return {manifests.PYTORCHJOB_FILE: manifests.to_yaml(doc, header)}


def next_command(files) -> str:
    """``kubectl apply -f {}/rayjob.yaml`` (or pytorchjob.yaml): what starts a rendered run directory."""
    from vdkit.k8s.manifests import PYTORCHJOB_FILE, RAYJOB_FILE

    name = RAYJOB_FILE if RAYJOB_FILE in files else PYTORCHJOB_FILE
    return "kubectl apply -f {}/" + name + "   (or: vdkit submit ...; then vdkit status DIR)"


def require() -> None:
    """One line when kubectl or a kubeconfig is missing (``vdkit submit`` asks before writing anything)."""
    from vdkit.k8s.kubectl import require_cluster

    require_cluster()


def submit(run_dir) -> str:
    """``kubectl apply`` the run directory's manifest; returns ``namespace/kind/name``."""
    from vdkit.k8s.kubectl import apply

    return apply(Path(run_dir))


def test(run_dir) -> str:
    """``kubectl apply --dry-run=server``: the API server (and the operator's CRD) check it; nothing is created."""
    from vdkit.k8s.kubectl import dry_run

    return dry_run(Path(run_dir))


def job(run_dir) -> str:
    """The run's latest job as ``vdkit submit`` recorded it (namespace/kind/name), else ``-``."""
    from vdkit.run.rundir import JOB_ID_FILE

    path = Path(run_dir) / JOB_ID_FILE
    ids = path.read_text().split() if path.is_file() else []
    return ids[-1] if ids else "-"


def status(run_dir) -> str:
    """COMPLETED / FAILED when the job ended, else the operator's word; its own spelling in parentheses. A job whose
    pre-flight refused is FAILED with the pre-flight's line: the operator would restart it for ever
    (:func:`vdkit.k8s.kubectl.preflight_refusal`), so the line names the cancel."""
    from vdkit.k8s.kubectl import job_state, preflight_refusal

    run_dir = Path(run_dir)
    refused = preflight_refusal(run_dir)
    state = job_state(run_dir)
    if refused and state.split(" ", 1)[0] not in ("COMPLETED", "FAILED"):
        return (f"FAILED (the job's pre-flight refused it: {refused}; the operator restarts a refused pre-flight "
                f"without end: vdkit cancel {run_dir}, fix, then vdkit submit again)")
    return state


def cancel(run_dir, settle_s: float = 60.0):
    """``kubectl delete`` the run's manifest (the operator's job and its pods; a restart cannot follow)."""
    from vdkit.k8s.kubectl import delete

    return delete(Path(run_dir))


def continue_command(run_dir) -> str:
    """Remove the cancel record and apply the manifest again (the job resumes from the latest checkpoint)."""
    import shlex

    from vdkit.k8s.kubectl import manifest_path
    from vdkit.run.rundir import CANCELLED_FILE

    run_dir = Path(run_dir)
    return (f"rm {shlex.quote(str(run_dir / CANCELLED_FILE))} && "
            f"kubectl apply -f {shlex.quote(str(manifest_path(run_dir)))}")


def log_command(run_dir, follow: bool = False):
    """``kubectl logs`` of the run's pods (a RayJob's submitter job; a PyTorchJob's pods by its label)."""
    from vdkit.k8s.kubectl import logs_argv

    return logs_argv(Path(run_dir), follow)
