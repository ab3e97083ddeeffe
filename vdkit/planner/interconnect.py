"""The inter-node fabric a plan assumes: bandwidth per node, latency per ring step, and where they come from.

One home for every regime (vdkit.planner.predict's fused / unfused stacks, vdkit.planner.predict_hf's
transformers stack): the cluster's ``transport`` (ib | roce | tcp), its adapters (``cluster.ib_hcas``) and,
when a site measured it, ``cluster.inter_node_gb_s`` (nccl-tests / rccl-tests all_gather_perf across two
nodes: what `vdkit site probe` or the site engineer writes into the cluster file). The figures per
transport - adapter line rates, the TCP default, the latency of one ring step - are data with their
sources in conf/calibration/hf_step_time.yaml (``adapter_gb_s``, ``fabric``).

Precedence: the site's measured ``inter_node_gb_s``, else adapters x the transport's usable rate per
adapter (InfiniBand, RoCE), else the transport's stated per-node default (TCP without RDMA adapters: the
sockets transport over the bootstrap interface). The plan and the render print which one was used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Fabric:
    """What the plan assumes of the inter-node fabric."""

    transport: str
    node_gb_s: float  # usable bandwidth per node and direction (GB/s), as collectives reach it
    latency_us: float  # one ring step across nodes
    source: str  # "cluster" (its inter_node_gb_s), "adapters" or "default": which figure was used
    why: str  # the figure's source, for the plan's line

    def per_gpu_gb_s(self, gpus_per_node: int) -> float:
        """The node's bandwidth shared by its GPUs (each GPU's rail in a ring that crosses nodes)."""
        return self.node_gb_s / max(1, gpus_per_node)

    def line(self) -> str:
        """The plan's / render's one line: the transport and the figures assumed, with their source."""
        return (f"{self.transport.upper() if self.transport != 'roce' else 'RoCE'}: {self.node_gb_s:.3g} GB/s per "
                f"node, {self.latency_us:g} us per inter-node ring step ({self.why})")


def _table() -> dict:
    from vdkit.planner.calibration import load

    return load("hf_step_time")


def interconnect(cluster, calib: Optional[dict] = None) -> Fabric:
    """The fabric ``cluster`` gives a plan (see the module docstring for the precedence)."""
    calib = calib or _table()
    t = cluster.transport
    row = (calib.get("fabric") or {}).get(t) or {}
    latency = float(row["latency_us"])
    if cluster.inter_node_gb_s:
        return Fabric(t, float(cluster.inter_node_gb_s), latency, "cluster",
                      "cluster.inter_node_gb_s, the cluster file's figure")
    rate = (calib.get("adapter_gb_s") or {}).get(t)
    if rate is not None:  # RDMA: the listed adapters, else every one NCCL finds (the file's default count)
        n = len(cluster.ib_hcas) or int(row["default_adapters"])
        listed = "" if cluster.ib_hcas else " (none listed: NCCL takes every active adapter; the file's default count)"
        return Fabric(t, n * float(rate), latency, "adapters",
                      f"{n} adapter(s) x {float(rate):g} GB/s{listed}, {row.get('adapter', 'datasheet')}; measure "
                      "yours with all_gather_perf and set cluster.inter_node_gb_s")
    return Fabric(t, float(row["gb_s_per_node"]), latency, "default",
                  f"assumed: {row.get('source', 'no source')}; measure yours with all_gather_perf and set "
                  "cluster.inter_node_gb_s")
