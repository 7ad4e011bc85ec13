"""apply end to end on simulated hosts: discover, plan, execute, until the node matches.

Covers the presets, idempotence, passthrough both ways, in-use protection with real
witnesses (a child process holding ``/dev/vfio/<group>``, a libvirt ``test:///`` domain)
and simulated ones (a QEMU process of the simulated host),
per-device kernel errors through a faulty transport, restore after a reboot, and bad
input rejected before any write.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mdev_manager import catalog, persist
from mdev_manager.config import ConfigError, load_config, parse_config
from mdev_manager.discovery import discover
from mdev_manager.models import MdevDefinition
from mdev_manager.plan import offered_types, resolve_type, select_gpus
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim import HostSpec, SimIO
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import (
    EXAMPLE_LAYOUT,
    Sim,
    build_sim,
    copy_sim,
    file_tree,
    layout,
    libvirt_missing,
    libvirt_node_xml,
    needs_libvirt,
)


# --------------------------------------------------------------------------- helpers
class CountingIO(SimIO):
    """Records every write the manager makes (kernel attributes and saved state)."""

    def __init__(self, host):
        super().__init__(host)
        self.writes: list[str] = []

    def write(self, path, data):
        self.writes.append(f"write {path}")
        super().write(path, data)

    def write_atomic(self, path, data, **kw):
        self.writes.append(f"write_atomic {path}")
        super().write_atomic(path, data, **kw)

    def remove(self, path):
        self.writes.append(f"remove {path}")
        super().remove(path)


class FaultyIO(SimIO):
    """Fails writes to chosen paths with a chosen errno, as a kernel or vendor driver would."""

    def __init__(self, host, faults: dict[Path, int]):
        super().__init__(host)
        self.faults = {os.path.realpath(p): e for p, e in faults.items()}
        self.hit: list[str] = []

    def write(self, path, data):
        code = self.faults.get(os.path.realpath(path))
        if code is not None:
            self.hit.append(str(path))
            raise OSError(code, os.strerror(code))
        super().write(path, data)


def example_doc() -> dict:
    return yaml.safe_load(EXAMPLE_LAYOUT.read_text())


def apply(sim: Sim, layouts, io=None, **kw):
    return reconcile(sim.env, io or sim.io, layouts, **kw)


def vgpu_counts(inv) -> Counter:
    return Counter((v.gpu, v.type_id) for v in inv.all_vgpus())


def wanted_counts(inv, layouts) -> Counter:
    """What a layout asks for, resolved against the inventory's offered types."""
    out = Counter()
    for addr, entry in select_gpus(inv, layouts).items():
        if entry.mode != "vgpu":
            continue
        for ref, n in entry.vgpus.items():
            if n:
                out[(addr, resolve_type(offered_types(inv.gpu(addr)), ref).id)] += n
    return out


def assert_persisted_exactly(sim: Sim):
    """Every vGPU has exactly one saved definition or record, and every saved one a vGPU."""
    inv = sim.discover()
    mdevs = sorted((v.parent, v.id, v.type_id) for v in inv.all_vgpus() if v.framework == "mdev")
    defs = sorted((d.parent, d.uuid, d.mdev_type) for d in sim.definitions())
    assert mdevs == defs
    vendor = {v.id: v.type_id for v in inv.all_vgpus() if v.framework == "vendor-vfio"}
    assert vendor == sim.records()
    ids = [v.id for v in inv.all_vgpus()]
    assert len(ids) == len(set(ids))



def type_id(board_key: str, short: str) -> str:
    b = catalog.board(board_key)
    t = next(t for t in b.types if t.short_name == short)
    return str(t.num) if b.framework == "vendor-vfio" else t.mdev_id(b.driver)


def gpu_by_board(inv, key: str, nth: int = 0):
    b = catalog.board(key)
    return [g for g in inv.gpus if (g.device_id, g.subsystem_device_id) == (b.device_id, b.subsystem_device_id)][nth]


@pytest.fixture(scope="module")
def applied_default(tmp_path_factory) -> Path:
    """A default-preset host with examples/layout.yaml applied; tests work on copies."""
    root = tmp_path_factory.mktemp("applied") / "host"
    sim = build_sim(root, "default")
    out = apply(sim, load_config(EXAMPLE_LAYOUT))
    assert out.ok, out
    return root


@pytest.fixture
def applied(applied_default, tmp_path) -> Sim:
    return copy_sim(applied_default, tmp_path / "host")


# --------------------------------------------------------------------------- presets, twice
PRESET_LAYOUTS = {
    "default": None,  # examples/layout.yaml
    "a100-node": [{"all": True, "vgpus": {"A100-10C": 4}}],
    "l40s-node": [{"index": 0, "vgpus": {"L40S-24Q": 2}}, {"index": 1, "vgpus": {"NVIDIA L40S-12Q": 4}},
                  {"index": 2, "mode": "passthrough"}, {"index": 3, "mode": "dra"}],
    "workstation": [{"index": 0, "vgpus": {"GVTg_V5_4": 2, "GVTg_V5_8": 1}}, {"index": 1, "mode": "passthrough"}],
}


@pytest.mark.parametrize("preset", list(PRESET_LAYOUTS))
def test_apply_presets_then_again_is_a_no_op(make_sim, preset):
    sim = make_sim(preset)
    layouts = load_config(EXAMPLE_LAYOUT) if PRESET_LAYOUTS[preset] is None else layout(*PRESET_LAYOUTS[preset])
    out = apply(sim, layouts)
    assert out.ok and out.changed > 0
    assert all(r.report is not None and not r.report.failed for r in out.rounds)
    inv = sim.discover()
    assert vgpu_counts(inv) == wanted_counts(inv, layouts)
    assert_persisted_exactly(sim)
    for addr, entry in select_gpus(inv, layouts).items():
        gpu = inv.gpu(addr)
        if entry.mode == "passthrough":
            assert set(gpu.iommu_group_drivers.values()) == {"vfio-pci"}
            assert sim.env.vfio_group(gpu.iommu_group).exists()
            if inv.iommufd:
                assert gpu.vfio_dev is not None
        elif entry.mode in ("vgpu", "dra"):
            board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
            assert gpu.driver == board.driver
            if board.framework != "mdev":
                assert gpu.sriov_num_vfs == gpu.sriov_total_vfs  # prepared for vGPUs, also in dra mode
        if entry.mode == "dra":
            assert gpu.vgpus == []  # the DRA bridge creates vGPUs per claim
    before = file_tree(sim.root)

    io = CountingIO(sim.host)
    again = apply(sim, layouts, io=io)
    assert again.ok and again.changed == 0
    assert io.writes == []
    assert all(r.plan.actions == [] for r in again.rounds)
    assert file_tree(sim.root) == before


