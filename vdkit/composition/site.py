"""A site's own facts, read on a node: `vdkit site probe --name NAME --out DIR` -> DIR/cluster/NAME.yaml.

What it reads (each reader is a pure function of a command's text, tested on recorded outputs in
tests/fixtures/site/, sources in its SOURCES.md):

- the RDMA adapters and their link layers: ``ibv_devinfo`` (rdma-core), else /sys/class/infiniband;
  the active InfiniBand ports become ``cluster.ib_hcas`` (exact names: NCCL_IB_HCA's "=" list) with
  ``transport: ib``; only active Ethernet (RoCE) ports: ``transport: roce``; none: ``transport: tcp``
  with ``NCCL_IB_DISABLE=1``. Ethernet ports beside InfiniBand ones are the node's storage / front-end
  NICs (an XE9680's bonded ConnectX ports) and are left out of NCCL's list;
- the NIC to bootstrap on (``cluster.socket_ifname``): the interface of the default route (/proc/net/route);
- the GPUs: ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`` or ``rocm-smi
  --showproductname`` -> ``gpu_type``, ``gpu_memory_gb``, ``node_gpus``, ``gpus_per_node``, ``gpu_vendor``;
- the partition: ``sinfo -h -o "%P %l %D"`` -> ``max_time_min`` (its time limit), ``max_nodes`` (its nodes);
- the container runtime: ``enroot version`` and pyxis's ``--container-image`` in ``srun --help``;
- the PMI plugin srun starts the tasks with: ``srun --mpi=list`` -> ``mpi`` (pmix, else pmi2, else none: the
  default pmix on a Slurm built without it failed every step at its start);
- a storage write-speed sample on the run directory (written, fsync'ed, timed, removed)
  -> ``storage_write_gbps_per_node``.

What it cannot read it says, and leaves at the documented default (vdkit/composition/schema.py ClusterCfg). The
file names the fields it read in ``cluster.probed``; `vdkit render` lists the others as assumptions.
Standard library only (a login or compute node without the kit's engines runs it).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

# The cluster fields a site's facts decide: what `vdkit render` lists while they are still assumed.
SITE_FACTS = ("ib_hcas", "transport", "socket_ifname", "gpu_type", "gpu_memory_gb", "node_gpus", "max_time_min",
              "max_nodes", "storage_write_gbps_per_node", "startup_s", "mtbf_h")
SAMPLE_MB = 256  # storage sample: enough to pass a client's write cache burst on NFS, seconds on any disk
COMMAND_TIMEOUT_S = 20  # a hung `sinfo` (controller down) must not hang the probe


# ----------------------------------------------------------------------------- readers (pure)
def parse_ibv_devinfo(text: str) -> List[Tuple[str, int, str, str]]:
    """``ibv_devinfo`` -> [(device, port, state, link_layer)] ("PORT_ACTIVE", "InfiniBand" / "Ethernet")."""
    ports, dev, port = [], None, None
    state = layer = None
    for line in text.splitlines():
        m = re.match(r"\s*hca_id:\s*(\S+)", line)
        if m:
            dev, port = m.group(1), None
            continue
        m = re.match(r"\s*port:\s*(\d+)", line)
        if m and dev:
            port, state, layer = int(m.group(1)), None, None
            continue
        m = re.match(r"\s*state:\s*(\S+)", line)
        if m and port is not None:
            state = m.group(1)
        m = re.match(r"\s*link_layer:\s*(\S+)", line)
        if m and port is not None:
            layer = m.group(1)
            ports.append((dev, port, state or "?", layer))
    return ports


def read_sysfs_ports(root: Path = Path("/sys/class/infiniband")) -> List[Tuple[str, int, str, str]]:
    """The same list from sysfs (``<dev>/ports/<n>/state`` "4: ACTIVE", ``link_layer``)."""
    out = []
    if not root.is_dir():
        return out
    for dev in sorted(root.iterdir()):
        for pdir in sorted((dev / "ports").glob("*")):
            try:
                state = (pdir / "state").read_text().strip()
                layer = (pdir / "link_layer").read_text().strip()
            except OSError:
                continue
            out.append((dev.name, int(pdir.name), "PORT_ACTIVE" if "ACTIVE" in state else state, layer))
    return out


def fabric(ports) -> Dict[str, object]:
    """Adapters -> ``ib_hcas`` / ``transport`` / env (see the module docstring for the rule)."""
    active = [(d, layer) for d, _, state, layer in ports if state.startswith("PORT_ACTIVE")]
    ib = _natural([d for d, layer in active if layer == "InfiniBand"])
    eth = _natural([d for d, layer in active if layer == "Ethernet"])
    if ib:
        return {"ib_hcas": ib, "transport": "ib"}
    if eth:
        return {"ib_hcas": eth, "transport": "roce"}
    return {"ib_hcas": [], "transport": "tcp", "env": {"NCCL_IB_DISABLE": "1"}}


def _natural(names: List[str]) -> List[str]:
    return sorted(dict.fromkeys(names), key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])


def default_route_iface(route_text: str) -> Optional[str]:
    """/proc/net/route -> the interface of the default route (destination 00000000)."""
    for line in route_text.splitlines()[1:]:
        f = line.split()
        if len(f) > 2 and f[1] == "00000000":
            return f[0]
    return None


def gpu_types() -> Dict[str, str]:
    """nvidia-smi / rocm-smi product names -> the kit's gpu_type: each GPU's ``product_names`` in
    conf/calibration/hf_step_time.yaml ``gpus`` (the one home of a GPU's facts: what the kit predicts for)."""
    from vdkit.planner.calibration import load

    return {name: gpu for gpu, g in load("hf_step_time")["gpus"].items() for name in g["product_names"]}


def parse_nvidia_smi(text: str) -> Optional[Dict[str, object]]:
    """``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`` (or ``nvidia-smi -q``) -> GPU facts
    (memory in the planner's GB, 1e9 bytes, from nvidia-smi's MiB)."""
    from vdkit.planner.calibration import gb_of_bytes

    names, mems = [], []
    for line in text.splitlines():
        m = re.match(r"\s*(?:NVIDIA\s+)?(.+?),\s*(\d+)\s*MiB\s*$", line)
        if m:
            names.append(m.group(1).strip())
            mems.append(int(m.group(2)))
            continue
        m = re.match(r"\s*Product Name\s*:\s*(?:NVIDIA\s+)?(.+?)\s*$", line)
        if m:
            names.append(m.group(1))
    if not mems:  # -q: "FB Memory Usage" then "Total : 81559 MiB"
        mems = [int(x) for x in re.findall(r"FB Memory Usage\s*\n\s*Total\s*:\s*(\d+)\s*MiB", text)]
    if not names:
        return None
    name = names[0]
    mib = mems[0] if mems else None
    return {"gpu_vendor": "nvidia", "gpu_type": gpu_types().get(name, name.replace(" ", "-")),
            "gpu_memory_gb": gb_of_bytes(mib * 2**20) if mib else None, "node_gpus": len(names),
            "gpus_per_node": len(names), "product": name}


def parse_rocm_smi(text: str) -> Optional[Dict[str, object]]:
    """``rocm-smi --showproductname`` -> GPU facts (one "Card Series:" line per GPU)."""
    series = re.findall(r"Card [Ss]eries:\s*(.+?)\s*$", text, re.M)
    if not series:
        return None
    from vdkit.planner.calibration import capacity_gb

    types = gpu_types()
    name = next((k for k in types if k in series[0]), series[0])
    memory = capacity_gb(types[name]) if name in types else None  # rocm-smi's product line has no size
    return {"gpu_vendor": "amd", "gpu_type": types.get(name, name.replace(" ", "-")), "gpu_memory_gb": memory,
            "node_gpus": len(series), "gpus_per_node": len(series), "product": series[0]}


_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}")


