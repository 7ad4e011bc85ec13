"""What one 8-GPU node puts in etcd (issue #13/#15): devices, slices and bytes of its ResourceSlices.

For 8 x T4, 8 x L40S, 8 x A100-40GB and 8 x H100-80GB nodes in ``dra`` mode (every vGPU type
offered; the A100 and H100 also in MIG mode, ``migMode: true``), the pool our agent publishes for
Kubernetes 1.36 (one vGPU size per GPU: no compatibility groups) and 1.37 (every size, kept apart
by compatibility groups), as JSON the way the publisher sends it. Beside it, NVIDIA's DRA driver
on the same GPUs: one device per MIG placement plus the full GPU (MIG GPUs, counted from the
profile and placement tables in ``catalog_mig``), one per GPU otherwise.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from dra_bridge.pool.devices import PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from mdev_manager.catalog_mig import mig_profiles
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from mdev_manager.sim.node import sim_node

from .common import HEADER, row

DRA_ALL = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})
DRA_MIG = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra",
                                                                          "migMode": True}]}})
CASES = (("T4", DRA_ALL, ""), ("L40S", DRA_ALL, ""), ("A100-40GB", DRA_ALL, ""), ("A100-40GB", DRA_MIG, " MIG"),
         ("H100-80GB", DRA_MIG, " MIG"))


def nvidia_devices_per_gpu(board: str) -> int:
    """NVIDIA's DRA driver: the full GPU plus one device per MIG placement of every profile."""
    return 1 + sum(len(p.placements) for p in mig_profiles(board))


def run() -> list[str]:
    lines = ["ResourceSlices of one 8-GPU node (dra mode, every type offered)", HEADER]
    with tempfile.TemporaryDirectory(prefix="vgsize") as d:
        for k, (board, layouts, mode) in enumerate(CASES):
            sim = sim_node(Path(d) / f"{k}-{board}", HostSpec(name=board, node=f"n-{board.lower()}",
                                                               gpus=[GpuGroup(board=board, count=8)]))
            reconcile(sim.env, sim.io, layouts)
            inv = discover(sim.env, sim.io)
            peer = 8 * nvidia_devices_per_gpu(board)
            for version in ((1, 36), (1, 37)):
                pool = build_pool(inv, PoolPolicy.default(), "vgpu.kubevirt.io", server_version=version)
                slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name=sim.node, pool_name=sim.node,
                                      generation=1, server_version=version)
                size = sum(len(json.dumps(s, separators=(",", ":"))) for s in slices)
                lines.append(row(f"8 x {board}{mode}, {version[0]}.{version[1]}: devices", str(len(pool.devices)), str(peer),
                                 len(pool.devices) / peer, f"{len(slices)} slices, {size / 1024:.0f} KiB; peer: NVIDIA's "
                                                           "DRA driver (MIG placements + full GPU)"))
    return lines