def test_dry_run_writes_nothing(sim):
    io = CountingIO(sim.host)
    before = file_tree(sim.root)
    out = apply(sim, load_config(EXAMPLE_LAYOUT), io=io, dry_run=True)
    assert io.writes == [] and file_tree(sim.root) == before
    (rnd,) = out.rounds
    assert rnd.report is None and rnd.plan.actions


# --------------------------------------------------------------------------- passthrough
def test_passthrough_binds_every_group_function_and_back(make_sim):
    sim = make_sim("workstation")
    t4 = sim.discover().gpus[1]
    assert len(t4.iommu_group_members) == 2  # GPU + HDA audio
    out = apply(sim, layout({"index": 1, "mode": "passthrough"}))
    assert out.ok
    inv = sim.discover()
    gpu = inv.gpu(t4.address)
    assert gpu.iommu_group_drivers == {m: "vfio-pci" for m in t4.iommu_group_members}
    assert gpu.framework == "none" and gpu.types == []
    node = sim.env.vfio_group(gpu.iommu_group)
    assert node.exists()

    # back to vGPUs: each function returns to its native driver, then vGPUs are made
    out = apply(sim, layout({"index": 1, "vgpus": {"T4-4Q": 2}}))
    assert out.ok and len(out.rounds) == 2  # driver round, then the vGPU round on the re-discovered GPU
    inv = sim.discover()
    gpu = inv.gpu(t4.address)
    audio = next(m for m in t4.iommu_group_members if m != t4.address)
    assert gpu.iommu_group_drivers == {t4.address: "nvidia", audio: "snd_hda_intel"}
    assert gpu.driver_override is None
    assert not node.exists()
    assert vgpu_counts(inv) == Counter({(t4.address, type_id("T4", "T4-4Q")): 2})
    assert_persisted_exactly(sim)


def test_sriov_gpu_from_passthrough_to_vgpu_in_one_apply(make_sim):
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="L40S", driver="vfio-pci"), GpuGroup(board="A100-40GB", driver="vfio-pci")]))
    inv = sim.discover()
    assert all(g.driver == "vfio-pci" and sim.env.vfio_group(g.iommu_group).exists() for g in inv.gpus)
    layouts = layout({"index": 0, "vgpus": {"L40S-8Q": 2}}, {"index": 1, "vgpus": {"A100-20C": 2}})
    out = apply(sim, layouts)
    # native driver, then VFs, then vGPUs: three rounds, each planned on what the GPU offers then
    assert out.ok and len(out.rounds) == 3
    after = sim.discover()
    assert vgpu_counts(after) == wanted_counts(after, layouts)
    for g in after.gpus:
        assert g.driver == "nvidia" and g.sriov_num_vfs == g.sriov_total_vfs
        assert not sim.env.vfio_group(g.iommu_group).exists()
    assert_persisted_exactly(sim)
    assert apply(sim, layouts).changed == 0


def test_vgpu_gpu_to_passthrough_clears_vgpus_vfs_and_saved_state(applied):
    inv = applied.discover()
    doc = example_doc()
    l40s = gpu_by_board(inv, "L40S")
    a100 = gpu_by_board(inv, "A100-40GB")
    doc["layouts"]["default"][2] = {"model": "A100", "mode": "passthrough"}
    doc["layouts"]["default"][3] = {"pciAddress": l40s.address, "mode": "passthrough"}
    out = apply(applied, parse_config(doc))
    assert out.ok
    inv = applied.discover()
    for addr in (a100.address, l40s.address):
        g = inv.gpu(addr)
        assert g.vgpus == [] and g.sriov_num_vfs == 0 and g.driver == "vfio-pci"
        assert applied.env.vfio_group(g.iommu_group).exists()
    assert applied.records() == {}
    assert {d.parent for d in applied.definitions()} == {gpu_by_board(inv, "T4").address}
    assert_persisted_exactly(applied)


# --------------------------------------------------------------------------- layout changes
def test_layout_change_leaves_existing_matching_devices_untouched(applied):
    before = applied.discover()
    old_ids = {v.id for v in before.all_vgpus()}
    doc = example_doc()
    doc["layouts"]["default"][2]["vgpus"] = {"A100-4C": 8}
    doc["layouts"]["default"][3]["vgpus"] = {"NVIDIA L40S-8Q": 5}
    out = apply(applied, parse_config(doc))
    assert out.ok
    steps = [r.step for rnd in out.rounds for r in rnd.report.results]
    assert not any(i in s for s in steps for i in old_ids)  # no step names an existing device
    after = applied.discover()
    assert old_ids <= {v.id for v in after.all_vgpus()}
    assert len(after.all_vgpus()) == len(old_ids) + 3
    # shrinking removes only the surplus: the rest are the very same devices
    doc["layouts"]["default"][2]["vgpus"] = {"A100-4C": 2}
    apply(applied, parse_config(doc))
    a100 = gpu_by_board(after, "A100-40GB").address
    remaining = {v.id for v in applied.discover().gpu(a100).vgpus}
    assert len(remaining) == 2 and remaining <= {v.id for v in after.gpu(a100).vgpus}
    assert_persisted_exactly(applied)


def test_changing_type_on_an_sriov_gpu(applied):
    doc = example_doc()
    doc["layouts"]["default"][2]["vgpus"] = {"A100-8C": 5}  # another size: the 4C ones go first
    out = apply(applied, parse_config(doc))
    assert out.ok
    inv = applied.discover()
    a100 = gpu_by_board(inv, "A100-40GB")
    assert Counter(v.type_name for v in a100.vgpus) == Counter({"NVIDIA A100-8C": 5})
    assert_persisted_exactly(applied)