def slurm_minutes(limit: str) -> Optional[int]:
    """A Slurm time limit ("4:00:00", "1-00:00:00", "2-12", "30", "UNLIMITED") -> minutes; None: unlimited, or not a
    time Slurm writes (sinfo's "-" for a partition without one, anything else): nothing is read from it."""
    limit = limit.strip()
    if limit.lower() in ("infinite", "unlimited", "n/a") or not _SLURM_TIME.fullmatch(limit):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        h, m = parts[0], (parts[1] if len(parts) > 1 else 0)
        return int(days) * 1440 + h * 60 + m
    if len(parts) == 3:  # hours:minutes:seconds
        return parts[0] * 60 + parts[1]
    return parts[0]  # minutes, or minutes:seconds


def parse_sinfo(text: str, partition: Optional[str] = None) -> Optional[Dict[str, object]]:
    """``sinfo -h -o "%P %l %D"`` -> the partition's time limit and nodes (the default, marked *, unless named)."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[2].isdigit():
            rows.append((f[0], f[1], int(f[2])))
    if not rows:
        return None
    pick = [r for r in rows if r[0].rstrip("*") == partition] if partition else [r for r in rows if r[0].endswith("*")]
    if partition and not pick:
        from vdkit.errors import UserError

        names = ", ".join(dict.fromkeys(r[0].rstrip("*") for r in rows))
        raise UserError(f"--partition {partition!r} is not a partition sinfo lists ({names})",
                        "pass one of those, or leave --partition out for the default partition")
    pick = pick or rows[:1]
    name = pick[0][0].rstrip("*")
    nodes = sum(r[2] for r in rows if r[0].rstrip("*") == name)  # one line per node state
    return {"partition": name, "max_time_min": slurm_minutes(pick[0][1]), "max_nodes": nodes}


# ----------------------------------------------------------------------------- the probe
Runner = Callable[[List[str]], Optional[str]]


MPI_PREFERENCE = ("pmix", "pmi2")  # srun's PMI plugins the kit's ranks start under, best first; else "none"


def parse_mpi_list(text: str) -> Optional[List[str]]:
    """``srun --mpi=list`` -> the plugin types it names (Slurm 22+: tab-indented words under "MPI plugin types
    are..."; older: "srun: TYPE" lines); None when it names none."""
    found = []
    for line in text.splitlines():
        word = line.strip()
        word = word[5:].strip() if word.startswith("srun:") else word
        if word and re.fullmatch(r"[a-z0-9_]+", word):
            found.append(word)
    return found or None


def run_command(argv: List[str]) -> Optional[str]:
    """A command's stdout, or None when it is missing, fails or hangs."""
    if not shutil.which(argv[0]):
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def storage_sample(directory: Path, mb: int = SAMPLE_MB) -> float:
    """GB/s of writing ``mb`` MB to ``directory`` and fsync'ing it (the file is removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".vdkit-write-sample-{os.getpid()}"
    block = os.urandom(1 << 20)  # incompressible: a compressing filesystem would flatter zeros
    start = time.perf_counter()
    try:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)
    return mb * (1 << 20) / 1e9 / max(seconds, 1e-9)


@dataclasses.dataclass
class Probe:
    """The facts read (cluster field -> value), where each came from, and what could not be read."""

    values: Dict[str, object] = dataclasses.field(default_factory=dict)
    sources: Dict[str, str] = dataclasses.field(default_factory=dict)
    missing: Dict[str, str] = dataclasses.field(default_factory=dict)  # field -> why it keeps its default
    notes: List[str] = dataclasses.field(default_factory=list)

    def read(self, source: str, **values) -> None:
        for k, v in values.items():
            if v is not None:
                self.values[k], self.sources[k] = v, source


def probe(run: Runner = run_command, sysfs: Path = Path("/sys/class/infiniband"),
          route_file: Path = Path("/proc/net/route"), storage_dir: Optional[Path] = None,
          sample_mb: int = SAMPLE_MB, partition: Optional[str] = None) -> Probe:
    """Read this node's facts (``run`` runs a command and returns its stdout or None)."""
    pr = Probe()
    text = run(["ibv_devinfo"])
    ports = parse_ibv_devinfo(text) if text else read_sysfs_ports(sysfs)
    source = "ibv_devinfo" if text else str(sysfs)
    if ports:
        f = fabric(ports)
        pr.read(source, ib_hcas=f["ib_hcas"], transport=f["transport"])
        if "env" in f:
            pr.values["env"] = f["env"]
    else:
        why = "no ibv_devinfo and no RDMA adapter in " + str(sysfs)
        pr.read(why, ib_hcas=[], transport="tcp")
        pr.values["env"] = {"NCCL_IB_DISABLE": "1"}
        pr.notes.append(f"no RDMA adapter found ({why}): transport tcp, NCCL_IB_DISABLE=1")
    try:
        iface = default_route_iface(route_file.read_text())
    except OSError:
        iface = None
    if iface:
        pr.read(f"{route_file} (default route)", socket_ifname=iface)
    else:
        pr.missing["socket_ifname"] = f"no default route in {route_file}"
    gpus = None
    for argv, parse in ((["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], parse_nvidia_smi),
                        (["rocm-smi", "--showproductname"], parse_rocm_smi)):
        out = run(argv)
        gpus = parse(out) if out else None
        if gpus:
            product = gpus.pop("product")
            pr.read(" ".join(argv[:1]) + f" ({product})", **gpus)
            break
    if not gpus:
        for k in ("gpu_type", "gpu_memory_gb", "node_gpus"):
            pr.missing[k] = "no nvidia-smi or rocm-smi answered (no GPU on this node?)"
    out = run(["sinfo", "-h", "-o", "%P %l %D"])
    part = parse_sinfo(out, partition) if out else None
    if part:
        pr.read(f"sinfo (partition {part['partition']})", max_nodes=part["max_nodes"], partition=part["partition"])
        if part["max_time_min"] is not None:
            pr.read(f"sinfo (partition {part['partition']})", max_time_min=part["max_time_min"])
        else:
            pr.missing["max_time_min"] = f"partition {part['partition']} has no time limit"
    else:
        for k in ("max_time_min", "max_nodes"):
            pr.missing[k] = "no sinfo answered (not a Slurm node?)"
        if partition:  # never written unchecked: a misspelt partition would only fail at sbatch
            pr.missing["partition"] = f"--partition {partition!r} could not be checked (no sinfo answered): not written"
    out = run(["srun", "--mpi=list"])
    kinds = parse_mpi_list(out) if out else None
    if kinds:
        pr.read(f"srun --mpi=list ({', '.join(kinds)})", mpi=next((k for k in MPI_PREFERENCE if k in kinds), "none"))
    else:
        pr.missing["mpi"] = "no srun --mpi=list answered (not a Slurm node?)"
    enroot = run(["enroot", "version"])
    srun_help = run(["srun", "--help"]) or ""
    pyxis = "--container-image" in srun_help
    pr.notes.append(f"container runtime: enroot {enroot.strip() if enroot else 'not found'}, "
                    f"pyxis {'found' if pyxis else 'not found'} (engines that run in a container need both)")
    if storage_dir is not None:
        try:
            gbps = storage_sample(storage_dir, sample_mb)
            pr.read(f"a {sample_mb} MB fsync'ed write to {storage_dir}", storage_write_gbps_per_node=round(gbps, 3))
        except OSError as exc:
            pr.missing["storage_write_gbps_per_node"] = f"could not write to {storage_dir}: {exc.strerror or exc}"
    else:
        pr.missing["storage_write_gbps_per_node"] = "no --run-dir to sample"
    for k in ("startup_s", "mtbf_h"):
        pr.missing[k] = "not readable on a node (startup_s: a job's log; mtbf_h: your incident history)"
    bound_facts(pr)
    return pr


# What a probed fact may be before it is written (a node's answer out of these is not a fact of an XE9680-class
# node: e.g. sinfo's 0 nodes of a drained partition, a broken driver's 1e17 GB, an adapter name a shell would run).
FACT_BOUNDS = {"gpus_per_node": (1, 64), "node_gpus": (1, 64), "gpu_memory_gb": (1, 4096), "max_nodes": (1, 100_000),
               "max_time_min": (1, 366 * 1440), "storage_write_gbps_per_node": (1e-4, 1e4)}
FACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+@-]{0,63}")  # adapters, NICs, GPU types, partitions


def bound_facts(pr: Probe) -> None:
    """Move every probed value outside :data:`FACT_BOUNDS` (or a name outside :data:`FACT_NAME`) from the facts
    to ``missing`` with the value it had: the file keeps the documented default and says why."""
    for key, value in list(pr.values.items()):
        why = None
        if key in FACT_BOUNDS:
            lo, hi = FACT_BOUNDS[key]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
            why = None if ok else f"the node said {value!r}, outside {lo}..{hi}"
        elif key in ("ib_hcas", "socket_ifname", "gpu_type", "partition"):
            names = value if isinstance(value, list) else [value]
            bad = [n for n in names if not isinstance(n, str) or not FACT_NAME.fullmatch(n)]
            why = f"the node named {bad[0]!r}, not an adapter / interface / GPU name" if bad else None
        if why:
            pr.values.pop(key)
            pr.sources.pop(key, None)
            pr.missing[key] = f"not written: {why}"
            if key == "ib_hcas":  # the transport was read from the same adapters
                pr.values.pop("transport", None)
                pr.sources.pop("transport", None)
                pr.missing["transport"] = "not written: read from the adapters above"


def cluster_yaml(name: str, pr: Probe, base: dict) -> str:
    """The cluster file: ``base`` (the ClusterCfg defaults) with the probed values, commented per field."""
    import yaml

    from vdkit.planner.calibration import FOLLOWS_GPU_TYPE

    data = {**base, **{k: v for k, v in pr.values.items() if k != "env"}, "name": name, "launcher": "slurm"}
    if "gpu_memory_gb" not in pr.values:  # not measured: the capacity follows the file's (or a command line's) GPU
        data["gpu_memory_gb"] = FOLLOWS_GPU_TYPE
    data["env"] = {**(base.get("env") or {}), **(pr.values.get("env") or {})}
    data["probed"] = sorted(k for k in pr.sources if k in SITE_FACTS)
    lines = [f"# cluster {name}: written by `vdkit site probe` on {os.uname().nodename} at "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}.",
             f"# Use it with: vdkit plan --config-dir <this file's grandparent> cluster={name} ...",
             "# Read on the node (field: source):"]
    lines += [f"#   {k}: {pr.sources[k]}" for k in sorted(pr.sources)]
    lines += ["# Left at the documented default (vdkit/composition/schema.py ClusterCfg), not readable here:"]
    lines += [f"#   {k}: {why}" for k, why in sorted(pr.missing.items())]
    lines += [f"# {n}" for n in pr.notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)
