"""Discovery on every catalog board and every vGPU framework, and on the shipped presets.

Host specs are built on the fly from the catalog, so every expectation below comes
from the catalog (ids, names, maximum counts, framebuffer) or from kernel.md facts.
"""

from __future__ import annotations

import os
import uuid as uuidlib

import pytest

from mdev_manager import catalog
from mdev_manager.executor import Executor
from mdev_manager.sim import HostSpec, load_host
from mdev_manager.sim.hostspec import GpuGroup

NVIDIA = "0x10de"


def combos():
    for key, board in catalog.BOARDS.items():
        frameworks = ["mdev"] + (["mdev-sriov", "vendor-vfio"] if board.sriov_total_vfs else [])
        for fw in frameworks:
            yield pytest.param(key, fw, id=f"{key}-{fw}")


def expected_id(board: catalog.BoardSpec, t: catalog.TypeSpec, fw: str) -> str:
    return str(t.num) if fw == "vendor-vfio" else t.mdev_id(board.driver)


def smallest_plain_type(board: catalog.BoardSpec) -> catalog.TypeSpec:
    """The non-MIG type with the most instances (ties: catalog order)."""
    return max((t for t in board.types if not t.mig_backed), key=lambda t: t.max_instances)


def link_base(path) -> str:
    return os.path.basename(os.readlink(path))


@pytest.mark.parametrize("key,fw", list(combos()))
def test_every_board_and_framework(make_sim, key, fw):
    board = catalog.board(key)
    sim = make_sim(HostSpec(gpus=[GpuGroup(board=key, framework=fw, vfs_enabled=True, numa_node=1)]))
    inv = sim.discover()

    # GPU count: one per board, four on an A16
    assert len(inv.gpus) == board.gpus_per_board
    assert [g.index for g in inv.gpus] == list(range(board.gpus_per_board))
    assert [g.address for g in inv.gpus] == sorted(g.address for g in inv.gpus)
    vfs_per_gpu = board.sriov_total_vfs if fw != "mdev" else 0
    all_groups = []
    for g in inv.gpus:
        assert (g.vendor_id, g.device_id, g.class_code) == (board.vendor_id, board.device_id, board.class_code)
        assert (g.subsystem_vendor_id, g.subsystem_device_id) == (board.subsystem_vendor_id, board.subsystem_device_id)
        assert g.driver == board.driver
        assert g.framework == fw
        assert g.numa_node == 1
        assert g.sriov_total_vfs == vfs_per_gpu
        assert g.sriov_num_vfs == vfs_per_gpu == len(g.vfs)
        for i, vf in enumerate(g.vfs):
            assert vf.index == i and vf.physfn == g.address
            assert vf.numa_node == 1 and vf.driver == board.driver
            assert vf.iommu_group is not None
        # PCI root complex: the pciDDDD:BB directory the function sits under in sysfs
        real = os.path.realpath(sim.env.pci(g.address))
        assert g.pcie_root is not None and g.pcie_root.startswith("pci")
        assert f"/{g.pcie_root}/" in real
        # IOMMU: the GPU alone in its group (no audio function here), each VF its own group
        assert g.iommu_group == int(link_base(sim.env.pci(g.address) / "iommu_group"))
        assert g.iommu_group_members == [g.address]
        assert g.iommu_group_drivers == {g.address: board.driver}
        all_groups += [g.iommu_group] + [vf.iommu_group for vf in g.vfs]

        # parents: the PF on mdev, every VF otherwise
        expected_parents = [g.address] if fw == "mdev" else [vf.address for vf in g.vfs]
        assert [p.address for p in g.parents] == expected_parents

        # types: ids, names, limits and framebuffer as the catalog says
        by_id = {t.id: t for t in g.types}
        assert set(by_id) == {expected_id(board, t, fw) for t in board.types}
        for spec in board.types:
            t = by_id[expected_id(board, spec, fw)]
            assert t.name == spec.name
            assert t.short_name == spec.short_name
            assert t.framework == ("vendor-vfio" if fw == "vendor-vfio" else "mdev")
            assert t.max_instances == spec.max_instances
            assert t.framebuffer_mib == spec.fb_mib
            assert t.mig_backed == spec.mig_backed
            if fw != "vendor-vfio" and spec.description:
                assert t.description == spec.description.rstrip("\n")
            # a fresh GPU offers every time-sliced type in full (bounded by its VFs)
            full = spec.max_instances if fw == "mdev" else min(spec.max_instances, vfs_per_gpu)
            assert t.available_instances == (0 if spec.mig_backed else full), t.name
        assert g.vgpus == []
    assert len(all_groups) == len(set(all_groups))
    if board.vendor_id == NVIDIA:
        roots = [g.pcie_root for g in inv.gpus]
        assert len(set(roots)) == len(roots)  # each NVIDIA GPU below its own root port bus