# --------------------------------------------------------------------------- in-use protection
def test_in_use_devices_survive_a_layout_that_drops_them(applied, holder):
    """A real child process or a simulated QEMU: either way its vGPUs stay."""
    inv = applied.discover()
    t4 = gpu_by_board(inv, "T4")
    l40s = gpu_by_board(inv, "L40S")
    t4_victim = sorted(t4.vgpus, key=lambda v: v.id)[-1]
    l40s_victim = l40s.vgpus[-1]
    h = holder(applied, applied.env.vfio_group(t4_victim.iommu_group), applied.env.vfio_group(l40s_victim.iommu_group))
    seen = h.view(applied)

    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 0}
    doc["layouts"]["default"][3]["vgpus"] = {"NVIDIA L40S-8Q": 0}
    out = apply(seen, parse_config(doc))
    assert out.ok  # skipping is not failing
    skipped = {s.device: s.reason for r in out.rounds for s in r.plan.skipped}
    assert set(skipped) == {t4_victim.id, l40s_victim.id}
    for reason in skipped.values():
        assert f"pid {h.pid} " in reason and "in use" in reason
    after = applied.discover()
    assert [v.id for v in after.gpu(t4.address).vgpus] == [t4_victim.id]
    assert [v.id for v in after.gpu(l40s.address).vgpus] == [l40s_victim.id]
    # the kept ones stay persisted, so a reboot brings them back for their VM
    assert_persisted_exactly(applied)
    # the other GPUs were not touched
    assert vgpu_counts(after)[(gpu_by_board(after, "A100-40GB").address, type_id("A100-40GB", "A100-4C"))] == 6

    h.release()
    out = apply(seen, parse_config(doc))
    assert out.ok and out.changed > 0
    after = applied.discover()
    assert after.gpu(t4.address).vgpus == [] and after.gpu(l40s.address).vgpus == []
    assert_persisted_exactly(applied)


def test_passthrough_gpu_held_open_waits_before_changing_form(applied, holder):
    """A GPU a VM holds is not rebound under it: the apply converges (blocked, nothing written)
    and finishes once the VM lets go."""
    inv = applied.discover()
    pt = inv.gpus[1]
    assert pt.driver == "vfio-pci"
    h = holder(applied, applied.env.vfio_group(pt.iommu_group))
    doc = example_doc()
    doc["layouts"]["default"][1] = {"index": 1, "vgpus": {"T4-2Q": 2}}
    io = CountingIO(applied.host)
    before = file_tree(applied.root)
    out = apply(h.view(applied), parse_config(doc), io=io)
    (b,) = out.blocked
    assert b.device == pt.address and f"pid {h.pid}" in b.held_by[0] and "return to nvidia" in b.blocks
    assert out.ok and not out.matches
    assert io.writes == [] and file_tree(applied.root) == before
    h.release()
    out = apply(applied, parse_config(doc))
    assert out.matches and len(applied.discover().gpu(pt.address).vgpus) == 2


def test_gpu_with_held_vgpus_waits_before_being_passed_through(applied, holder):
    t4 = applied.discover().gpus[0]
    h = holder(applied, applied.env.vfio_group(t4.vgpus[3].iommu_group))
    doc = example_doc()
    doc["layouts"]["default"][0] = {"index": 0, "mode": "passthrough"}
    io = CountingIO(applied.host)
    out = apply(h.view(applied), parse_config(doc), io=io)
    (b,) = out.blocked
    assert b.device == t4.vgpus[3].id and f"pid {h.pid}" in b.held_by[0] and "through" in b.blocks
    assert io.writes == [] and [v.id for v in applied.discover().gpus[0].vgpus] == [v.id for v in t4.vgpus]


IOMMUFD_HOST = HostSpec(iommufd=True, gpus=[GpuGroup(board="T4"), GpuGroup(board="L40S", count=2)])
IOMMUFD_LAYOUT = [{"index": 0, "vgpus": {"T4-2Q": 2}}, {"index": 1, "vgpus": {"L40S-24Q": 2}},
                  {"index": 2, "mode": "passthrough"}]


def vfio_cdev(sim: Sim, device_dir: Path) -> Path:
    """``/dev/vfio/devices/vfioN`` of a device (what an iommufd VM opens instead of its group)."""
    (name,) = os.listdir(device_dir / "vfio-dev")
    return sim.env.vfio_cdev_dir / name


def test_devices_held_through_their_vfio_cdev_survive_a_layout_that_drops_them(make_sim, holder):
    """iommufd: the VM holds ``/dev/vfio/devices/vfioN`` (and /dev/iommu), no group. Its mdev,
    vendor-VFIO vGPU and passed-through GPU are in use all the same."""
    sim = make_sim(IOMMUFD_HOST)
    assert apply(sim, layout(*IOMMUFD_LAYOUT)).ok
    inv = sim.discover()
    t4, l40s, pt = inv.gpus
    t4_victim = sorted(t4.vgpus, key=lambda v: v.id)[-1]
    l40s_victim = l40s.vgpus[-1]
    cdevs = [vfio_cdev(sim, sim.env.pci(t4_victim.parent) / t4_victim.id), vfio_cdev(sim, sim.env.pci(l40s_victim.id)),
             vfio_cdev(sim, sim.env.pci(pt.address))]
    h = holder(sim, sim.env.iommufd, *cdevs)
    seen = h.view(sim)

    # the passed-through GPU cannot change form under its VM: blocked, nothing written
    io = CountingIO(sim.host)
    before = file_tree(sim.root)
    out = apply(seen, layout(*IOMMUFD_LAYOUT[:2], {"index": 2, "vgpus": {"L40S-24Q": 1}}), io=io)
    (b,) = out.blocked
    assert b.device == pt.address and f"pid {h.pid}" in b.held_by[0] and str(cdevs[2]) in b.held_by[0]
    assert io.writes == [] and file_tree(sim.root) == before

    # vGPUs a layout drops stay while their cdev is open
    dropping = layout({"index": 0, "vgpus": {"T4-2Q": 0}}, {"index": 1, "vgpus": {"L40S-24Q": 0}}, IOMMUFD_LAYOUT[2])
    out = apply(seen, dropping)
    assert out.ok  # skipping is not failing
    skipped = {s.device: s.reason for r in out.rounds for s in r.plan.skipped}
    assert set(skipped) == {t4_victim.id, l40s_victim.id}
    for reason, cdev in zip((skipped[t4_victim.id], skipped[l40s_victim.id]), cdevs, strict=False):
        assert f"pid {h.pid} " in reason and "in use" in reason and str(cdev) in reason
    after = sim.discover()
    assert [v.id for v in after.gpu(t4.address).vgpus] == [t4_victim.id]
    assert [v.id for v in after.gpu(l40s.address).vgpus] == [l40s_victim.id]
    assert after.gpu(pt.address).driver == "vfio-pci"
    assert_persisted_exactly(sim)

    h.release()
    out = apply(seen, dropping)
    assert out.ok and out.changed > 0
    after = sim.discover()
    assert after.gpu(t4.address).vgpus == [] and after.gpu(l40s.address).vgpus == []
    assert_persisted_exactly(sim)


