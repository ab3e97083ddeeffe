"""A plan and its engine's job request -> Kubernetes manifests (plain data, then YAML). Pure functions.

Two kinds, chosen by what the engine runs (never by its name): an engine whose ranks run the
kit's own training loop on any Python (``vdkit run`` can start them: the transformers engine, the
MI300X blog's system) gets a KubeRay **RayJob**; an engine that runs in its own container (NeMo,
and the megatron / Bridge engines when given an image) gets a Kubeflow **PyTorchJob** with
torchrun, the training job NVIDIA's NeMo-Framework-Launcher renders for its ``k8s`` cluster type.

Why PyTorchJob (``kubeflow.org/v1``, training-operator v1.9.0) and not Kubeflow Trainer's TrainJob:
``v1`` is a stable API that NeMo's own Kubernetes path and NVIDIA's docs require, while TrainJob is
``v1alpha1`` and renamed its pod-override field in each of its last minor releases
(``podSpecOverrides`` -> v2.1 ``podTemplateOverrides`` -> v2.2 ``runtimePatches``); a manifest pinned
to it would break on the next upgrade.

Both kinds share one pod shape (:func:`pod_template`): one pod per node holding all its GPUs
(extended-resource requests equal limits), the RDMA device plugin's resource when the fabric is
RDMA, ``IPC_LOCK`` (pinned memory for RDMA), ``/dev/shm`` as a memory ``emptyDir``, optional host
network, the shared storage (PVC or host path) at the same path as on the rendering machine, the
fabric environment of the cluster (the Slurm job's NCCL / RCCL variables), the engine's variables,
and secrets only by reference (``envFrom`` a Secret), never a value.

Continuation: a rank that stops cleanly after a checkpoint exits non-zero (the preemption exit code).
RayJob: Ray Train's ``FailureConfig(max_failures=backoff_limit)`` restarts the worker group, which
resumes from the checkpoint on shared storage; ``spec.backoffLimit`` retries the whole RayJob (new
Ray cluster) when the driver itself is lost. PyTorchJob: ``restartPolicy: OnFailure`` on every replica
and ``runPolicy.backoffLimit``: the pods restart and torchrun rendezvouses again. Not ``ExitCode``:
training-operator treats exit codes 1-127 as permanent there, and the clean-stop code is below 128.
"""
from __future__ import annotations

import copy
import shlex
from pathlib import PurePosixPath
from typing import Dict, List, Optional

from vdkit.composition.schema import CPU_GPU_TYPE
from vdkit.errors import UserError
from vdkit.run.jobspec import JobSpec

from vdkit.k8s import settings as ks

RAYJOB_FILE = "rayjob.yaml"
PYTORCHJOB_FILE = "pytorchjob.yaml"
MANAGED_BY = "vdkit"
RAY_HEAD_CONTAINER = "ray-head"
RAY_WORKER_CONTAINER = "ray-worker"
RAY_WORKER_GROUP = "gpu-group"  # the blog's name for its worker group
PYTORCH_CONTAINER = "pytorch"  # training-operator finds the rank container by this name
RAY_DRIVER_MODULE = "vdkit.k8s.raytrain"
SHM_VOLUME, SHARED_VOLUME = "dshm", "shared"
POD_PYTHON = "python3"  # the interpreter inside the image


# ----------------------------------------------------------------------------- what goes into a pod
def fabric_env(plan, job: JobSpec) -> Dict[str, str]:
    """The cluster's NCCL / RCCL / socket variables and the engine's, exactly as the Slurm job exports them."""
    from vdkit.launch.fabric import job_env

    return job_env(plan, job.env)


