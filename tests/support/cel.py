"""A catalog node's published ResourceSlices, and DRA selection over them with real CEL.

The node is the ``default`` simulated host (two T4 on mdev, an A100 with mdev on SR-IOV VFs,
an L40S with vendor-specific VFIO) with every GPU handed to DRA, published the way
``vgpuctl serve`` publishes it. Selection uses :mod:`dra_bridge.scheduling.cel` (the
``common-expression-language`` package plus the Kubernetes quantity library).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.pool.devices import Pool, PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.cel import claim_spec_of, request_alternatives, select, slice_devices
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.models import Inventory
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node

DRIVER = DEFAULT_DRIVER
ALL_DRA = {"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}}

_keep: list[tempfile.TemporaryDirectory] = []


@cache
def catalog_inventory(preset: str = "default") -> Inventory:
    """The simulated node after the agent prepared every GPU for DRA (VFs enabled)."""
    tmp = tempfile.TemporaryDirectory(prefix="vgpuctl-cel-")
    _keep.append(tmp)
    sim = sim_node(Path(tmp.name), preset)
    out = reconcile(sim.env, sim.io, parse_config(ALL_DRA))
    assert out.ok, out
    return discover(sim.env, sim.io, node=sim.node)


@cache
def catalog_pool(preset: str = "default", server_version: tuple[int, int] = (1, 37)) -> Pool:
    return build_pool(catalog_inventory(preset), PoolPolicy.default(), DRIVER, server_version=server_version)


@cache
def _slices(preset: str, server_version: tuple[int, int]) -> tuple:
    node = catalog_inventory(preset).node
    slices = build_slices(catalog_pool(preset, server_version), driver=DRIVER, node_name=node, pool_name=node,
                          generation=1, server_version=server_version)
    return tuple(slices)


def catalog_slices(preset: str = "default", server_version: tuple[int, int] = (1, 37)) -> list[dict[str, Any]]:
    return list(_slices(preset, server_version))


def foreign_slice() -> dict[str, Any]:
    """A slice of another driver on the same node, whose devices must never be selected."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "sim-node-1-gpu-nvidia-com-0"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "sim-node-1",
            "pool": {"name": "sim-node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA A100"}},
                 "capacity": {"memory": {"value": "40Gi"}}},
                {"name": "gpu-vfio-1", "attributes": {"type": {"string": "vfio"}}},
            ],
        },
    }


def selected_names(slices: Iterable[Mapping[str, Any]], expressions: Iterable[str]) -> set[str]:
    """Names of the devices (``driver/pool/device``-unique here) all ``expressions`` select."""
    return {d.name for d in select(slice_devices(slices), expressions)}


def classes_by_name(objects: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o.get("kind") == "DeviceClass"}


def claim_selection(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]],
                    slices: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """For each request (``req`` or ``req/sub`` for firstAvailable) of a claim or claim template,
    the devices its class and its own selectors select."""
    devices = slice_devices(slices)
    out: dict[str, set[str]] = {}
    for r in claim_spec_of(claim)["devices"]["requests"]:
        for name, exprs in request_alternatives(r, classes).items():
            out[name] = {d.name for d in select(devices, exprs)}
    return out
