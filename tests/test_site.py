"""`vdkit site probe`: the readers on recorded XE9680-like outputs (tests/fixtures/site/SOURCES.md), the
probe on this machine (no GPU, no RDMA: a valid file), and `vdkit plan --config-dir DIR cluster=NAME`."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vdkit.composition import site
from vdkit.cli import main

FIX = Path(__file__).resolve().parent / "fixtures" / "site"
XE9680_HCAS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


@pytest.fixture(autouse=True)
def _no_config_dir_left_behind():
    """--config-dir is process state (vdkit.composition.config._USER_DIRS): other tests must not see these clusters."""
    from vdkit.composition import config

    yield
    config._USER_DIRS.clear()


def _text(name: str) -> str:
    return (FIX / name).read_text()


def test_ibv_devinfo_of_an_xe9680_gives_its_eight_infiniband_adapters():
    ports = site.parse_ibv_devinfo(_text("ibv_devinfo_xe9680_8ib.txt"))
    assert len(ports) == 12 and ("mlx5_7", 1, "PORT_DOWN", "Ethernet") in ports
    f = site.fabric(ports)
    assert f == {"ib_hcas": XE9680_HCAS, "transport": "ib"}  # the bonded Ethernet ports are left out


def test_a_roce_node_and_a_node_without_rdma():
    f = site.fabric(site.parse_ibv_devinfo(_text("ibv_devinfo_roce_8.txt")))
    assert f == {"ib_hcas": [f"bnxt_re{i}" for i in range(8)], "transport": "roce"}
    assert site.fabric([]) == {"ib_hcas": [], "transport": "tcp", "env": {"NCCL_IB_DISABLE": "1"}}


def test_sysfs_gives_the_same_ports(tmp_path):
    for dev, state, layer in (("mlx5_0", "4: ACTIVE", "InfiniBand"), ("mlx5_1", "1: DOWN", "InfiniBand")):
        p = tmp_path / dev / "ports" / "1"
        p.mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "link_layer").write_text(layer + "\n")
    assert site.fabric(site.read_sysfs_ports(tmp_path)) == {"ib_hcas": ["mlx5_0"], "transport": "ib"}


@pytest.mark.parametrize("name", ["nvidia_smi_query_h100.csv", "nvidia_smi_q_h100.txt"])
def test_nvidia_smi_gives_eight_h100_sxm5(name):
    g = site.parse_nvidia_smi(_text(name))
    assert (g["gpu_type"], g["gpu_memory_gb"], g["node_gpus"], g["gpu_vendor"]) == ("H100-SXM5-80GB", 85.5, 8, "nvidia")


def test_rocm_smi_gives_eight_mi300x():
    g = site.parse_rocm_smi(_text("rocm_smi_mi300x.txt"))
    assert (g["gpu_type"], g["gpu_memory_gb"], g["node_gpus"], g["gpu_vendor"]) == ("MI300X-192GB", 205.8, 8, "amd")


def test_sinfo_partitions_and_time_limits():
    text = _text("sinfo_xe9680.txt")
    assert site.parse_sinfo(text) == {"partition": "xe9680", "max_time_min": 240, "max_nodes": 6}
    assert site.parse_sinfo(text, "long")["max_time_min"] == 2880
    assert site.parse_sinfo(text, "debug")["max_time_min"] == 30
    assert site.slurm_minutes("1-12") == 2160 and site.slurm_minutes("UNLIMITED") is None


def test_default_route_names_the_bootstrap_nic():
    assert site.default_route_iface(_text("proc_net_route.txt")) == "bond0"


def _fake_node(argv, mpi_list="srun_mpi_list_22.05.txt"):
    """An XE9680 as its commands answer (the recorded outputs)."""
    if argv[:2] == ["srun", "--mpi=list"]:
        return _text(mpi_list) if mpi_list else None
    return {"ibv_devinfo": _text("ibv_devinfo_xe9680_8ib.txt"),
            "nvidia-smi": _text("nvidia_smi_query_h100.csv"), "rocm-smi": None,
            "sinfo": _text("sinfo_xe9680.txt"), "enroot": "3.4.1\n",
            "srun": "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"}[argv[0]]


def test_srun_mpi_list_picks_the_pmi_plugin_the_site_has(tmp_path):
    """The probe wrote the schema's `mpi: pmix` whatever the site's Slurm has: on one built without PMIx every
    step failed at srun ("Couldn't find the specified plugin name for mpi/pmix"), restarted as a crash. It reads
    `srun --mpi=list` (Slurm 22.05's own answer, recorded) and falls back to pmi2, then none."""
    assert site.parse_mpi_list(_text("srun_mpi_list_22.05.txt")) == ["pmix", "none", "cray_shasta", "pmi2"]
    assert site.parse_mpi_list("srun: MPI types are...\nsrun: none\nsrun: pmi2\n") == ["none", "pmi2"]  # older
    no_pmix = tmp_path / "no_pmix.txt"
    no_pmix.write_text("MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n")
    probe = lambda mpi_list: site.probe(run=lambda argv: _fake_node(argv, mpi_list),  # noqa: E731
                                        route_file=FIX / "proc_net_route.txt")
    assert probe("srun_mpi_list_22.05.txt").values["mpi"] == "pmix"
    assert probe(str(no_pmix)).values["mpi"] == "pmi2"
    assert "mpi" not in probe(None).values and "srun --mpi=list" in probe(None).missing["mpi"]


def test_probe_of_a_recorded_xe9680_writes_a_cluster_the_planner_uses(tmp_path, capsys, monkeypatch):
    pr = site.probe(run=_fake_node, route_file=FIX / "proc_net_route.txt", storage_dir=tmp_path / "runs", sample_mb=2)
    assert pr.values["ib_hcas"] == XE9680_HCAS and pr.values["socket_ifname"] == "bond0"
    assert pr.values["max_time_min"] == 240 and pr.values["storage_write_gbps_per_node"] > 0
    assert set(pr.missing) == {"startup_s", "mtbf_h"} and pr.values["mpi"] == "pmix"
    assert any("enroot 3.4.1, pyxis found" in n for n in pr.notes)
    monkeypatch.setattr(site, "probe", lambda **kw: pr)
    assert main(["site", "probe", "--name", "xe_lab", "--out", str(tmp_path / "conf")]) == 0
    written = yaml.safe_load((tmp_path / "conf" / "cluster" / "xe_lab.yaml").read_text())
    assert written["ib_hcas"] == XE9680_HCAS and written["transport"] == "ib" and "ib_hcas" in written["probed"]
    capsys.readouterr()
    assert main(["plan", "--config-dir", str(tmp_path / "conf"), "cluster=xe_lab", "model=llama2_7b",
                 "method=lora", "cluster.nodes=2", "--json"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)
    assert plan["cluster"] == "xe_lab" and plan["feasible"] and plan["gpus"] == 16


def test_a_measured_gpu_memory_wins_and_a_command_line_gpu_against_it_is_refused(tmp_path, capsys, monkeypatch):
    """A site's nvidia-smi figure is its GPU's: it wins over the catalogue's, and a command-line cluster.gpu_type of
    another GPU (its memory unstated) is refused in one line, not planned into the measured one's memory."""
    smi = "NVIDIA H100 80GB HBM3, 80000 MiB\n" * 8  # a driver reporting less than the catalogue's 81,559 MiB
    pr = site.probe(run=_hostile_node(**{"nvidia-smi": smi}), route_file=FIX / "proc_net_route.txt")
    monkeypatch.setattr(site, "probe", lambda **kw: pr)
    assert main(["site", "probe", "--name", "lab", "--out", str(tmp_path)]) == 0
    plan = ["plan", "--config-dir", str(tmp_path), "cluster=lab", "model=llama2_7b", "method=lora"]
    capsys.readouterr()
    assert main(plan) == 0 and "of 83.8 GB" in capsys.readouterr().out  # 80,000 MiB, measured
    assert main([*plan, "cluster.gpu_type=H200-SXM5-141GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cluster.gpu_memory_gb=83.8 (measured on its node" in err, err
    assert "add cluster.gpu_memory_gb=150.7" in err and "Traceback" not in err
    assert main([*plan, "cluster.gpu_type=H200-SXM5-141GB", "cluster.gpu_memory_gb=150.7"]) == 0


def test_probe_here_writes_a_valid_file_and_plan_reads_it(tmp_path, capsys):
    """This machine (no GPU, no RDMA, maybe no Slurm): what it cannot read it says; the file plans."""
    out = tmp_path / "site"
    assert main(["site", "probe", "--name", "mysite", "--out", str(out), "--sample-mb", "2"]) == 0
    err = capsys.readouterr().err
    text = (out / "cluster" / "mysite.yaml").read_text()
    assert "Left at the documented default" in text and "startup_s" in err
    assert main(["plan", "--config-dir", str(out), "cluster=mysite", "model=llama2_7b", "method=lora"]) == 0
    assert "llama2_7b lora on mysite" in capsys.readouterr().out


def test_config_dir_given_as_the_cluster_folder_says_where_the_file_goes(tmp_path, capsys):
    """`--config-dir site/cluster` (the folder holding mysite.yaml) found no cluster=mysite, and the fix listed only
    the kit's own clusters: a dead end. Now the door names the file and the layout."""
    out = tmp_path / "site"
    assert main(["site", "probe", "--name", "mysite", "--out", str(out), "--sample-mb", "1"]) == 0
    capsys.readouterr()
    assert main(["plan", "--config-dir", str(out / "cluster"), "cluster=mysite", "model=llama2_7b"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mysite.yaml at its top, in no group folder" in err
    assert "cluster/NAME.yaml" in err and "Traceback" not in err


def test_bad_names_and_dirs_are_one_line(tmp_path, capsys):
    assert main(["site", "probe", "--name", "../x", "--out", str(tmp_path)]) == 2
    assert main(["plan", "--config-dir", str(tmp_path / "nope"), "cluster=mysite"]) == 2
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "xe9680.yaml").write_text("name: xe9680\n")
    assert main(["plan", "--config-dir", str(tmp_path), "cluster=xe9680"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 3


# ----------------------------------------------------------------------------- the door (issue 36)
def _hostile_node(**answers):
    """The recorded XE9680 with some commands answering otherwise."""
    return lambda argv: answers[argv[0]] if argv[0] in answers else _fake_node(argv)


def test_a_sinfo_without_a_time_limit_is_no_traceback():
    assert site.parse_sinfo("batch* - 4 idle\n") == {"partition": "batch", "max_time_min": None, "max_nodes": 4}
    assert site.slurm_minutes("-") is None and site.slurm_minutes("soon") is None


def test_an_unknown_partition_is_refused_not_replaced_by_the_default(tmp_path):
    from vdkit.errors import UserError

    with pytest.raises(UserError, match="--partition 'xe968' is not a partition sinfo lists"):
        site.probe(run=_fake_node, route_file=FIX / "proc_net_route.txt", partition="xe968")


def test_probed_facts_out_of_bounds_are_not_written(tmp_path, capsys, monkeypatch):
    evil = _text("ibv_devinfo_xe9680_8ib.txt").replace("mlx5_0", "evil;touch", 1)
    node = _hostile_node(ibv_devinfo=evil, sinfo="xe9680* 4:00:00 0 idle\n",
                         **{"nvidia-smi": "NVIDIA H100 80GB HBM3, 100000000000000000000 MiB\n"})
    pr = site.probe(run=node, route_file=FIX / "proc_net_route.txt")
    for key in ("ib_hcas", "transport", "max_nodes", "gpu_memory_gb"):
        assert key not in pr.values and pr.missing[key].startswith("not written: "), key
    assert pr.values["gpus_per_node"] == 1 and pr.values["max_time_min"] == 240
    monkeypatch.setattr(site, "probe", lambda **kw: pr)
    assert main(["site", "probe", "--name", "lab", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "cluster" / "lab.yaml").read_text()
    data = yaml.safe_load(text)
    assert "evil" not in yaml.safe_dump(data["ib_hcas"]) and data["max_nodes"] == 6
    from vdkit.planner.calibration import FOLLOWS_GPU_TYPE

    assert data["gpu_memory_gb"] == FOLLOWS_GPU_TYPE  # not measured: the probed H100's reported total at compose


@pytest.mark.parametrize("name,text", [("123", "is not a cluster name"), ("null", "is not a cluster name"),
                                       ("True", "is not a cluster name"), ("xe9680", "is a cluster the kit ships")])
def test_names_that_would_break_or_shadow_a_cluster_are_refused(tmp_path, capsys, name, text):
    assert main(["site", "probe", "--name", name, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err and "fix:" in err and not any(tmp_path.iterdir())


def test_an_out_whose_cluster_is_a_file_or_a_loop_and_an_existing_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "cluster").write_text("x")
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "cluster").symlink_to(tmp_path / "loop" / "cluster")
    for out, text in (("f", "is not a directory"), ("loop", "is a loop of symbolic links")):
        assert main(["site", "probe", "--name", "lab", "--out", str(tmp_path / out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and text in err and "Traceback" not in err
    pr = site.probe(run=_fake_node, route_file=FIX / "proc_net_route.txt")
    monkeypatch.setattr(site, "probe", lambda **kw: pr)
    edited = tmp_path / "site" / "cluster" / "lab.yaml"
    edited.parent.mkdir(parents=True)
    edited.write_text("# edited by hand\nname: lab\n")
    assert main(["site", "probe", "--name", "lab", "--out", str(tmp_path / "site")]) == 2
    assert "is not overwritten" in capsys.readouterr().err and edited.read_text().startswith("# edited by hand")
    assert main(["site", "probe", "--name", "lab", "--out", str(tmp_path / "site"), "--force"]) == 0
    assert "ib_hcas" in edited.read_text()


@pytest.mark.parametrize("line,text", [
    ("partition: ${oc.env:HOME}", "partition: environment interpolation ${oc.env:...} is refused"),
    ("gpus_per_node: lots", "gpus_per_node: 'lots' is not a value of its type"),
    ("extra_key: 1", "extra_key is not a cluster key"),
    ("nödes: 2", "key 'nödes' is not a cluster key"),
    ("nccl_debug: x-${env:SECRET}", "nccl_debug: environment interpolation"),
])
def test_a_site_file_is_held_to_the_command_lines_rules(tmp_path, capsys, line, text):
    """A site file's ${oc.env:HOME} rendered `#SBATCH --partition=/root`; a wrong type, extra or Unicode key said
    only "ValidationError raised while composing config" with an unrelated fix."""
    conf = Path(__file__).resolve().parent.parent / "conf" / "cluster" / "xe9680.yaml"
    path = tmp_path / "cluster" / "lab.yaml"
    path.parent.mkdir()
    kept = [ln for ln in conf.read_text().splitlines() if not ln.startswith(line.split(":")[0] + ":")]
    path.write_text("\n".join(kept).replace("name: xe9680", "name: lab") + "\n" + line + "\n")
    (tmp_path / "cluster" / "fine.yaml").write_text(conf.read_text().replace("name: xe9680", "name: fine"))
    assert main(["plan", "--config-dir", str(tmp_path), "cluster=lab", "model=llama2_7b", "method=lora"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and text in err and "fix:" in err, err
    assert main(["plan", "--config-dir", str(tmp_path), "cluster=fine", "model=llama2_7b", "method=lora"]) == 0


def test_a_whole_file_that_is_empty_a_list_or_not_yaml_stops_only_the_command_that_chooses_it(tmp_path, capsys):
    """A list-shaped cluster file beside a good one stopped every command on the directory ("list.yaml is not a
    mapping" for cluster=fine), against the guide's "a broken file that no command chooses does not stop the
    others"; an empty one became cluster=empty planned as the schema's default xe9680."""
    conf = Path(__file__).resolve().parent.parent / "conf" / "cluster" / "xe9680.yaml"
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "fine.yaml").write_text(conf.read_text().replace("name: xe9680", "name: fine"))
    broken = {"empty": ("# to fill in\n", "is empty: cluster=empty would be the schema's defaults"),
              "listed": ("- a\n- b\n", "is not a mapping of cluster keys"),
              "tabbed": ("name: tabbed\n\tnodes: 2\n", "is not valid YAML")}
    for name, (text, _) in broken.items():
        (tmp_path / "cluster" / f"{name}.yaml").write_text(text)
    plan = ["plan", "--config-dir", str(tmp_path), "model=llama2_7b", "method=lora", "cluster.ib_hcas=[mlx5_0]"]
    assert main(plan + ["cluster=fine"]) == 0
    capsys.readouterr()
    for name, (_, said) in broken.items():
        assert main(plan + [f"cluster={name}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{name}.yaml" in err and said in err, err


def test_a_partition_that_cannot_be_checked_is_said_not_written():
    pr = site.probe(run=_hostile_node(sinfo=None), route_file=FIX / "proc_net_route.txt", partition="gpu")
    assert "partition" not in pr.values and "could not be checked" in pr.missing["partition"]
