"""What a CRD schema cannot say about a rendered job, checked on the manifest itself (pure, standard library).

- extended resources (GPUs, RDMA): requests equal limits (Kubernetes cannot overcommit them, and a
  pod whose requests differ is rejected by the API server, not by the CRD schema);
- GPUs per pod equal the ranks per pod: Ray's ``num-gpus`` (a RayJob) or ``nprocPerNode`` (a PyTorchJob)
  equal the pod's GPU limit and ``cluster.gpus_per_node``;
- world size = pods x ranks per pod = the plan's ``cluster.nodes x cluster.gpus_per_node``, and the
  RayJob entrypoint's ``--workers`` says the same;
- ``rayStartParams`` values are strings (``ray start`` flags; the CRD types them as strings, YAML
  would happily write ``8`` as an integer).

A violation is a bug in the renderer, not the user's input: it raises ``AssertionError`` with the
rule's name. :func:`violations` lists them (tests call it on hand-broken manifests).
"""
from __future__ import annotations

import shlex
from typing import Iterator, List, Tuple

from vdkit.composition.schema import CPU_GPU_TYPE

_CORE = ("cpu", "memory", "ephemeral-storage")


def _pods(doc: dict) -> List[Tuple[str, int, dict]]:
    """(role, replicas, pod template) for every pod group of a RayJob or PyTorchJob."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "RayJob":
        rc = spec.get("rayClusterSpec") or {}
        out = [("head", 1, (rc.get("headGroupSpec") or {}).get("template") or {})]
        for g in rc.get("workerGroupSpecs") or []:
            out.append((f"worker group {g.get('groupName')}", int(g.get("replicas", 1)), g.get("template") or {}))
        return out
    if doc.get("kind") == "PyTorchJob":
        return [(role, int(r.get("replicas", 1)), r.get("template") or {})
                for role, r in (spec.get("pytorchReplicaSpecs") or {}).items()]
    raise AssertionError(f"not a RayJob or PyTorchJob: kind {doc.get('kind')!r}")


def _containers(template: dict) -> Iterator[dict]:
    yield from (template.get("spec") or {}).get("containers") or []


def _gpus(container: dict) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    return sum(int(v) for k, v in limits.items() if k.endswith("gpu"))  # KubeRay's rule for GPU resources


def violations(doc: dict, plan) -> List[str]:
    """Every invariant ``doc`` breaks for ``plan`` (empty: none)."""
    c = plan.recipe.cluster
    want_gpus = 0 if c.gpu_type == CPU_GPU_TYPE else c.gpus_per_node
    out: List[str] = []
    pods = _pods(doc)
    for role, _n, template in pods:
        for ctr in _containers(template):
            res = ctr.get("resources") or {}
            req, lim = res.get("requests") or {}, res.get("limits") or {}
            for name in sorted(set(req) | set(lim)):
                if name not in _CORE and not name.startswith("hugepages-") and str(req.get(name)) != str(lim.get(name)):
                    out.append(f"{role}: extended resource {name} requests {req.get(name)} != limits {lim.get(name)}")
            if _gpus(ctr) != want_gpus:
                out.append(f"{role}: {_gpus(ctr)} GPUs per pod, the plan has {want_gpus} per node")
    n_pods = sum(n for _r, n, _t in pods)
    if n_pods != c.nodes:
        out.append(f"{n_pods} pods for {c.nodes} nodes")
    world = plan.recipe.world_size
    if doc["kind"] == "RayJob":
        rc = doc["spec"]["rayClusterSpec"]
        groups = [rc["headGroupSpec"]] + list(rc.get("workerGroupSpecs") or [])
        for g in groups:
            for k, v in (g.get("rayStartParams") or {}).items():
                if not isinstance(v, str):
                    out.append(f"rayStartParams {k}={v!r} is not a string")
            if str((g.get("rayStartParams") or {}).get("num-gpus")) != str(want_gpus):
                out.append(f"rayStartParams num-gpus={(g.get('rayStartParams') or {}).get('num-gpus')!r}, "
                           f"the pod has {want_gpus} GPUs")
        argv = shlex.split(doc["spec"]["entrypoint"])
        workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else None
        if workers != world or n_pods * c.gpus_per_node != world:
            out.append(f"world size: entrypoint --workers {workers}, pods x ranks per pod "
                       f"{n_pods} x {c.gpus_per_node}, the plan {world}")
    else:
        nproc = int(doc["spec"].get("nprocPerNode", 0))
        if nproc != c.gpus_per_node:
            out.append(f"nprocPerNode {nproc} != {c.gpus_per_node} ranks per node")
        if want_gpus and nproc != want_gpus:
            out.append(f"nprocPerNode {nproc} != {want_gpus} GPUs per pod")
        if n_pods * nproc != world:
            out.append(f"world size: {n_pods} pods x {nproc} ranks != the plan's {world}")
    return out


def check(doc: dict, plan) -> None:
    """Raise AssertionError naming every broken invariant (a renderer bug)."""
    found = violations(doc, plan)
    if found:
        raise AssertionError("rendered manifest breaks: " + "; ".join(found))
