"""Kubernetes manifests: the blog's six cells as RayJobs, a NeMo-stack job as a PyTorchJob, checked offline.

Every rendered manifest passes its pinned upstream CRD (lenient as the API server, and strict), the
CRD's CEL rules, Kubernetes' own schemas for its pod templates and metadata, and the invariants a
schema cannot say (vdkit.k8s.invariants). The checkers are shown to fail on broken manifests. The six
RayJobs (and one PyTorchJob) are golden files: after a deliberate change,

    VDKIT_UPDATE_GOLDEN=1 python -m pytest tests/test_k8s_manifests.py -q && git diff tests/golden/k8s/
"""
from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path

import pytest
import yaml

import k8s_schema as schema
from vdkit.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden" / "k8s"
BLOG_CELLS = ["llama3_1_8b_1n", "llama3_1_8b_2n_noroce", "llama3_1_8b_2n_roce",
              "llama3_1_70b_1n", "llama3_1_70b_2n_noroce", "llama3_1_70b_2n_roce"]


def storage(tmp_path, *extra) -> str:
    """The site's shared volume moved to ``tmp_path`` (run dirs must lie on one), plus its other volumes."""
    vols = [f"{{mount_path:'{tmp_path}',claim:vdkit-shared}}", "{mount_path:/data,host_path:/data}", *extra]
    return "cluster.kubernetes.storage=[" + ",".join(vols) + "]"


def render(capsys, *args) -> list:
    assert main(["render", *args]) == 0, capsys.readouterr().err
    return [Path(p) for p in capsys.readouterr().out.split()]


def load(run_dir: Path) -> dict:
    (path,) = [p for p in run_dir.iterdir() if p.name in ("rayjob.yaml", "pytorchjob.yaml")]
    return yaml.safe_load(path.read_text())


