"""Offline checks of Kubernetes manifests, as an API server with the pinned operators' CRDs would make them.

- :func:`crd_errors`: a RayJob / PyTorchJob against the ``openAPIV3Schema`` of its pinned upstream CRD
  (tests/data/k8s/, see NOTICE.md) with jsonschema. ``strict=False`` is the API server's view: defaults
  are filled in first (structural defaulting), so a required field that has a default is not demanded,
  and fields the schema does not name are pruned, not refused. ``strict=True`` adds
  ``additionalProperties: false`` wherever the schema lists properties (what ``kubectl --validate=strict``
  refuses as an unknown field: a typo such as ``workerGroupSpec``).
- :func:`cel_errors`: the CRD's ``x-kubernetes-validations`` rules evaluated with a CEL interpreter
  (cel-python) on the nodes they sit on; transition rules (``oldSelf``) apply to updates, not to a create.
- :func:`core_errors`: every pod template, wrapped as a core ``PodTemplate``, and the object's
  metadata against Kubernetes' own schemas (kubernetes-validate, strict), version
  ``vdkit.k8s.settings.KUBERNETES_VERSION``.
"""
from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Iterator, List, Tuple

import yaml

DATA = Path(__file__).resolve().parent / "data" / "k8s"
CRD_FILES = {("ray.io", "RayJob"): "ray.io_rayjobs.yaml.gz", ("kubeflow.org", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml.gz"}


@functools.lru_cache(maxsize=None)
def crd(group: str, kind: str) -> dict:
    """The pinned CustomResourceDefinition of ``kind``."""
    with gzip.open(DATA / CRD_FILES[(group, kind)], "rt") as fh:
        return yaml.safe_load(fh)


def openapi_schema(doc: dict) -> dict:
    """The ``openAPIV3Schema`` of the CRD version ``doc``'s apiVersion names."""
    group, version = doc["apiVersion"].split("/")
    for v in crd(group, doc["kind"])["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{doc['apiVersion']} is not served by the pinned {doc['kind']} CRD")


def _to_jsonschema(node, strict: bool):
    """OpenAPI v3 (Kubernetes' structural subset) -> JSON Schema for jsonschema."""
    if isinstance(node, list):
        return [_to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ("properties", "patternProperties"):
            out[k] = {name: _to_jsonschema(s, strict) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = _to_jsonschema(v, strict)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [_to_jsonschema(s, strict) for s in v]
        elif k.startswith("x-kubernetes-") or k in ("nullable", "format", "description", "example"):
            continue
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable"):
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
    if (strict and node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def fill_defaults(doc, schema):
    """A copy of ``doc`` with the schema's ``default`` values filled in where a field is absent (the API
    server does this before it validates)."""
    doc = copy.deepcopy(doc)

    def walk(value, node):
        if isinstance(value, dict) and node.get("properties"):
            for name, sub in node["properties"].items():
                if name not in value and "default" in sub:
                    value[name] = copy.deepcopy(sub["default"])
                if name in value:
                    walk(value[name], sub)
        elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
            for v in value.values():
                walk(v, node["additionalProperties"])
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for v in value:
                walk(v, node["items"])

    walk(doc, schema)
    return doc


def crd_errors(doc: dict, strict: bool) -> List[str]:
    """Every schema error of ``doc`` against its pinned CRD (empty: valid)."""
    import jsonschema

    schema = openapi_schema(doc)
    validator = jsonschema.Draft7Validator(_to_jsonschema(schema, strict))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(fill_defaults(doc, schema))]


def _rules(value, node, path="") -> Iterator[Tuple[str, dict, object]]:
    """(path, rule, the value it applies to) for every x-kubernetes-validations rule on a present node."""
    for rule in node.get("x-kubernetes-validations") or []:
        yield path or "<root>", rule, value
    if isinstance(value, dict):
        for name, sub in (node.get("properties") or {}).items():
            if name in value:
                yield from _rules(value[name], sub, f"{path}/{name}")
        if isinstance(node.get("additionalProperties"), dict):
            for k, v in value.items():
                yield from _rules(v, node["additionalProperties"], f"{path}/{k}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, v in enumerate(value):
            yield from _rules(v, node["items"], f"{path}/{i}")


def all_rules(doc: dict) -> List[str]:
    """Every CEL rule the pinned CRD declares for ``doc``'s version (wherever it sits)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            found.extend(r["rule"] for r in node.get("x-kubernetes-validations") or [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(openapi_schema(doc))
    return found


def cel_errors(doc: dict) -> Tuple[List[str], int]:
    """(messages of the CRD's CEL rules ``doc`` breaks, how many rules were evaluated)."""
    import celpy

    env = celpy.Environment()
    schema = openapi_schema(doc)
    errors, evaluated = [], 0
    for path, rule, value in _rules(fill_defaults(doc, schema), schema):
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: checked on update only
        program = env.program(env.compile(rule["rule"]))
        evaluated += 1
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            errors.append(f"{path}: {rule.get('message') or rule['rule']}")
    return errors, evaluated


def pod_templates(doc: dict) -> List[Tuple[str, dict]]:
    """(where, PodTemplateSpec) for every pod group of a RayJob or PyTorchJob."""
    spec = doc["spec"]
    if doc["kind"] == "RayJob":
        rc = spec["rayClusterSpec"]
        return [("head", rc["headGroupSpec"]["template"])] + [
            (f"worker group {g['groupName']}", g["template"]) for g in rc.get("workerGroupSpecs") or []]
    return [(role, r["template"]) for role, r in spec["pytorchReplicaSpecs"].items()]


def core_errors(doc: dict) -> List[str]:
    """Kubernetes' own schemas (strict): each pod template as a core PodTemplate, and the object's metadata."""
    import kubernetes_validate

    from vdkit.k8s.settings import KUBERNETES_VERSION

    errors = []
    wrapped = [(where, {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": t})
               for where, t in pod_templates(doc)]
    wrapped.append(("metadata", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}))
    for where, obj in wrapped:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {exc.message if hasattr(exc, 'message') else exc}")
    return errors