@pytest.mark.parametrize("key,fw", list(combos()))
def test_vgpus_after_creation(make_sim, key, fw):
    board = catalog.board(key)
    sim = make_sim(HostSpec(gpus=[GpuGroup(board=key, framework=fw, vfs_enabled=True)]))
    gpu = sim.discover().gpus[-1]
    spec = smallest_plain_type(board)
    tid = expected_id(board, spec, fw)
    ex = Executor(sim.env, sim.io)
    made = []
    n = min(2, spec.max_instances)  # B200X-180C, the B200's only time-sliced type, takes the whole GPU
    if fw == "mdev":
        for _ in range(n):
            u = str(uuidlib.uuid4())
            ex.create_mdev(gpu.address, tid, u)
            made.append((u, gpu.address))
    elif fw == "mdev-sriov":
        for vf in gpu.vfs[:n]:
            u = str(uuidlib.uuid4())
            ex.create_mdev(vf.address, tid, u)
            made.append((u, vf.address))
    else:
        for vf in gpu.vfs[:n]:
            ex.set_vgpu_type(vf.address, tid)
            made.append((vf.address, vf.address))

    after = sim.discover().gpu(gpu.address)
    got = {v.id: v for v in after.vgpus}
    assert set(got) == {vid for vid, _ in made}
    vf_groups = {vf.address: vf.iommu_group for vf in after.vfs}
    for vid, parent in made:
        v = got[vid]
        assert v.parent == parent and v.gpu == gpu.address
        assert v.type_id == tid and v.type_name == spec.name
        assert v.framework == ("vendor-vfio" if fw == "vendor-vfio" else "mdev")
        if fw == "vendor-vfio":
            assert v.iommu_group == vf_groups[parent]  # the VF itself goes to the VM
        else:
            assert v.iommu_group == int(link_base(sim.env.pci(parent) / vid / "iommu_group"))
            assert v.iommu_group not in vf_groups.values() and v.iommu_group != after.iommu_group
        assert sim.env.vfio_group(v.iommu_group).exists()
    types = {t.id: t for t in after.types}
    assert types[tid].available_instances == spec.max_instances - n
    for other in board.types:
        if other.fb_mib != spec.fb_mib and board.vendor_id == NVIDIA:
            # equal-size mode: a GPU holding one size offers no other
            assert types[expected_id(board, other, fw)].available_instances == 0, other.name
    # the other GPUs of an A16 board are separate physical GPUs and still offer everything
    for g in sim.discover().gpus[:-1]:
        assert {t.id: t.available_instances for t in g.types}[tid] == spec.max_instances


def test_a16_node_preset(make_sim):
    sim = make_sim("a16-node")
    inv = sim.discover()
    a16, a2 = catalog.board("A16"), catalog.board("A2")
    assert len(inv.gpus) == a16.gpus_per_board + a2.gpus_per_board
    by_sub = {}
    for g in inv.gpus:
        by_sub.setdefault(g.subsystem_device_id, []).append(g)
    # A2 and A16 share a PCI device id; the subsystem id tells them apart
    assert a16.device_id == a2.device_id
    assert len(by_sub[a16.subsystem_device_id]) == 4 and len(by_sub[a2.subsystem_device_id]) == 1
    assert len({g.address for g in inv.gpus}) == 5
    # before VFs are enabled the GPUs offer nothing yet
    assert all(g.framework == "none" and g.sriov_total_vfs for g in inv.gpus)