@pytest.mark.libvirt
@needs_libvirt
def test_libvirt_domain_protects_its_mdev_and_pci_device(applied, tmp_path):
    inv = applied.discover()
    t4 = inv.gpus[0]
    pt = inv.gpus[1]
    held = sorted(t4.vgpus, key=lambda v: v.id)[0]
    node = tmp_path / "node.xml"
    node.write_text(libvirt_node_xml({"vm1": ([held.id], [pt.address]), "idle": ([], [])}))
    lv = applied.with_env(libvirt_uri=f"test://{node}")

    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 2}
    out = apply(lv, parse_config(doc))
    assert out.ok and out.warnings == []
    left = {v.id for v in lv.discover().gpu(t4.address).vgpus}
    assert held.id in left and len(left) == 2
    # the referenced one was preferred for keeping, so nothing had to be skipped
    assert all(not r.plan.skipped for r in out.rounds)

    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 0}
    out = apply(lv, parse_config(doc))
    (skip,) = [s for r in out.rounds for s in r.plan.skipped]
    assert skip.device == held.id and "libvirt domain vm1" in skip.reason
    assert [v.id for v in lv.discover().gpu(t4.address).vgpus] == [held.id]

    # the passed-through GPU is referenced by vm1: it does not become a vGPU host under it
    doc["layouts"]["default"][1] = {"index": 1, "vgpus": {"T4-2Q": 1}}
    io = CountingIO(applied.host)
    out = reconcile(lv.env, io, parse_config(doc))
    (b,) = [b for b in out.blocked if b.device == pt.address]
    assert "libvirt domain vm1" in b.held_by[0] and "return to nvidia" in b.blocks
    assert io.writes == []


def test_unreadable_libvirt_keeps_every_device_a_domain_may_name(applied, tmp_path, monkeypatch):
    """libvirt asked for (``--libvirt-uri``) but unreadable, here libvirt-python missing as ``pip install
    '.[test]'`` leaves it (issue 36: campaign seed 11 then removed the L40S VF a defined domain named):
    the domains cannot be listed, so no vGPU is removed and no passed-through GPU changes form, and
    the warning says why. Once libvirt can be read, only what a domain names is kept."""
    inv = applied.discover()
    t4, pt, l40s = inv.gpus[0], inv.gpus[1], gpu_by_board(inv, "L40S")
    named = sorted(l40s.vgpus, key=lambda v: v.id)[0]
    node = tmp_path / "node.xml"
    node.write_text(libvirt_node_xml({"vm1": ([], [named.id])}))
    lv = applied.with_env(libvirt_uri=f"test://{node}")
    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 0}
    doc["layouts"]["default"][1] = {"index": 1, "vgpus": {"T4-2Q": 1}}
    doc["layouts"]["default"][3]["vgpus"] = {"NVIDIA L40S-12Q": 2}
    before = {v.id for v in inv.all_vgpus()}

    monkeypatch.setitem(sys.modules, "libvirt", None)  # `import libvirt` raises ImportError
    io = CountingIO(applied.host)
    out = reconcile(lv.env, io, parse_config(doc))
    after = lv.discover()
    assert {v.id for v in after.all_vgpus()} == before and after.gpu(pt.address).driver == "vfio-pci"
    assert not [w for w in io.writes if "/sys/" in w]
    assert any("libvirt-python is not installed" in w and "no existing vGPU or passed-through GPU is removed" in w
               for w in out.warnings), out.warnings
    held = {b.device: b.held_by for b in out.blocked}
    assert named.id in held and t4.vgpus[0].id in held and pt.address in held
    assert "unreadable libvirt" in held[named.id][0]
    assert not out.matches

    monkeypatch.undo()
    if libvirt_missing() is not None:  # libvirt-python missing on this machine: the rest needs it
        return
    out = reconcile(lv.env, lv.io, parse_config(doc))
    after = lv.discover()
    assert out.warnings == [] and {b.device for b in out.blocked} == {named.id}
    assert named.id in {v.id for v in after.all_vgpus()} and after.gpu(t4.address).vgpus == []
    assert after.gpu(pt.address).driver == "nvidia"


@pytest.mark.libvirt
@needs_libvirt
def test_apply_after_a_reboot_brings_back_what_a_domain_names_though_the_layout_changed(applied, tmp_path):
    """After a reboot whose restore did not run (or failed), apply with a layout of other sizes: the
    saved T4 mdev and L40S VF record a libvirt domain names come back as they were saved (UUID,
    parent, type), their saved state is not forgotten, and the node is blocked on them naming the
    domain. Before, the planner forgot both and gave the VF another type (issue 36, point 1)."""
    inv = applied.discover()
    t4, l40s = inv.gpus[0], gpu_by_board(inv, "L40S")
    mdev = sorted(t4.vgpus, key=lambda v: v.id)[0]
    vf = sorted(l40s.vgpus, key=lambda v: v.id)[0]
    node = tmp_path / "node.xml"
    node.write_text(libvirt_node_xml({"vm1": ([mdev.id], [vf.id])}))
    lv = applied.with_env(libvirt_uri=f"test://{node}")
    applied.host.reboot()
    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-4Q": 2}
    doc["layouts"]["default"][3]["vgpus"] = {"NVIDIA L40S-12Q": 2}
    out = apply(lv, parse_config(doc))
    after = {v.id: v for v in lv.discover().all_vgpus()}
    assert (after[mdev.id].parent, after[mdev.id].type_id) == (mdev.parent, mdev.type_id)
    assert after[vf.id].type_id == vf.type_id
    assert (mdev.parent, mdev.id, mdev.type_id) in {(d.parent, d.uuid, d.mdev_type) for d in lv.definitions()}
    assert lv.records()[vf.id] == vf.type_id
    held = {b.device: b.held_by for b in out.blocked}
    assert "libvirt domain vm1" in held[mdev.id][0] and "libvirt domain vm1" in held[vf.id][0]
    assert not out.matches


