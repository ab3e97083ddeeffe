"""vdkit.launch.fabric: every rank's NCCL / RCCL variables from the cluster's data, in a fixed order, refused in one line
where a shell or NCCL could not take them. Pure functions: a plan stand-in with a real ClusterCfg is enough."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from vdkit.launch import fabric
from vdkit.errors import UserError
from vdkit.composition.schema import ClusterCfg


def plan_of(**cluster) -> SimpleNamespace:
    return SimpleNamespace(recipe=SimpleNamespace(cluster=dataclasses.replace(ClusterCfg(), **cluster)))


def test_adapters_are_matched_exactly():
    # without the leading '=' NCCL matches prefixes: mlx5_1 would also select mlx5_10
    assert fabric.ib_hca_value(["mlx5_0", "mlx5_3:1"]) == "=mlx5_0,mlx5_3:1"
    with pytest.raises(UserError, match="'mlx5 0' is not an adapter name"):
        fabric.ib_hca_value(["mlx5 0"])


def test_the_order_cluster_then_env_then_engine_then_debug():
    env = fabric.job_env(plan_of(ib_hcas=["mlx5_0"], socket_ifname="bond0", nccl_debug="info",
                                 env={"NCCL_NVLS_ENABLE": "0", "NCCL_IB_GID_INDEX": "3"}),
                         {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert list(env.items()) == [("NCCL_IB_HCA", "=mlx5_0"), ("NCCL_SOCKET_IFNAME", "bond0"),
                                 ("GLOO_SOCKET_IFNAME", "bond0"), ("NCCL_NVLS_ENABLE", "0"),
                                 ("NCCL_IB_GID_INDEX", "3"), ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
                                 ("NCCL_DEBUG", "INFO")]


def test_nothing_is_set_that_the_cluster_does_not_ask_for():
    assert fabric.job_env(plan_of(ib_hcas=[], socket_ifname=None, nccl_debug=None, env={})) == {}


@pytest.mark.parametrize("cluster, engine_env, words", [
    ({"socket_ifname": "eth0; rm -rf /"}, None, "is not an interface name"),
    ({"env": {"A-B": "1"}}, None, "which a shell cannot export"),
    ({"env": {"NCCL_X": "a\nb"}}, None, "contains a control character"),
    ({}, {"BAD NAME": "1"}, "the engine asks for an environment variable named"),
    ({"nccl_debug": "LOUD"}, None, "is not an NCCL_DEBUG level"),
])
def test_what_a_shell_or_nccl_cannot_take_is_one_line(cluster, engine_env, words):
    with pytest.raises(UserError, match=words) as info:
        fabric.job_env(plan_of(**cluster), engine_env)
    assert "\n" not in str(info.value)


def test_nccl_debug_levels_have_one_home():
    """Composition's field rules (vdkit.composition.fields) refuse the same levels the fabric exports: one tuple, in
    fabric.py."""
    from vdkit.composition import fields

    assert fields.NCCL_DEBUG_LEVELS is fabric.NCCL_DEBUG_LEVELS
    for level in fabric.NCCL_DEBUG_LEVELS:
        assert fabric.job_env(plan_of(nccl_debug=level.lower()))["NCCL_DEBUG"] == level


def test_the_comment_names_the_fabric_and_the_library_from_data():
    assert fabric.fabric_comment(dataclasses.replace(ClusterCfg(), name="x", gpu_vendor="amd", transport="roce")) \
        == "# RCCL over RoCE (RDMA over Converged Ethernet), from cluster x"
    assert fabric.fabric_comment(dataclasses.replace(ClusterCfg(), name="y", gpu_vendor="nvidia", transport="tcp")) \
        == "# NCCL over TCP sockets (no RDMA), from cluster y"