def _oci_image(image: str, key: str) -> str:
    """A registry reference a kubelet can pull: enroot's ``REGISTRY#IMAGE`` spelled ``REGISTRY/IMAGE``."""
    image = str(image).strip()
    if not image or any(ch.isspace() or ord(ch) < 32 for ch in image):
        raise UserError(f"{key}={image!r} is not an image reference", "give e.g. nvcr.io/nvidia/nemo:24.01.01.framework")
    if image.startswith(("/", "./")) or image.endswith((".sqsh", ".squashfs")):
        raise UserError(f"{key}={image} is a squashfs file (what pyxis runs on Slurm); a Kubernetes pod needs "
                        "an image from a registry", f"set {key}=REGISTRY/IMAGE:TAG, e.g. nvcr.io/nvidia/nemo:24.01.01.framework")
    if "://" in image:
        raise UserError(f"{key}={image} has a URI scheme", "drop it: REGISTRY/IMAGE:TAG")
    return image.replace("#", "/", 1)


def pod_image(job: JobSpec, s: ks.KubeSettings) -> str:
    """The engine's own image (engine.container_image) when it has one; else the site's cluster.kubernetes.image.

    cluster.container_image is the Slurm site's image file; on Kubernetes the pods run the site's
    registry image instead, so one cluster YAML can describe the same machines for both launchers.
    """
    c = job.container
    if c is not None and c.image_key == "engine.container_image" and c.image:
        return _oci_image(c.image, c.image_key)
    if not s.image:
        raise UserError("cluster.kubernetes.image is not set: the pods need an image with vdkit, torch and the "
                        "engine's libraries (and Ray for a RayJob)",
                        "set cluster.kubernetes.image=REGISTRY/IMAGE:TAG (docs/cluster-guide.md says how to build one)")
    return _oci_image(s.image, "cluster.kubernetes.image")


def pod_argv(job: JobSpec) -> List[str]:
    """The rank command inside a pod: the image's ``python3`` for a command that starts with a Python."""
    argv = [str(a) for a in job.argv]
    if argv and PurePosixPath(argv[0]).name.startswith("python"):
        argv[0] = POD_PYTHON
    return argv


def check_paths(plan, job: JobSpec, run_dir, s: ks.KubeSettings) -> None:
    """Every path the job reads or writes (run dir, data, results, base model) must lie on a shared volume
    (cluster.kubernetes.storage): those are the only file systems every pod sees."""
    roots = [PurePosixPath(v.mount_path) for v in s.storage]
    wanted = [("the run directory", str(run_dir))]
    if job.container is not None:
        wanted += [(what, path) for what, path in job.container.mounts]
    r = plan.recipe
    wanted += [(w, p) for w, p in (("data.data_dir", r.data.data_dir), ("run.results_dir", r.run.results_dir)) if p]
    for what, path in wanted:
        p = PurePosixPath(path)
        if not any(p == root or root in p.parents for root in roots):
            where = ", ".join(str(r) for r in roots)
            raise UserError(f"{what} {path} is on none of the shared volumes the pods mount ({where}; "
                            "cluster.kubernetes.storage)",
                            f"keep it under one of them (render with --out {roots[0]}/runs), or add a volume")


def _resources(plan, s: ks.KubeSettings) -> Dict[str, str]:
    """One pod's requests (= limits): the node's CPUs for its ranks, its GPUs, the RDMA resource."""
    c = plan.recipe.cluster
    out = {"cpu": str(c.cpus_per_task * c.gpus_per_node)}
    if c.gpu_type != "cpu":
        out[s.gpu_resource_for(c.gpu_vendor)] = str(c.gpus_per_node)
    if ks.uses_rdma(c, s):
        out[s.rdma_resource] = "1"  # the shared-device plugin: one grants every RDMA device of the node
    return out


def _env_list(plan, job: JobSpec) -> List[dict]:
    env = fabric_env(plan, job)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def container(plan, job: JobSpec, run_dir, s: ks.KubeSettings, name: str, image: str,
              command: Optional[List[str]] = None, args: Optional[List[str]] = None,
              ports: Optional[List[dict]] = None) -> dict:
    """The one container of a pod (see the module docstring for what it carries)."""
    res = _resources(plan, s)
    out = {"name": name, "image": image}
    if command:
        out["command"] = list(command)
    if args:
        out["args"] = list(args)
    out["workingDir"] = str(run_dir)
    out["env"] = _env_list(plan, job)
    if s.secret:
        out["envFrom"] = [{"secretRef": {"name": s.secret}}]
    if ports:
        out["ports"] = ports
    out["resources"] = {"requests": dict(res), "limits": dict(res)}
    out["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    out["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}] + [
        {"name": f"{SHARED_VOLUME}-{i}", "mountPath": v.mount_path} for i, v in enumerate(s.storage)]
    return out