# --------------------------------------------------------------------------- kernel errors
@pytest.mark.parametrize("code", [errno.EBUSY, errno.EINVAL, errno.ENOSPC, errno.EEXIST, errno.EIO])
def test_kernel_errors_are_reported_per_device_and_nothing_correct_is_undone(applied, code):
    inv = applied.discover()
    t4, a100, l40s = gpu_by_board(inv, "T4"), gpu_by_board(inv, "A100-40GB"), gpu_by_board(inv, "L40S")
    old = {v.id for v in inv.all_vgpus()}
    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 6}            # 2 removals
    doc["layouts"]["default"][2]["vgpus"] = {"A100-4C": 8}          # 2 creations
    doc["layouts"]["default"][3]["vgpus"] = {"NVIDIA L40S-8Q": 6}   # 2 creations
    # choose the devices the plan will touch, as the planner orders them
    plan_removed = sorted(t4.vgpus, key=lambda v: v.id)[-2:]
    busy_vfs = {v.parent for v in a100.vgpus}
    free_a100 = [vf.address for vf in a100.vfs if vf.address not in busy_vfs][:2]
    free_l40s = [vf.address for vf in l40s.vfs if vf.address not in {v.id for v in l40s.vgpus}][:2]
    bad_remove = applied.env.pci(t4.address) / plan_removed[0].id / "remove"
    bad_create = applied.env.pci(free_a100[0]) / "mdev_supported_types" / "nvidia-468" / "create"
    bad_set = applied.env.pci(free_l40s[0]) / "nvidia" / "current_vgpu_type"
    io = FaultyIO(applied.host, {bad_remove: code, bad_create: code, bad_set: code})

    out = apply(applied, parse_config(doc), io=io)
    assert not out.ok
    assert len(io.hit) == 3
    failed = [r for rnd in out.rounds for r in rnd.report.failed if not r.skipped]
    assert len(failed) == 3 and {r.error for r in failed} == {errno.errorcode[code]}
    by_kind = {r.step.split()[0]: r for r in failed}
    assert by_kind["remove"].device == plan_removed[0].id
    assert by_kind["set"].device == free_l40s[0]
    assert by_kind["create"].step.endswith(f"on {free_a100[0]}")
    # the failed device's dependent step is skipped, not run
    skipped = [r for rnd in out.rounds for r in rnd.report.results if r.skipped]
    assert any(r.device == plan_removed[0].id and "forget" in r.step for r in skipped)

    after = applied.discover()
    ids = {v.id for v in after.all_vgpus()}
    # nothing correct was undone: only the one surplus removal that succeeded is gone
    assert old - ids == {plan_removed[1].id}
    assert plan_removed[0].id in ids
    # everything else in the plan happened
    assert len(after.gpu(a100.address).vgpus) == 7 and len(after.gpu(l40s.address).vgpus) == 5
    # saved state still describes every device, and a clean re-apply converges
    saved = {d.uuid for d in applied.definitions()}
    assert {v.id for v in after.all_vgpus() if v.framework == "mdev"} <= saved
    out = apply(applied, parse_config(doc))
    assert out.ok
    inv = applied.discover()
    assert vgpu_counts(inv) == wanted_counts(inv, parse_config(doc))
    assert_persisted_exactly(applied)
    assert ids - {plan_removed[0].id} <= {v.id for v in inv.all_vgpus()}


def test_failing_vf_enable_blocks_only_that_gpu(sim):
    inv = sim.discover()
    a100 = gpu_by_board(inv, "A100-40GB")
    io = FaultyIO(sim.host, {sim.env.pci(a100.address) / "sriov_numvfs": errno.EIO})
    out = apply(sim, load_config(EXAMPLE_LAYOUT), io=io)
    assert not out.ok
    failed = [r for rnd in out.rounds for r in rnd.report.failed]
    assert [(r.device, r.error) for r in failed] == [(a100.address, "EIO")]
    after = sim.discover()
    # the other GPUs were configured in the same round
    assert gpu_by_board(after, "T4").vgpus and after.gpus[1].driver == "vfio-pci"
    assert after.gpu(a100.address).sriov_num_vfs == 0


# --------------------------------------------------------------------------- restore after reboot
def test_restore_after_reboot_recreates_the_same_devices(applied):
    inv = applied.discover()
    before = sorted((v.parent, v.id, v.type_id) for v in inv.all_vgpus())
    assert any(v.framework == "vendor-vfio" for v in inv.all_vgpus())
    applied.host.reboot()
    gone = applied.discover()
    assert gone.all_vgpus() == [] and all(g.sriov_num_vfs == 0 for g in gone.gpus)

    reports = restore(applied.env, applied.io)
    assert reports and all(not r.failed for r in reports)
    after = applied.discover()
    assert sorted((v.parent, v.id, v.type_id) for v in after.all_vgpus()) == before
    for g in after.gpus:
        old = inv.gpu(g.address)
        assert g.sriov_num_vfs == old.sriov_num_vfs
    assert_persisted_exactly(applied)
    # restore is idempotent
    assert restore(applied.env, applied.io) == []
    # restore re-bound the passthrough GPU too: apply has nothing left
    out = apply(applied, load_config(EXAMPLE_LAYOUT))
    steps = [r.step for rnd in out.rounds for r in rnd.report.results]
    assert out.ok and steps == [] and applied.discover().gpu(inv.gpus[1].address).driver == "vfio-pci"
    assert sorted((v.parent, v.id, v.type_id) for v in applied.discover().all_vgpus()) == before


