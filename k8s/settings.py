"""A Kubernetes site as data: ``cluster.kubernetes`` read into a typed, checked :class:`KubeSettings`.

The cluster YAML (conf/cluster/k8s_*.yaml) holds the hardware (nodes, GPUs, fabric environment,
exactly as for Slurm) and a ``kubernetes:`` mapping with the site's Kubernetes facts; this module
is the one home of that mapping's keys, defaults and rules, and of the pinned operator versions
the manifests are written for. Standard library only.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from vdkit.errors import UserError
from vdkit.composition.limits import INT32_MAX

# ----------------------------------------------------------------------------- pinned versions
# The manifests are written for (and tested against the CRDs of) exactly these releases.
KUBERAY_VERSION = "v1.7.0"  # ray-project/kuberay: RayJob ray.io/v1
RAY_VERSION = "2.60.0"  # spec.rayClusterSpec.rayVersion; the image's Ray and the `ray` extra's pin
TRAINING_OPERATOR_VERSION = "v1.9.0"  # kubeflow/training-operator: PyTorchJob kubeflow.org/v1
KUBERNETES_VERSION = "1.32.0"  # core schemas the pod templates are checked against (kubectl 1.32)

# The device plugins' extended-resource names, by cluster.gpu_vendor (ROCm/k8s-device-plugin,
# NVIDIA GPU Operator); KubeRay turns any limit ending in "gpu" into Ray's num-gpus.
GPU_RESOURCES = {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}
# Mellanox/k8s-rdma-shared-dev-plugin's default resource: one grants a pod every RDMA device of its node.
DEFAULT_RDMA_RESOURCE = "rdma/hca_shared_devices_a"

JOB_KINDS = ("rayjob", "pytorchjob")

# A DNS-1123 label (namespace, Secret and claim names; object names are made from run names).
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# An extended resource name: a domain prefix and a name (amd.com/gpu, rdma/hca_shared_devices_a).
_RESOURCE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# An image reference as a pod spec takes it: no whitespace, no scheme ("https://" is a URL, not an image).
_IMAGE = re.compile(r"^(?![a-z]+://)\S+$")  # (a squashfs path is refused later, naming what a pod needs)
# A Kubernetes quantity such as 64Gi or 512Mi.
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


@dataclass(frozen=True)
class Storage:
    """A shared volume every pod mounts at ``mount_path``: a PersistentVolumeClaim or a host path.

    Run directories, data and checkpoints live on such volumes, at the same path inside the pods
    as on the machine that renders (as on a Slurm site's shared file systems).
    """

    mount_path: str
    claim: Optional[str] = None  # a ReadWriteMany PersistentVolumeClaim in the namespace
    host_path: Optional[str] = None  # or a directory every node mounts (NFS, Lustre, PowerScale)


@dataclass(frozen=True)
class KubeSettings:
    """The keys of ``cluster.kubernetes`` (see conf/cluster/k8s_*.yaml for commented examples)."""

    namespace: str = "default"
    job_kind: str = "rayjob"  # rayjob (KubeRay; the MI300X blog) | pytorchjob (Kubeflow; NVIDIA's NeMo stack)
    image: Optional[str] = None  # the pods' image for engines without their own (vdkit, Ray, torch inside)
    gpu_resource: Optional[str] = None  # None: by cluster.gpu_vendor (GPU_RESOURCES)
    rdma_resource: Optional[str] = DEFAULT_RDMA_RESOURCE  # requested when cluster.transport is ib / roce
    host_network: bool = False  # pods on the node's network (the RDMA / socket interfaces), ClusterFirstWithHostNet DNS
    shm_size: str = "64Gi"  # /dev/shm: an emptyDir in memory of this size
    secret: Optional[str] = None  # a Secret whose keys become the ranks' environment (HF_TOKEN, ...), never inline
    service_account: Optional[str] = None
    image_pull_secret: Optional[str] = None
    ttl_seconds_after_finished: int = 3600  # RayJob: keep the finished cluster's record this long
    backoff_limit: int = 2  # retries of a job whose rank stopped cleanly or failed (RayJob / PyTorchJob)
    storage: Tuple[Storage, ...] = ()  # shared volumes (runs, results, data), each at the same path as here

    def gpu_resource_for(self, vendor: str) -> str:
        return self.gpu_resource or GPU_RESOURCES[vendor]


def _fail(key: str, value, why: str, fix: str):
    raise UserError(f"cluster.kubernetes.{key}={value!r} {why}", fix)


def settings(cluster) -> KubeSettings:
    """``cluster.kubernetes`` as :class:`KubeSettings`; UserError (one line) for an unknown key or a bad value."""
    raw = dict(getattr(cluster, "kubernetes", None) or {})
    if not raw:
        raise UserError(f"cluster {cluster.name} is a Kubernetes cluster but has no cluster.kubernetes settings",
                        "add a kubernetes: mapping (namespace, image, storage, ...) to its YAML, "
                        "e.g. as conf/cluster/k8s_mi300x.yaml")
    known = {f.name for f in dataclasses.fields(KubeSettings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"cluster.kubernetes has unknown key(s) {', '.join(unknown)}",
                        "use " + ", ".join(sorted(known)))
    volumes = raw.pop("storage", None) or []
    if not isinstance(volumes, (list, tuple)) or not volumes:
        raise UserError("cluster.kubernetes.storage must list the shared volumes the pods mount",
                        "e.g. storage: [{mount_path: /shared, claim: vdkit-shared}]")
    sknown = {f.name for f in dataclasses.fields(Storage)}
    parsed = []
    for i, vol in enumerate(volumes):
        if not isinstance(vol, dict) or set(vol) - sknown or "mount_path" not in vol:
            raise UserError(f"cluster.kubernetes.storage[{i}] is not a volume ({vol!r})",
                            "give mount_path and one of claim or host_path")
        parsed.append(Storage(**vol))
    s = KubeSettings(**raw, storage=tuple(parsed))
    _check(s, cluster)
    return s


def _check(s: KubeSettings, cluster) -> None:
    if s.job_kind not in JOB_KINDS:
        _fail("job_kind", s.job_kind, "is not a job kind", "use " + " or ".join(JOB_KINDS))
    if not _LABEL.match(str(s.namespace)) or len(s.namespace) > 63:
        _fail("namespace", s.namespace, "is not a Kubernetes namespace name", "use lower-case letters, digits and '-'")
    for key in ("secret", "service_account", "image_pull_secret"):
        value = getattr(s, key)
        if value is not None and (not _SUBDOMAIN.match(str(value)) or len(value) > 253):
            _fail(key, value, "is not a Kubernetes object name", "use lower-case letters, digits, '-' and '.'")
    for key in ("gpu_resource", "rdma_resource"):
        value = getattr(s, key)
        if value is not None and not _RESOURCE.match(str(value)):
            _fail(key, value, "is not an extended-resource name", "write it as the device plugin names it, e.g. amd.com/gpu")
    if s.image is not None and (not isinstance(s.image, str) or not _IMAGE.match(s.image)):
        _fail("image", s.image, "is not a container image reference", "use REGISTRY/IMAGE:TAG, e.g. "
              "registry.example.com/vdkit/vdkit-ngc:0.1.0, or null for engines with their own image")
    if not _QUANTITY.match(str(s.shm_size)):
        _fail("shm_size", s.shm_size, "is not a Kubernetes quantity", "use e.g. 64Gi")
    if not isinstance(s.host_network, bool):
        _fail("host_network", s.host_network, "is not true or false", "use true or false")
    for key in ("ttl_seconds_after_finished", "backoff_limit"):
        value = getattr(s, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(key, value, "must be a whole number >= 0", f"use e.g. cluster.kubernetes.{key}=2")
        if value > INT32_MAX:  # the API server's int32 field: kubectl apply would refuse the manifest
            _fail(key, value, f"is more than Kubernetes' int32 field holds ({INT32_MAX})",
                  f"use e.g. cluster.kubernetes.{key}=2")
    seen = set()
    for i, st in enumerate(s.storage):
        if not str(st.mount_path).startswith("/") or st.mount_path in seen or st.mount_path in ("/", "/dev/shm"):
            _fail(f"storage[{i}].mount_path", st.mount_path, "is not an absolute path of its own",
                  "use a distinct directory, e.g. /shared")
        for key in ("mount_path", "host_path"):
            _check_volume_path(f"storage[{i}].{key}", getattr(st, key))
        seen.add(st.mount_path)
        if bool(st.claim) == bool(st.host_path):
            raise UserError(f"cluster.kubernetes.storage[{i}] needs exactly one of claim (a PersistentVolumeClaim) "
                            "or host_path (a directory on every node)", "e.g. {mount_path: /shared, claim: vdkit-shared}")
        if st.claim and (not _SUBDOMAIN.match(str(st.claim)) or len(st.claim) > 253):
            _fail(f"storage[{i}].claim", st.claim, "is not a PersistentVolumeClaim name", "use lower-case letters, digits, '-'")
        if st.host_path and not str(st.host_path).startswith("/"):
            _fail(f"storage[{i}].host_path", st.host_path, "is not an absolute path", "use e.g. /shared")
    if cluster.gpu_type != "cpu" and s.gpu_resource is None and cluster.gpu_vendor not in GPU_RESOURCES:
        raise UserError(f"no GPU resource is known for cluster.gpu_vendor={cluster.gpu_vendor!r}",
                        "set cluster.kubernetes.gpu_resource to the device plugin's resource name")


SYSTEM_DIRS = ("/proc", "/sys", "/dev")  # the kernel's and the runtime's: a volume over them breaks the pod


def _check_volume_path(key: str, path) -> None:
    """A volume path that is plain (no '..', '.', '//': the path that is written is the path that is mounted)
    and not over (or under) the kernel's /proc, /sys or /dev."""
    if path is None:
        return
    text = str(path)
    if any(part in ("..", ".") for part in text.split("/")) or "//" in text or (text != "/" and text.endswith("/")):
        _fail(key, path, "is not a plain absolute path ('..', '.' or '//' in it)",
              "write the directory itself, e.g. /shared")
    for system in SYSTEM_DIRS:
        if text == system or text.startswith(system + "/"):
            _fail(key, path, f"is over {system}, which the container runtime provides",
                  "mount the volume at a directory of its own, e.g. /shared")


def uses_rdma(cluster, s: KubeSettings) -> bool:
    """Whether pods request the RDMA resource: an RDMA transport (ib / roce) and a resource name."""
    return cluster.transport in ("ib", "roce") and bool(s.rdma_resource)


def object_name(run_dir_name: str) -> str:
    """A DNS-1123 name for the job's objects, from its run directory's name (kept <= 40 characters:
    KubeRay appends suffixes to the RayCluster, its head Service and the pods)."""
    import hashlib

    name = re.sub(r"[^a-z0-9-]+", "-", run_dir_name.lower()).strip("-") or "vdkit"
    if len(name) > 40:  # distinct long run dirs (name, name-2) keep distinct object names
        digest = hashlib.sha1(run_dir_name.encode()).hexdigest()[:6]
        name = f"{name[:33].rstrip('-')}-{digest}"
    return name