PREFLIGHT_CONTAINER = "preflight"


def preflight_container(job: JobSpec, the_container: dict) -> Optional[dict]:
    """The pod's init container: the job's pre-flight (:mod:`vdkit.recipes.common.preflight`) in the pod's image, with its
    volumes, before the ranks start; its refusal is one line in the init container's log and exit 2 (no GPU, no
    rank ever starts). None when the job has no pre-flight."""
    if not job.preflight:
        return None
    argv = [str(a) for a in job.preflight]
    argv[0] = POD_PYTHON
    # FallbackToLogsOnError: a refusal's line (the log's tail) is the container status' message, which `vdkit status`
    # reads in the pod's JSON (vdkit.k8s.kubectl.preflight_refusal) - no log query, no log retention needed
    return {"name": PREFLIGHT_CONTAINER, "image": the_container["image"], "command": argv,
            "workingDir": the_container["workingDir"], "volumeMounts": copy.deepcopy(the_container["volumeMounts"]),
            "terminationMessagePolicy": "FallbackToLogsOnError"}


def pod_template(plan, s: ks.KubeSettings, the_container: dict, labels: Dict[str, str],
                 restart_policy: Optional[str] = None, init: Optional[dict] = None) -> dict:
    """A PodTemplateSpec around ``the_container`` (after ``init``, the pre-flight): host network, volumes, service
    account, pull secret."""
    spec: dict = {}
    if s.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # keep cluster DNS (the head Service) on the host network
    if s.service_account:
        spec["serviceAccountName"] = s.service_account
    if s.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": s.image_pull_secret}]
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if init:
        spec["initContainers"] = [init]
    spec["containers"] = [the_container]
    spec["volumes"] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": s.shm_size}}] + [
        {"name": f"{SHARED_VOLUME}-{i}", **({"persistentVolumeClaim": {"claimName": v.claim}} if v.claim
                                            else {"hostPath": {"path": v.host_path, "type": "Directory"}})}
        for i, v in enumerate(s.storage)]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def _metadata(name: str, s: ks.KubeSettings, plan, kind_label: str) -> dict:
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/name": kind_label,
              "vdkit/run": name}
    return {"name": name, "namespace": s.namespace, "labels": labels}


# ----------------------------------------------------------------------------- RayJob
def ray_entrypoint(plan, job: JobSpec, run_dir, s: ks.KubeSettings) -> str:
    """The RayJob's entrypoint: the kit's Ray Train driver, sized from the plan, then the rank command.

    ``python3 -m vdkit.k8s.raytrain --workers W --cpus-per-worker C --gpus-per-worker G
    --max-failures F --storage DIR -- <rank command>``: Ray Train starts W workers (one per GPU), each
    runs the rank command with torchrun's variables (:mod:`vdkit.k8s.raytrain`).
    """
    c = plan.recipe.cluster
    gpus = 0 if c.gpu_type == CPU_GPU_TYPE else 1
    argv = [POD_PYTHON, "-m", RAY_DRIVER_MODULE, "--workers", str(plan.recipe.world_size),
            "--cpus-per-worker", str(c.cpus_per_task), "--gpus-per-worker", str(gpus),
            "--max-failures", str(s.backoff_limit), "--storage", str(PurePosixPath(str(run_dir)) / "ray"),
            "--", *pod_argv(job)]
    return shlex.join(argv)


def ray_start_params(plan, head: bool) -> Dict[str, str]:
    """``rayStartParams`` (strings, as the CRD demands): the pod's GPUs and CPUs as Ray resources."""
    c = plan.recipe.cluster
    params = {"num-cpus": str(c.cpus_per_task * c.gpus_per_node),
              "num-gpus": str(0 if c.gpu_type == CPU_GPU_TYPE else c.gpus_per_node)}
    if head:
        params = {"dashboard-host": "0.0.0.0", **params}
    return params


