"""The Kubernetes launcher at the door: bad input is one line (exit 2, nothing written); submit / status
go through kubectl (a recording stand-in here: no API server can run on this machine) and say so in one
line when no kubeconfig is present."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from vdkit.cli import main

from helpers import K8S_TINY as TINY, k8s_vols as vols  # fake_kubectl: a conftest fixture


def one_line_error(capsys, argv, text, out_dir: Path):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err and "Traceback" not in err, err
    assert not out_dir.exists() or not any(out_dir.iterdir())


@pytest.mark.parametrize("extra,text", [
    (["cluster.kubernetes.namespce=x"], "Key 'namespce' is not in struct"),  # Hydra refuses it
    (["+cluster.kubernetes.namespce=x"], "cluster.kubernetes has unknown key(s) namespce"),  # a forced key: ours
    (["cluster.kubernetes.job_kind=trainjob"], "cluster.kubernetes.job_kind='trainjob' is not a job kind"),
    (["cluster.kubernetes.namespace=Bad_NS"], "is not a Kubernetes namespace name"),
    (["cluster.kubernetes.shm_size=lots"], "is not a Kubernetes quantity"),
    (["cluster.kubernetes.gpu_resource=gpu"], "is not an extended-resource name"),
    (["run.secrets_file=/home/me/secrets.env"], "run.secrets_file is a file the Slurm job reads"),
    (["cluster.kubernetes.image=/shared/containers/x.sqsh"], "is a squashfs file"),
    (["cluster.kubernetes.image=null"], "cluster.kubernetes.image is not set"),
])
def test_bad_kubernetes_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, text):
    out = tmp_path / "runs"
    one_line_error(capsys, ["render", *TINY, vols(tmp_path), *extra, "--out", str(out)], text, out)


def test_a_run_dir_off_the_shared_volumes_is_refused(tmp_path, capsys):
    out = tmp_path / "elsewhere"
    one_line_error(capsys, ["render", *TINY, "cluster.kubernetes.storage=[{mount_path:/srv/shared,claim:c}]",
                            "--out", str(out)], "is on none of the shared volumes the pods mount (/srv/shared", out)


def test_storage_needs_a_claim_or_a_host_path(tmp_path, capsys):
    out = tmp_path / "runs"
    one_line_error(capsys, ["render", *TINY, f"cluster.kubernetes.storage=[{{mount_path:'{tmp_path}'}}]",
                            "--out", str(out)], "needs exactly one of claim", out)


def test_a_cluster_without_kubernetes_settings(tmp_path, capsys):
    out = tmp_path / "runs"
    one_line_error(capsys, ["render", "cluster=xe9680", "cluster.launcher=kubernetes", "--out", str(out)],
                   "cluster xe9680 is a Kubernetes cluster but has no cluster.kubernetes settings", out)


def test_an_engine_with_its_own_image_is_not_put_in_a_rayjob(tmp_path, capsys):
    out = tmp_path / "runs"
    one_line_error(capsys, ["render", "cluster=k8s_mi300x", "engine=nemo", "model=llama2_7b",
                            "engine.container_image=nvcr.io/nvidia/nemo:24.01.01.framework",
                            "cluster.kubernetes.storage=[{mount_path:/shared,claim:c}]", "--out", str(out)],
                   "a RayJob (cluster.kubernetes.job_kind=rayjob) runs the site's Ray image", out)


def test_secrets_come_from_a_secret_by_name_never_inline(tmp_path, capsys):
    assert main(["render", *TINY, vols(tmp_path), "cluster.kubernetes.secret=hf-token", "--out", str(tmp_path)]) == 0
    run_dir = Path(capsys.readouterr().out.split()[-1])
    doc = yaml.safe_load((run_dir / "rayjob.yaml").read_text())
    pods = [doc["spec"]["rayClusterSpec"]["headGroupSpec"]] + doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    for group in pods:
        c = group["template"]["spec"]["containers"][0]
        assert c["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
        assert not any("TOKEN" in e["name"] or "KEY" in e["name"] for e in c["env"])


# ----------------------------------------------------------------------------- kubectl
def test_submit_without_a_kubeconfig_says_so_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "runs"
    one_line_error(capsys, ["submit", *TINY, vols(tmp_path), "--out", str(out)], "no kubeconfig here", out)


def test_status_without_a_kubeconfig_says_so(tmp_path, capsys, monkeypatch):
    assert main(["render", *TINY, vols(tmp_path), "--out", str(tmp_path)]) == 0
    run_dir = capsys.readouterr().out.split()[-1]
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["status", run_dir]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no kubeconfig here" in err




def test_submit_applies_the_manifest_and_status_reads_the_job(tmp_path, capsys, monkeypatch, fake_kubectl):
    assert main(["submit", *TINY, vols(tmp_path), "--out", str(tmp_path / "runs")]) == 0
    line = capsys.readouterr().out.strip()
    run_dir = Path(line.split("\t")[0])
    assert line.split("\t")[1] == "default/RayJob/tiny-llama-lora-2n1g"
    assert (run_dir / "job_id.txt").read_text() == "default/RayJob/tiny-llama-lora-2n1g\n"
    assert fake_kubectl() == [["apply", "-f", str(run_dir / "rayjob.yaml")]]

    for raw, word in (("RUNNING", "RUNNING"), ("SUCCEEDED", "COMPLETED"), ("FAILED", "FAILED"), ("", "UNKNOWN")):
        monkeypatch.setenv("FAKE_STATE", raw)
        assert main(["status", str(run_dir)]) == 0
        assert capsys.readouterr().out.strip().split("\t")[2].startswith(f"{word} (RayJob ")
    assert fake_kubectl()[-1] == ["get", "-n", "default", "rayjobs.ray.io", "tiny-llama-lora-2n1g", "-o",
                                  "jsonpath={.status.jobStatus}"]
    monkeypatch.setenv("FAKE_STATE", "SUCCEEDED")
    assert main(["status", "--wait", str(run_dir)]) == 0
    assert "COMPLETED (RayJob SUCCEEDED)" in capsys.readouterr().out


def test_submit_test_only_is_a_server_dry_run(tmp_path, capsys, fake_kubectl):
    assert main(["submit", "--test-only", *TINY, vols(tmp_path), "--out", str(tmp_path / "runs")]) == 0
    assert "server dry run" in capsys.readouterr().out
    assert fake_kubectl()[0][:2] == ["apply", "--dry-run=server"]


# ----------------------------------------------------------------------------- the RayJob entrypoint's pieces
def test_the_ray_driver_reads_the_rendered_entrypoint(tmp_path, capsys):
    import shlex

    from vdkit.k8s.raytrain import parse

    assert main(["render", *TINY, vols(tmp_path), "--out", str(tmp_path)]) == 0
    run_dir = Path(capsys.readouterr().out.split()[-1])
    argv = shlex.split(yaml.safe_load((run_dir / "rayjob.yaml").read_text())["spec"]["entrypoint"])
    assert argv[:3] == ["python3", "-m", "vdkit.k8s.raytrain"]
    args = parse(argv[3:])
    assert (args.workers, args.cpus_per_worker, args.gpus_per_worker, args.max_failures) == (2, 1.0, 0.0, 2)
    assert args.storage == str(run_dir / "ray")
    assert args.command == ["python3", "-m", "vdkit.recipes.reference", str(run_dir)]
    with pytest.raises(SystemExit):
        parse(["--workers", "2", "--storage", "/x", "--"])  # no rank command


def test_each_ray_worker_gives_its_rank_torchruns_variables():
    from vdkit.k8s.raytrain import RANK_VARS, rank_env

    class Ctx:  # what ray.train.get_context() answers on world rank 5 of 16 (first node)
        def get_world_rank(self): return 5
        def get_world_size(self): return 16
        def get_local_rank(self): return 5
        def get_local_world_size(self): return 8
        def get_node_rank(self): return 0

    env = rank_env(Ctx(), "10.0.0.1", 23456, 12.0, base={"NCCL_IB_HCA": "=bnxt_re0", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert {k: env[k] for k in RANK_VARS} == {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8",
                                              "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456"}
    assert env["NCCL_IB_HCA"] == "=bnxt_re0" and env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the pod's and Ray's kept
    assert env["OMP_NUM_THREADS"] == "12"


def test_status_of_a_job_whose_preflight_refused_is_failed_with_its_line(tmp_path, capsys, monkeypatch, fake_kubectl):
    """The operator restarts a refused init container without end (training-operator counts restarts of Running pods
    only; the pod of a failing init container stays Pending): `vdkit status` says FAILED with the pre-flight's line
    (the container's termination message, FallbackToLogsOnError) and the cancel, and `status --wait` ends on it."""
    import json

    assert main(["submit", *TINY, vols(tmp_path), "--out", str(tmp_path / "runs")]) == 0
    run_dir = Path(capsys.readouterr().out.strip().split("\t")[0])
    manifest = yaml.safe_load((run_dir / "rayjob.yaml").read_text())
    init = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["initContainers"][0]
    assert init["name"] == "preflight" and init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    line = "vdkit pre-flight: data.data_dir /shared/data: training.jsonl is empty (fix: prepare the data)"
    refused = {"name": "preflight", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 2, "message": f"some earlier output\n{line}\n"}}}
    monkeypatch.setenv("FAKE_PODS", json.dumps({"items": [
        {"metadata": {"name": "head-0"}, "status": {"phase": "Pending", "initContainerStatuses": [refused]}}]}))
    monkeypatch.setenv("FAKE_STATE", "PENDING")
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"FAILED (the job's pre-flight refused it: {line};" in out and f"vdkit cancel {run_dir}" in out
    assert ["get", "pods", "-n", "default", "-l", "vdkit/run=tiny-llama-lora-2n1g", "-o", "json"] in fake_kubectl()
    assert main(["status", "--wait", str(run_dir)]) == 1  # FAILED ends the wait (exit 1: the run failed)
    assert "pre-flight refused" in capsys.readouterr().out
    monkeypatch.setenv("FAKE_PODS", json.dumps({"items": [
        {"metadata": {"name": "head-0"}, "status": {"phase": "Running", "initContainerStatuses": [
            {"name": "preflight", "state": {"terminated": {"exitCode": 0}}}]}}]}))
    assert main(["status", str(run_dir)]) == 0
    assert "PENDING (RayJob PENDING)" in capsys.readouterr().out  # a pre-flight that passed: the operator's word