def test_workstation_audio_function_shares_the_group(make_sim):
    sim = make_sim("workstation")
    inv = sim.discover()
    assert [g.vendor_id for g in inv.gpus] == ["0x8086", NVIDIA]
    t4 = inv.gpus[1]
    assert len(t4.iommu_group_members) == 2
    audio = next(m for m in t4.iommu_group_members if m != t4.address)
    assert t4.iommu_group_drivers == {t4.address: "nvidia", audio: "snd_hda_intel"}
    # the audio function is not a GPU (class 0x0403)
    assert audio not in {g.address for g in inv.gpus}
    assert os.path.basename(os.readlink(sim.env.pci(audio) / "iommu_group")) == str(t4.iommu_group)


def test_gvtg_types_and_framebuffer_from_description(make_sim):
    sim = make_sim("workstation")
    igd = sim.discover().gpus[0]
    board = catalog.board("UHD630")
    assert igd.address == "0000:00:02.0" and igd.driver == "i915" and igd.framework == "mdev"
    assert igd.pcie_root == "pci0000:00"
    for spec in board.types:
        t = igd.type_by_ref(spec.mdev_id(board.driver))
        assert t is not None and t.id == spec.num and t.name == spec.name
        assert t.description == spec.description.rstrip("\n")  # multi-line, as printed
        lines = dict(line.split(": ") for line in t.description.splitlines())
        # low_gm_size + high_gm_size, in MB
        assert t.framebuffer_mib == int(lines["low_gm_size"][:-2]) + int(lines["high_gm_size"][:-2])
        assert t.framebuffer_mib == spec.fb_mib
        assert t.max_instances == spec.max_instances


def test_passthrough_and_unbound_gpus(make_sim):
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="T4", driver="vfio-pci"), GpuGroup(board="T4", driver="none"),
                                  GpuGroup(board="L40S", driver="vfio-pci")]))
    inv = sim.discover()
    assert [g.driver for g in inv.gpus] == ["vfio-pci", None, "vfio-pci"]
    for g in inv.gpus:
        assert g.framework == "none" and g.types == [] and g.parents == []
    assert sim.env.vfio_group(inv.gpus[0].iommu_group).exists()
    assert not sim.env.vfio_group(inv.gpus[1].iommu_group).exists()


def test_iommufd_host(make_sim):
    sim = make_sim(HostSpec(iommufd=True, gpus=[GpuGroup(board="L40S", driver="vfio-pci"), GpuGroup(board="L40S")]))
    inv = sim.discover()
    assert inv.iommufd is True
    assert inv.gpus[0].vfio_dev is not None and inv.gpus[0].vfio_dev.startswith("vfio")
    assert inv.gpus[1].vfio_dev is None


def test_only_display_controllers_are_gpus(make_sim):
    sim = make_sim("workstation")
    inv = sim.discover()
    for g in inv.gpus:
        assert g.class_code.startswith("0x03")
    all_functions = os.listdir(sim.env.pci_devices)
    assert len(all_functions) == len(inv.gpus) + 1  # plus the audio function


@pytest.mark.parametrize("preset", ["default", "t4-node", "a100-node", "l40s-node", "a16-node", "workstation", "mixed-node"])
def test_presets_discover(make_sim, preset):
    spec = load_host(preset)
    want: dict[str, int] = {}
    for grp in spec.gpus:
        b = catalog.board(grp.board)
        want[b.key] = want.get(b.key, 0) + grp.count * b.gpus_per_board
    inv = make_sim(preset).discover()
    got: dict[str, int] = {}
    for g in inv.gpus:
        b = catalog.match_board(g.vendor_id, g.device_id, g.subsystem_device_id)
        got[b.key] = got.get(b.key, 0) + 1
    assert got == want
    assert inv.iommufd == spec.iommufd