def test_apply_after_reboot_also_recreates_the_same_devices(applied):
    before = sorted((v.parent, v.id, v.type_id) for v in applied.discover().all_vgpus())
    applied.host.reboot()
    out = apply(applied, load_config(EXAMPLE_LAYOUT))
    assert out.ok
    assert sorted((v.parent, v.id, v.type_id) for v in applied.discover().all_vgpus()) == before
    assert_persisted_exactly(applied)


def test_restore_skips_manual_and_foreign_definitions(sim):
    t4 = sim.discover().gpus[0]
    auto = MdevDefinition(uuid="11111111-1111-4111-8111-111111111111", parent=t4.address,
                          mdev_type="nvidia-231")
    manual = MdevDefinition(uuid="22222222-2222-4222-8222-222222222222", parent=t4.address,
                            mdev_type="nvidia-231", start="manual")
    foreign = MdevDefinition(uuid="33333333-3333-4333-8333-333333333333", parent="0000:77:00.0",
                             mdev_type="nvidia-231")
    for d in (auto, manual, foreign):
        persist.save_definition(sim.env, sim.io, d)
    reports = restore(sim.env, sim.io)
    assert [r.changed for r in reports] == [1]
    assert [v.id for v in sim.discover().all_vgpus()] == [auto.uuid]


def test_hostile_saved_state_never_reaches_sysfs(sim):
    t4 = sim.discover().gpus[0]
    root = sim.env.mdevctl_root
    (root / t4.address).mkdir(parents=True)
    (root / t4.address / "44444444-4444-4444-8444-444444444444").write_text(
        json.dumps({"mdev_type": "../../../../../../etc/x", "start": "auto", "attrs": []}))
    (root / t4.address / "not-a-uuid").write_text(json.dumps({"mdev_type": "nvidia-231", "start": "auto", "attrs": []}))
    (root / "0000:10:00.0..").mkdir()
    (root / "0000:10:00.0..").joinpath("55555555-5555-4555-8555-555555555555").write_text(
        json.dumps({"mdev_type": "nvidia-231", "start": "auto", "attrs": []}))
    sim.env.vendor_vfio_state.parent.mkdir(parents=True, exist_ok=True)
    sim.env.vendor_vfio_state.write_text(json.dumps({"version": 1, "vfs": {"../../0000:19:00.4": "1152",
                                                                         "0000:19:00.4": "../1"}}))
    io = CountingIO(sim.host)
    assert restore(sim.env, io) == []
    assert io.writes == []
    out = apply(sim, layout({"index": 0, "vgpus": {"T4-2Q": 1}}), io=io)
    assert out.ok
    assert len([w for w in out.warnings if str(root) in w]) == 3  # each bad file is named
    real_root = os.path.realpath(sim.root)
    for w in io.writes:
        assert os.path.realpath(w.split(" ", 1)[1]).startswith(real_root + os.sep), w


def test_passthrough_after_reboot_forgets_the_vanished_vfs_vgpus(applied):
    """After a reboot the VFs are gone; their saved vGPUs must go with a switch to passthrough,
    or a later restore would enable VFs on the passed-through GPU and re-create them."""
    inv = applied.discover()
    a100, l40s = gpu_by_board(inv, "A100-40GB"), gpu_by_board(inv, "L40S")
    applied.host.reboot()
    doc = example_doc()
    doc["layouts"]["default"][2] = {"model": "A100", "mode": "passthrough"}
    doc["layouts"]["default"][3] = {"pciAddress": l40s.address, "mode": "passthrough"}
    assert apply(applied, parse_config(doc)).ok
    assert {d.parent for d in applied.definitions()} == {gpu_by_board(inv, "T4").address}
    assert applied.records() == {}
    assert_persisted_exactly(applied)
    assert restore(applied.env, applied.io) == []
    after = applied.discover()
    for addr in (a100.address, l40s.address):
        assert after.gpu(addr).driver == "vfio-pci" and after.gpu(addr).sriov_num_vfs == 0


def test_restore_never_enables_vfs_on_a_passed_through_gpu(applied):
    inv = applied.discover()
    a100 = gpu_by_board(inv, "A100-40GB")
    applied.host.reboot()
    doc = example_doc()
    doc["layouts"]["default"][2] = {"model": "A100", "mode": "passthrough"}
    assert apply(applied, parse_config(doc)).ok
    # saved state for the GPU's VFs, as an older version or an admin may have left it
    vf = sorted(v.parent for v in a100.vgpus)[0]
    persist.save_definition(applied.env, applied.io, MdevDefinition(
        uuid="66666666-6666-4666-8666-666666666666", parent=vf, mdev_type=type_id("A100-40GB", "A100-4C")))
    io = CountingIO(applied.host)
    restore(applied.env, io)
    assert not [w for w in io.writes if a100.address in w]
    assert applied.discover().gpu(a100.address).sriov_num_vfs == 0