def rayjob(plan, job: JobSpec, run_dir, name: str, s: ks.KubeSettings) -> dict:
    """The RayJob of one run: the head pod is node 0 and trains too (the blog's layout: ``num-gpus`` on the
    head), ``cluster.nodes - 1`` worker pods in one group; the job's cluster is deleted after it finishes."""
    c = plan.recipe.cluster
    image = pod_image(job, s)
    meta = _metadata(name, s, plan, "rayjob")
    labels = {"vdkit/run": name}
    head_c = container(plan, job, run_dir, s, RAY_HEAD_CONTAINER, image,
                       ports=[{"containerPort": 6379, "name": "gcs-server"},
                              {"containerPort": 8265, "name": "dashboard"},
                              {"containerPort": 10001, "name": "client"}])
    worker_c = container(plan, job, run_dir, s, RAY_WORKER_CONTAINER, image)
    cluster_spec: dict = {
        "rayVersion": ks.RAY_VERSION,
        "headGroupSpec": {"rayStartParams": ray_start_params(plan, head=True),
                          "template": pod_template(plan, s, head_c, labels, init=preflight_container(job, head_c))},
    }
    workers = c.nodes - 1
    if workers:
        cluster_spec["workerGroupSpecs"] = [{
            "groupName": RAY_WORKER_GROUP, "replicas": workers, "minReplicas": workers, "maxReplicas": workers,
            "rayStartParams": ray_start_params(plan, head=False),
            "template": pod_template(plan, s, worker_c, labels)}]
    spec = {
        "entrypoint": ray_entrypoint(plan, job, run_dir, s),
        "submissionMode": "K8sJobMode",  # a Kubernetes Job runs `ray job submit` (KubeRay's default, said)
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": s.ttl_seconds_after_finished,
        "backoffLimit": s.backoff_limit,
        "rayClusterSpec": cluster_spec,
    }
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": spec}


# ----------------------------------------------------------------------------- PyTorchJob
TORCHRUN = ("torchrun", "--no-python")  # nodes, ranks, master: training-operator's PET_* variables


def pytorchjob(plan, job: JobSpec, run_dir, name: str, s: ks.KubeSettings) -> dict:
    """The PyTorchJob of one run: a Master and ``cluster.nodes - 1`` Workers, one pod per node, torchrun in
    each starting ``cluster.gpus_per_node`` ranks (``nprocPerNode``) of the engine's command."""
    c = plan.recipe.cluster
    image = pod_image(job, s)
    labels = {"vdkit/run": name}
    the_container = container(plan, job, run_dir, s, PYTORCH_CONTAINER, image,
                              command=list(TORCHRUN), args=pod_argv(job))
    init = preflight_container(job, the_container)
    replica = lambda n: {"replicas": n, "restartPolicy": "OnFailure",  # noqa: E731 - see the module docstring
                         "template": pod_template(plan, s, copy.deepcopy(the_container), labels, init=init)}
    replicas = {"Master": replica(1)}
    if c.nodes > 1:
        replicas["Worker"] = replica(c.nodes - 1)
    spec = {
        "nprocPerNode": str(c.gpus_per_node),
        "runPolicy": {"backoffLimit": s.backoff_limit, "cleanPodPolicy": "None",
                      "ttlSecondsAfterFinished": s.ttl_seconds_after_finished},
        "pytorchReplicaSpecs": replicas,
    }
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(name, s, plan, "pytorchjob"),
            "spec": spec}


# ----------------------------------------------------------------------------- text
def to_yaml(manifest: dict, header: str = "") -> str:
    """Block-style YAML in the manifest's own key order; ``header`` lines become comments."""
    import yaml

    class NoAliases(yaml.SafeDumper):  # a shared sub-object is written out in full, never as &id / *id
        def ignore_aliases(self, data):
            return True

    lines = "".join(f"# {ln}\n" if ln else "#\n" for ln in header.splitlines())
    return lines + yaml.dump(manifest, Dumper=NoAliases, sort_keys=False, default_flow_style=False, width=4096)