def all_checks(doc: dict, plan_of_run) -> None:
    from vdkit.k8s.invariants import violations

    assert schema.crd_errors(doc, strict=False) == []
    assert schema.crd_errors(doc, strict=True) == []
    errors, _ = schema.cel_errors(doc)
    assert errors == []
    assert schema.core_errors(doc) == []
    assert violations(doc, plan_of_run) == []


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("VDKIT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: regenerate with VDKIT_UPDATE_GOLDEN=1"
    if text != path.read_text():
        diff = "".join(difflib.unified_diff(path.read_text().splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"{name} differs (VDKIT_UPDATE_GOLDEN=1 regenerates):\n{diff}")


@pytest.fixture(scope="module")
def blog(tmp_path_factory):
    """`vdkit render --sweep llama31_roce cluster.launcher=kubernetes`: the blog's cells on its Kubernetes clusters."""
    tmp = tmp_path_factory.mktemp("shared")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        # the sweep's weights are staged on the site's shared storage (/shared/models): the pods mount it too
        # --no-check-mounts: the shared volume stands in a tmp dir here, too small for a 70B's checkpoints
        rc = main(["render", "--sweep", "llama31_roce", "cluster.launcher=kubernetes", "--no-check-mounts",
                   storage(tmp, "{mount_path:/shared/models,claim:vdkit-models}"), "--out", str(tmp / "runs")])
    assert rc == 0
    return tmp, [Path(p) for p in out.getvalue().split()]


def test_the_blog_sweep_writes_six_rayjobs_that_pass_every_check(blog):
    from vdkit.run.rundir import load_plan

    tmp, dirs = blog
    assert [d.name for d in dirs] == BLOG_CELLS
    for d in dirs:
        assert sorted(p.name for p in d.iterdir()) == ["overrides.txt", "plan.json", "preflight.json", "rayjob.yaml",
                                                        "recipe.yaml", "vdkit_preflight.py"]
        doc = load(d)
        all_checks(doc, load_plan(d))
        spec = doc["spec"]
        head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in head["env"]}
        nodes = 2 if "_2n_" in d.name else 1
        assert f"--workers {8 * nodes} " in spec["entrypoint"] and "--gpus-per-worker 1" in spec["entrypoint"]
        assert spec["entrypoint"].endswith(f"-- python3 -m vdkit.recipes.reference {d}")
        assert len(spec["rayClusterSpec"].get("workerGroupSpecs") or []) == nodes - 1
        assert head["resources"]["limits"]["amd.com/gpu"] == "8"
        assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "8"
        assert head["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        pod = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Gi"}} in pod["volumes"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 3600
        assert spec["rayClusterSpec"]["rayVersion"] == "2.60.0"
        assert head["envFrom"] == [{"secretRef": {"name": "vdkit-secrets"}}]
        if "noroce" in d.name:  # RCCL over TCP sockets: no RDMA resource, IB transport off
            assert "rdma/hca_shared_devices_a" not in head["resources"]["limits"]
            assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
        else:  # RoCE through the Thor 2 NICs (1-node cells request it too: the same pods)
            assert head["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
            assert env["NCCL_IB_HCA"].startswith("=bnxt_re0,") and env["NCCL_IB_GID_INDEX"] == "3"
        assert env["NCCL_SOCKET_IFNAME"] == "bond0"


@pytest.mark.parametrize("cell", BLOG_CELLS)
def test_blog_rayjob_golden(blog, cell):
    tmp, dirs = blog
    (d,) = [x for x in dirs if x.name == cell]
    golden(f"{cell}.rayjob.yaml", (d / "rayjob.yaml").read_text().replace(str(tmp), "@SHARED@"))


def test_the_k8s_clusters_are_the_slurm_machines_with_another_launcher():
    from vdkit.composition.config import compose

    for k8s, slurm in (("k8s_mi300x", "xe9680_mi300x"), ("k8s_mi300x_noroce", "xe9680_mi300x_noroce")):
        a, b = compose([f"cluster={k8s}"]).cluster, compose([f"cluster={slurm}"]).cluster
        assert (a.launcher, b.launcher) == ("kubernetes", "slurm")
        assert {**vars(a), "name": 0, "launcher": 0} == {**vars(b), "name": 0, "launcher": 0}


def test_vdkit_list_shows_the_inherited_hardware(capsys):
    assert main(["list"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  k8s_")}
    assert "1-2 nodes x 8 MI300X-192GB, kubernetes, roce" in lines["k8s_mi300x"]
    assert "1-2 nodes x 8 MI300X-192GB, kubernetes, tcp" in lines["k8s_mi300x_noroce"]
    assert "1-6 nodes x 8 H100-SXM5-80GB, kubernetes, ib" in lines["k8s_h100"]


def test_a_nemo_stack_engine_on_the_h100_cluster_writes_a_checked_pytorchjob(tmp_path, capsys):
    from vdkit.run.rundir import load_plan

    (d,) = render(capsys, "cluster=k8s_h100", "cluster.nodes=2", "model=llama2_7b", "method=lora", "engine=nemo",
                  "engine.container_image=nvcr.io/nvidia/nemo:24.01.01.framework",
                  storage(tmp_path, "{mount_path:/models,host_path:/models}"), "--out", str(tmp_path / "runs"))
    # import_hf.sbatch: the engine's one-time HF -> .nemo conversion (issue 29) is written as a Slurm job on
    # every launcher today; a Kubernetes form of it is open work (closing note of this stop)
    assert sorted(p.name for p in d.iterdir()) == ["import_hf.sbatch", "nemo.yaml", "nemo_callbacks", "overrides.txt",
                                                    "plan.json", "preflight.json", "pytorchjob.yaml", "recipe.yaml",
                                                    "vdkit_preflight.py"]
    doc = load(d)
    all_checks(doc, load_plan(d))
    spec = doc["spec"]
    assert spec["nprocPerNode"] == "8" and spec["runPolicy"]["backoffLimit"] == 2
    master, worker = spec["pytorchReplicaSpecs"]["Master"], spec["pytorchReplicaSpecs"]["Worker"]
    assert (master["replicas"], worker["replicas"]) == (1, 1)
    assert master["restartPolicy"] == worker["restartPolicy"] == "OnFailure"  # a clean stop's exit restarts
    c = master["template"]["spec"]["containers"][0]
    assert c["name"] == "pytorch" and c["image"] == "nvcr.io/nvidia/nemo:24.01.01.framework"
    # NeMo's script under the image's python, the run dir's heartbeat callbacks on PYTHONPATH (vdkit.recipes.nemo)
    assert c["command"] == ["torchrun", "--no-python"] and c["args"][:2] == ["bash", "-c"]
    assert " exec python -u /opt/NeMo/" in c["args"][2] and f"--config-path={d}" in c["args"][2]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8" == c["resources"]["requests"]["nvidia.com/gpu"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NCCL_IB_HCA"].count("mlx5") == 8 and env["NCCL_NVLS_ENABLE"] == "0"
    golden("llama2_7b_lora_2n_h100.pytorchjob.yaml", (d / "pytorchjob.yaml").read_text().replace(str(tmp_path), "@SHARED@"))


def test_the_megatron_engine_runs_its_registry_image_in_a_pytorchjob(tmp_path, capsys):
    from vdkit.run.rundir import load_plan

    args = ["cluster=k8s_h100", "cluster.nodes=1", "model=llama2_7b", "method=lora", "engine=megatron", "data=synthetic",
            "model.hf_path=/data/models/Llama-2-7b-hf",  # the base it fine-tunes, on a volume the pods mount
            storage(tmp_path), "--out", str(tmp_path / "runs")]
    # its default image is a squashfs file for pyxis: one line says what a pod needs instead
    assert main(["render", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "squashfs file" in err and "REGISTRY/IMAGE:TAG" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    (d,) = render(capsys, *args, "engine.container_image=registry.example.com/vdkit/vdkit-ngc:0.1.0")
    doc = load(d)
    all_checks(doc, load_plan(d))
    c = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example.com/vdkit/vdkit-ngc:0.1.0"
    assert c["args"][1:3] == ["-m", "vdkit.recipes.megatron"]
    assert "Worker" not in doc["spec"]["pytorchReplicaSpecs"]


def test_the_cpu_cluster_rayjob_has_no_gpus(tmp_path, capsys):
    from vdkit.run.rundir import load_plan

    (d,) = render(capsys, "cluster=k8s_cpu", "engine=reference", "model=tiny_llama", "data=synthetic",
                  f"cluster.kubernetes.storage=[{{mount_path:'{tmp_path}',host_path:'{tmp_path}'}}]", "--out", str(tmp_path))
    doc = load(d)
    all_checks(doc, load_plan(d))
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-cpus": "1", "num-gpus": "0"}
    assert head["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    assert "--gpus-per-worker 0" in doc["spec"]["entrypoint"]


# ----------------------------------------------------------------------------- the checkers fail when they should
@pytest.fixture(scope="module")
def one(blog):
    from vdkit.run.rundir import load_plan

    _, dirs = blog
    d = [x for x in dirs if x.name == "llama3_1_8b_2n_roce"][0]
    return load(d), load_plan(d)


def test_strict_crd_check_catches_a_misspelled_field_the_lenient_one_prunes(one):
    doc = copy.deepcopy(one[0])
    doc["spec"]["rayClusterSpec"]["workerGroupSpec"] = doc["spec"]["rayClusterSpec"].pop("workerGroupSpecs")
    assert schema.crd_errors(doc, strict=False) == []
    assert any("workerGroupSpec" in e for e in schema.crd_errors(doc, strict=True))


def test_crd_check_needs_what_has_no_default(one):
    doc = copy.deepcopy(one[0])
    del doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e for e in schema.crd_errors(doc, strict=False))
    # submissionMode has a default (K8sJobMode): the API server fills it, so leaving it out is fine
    del doc["spec"]["submissionMode"]
    doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] = "g"
    assert schema.crd_errors(doc, strict=False) == []


def test_integer_ray_start_params_fail_the_schema_and_the_invariant(one):
    from vdkit.k8s.invariants import violations

    doc, plan = copy.deepcopy(one[0]), one[1]
    doc["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 8
    assert any("num-gpus" in e and "string" in e for e in schema.crd_errors(doc, strict=False))
    assert any("not a string" in v for v in violations(doc, plan))


def test_the_cel_rules_are_evaluated_and_can_fail(one):
    doc = copy.deepcopy(one[0])
    rules = schema.all_rules(doc)
    assert len(rules) == 9 and any("deletionRules" in r for r in rules)
    doc["spec"]["deletionStrategy"] = {"onSuccess": {"policy": "DeleteCluster"}}
    errors, n = schema.cel_errors(doc)
    assert n == 2 and errors == ["/spec/deletionStrategy: deletionStrategy requires either BOTH onSuccess and "
                                 "onFailure, OR the deletionRules field (cannot be empty)"]
    doc["spec"]["deletionStrategy"]["onFailure"] = {"policy": "DeleteNone"}
    assert schema.cel_errors(doc) == ([], 2)
    doc["spec"]["managedBy"] = "someone-else"
    assert any("managedBy" in e for e in schema.cel_errors(doc)[0])


def test_core_schema_catches_a_bad_pod_field(one):
    doc = copy.deepcopy(one[0])
    doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["securityContext"][
        "capabilities"]["add"] = "IPC_LOCK"  # a string, not a list
    assert schema.core_errors(doc)
    doc = copy.deepcopy(one[0])
    doc["metadata"]["labelz"] = {}
    assert any("labelz" in e for e in schema.core_errors(doc))


def test_invariants_catch_what_no_schema_says(one):
    from vdkit.k8s.invariants import violations

    base, plan = one
    doc = copy.deepcopy(base)  # requests != limits for an extended resource
    doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "amd.com/gpu"] = "4"
    assert any("requests 4 != limits 8" in v for v in violations(doc, plan))
    doc = copy.deepcopy(base)  # a pod with fewer GPUs than ranks
    for where in ("requests", "limits"):
        doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][where][
            "amd.com/gpu"] = "4"
    assert any("4 GPUs per pod" in v for v in violations(doc, plan))
    doc = copy.deepcopy(base)  # world size: one worker pod too many
    doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 2
    assert any("3 pods for 2 nodes" in v for v in violations(doc, plan))
    assert any("world size" in v for v in violations(doc, plan))
    doc = copy.deepcopy(base)
    doc["spec"]["entrypoint"] = doc["spec"]["entrypoint"].replace("--workers 16", "--workers 8")
    assert any("world size: entrypoint --workers 8" in v for v in violations(doc, plan))


def test_pinned_versions_match_the_shipped_crds():
    from vdkit.k8s import settings

    notice = (schema.DATA / "NOTICE.md").read_text()
    assert f"| {settings.KUBERAY_VERSION} (" in notice and f"| {settings.TRAINING_OPERATOR_VERSION} (" in notice
    assert [v["name"] for v in schema.crd("ray.io", "RayJob")["spec"]["versions"]] == ["v1", "v1alpha1"]
    import hashlib
    import gzip

    for name in schema.CRD_FILES.values():
        digest = hashlib.sha256(gzip.open(schema.DATA / name).read()).hexdigest()
        assert digest in notice, name