def test_adoption_of_hand_made_vgpus_and_mdevctl_definitions(sim):
    """vGPUs an admin made (and definitions mdevctl wrote) are kept and persisted, not re-made."""
    inv = sim.discover()
    t4, l40s = inv.gpus[0], gpu_by_board(inv, "L40S")
    q2 = type_id("T4", "T4-2Q")
    by_hand = ["77777777-7777-4777-8777-777777777777", "88888888-8888-4888-8888-888888888888"]
    for u in by_hand:
        sim.io.write(sim.env.pci(t4.address) / "mdev_supported_types" / q2 / "create", u + "\n")
    # mdevctl accepts upper-case file names; this one already describes the second device
    (sim.env.mdevctl_root / t4.address).mkdir(parents=True)
    (sim.env.mdevctl_root / t4.address / by_hand[1].upper()).write_text(
        json.dumps({"mdev_type": q2, "start": "auto", "attrs": []}))
    sim.io.write(sim.env.pci(l40s.address) / "sriov_numvfs", f"{l40s.sriov_total_vfs}\n")
    vf = sim.discover().gpu(l40s.address).vfs[3].address
    sim.io.write(sim.env.pci(vf) / "nvidia" / "current_vgpu_type", type_id("L40S", "L40S-8Q") + "\n")

    doc = example_doc()
    doc["layouts"]["default"][0]["vgpus"] = {"T4-2Q": 3}
    out = apply(sim, parse_config(doc))
    assert out.ok
    after = sim.discover()
    ids = {v.id for v in after.gpu(t4.address).vgpus}
    assert set(by_hand) <= ids and len(ids) == 3
    assert vf in {v.id for v in after.gpu(l40s.address).vgpus}
    steps = [r.step for rnd in out.rounds for r in rnd.report.results]
    assert [s for s in steps if by_hand[0] in s] == [f"persist mdev {by_hand[0]} ({q2}) on {t4.address}"]
    assert not [s for s in steps if by_hand[1] in s]  # already defined: nothing to do
    assert not [s for s in steps if s.startswith(f"set VF {vf}")]
    saved = json.loads((sim.env.mdevctl_root / t4.address / by_hand[0]).read_text())
    assert saved == {"mdev_type": q2, "start": "auto", "attrs": []}  # mdevctl's format
    assert_persisted_exactly(sim)


# --------------------------------------------------------------------------- bad input, before any write
@pytest.mark.parametrize("change,field", [
    (lambda d: d["layouts"]["default"][0].update(vgpus={"T4-3Q": 1}), "gpus[0].vgpus.T4-3Q"),
    (lambda d: d["layouts"]["default"][0].update(vgpus={"T4-2Q": 9}), "gpus[0].vgpus.T4-2Q"),
    (lambda d: d["layouts"]["default"][2].update(vgpus={"A100-4C": 11}), "gpus[2].vgpus.A100-4C"),
    (lambda d: d["layouts"]["default"][3].update(vgpus={"L40S-1Q": 33}), "gpus[3].vgpus.L40S-1Q"),
    (lambda d: d["layouts"]["default"][0].update(vgpus={"T4-2Q": 4, "T4-1Q": 4}), "gpus[0].vgpus"),
    (lambda d: d["layouts"]["default"].append({"pciAddress": "0000:10:00.0", "mode": "unmanaged"}), "gpus[4]"),
    (lambda d: d["layouts"]["default"][3].update(pciAddress="0000:42:00.0"), "gpus[3] (pciAddress 0000:42:00.0)"),
])
def test_bad_layouts_change_nothing(sim, change, field):
    doc = example_doc()
    change(doc)
    io = CountingIO(sim.host)
    before = file_tree(sim.root)
    with pytest.raises(ConfigError) as e:
        apply(sim, parse_config(doc), io=io)
    assert any(p.startswith(field) for p in e.value.problems), e.value.problems
    assert io.writes == []
    assert file_tree(sim.root) == before


@pytest.mark.parametrize("entry", [
    {"index": 0, "vgpus": {"../../../../class/mdev_bus": 1}},
    {"index": 0, "vgpus": {"nvidia-231/../nvidia-222": 1}},
    {"pciAddress": "0000:10:00.0/../../../../etc", "mode": "passthrough"},
    {"model": "../../T4", "mode": "passthrough"},
])
def test_hostile_names_change_nothing(sim, entry):
    doc = example_doc()
    doc["layouts"]["default"][0] = entry
    before = file_tree(sim.root)
    with pytest.raises(ConfigError):
        apply(sim, parse_config(doc))
    assert file_tree(sim.root) == before


def test_gpu_bound_to_another_driver_is_refused_before_any_write(make_sim, tmp_path):
    sim = make_sim("t4-node")
    t4 = sim.discover().gpus[2]
    # hand the GPU to some other driver, as another workload would
    sim.io.write(sim.env.pci(t4.address) / "driver_override", "snd_hda_intel\n")
    sim.io.write(sim.env.pci_drivers / "nvidia" / "unbind", t4.address)
    sim.io.write(sim.env.pci_drivers / "snd_hda_intel" / "bind", t4.address)
    assert sim.discover().gpus[2].driver == "snd_hda_intel"
    io = CountingIO(sim.host)
    with pytest.raises(ConfigError) as e:
        apply(sim, layout({"all": True, "vgpus": {"T4-8Q": 2}}), io=io)
    (p,) = e.value.problems
    assert p.startswith("gpus[0].mode:") and t4.address in p and "snd_hda_intel" in p
    assert io.writes == []
    # leaving it unmanaged lets the rest proceed
    out = apply(sim, layout({"index": 0, "vgpus": {"T4-8Q": 2}}, {"index": 1, "vgpus": {"T4-8Q": 2}},
                            {"index": 2, "mode": "unmanaged"}, {"index": 3, "vgpus": {"T4-8Q": 2}}))
    assert out.ok and sim.discover().gpus[2].driver == "snd_hda_intel"
    assert len(sim.discover().all_vgpus()) == 6


def test_dra_mode_prepares_but_creates_nothing(sim):
    out = apply(sim, load_config(EXAMPLE_LAYOUT, "dra"))
    assert out.ok
    inv = sim.discover()
    assert inv.all_vgpus() == []
    assert all(g.sriov_num_vfs == g.sriov_total_vfs for g in inv.gpus)
    assert all(g.types for g in inv.gpus)


def test_device_manager_config_applies(make_sim, tmp_path):
    sim = make_sim("t4-node")
    cfg = tmp_path / "dm.yaml"
    cfg.write_text("""
version: v1
vgpu-configs:
  T4-mixed:
    - devices: [0, 1]
      vgpu-devices: {"T4-4Q": 4}
    - devices: [3]
      vgpu-devices: {"T4-16Q": 1}
""")
    out = apply(sim, load_config(cfg, "T4-mixed"))
    assert out.ok
    inv = sim.discover()
    assert [Counter(v.type_name for v in g.vgpus) for g in inv.gpus] == [
        Counter({"GRID T4-4Q": 4}), Counter({"GRID T4-4Q": 4}), Counter(), Counter({"GRID T4-16Q": 1})]
    assert_persisted_exactly(sim)


