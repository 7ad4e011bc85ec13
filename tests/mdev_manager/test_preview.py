"""Previews without copying the host (issue #37, point 6): the agent's rounds planned on the node
in memory (:func:`mdev_manager.preview.preview`, the kernel's steps applied to the inventory by
:func:`mdev_manager.expect.expected`) leave the node exactly as the agent's real rounds read it
back, write nothing, and never read a device that does not exist yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_bridge.api import compat
from dra_bridge.pool.shape import choose_shape, node_pool
from dra_bridge.pool.slices import plan_slices
from mdev_manager.actions import EnableVfs, Plan
from mdev_manager.config import load_config
from mdev_manager.discovery import discover
from mdev_manager.expect import expected
from mdev_manager.models import Inventory
from mdev_manager.preview import preview
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node
from tests.mdev_manager.test_overlay import snapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def comparable(inv: Inventory) -> list[dict]:
    """What a preview can know: everything discovery reads but the kernel's own choices (the new VFs'
    IOMMU groups and vfio cdevs, an mdev's random UUID and its IOMMU group)."""
    out = []
    for g in inv.gpus:
        d = g.model_dump()
        for vf in d["vfs"]:
            vf["iommu_group"] = vf["vfio_dev"] = None
        d["vgpus"] = sorted((v["type_id"], v["parent"] if v["framework"] != "mdev" else "", v["gpu_instance"],
                             v["placement_id"]) for v in d["vgpus"])
        if d["mig"]:
            for gi in d["mig"]["instances"]:
                gi["vgpu"], gi["vgpus"] = bool(gi["vgpu"]), len(gi["vgpus"])
        for p in d["parents"]:
            p["types"] = sorted((t["id"], t["available_instances"]) for t in p["types"])
        out.append(d)
    return out


def slices(inv: Inventory, layouts) -> list[dict]:
    version = (1, 37)
    kept = compat.kept_by_gates(version, compat.resolve(version, {"DRADeviceCompatibilityGroups": True}))
    shape = choose_shape(version, kept)
    pool = node_pool(inv, layouts, "gpu.vgpuctl.io", shape)
    return plan_slices(pool, driver="gpu.vgpuctl.io", node_name="n", pool_name="n", generation=1,
                       server_version=shape.version).slices


CASES = [  # preset, layout file, layout, the layout applied before (None: a cold node), GPUs NVML has not named yet
    ("a100-node", "mig-layout.yaml", "dra", None, ()),  # 8 x 16 VFs, then MIG mode (README's benchmark row)
    ("default", "layout.yaml", "default", None, ()),  # mdev on the PF, mdev on VFs, vendor VFIO, passthrough
    ("mixed-node", "mixed-size-layout.yaml", "default", None, ()),  # mixed-size mode, placements
    ("rtxpro-node", "rtxpro-layout.yaml", "default", None, ()),  # MIG time-slicing: placements inside instances
    ("mig-node", "mig-layout.yaml", "default", "dra", ()),  # GPU instances and MIG-backed vGPUs on a MIG node
    ("b200-node", "b200-layout.yaml", "dra", "default", ()),  # vGPUs and instances removed again
    ("rtxpro-node", "rtxpro-layout.yaml", "dra", "default", (3,)),  # a passed-through GPU back on nvidia
    ("default", "layout.yaml", "dra", "default", ()),  # a passed-through T4 back to mdev on its PF, vGPUs removed
]


@pytest.mark.parametrize("preset, file, name, before, unnamed", CASES,
                         ids=[f"{c[0]}-{c[2]}" + (f"-after-{c[3]}" if c[3] else "") for c in CASES])
def test_the_preview_is_the_node_the_agent_leaves(tmp_path, preset, file, name, before, unnamed):
    node = sim_node(tmp_path / "node", preset)
    layouts = load_config(EXAMPLES / file, name)
    if before:
        assert reconcile(node.env, node.io, load_config(EXAMPLES / file, before), node="n").ok
    pv = preview(node.env, node.io, layouts, node="n")
    assert pv.ok and pv.plans, (pv.failed, pv.unfinished)
    shown = slices(pv.inventory, layouts)

    out = reconcile(node.env, node.io, layouts, node="n")  # the agent's rounds, on the same node
    assert out.ok and len(out.rounds) == len(pv.plans)
    applied = discover(node.env, node.io, node="n")
    for gpu in unnamed:  # NVML names a GPU (its UUID) once it is on nvidia again: the preview cannot
        applied.gpus[gpu].mig.uuid = None
    assert comparable(pv.inventory) == comparable(applied)
    assert shown == slices(applied, layouts)


class Recording:
    """A transport that notes every path it is asked about, and every write."""

    WRITES = ("write", "write_atomic", "remove", "rename", "makedirs", "rmdir")

    def __init__(self, io: Any) -> None:
        self._io, self.paths, self.writes = io, [], []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._io, name)
        if not callable(target) or name == "nvml":
            return target

        def call(*args: Any, **kw: Any) -> Any:
            self.paths += [str(a) for a in args if isinstance(a, (str, Path))]
            if name in self.WRITES:
                self.writes.append((name, args))
            return target(*args, **kw)
        return call


def test_a_preview_writes_nothing_and_reads_no_vf_before_it_exists(tmp_path):
    node = sim_node(tmp_path / "node", "a100-node")
    discover(node.env, node.io)  # the simulator makes its lock file on its first NVML read
    before = snapshot(tmp_path / "node")
    io = Recording(node.io)
    layouts = load_config(EXAMPLES / "mig-layout.yaml", "dra")
    pv = preview(node.env, io, layouts, node="n")  # type: ignore[arg-type]
    assert pv.ok and sum(isinstance(a, EnableVfs) for p in pv.plans for a in p.actions) == 8
    vfs = {vf.address for g in pv.inventory.gpus for vf in g.vfs}
    assert len(vfs) == 8 * 16
    assert io.paths, "the recorder saw nothing: the test would pass whatever the preview read"
    assert not [p for p in io.paths if any(vf in p for vf in vfs)]
    assert io.writes == []
    assert snapshot(tmp_path / "node") == before
    assert all(not g.vfs for g in discover(node.env, node.io).gpus)


def test_expected_copies_only_the_gpus_a_step_touches(tmp_path):
    node = sim_node(tmp_path / "node", "a100-node")
    inv = discover(node.env, node.io)
    first = inv.gpus[0]
    out = expected(inv, Plan(actions=[EnableVfs(gpu=first.address, count=16)]))
    assert all(a is b for a, b in zip(out.inventory.gpus[1:], inv.gpus[1:], strict=True))
    assert len(out.inventory.gpus[0].vfs) == 16 and not first.vfs and not first.types  # the original is untouched
    assert out.inventory.gpus[0].framework == "mdev-sriov" and out.inventory.gpus[0].types
    assert any("VFs at devfn offset 4" in a for a in out.assumptions)  # the guess is said