def test_the_vfs_of_gpus_of_one_board_share_one_record_per_type_and_reading(make_sim):
    """#37: 16 L40S x 32 VFs x 23 types were 11,776 type models (~30 MB in the agent). Parents offering the
    same type with the same instances free share one frozen record; the GPU's summed types are its own."""
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="L40S", framework="mdev-sriov", vfs_enabled=True, count=2)]))
    first, second = sim.discover(), sim.discover()
    gpus = first.gpus + second.gpus
    parents = [p for g in gpus for p in g.parents]
    assert len(parents) == 4 * catalog.board("L40S").sriov_total_vfs
    records = {id(t) for p in parents for t in p.types}
    assert len(records) == len(parents[0].types)  # every VF free: one record per type, node-wide, across reads
    assert all(p.types == parents[0].types for p in parents)
    summed = {id(t) for g in gpus for t in g.types}
    assert len(summed) == sum(len(g.types) for g in gpus) and not summed & records
    assert {t.available_instances for t in first.gpus[0].types} != {1}  # summed over the VFs, not a VF's 1
    with pytest.raises(ValueError, match="frozen"):
        parents[0].types[0].available_instances = 0


def test_a_gpus_vfs_read_each_type_name_once_and_every_parents_free_instances(make_sim):
    """#37: the VFs of one GPU list one type table; discovery reads each type's name, description and
    device_api on the GPU's first parent only, and every parent's ``available_instances`` (which differ:
    a vGPU on one VF lowers only that VF's), with a type id a later VF alone lists read whole."""
    from mdev_manager.discovery import DeviceDirs, discover
    from mdev_manager.sim import SimIO

    class Counting(SimIO):
        def __init__(self, host):
            super().__init__(host)
            self.names: list[str] = []

        def read_attrs(self, directory, names):
            if directory.parent.name == "mdev_supported_types":
                self.names += names
            return super().read_attrs(directory, names)

        def read_children(self, directory, names):
            out = super().read_children(directory, names)
            self.names += [n for _ in out for n in names]
            return out

    sim = make_sim(HostSpec(gpus=[GpuGroup(board="L40S", framework="mdev-sriov", vfs_enabled=True, count=2)]))
    gpu = sim.discover().gpus[0]
    vf = gpu.parents[3].address
    t = gpu.parents[3].types[0]
    Executor(sim.env, sim.io).create_mdev(vf, t.id, str(uuidlib.uuid4()))
    extra = DeviceDirs(sim.env, sim.io)(gpu.parents[5].address) / "mdev_supported_types" / "nvidia-9999"
    extra.mkdir()  # a type only this VF lists: read whole
    for attr, value in (("name", "NVIDIA L40S-X"), ("description", "num_heads=1"), ("device_api", "vfio-pci"),
                        ("available_instances", "1")):
        (extra / attr).write_text(value + "\n")
    io = Counting(sim.host)
    inv = discover(sim.env, io)
    n_types = len(gpu.parents[0].types)
    n_parents = sum(len(g.parents) for g in inv.gpus)
    assert io.names.count("name") == 2 * n_types + 1  # once per GPU, not once per VF
    assert io.names.count("available_instances") == n_parents * n_types + 2  # the new type: listed, then whole
    assert [(x.name, x.description) for x in inv.gpus[0].parents[5].types if x.id == "nvidia-9999"] == [
        ("NVIDIA L40S-X", "num_heads=1")]
    got = inv.gpus[0]
    assert [p.types for p in got.parents] != [got.parents[0].types] * len(got.parents)
    assert next(x for x in got.parents[3].types if x.id == t.id).available_instances == 0
    assert all(x.name and x.description for p in got.parents for x in p.types)