# --------------------------------------------------------------------------- vgpu-device-manager's device-filter
def test_device_manager_device_filters_pick_the_boards(make_sim, tmp_path):
    """One file for a fleet: each entry applies to the boards its filter names, and to no other."""
    sim = make_sim("default")  # 2 x T4, A100-40GB, L40S
    cfg = tmp_path / "dm.yaml"
    cfg.write_text("""
version: v1
vgpu-configs:
  fleet:
    - devices: all
      device-filter: "0x1EB810DE"            # Tesla T4
      vgpu-devices: {"T4-2Q": 2}
    - devices: all
      device-filter: ["0x20F110DE", "0x20B510DE"]   # A100 40GB or 80GB
      vgpu-devices: {"A100-4C": 2}
    - devices: all
      device-filter: "0x25B610DE"            # A16 / A2: none here, and that is no error
      vgpu-devices: {"A16-1Q": 4}
""")
    assert apply(sim, load_config(cfg, "fleet")).ok
    inv = sim.discover()
    assert [Counter(v.type_name for v in g.vgpus) for g in inv.gpus] == [
        Counter({"GRID T4-2Q": 2}), Counter({"GRID T4-2Q": 2}), Counter({"NVIDIA A100-4C": 2}), Counter()]
    assert_persisted_exactly(sim)


def test_device_filter_subsystem_tells_a16_from_a2(make_sim):
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="A2"), GpuGroup(board="A16")]))  # same device id 0x25B6
    doc = {"version": "v1", "vgpu-configs": {"a16": [
        {"devices": "all", "device-filter": "0x25B610DE:0x14A910DE", "vgpu-devices": {"A16-2Q": 2}}]}}
    assert apply(sim, parse_config(doc, "a16")).ok
    inv = sim.discover()
    assert [len(g.vgpus) for g in inv.gpus] == [0, 2, 2, 2, 2]  # the A2 first, then the A16's four GPUs


def test_device_manager_errors_name_its_own_fields(make_sim):
    sim = make_sim("t4-node")
    doc = {"version": "v1", "vgpu-configs": {"x": [
        {"devices": [0], "vgpu-devices": {"T4-3Q": 1}},
        {"devices": [9], "vgpu-devices": {"T4-1Q": 1}},
        {"devices": [1], "vgpu-devices": {"T4-1Q": 4, "T4-2Q": 2}},
    ]}}
    with pytest.raises(ConfigError) as exc:
        apply(sim, parse_config(doc, "x"))
    problems = exc.value.problems
    assert any(p.startswith("vgpu-configs.x[1] (index 9).devices: the node has") for p in problems), problems
    with pytest.raises(ConfigError) as exc:
        apply(sim, parse_config({"version": "v1", "vgpu-configs": {"x": [doc["vgpu-configs"]["x"][0],
                                                                          doc["vgpu-configs"]["x"][2]]}}, "x"))
    problems = exc.value.problems
    assert any(p.startswith("vgpu-configs.x[0].vgpu-devices.T4-3Q: ") for p in problems), problems
    # a T4 has no mixed-size mode at all (no placement table): the fix is one size, not a declaration
    assert any(p.startswith("vgpu-configs.x[1].vgpu-devices: ") and "equal-size" in p
               and "no mixed-size mode: give the GPU vGPUs of one size" in p for p in problems), problems
    assert not any("gpus[" in p or ".vgpus" in p for p in problems), problems
    assert sim.discover().all_vgpus() == []


class ListingIO(SimIO):
    """Counts the listings of the PCI bus: one per discovery of the node."""

    def __init__(self, host, bus: Path):
        super().__init__(host)
        self.bus, self.listings = str(bus), 0

    def listdir(self, path):
        self.listings += str(path) == self.bus
        return super().listdir(path)


def test_apply_plans_its_first_round_on_the_inventory_it_was_given(make_sim, tmp_path):
    """``vgpuctl apply`` discovers the node under its lock (to show what was there); the first round
    plans on that inventory instead of discovering the node a second time, to the same result."""
    layouts = load_config(EXAMPLE_LAYOUT)
    outcomes, listings = [], []
    for given in (False, True):
        sim = copy_sim(make_sim("default"), tmp_path / f"host-{given}")
        io = ListingIO(sim.host, sim.env.pci_devices)
        inv = discover(sim.env, io, node="test-node") if given else None
        io.listings = 0
        out = reconcile(sim.env, io, layouts, node="test-node", read_back=True, inventory=inv)
        assert out.ok and not out.unapplied, out
        outcomes.append(vgpu_counts(sim.discover()))
        listings.append(io.listings)
    assert outcomes[0] == outcomes[1] and sum(outcomes[0].values()) > 0
    assert listings[1] == listings[0] - 1, listings


def test_a_companion_function_left_on_vfio_pci_is_returned_with_the_gpu_already_back(make_sim):
    """A return from passthrough stopped between the GPU's rebind and its audio function's (the
    campaign's seed 10: the agent killed at the audio function's driver_override) left the audio on
    vfio-pci with the GPU on nvidia; the next apply said the node matched. It now returns the audio
    function too, and the node matches only then."""
    sim = make_sim("workstation")
    t4 = sim.discover().gpus[1]
    audio = next(m for m in t4.iommu_group_members if m != t4.address)
    assert apply(sim, layout({"index": 1, "mode": "passthrough"})).ok
    # the GPU alone back on its driver, as the interrupted return left it
    for path, data in ((sim.env.pci(t4.address) / "driver_override", "\n"),
                       (sim.env.pci(t4.address) / "driver" / "unbind", t4.address),
                       (sim.env.drivers_probe, t4.address)):
        sim.io.write(path, data)
    gpu = sim.discover().gpu(t4.address)
    assert gpu.iommu_group_drivers == {t4.address: "nvidia", audio: "vfio-pci"}
    out = apply(sim, layout({"index": 1, "vgpus": {"T4-4Q": 2}}), read_back=True)
    assert out.ok and not out.unapplied, out
    gpu = sim.discover().gpu(t4.address)
    assert gpu.iommu_group_drivers == {t4.address: "nvidia", audio: "snd_hda_intel"}
    assert vgpu_counts(sim.discover()) == Counter({(t4.address, type_id("T4", "T4-4Q")): 2})
