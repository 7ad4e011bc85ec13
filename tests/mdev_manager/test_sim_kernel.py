"""The simulated kernel: every write behaves, and fails, as kernel.md says the kernel does.

The manager's correctness on a simulated host is only worth what the simulation is
worth, so its kernel behaviour is pinned here against the reference facts (errnos,
file layout, equal-size mode, SR-IOV rules, vendor-specific VFIO, reboot), and so is
its process table (simulated holders of ``/dev/vfio`` files, as ``/proc`` shows them).
The EBUSY tests run with a real child process and with a simulated one.
"""

from __future__ import annotations

import errno
import os
import uuid as uuidlib
from pathlib import Path

import pytest

from mdev_manager import catalog
from mdev_manager.sim import HostSpec
from mdev_manager.sim import kernel as simkernel
from mdev_manager.sim.hostspec import GpuGroup

U1 = "5f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"
U2 = "6f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"


# --------------------------------------------------------------------------- helpers
def gpu_of(sim, board_key: str, nth: int = 0) -> str:
    """PCI address of the nth simulated GPU of a catalog board."""
    return [g["pf"] for g in sim.host.gpus() if g["board"] == board_key][nth]


def spec(board_key: str, short: str) -> catalog.TypeSpec:
    return next(t for t in catalog.board(board_key).types if t.short_name == short)


def type_dir(sim, parent: str, board_key: str, short: str) -> Path:
    b = catalog.board(board_key)
    return sim.env.pci(parent) / "mdev_supported_types" / spec(board_key, short).mdev_id(b.driver)


def read(path: Path) -> str:
    return path.read_text()


def avail(tdir: Path) -> int:
    return int(read(tdir / "available_instances"))


def link_base(path: Path) -> str:
    return os.path.basename(os.readlink(path))


def write_err(sim, path: Path, data: str) -> int:
    with pytest.raises(OSError) as e:
        sim.io.write(path, data)
    return e.value.errno


def enable_vfs(sim, pf: str, n: int | None = None) -> list[str]:
    total = int(read(sim.env.pci(pf) / "sriov_totalvfs"))
    sim.io.write(sim.env.pci(pf) / "sriov_numvfs", f"{total if n is None else n}\n")
    d = sim.env.pci(pf)
    return [link_base(d / f"virtfn{i}") for i in range(int(read(d / "sriov_numvfs")))]


# --------------------------------------------------------------------------- mdev create
def test_create_makes_the_device_layout(sim):
    t4 = gpu_of(sim, "T4")
    tdir = type_dir(sim, t4, "T4", "T4-2Q")
    sim.io.write(tdir / "create", U1 + "\n")  # 37 bytes with the newline
    mdir = sim.env.pci(t4) / U1
    assert mdir.is_dir()
    assert os.path.realpath(sim.env.mdev_devices / U1) == os.path.realpath(mdir)
    assert os.path.realpath(mdir / "mdev_type") == os.path.realpath(tdir)
    assert os.path.realpath(tdir / "devices" / U1) == os.path.realpath(mdir)
    assert (mdir / "remove").exists()
    group = link_base(mdir / "iommu_group")
    assert group.isdigit()
    assert sim.env.vfio_group(group).exists()
    # each mdev gets its own group, not the parent's
    assert group != link_base(sim.env.pci(t4) / "iommu_group")
    assert os.path.lexists(sim.env.iommu_groups / group / "devices" / U1)


def test_create_without_newline_and_upper_case_is_lower_cased(sim):
    t4 = gpu_of(sim, "T4")
    tdir = type_dir(sim, t4, "T4", "T4-2Q")
    sim.io.write(tdir / "create", U1.upper())  # exactly 36 bytes
    assert (sim.env.pci(t4) / U1).is_dir()
    assert not (sim.env.pci(t4) / U1.upper()).exists()


@pytest.mark.parametrize("data", [
    U1[:-1],                        # 35 bytes
    U1[:-1] + "\n",                 # 35 bytes and a newline
    U1 + "0",                       # 37 bytes, no newline
    U1 + "\n\n",                    # 38 bytes
    "zf3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f",  # 36 bytes, not hex
    "5f3a7f621b2c4d5e8f900a1b2c3d4e5f0000",  # 36 bytes, no dashes
    "",
])
def test_create_rejects_anything_but_a_uuid_with_einval(sim, data):
    t4 = gpu_of(sim, "T4")
    tdir = type_dir(sim, t4, "T4", "T4-2Q")
    before = avail(tdir)
    assert write_err(sim, tdir / "create", data) == errno.EINVAL
    assert avail(tdir) == before
    assert os.listdir(sim.env.mdev_devices) == []


def test_create_duplicate_uuid_anywhere_is_eexist(sim):
    t4a, t4b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    sim.io.write(type_dir(sim, t4a, "T4", "T4-2Q") / "create", U1 + "\n")
    # same type, other type, other parent: the UUID is taken host-wide
    assert write_err(sim, type_dir(sim, t4a, "T4", "T4-2Q") / "create", U1 + "\n") == errno.EEXIST
    assert write_err(sim, type_dir(sim, t4a, "T4", "T4-2B") / "create", U1 + "\n") == errno.EEXIST
    assert write_err(sim, type_dir(sim, t4b, "T4", "T4-2Q") / "create", U1.upper() + "\n") == errno.EEXIST
    assert not (sim.env.pci(t4b) / U1).exists()


def test_available_instances_fall_and_eusers_when_none_left(sim):
    t4 = gpu_of(sim, "T4")
    tdir = type_dir(sim, t4, "T4", "T4-2Q")
    cap = spec("T4", "T4-2Q").max_instances
    assert avail(tdir) == cap
    for i in range(cap):
        sim.io.write(tdir / "create", str(uuidlib.uuid4()) + "\n")
        assert avail(tdir) == cap - i - 1
    assert write_err(sim, tdir / "create", U1 + "\n") == errno.EUSERS
    assert not (sim.env.pci(t4) / U1).exists()
    assert len(os.listdir(tdir / "devices")) == cap


def test_equal_size_mode_zeroes_every_other_size(sim):
    t4 = gpu_of(sim, "T4")
    board = catalog.board("T4")
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    two_gb = spec("T4", "T4-2Q").fb_mib
    for t in board.types:
        a = avail(sim.env.pci(t4) / "mdev_supported_types" / t.mdev_id())
        if t.fb_mib == two_gb:
            assert a == t.max_instances - 1, t.name  # every 2 GB type holds 8 per T4
        else:
            assert a == 0, t.name
    # the other T4 is a different physical GPU and is untouched
    other = gpu_of(sim, "T4", 1)
    assert avail(type_dir(sim, other, "T4", "T4-1Q")) == spec("T4", "T4-1Q").max_instances
    # a same-size type of another series still fits beside it (A, B and Q of one size mix)
    sim.io.write(type_dir(sim, t4, "T4", "T4-2B") / "create", U2 + "\n")
    assert write_err(sim, type_dir(sim, t4, "T4", "T4-1Q") / "create", str(uuidlib.uuid4())) == errno.EUSERS


# mixed-size mode (placements) is pinned in test_sim_placements.py


# --------------------------------------------------------------------------- mdev remove
def test_remove_one_removes_zero_does_nothing(sim):
    t4 = gpu_of(sim, "T4")
    tdir = type_dir(sim, t4, "T4", "T4-2Q")
    sim.io.write(tdir / "create", U1 + "\n")
    mdir = sim.env.pci(t4) / U1
    group = link_base(mdir / "iommu_group")
    sim.io.write(mdir / "remove", "0\n")
    assert mdir.is_dir()
    assert write_err(sim, mdir / "remove", "yes\n") == errno.EINVAL  # not a number (kstrtoul)
    assert mdir.is_dir()
    sim.io.write(mdir / "remove", "1\n")
    assert not mdir.exists()
    assert not os.path.lexists(sim.env.mdev_devices / U1)
    assert not os.path.lexists(tdir / "devices" / U1)
    assert not sim.env.vfio_group(group).exists()
    assert avail(tdir) == spec("T4", "T4-2Q").max_instances
    # every size is creatable again
    assert avail(type_dir(sim, t4, "T4", "T4-16Q")) == 1
    # a removed device's attribute is gone, so writing it again is ENOENT
    assert write_err(sim, mdir / "remove", "1\n") == errno.ENOENT


def test_remove_is_ebusy_while_a_process_holds_the_group(sim, holder):
    t4 = gpu_of(sim, "T4")
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    mdir = sim.env.pci(t4) / U1
    node = sim.env.vfio_group(link_base(mdir / "iommu_group"))
    h = holder(sim, node)
    assert write_err(sim, mdir / "remove", "1\n") == errno.EBUSY
    assert mdir.is_dir() and node.exists()
    h.release()
    sim.io.write(mdir / "remove", "1\n")
    assert not mdir.exists()


# --------------------------------------------------------------------------- SR-IOV
def test_sriov_numvfs_rules(sim):
    a100 = gpu_of(sim, "A100-40GB")
    d = sim.env.pci(a100)
    total = catalog.board("A100-40GB").sriov_total_vfs
    assert int(read(d / "sriov_totalvfs")) == total
    assert int(read(d / "sriov_numvfs")) == 0
    assert not (d / "mdev_supported_types").exists()  # mdevs live on the VFs, not the PF
    assert write_err(sim, d / "sriov_numvfs", f"{total + 1}\n") == errno.ERANGE
    sim.io.write(d / "sriov_numvfs", "0\n")  # the current value: a no-op
    vfs = enable_vfs(sim, a100, 4)
    assert len(vfs) == 4 and int(read(d / "sriov_numvfs")) == 4
    for vf in vfs:
        vd = sim.env.pci(vf)
        assert os.path.realpath(vd / "physfn") == os.path.realpath(d)
        assert (sim.env.mdev_bus / vf).exists()
        assert link_base(vd / "driver") == "nvidia"
        # each VF is an mdev parent that holds one vGPU: 1 or 0 per type
        assert avail(type_dir(sim, vf, "A100-40GB", "A100-4C")) == 1
        assert link_base(vd / "iommu_group") != link_base(d / "iommu_group")
    sim.io.write(d / "sriov_numvfs", "4\n")  # no-op
    assert write_err(sim, d / "sriov_numvfs", "8\n") == errno.EBUSY  # disable first
    assert int(read(d / "sriov_numvfs")) == 4
    sim.io.write(d / "sriov_numvfs", "0\n")
    assert int(read(d / "sriov_numvfs")) == 0
    assert not any(n.startswith("virtfn") for n in os.listdir(d))
    for vf in vfs:
        assert not os.path.lexists(sim.env.pci(vf))
        assert not os.path.lexists(sim.env.mdev_bus / vf)
    assert len(enable_vfs(sim, a100, 8)) == 8


def test_vf_mdev_takes_the_vf_and_counts_against_the_gpu(sim):
    a100 = gpu_of(sim, "A100-40GB")
    vfs = enable_vfs(sim, a100)
    cap = spec("A100-40GB", "A100-20C").max_instances
    sim.io.write(type_dir(sim, vfs[0], "A100-40GB", "A100-20C") / "create", U1 + "\n")
    # the VF now holds its one vGPU
    assert avail(type_dir(sim, vfs[0], "A100-40GB", "A100-20C")) == 0
    assert write_err(sim, type_dir(sim, vfs[0], "A100-40GB", "A100-20C") / "create", U2) == errno.EUSERS
    # other VFs: same size still possible, other sizes not (equal-size mode)
    assert avail(type_dir(sim, vfs[1], "A100-40GB", "A100-20C")) == 1
    assert avail(type_dir(sim, vfs[1], "A100-40GB", "A100-4C")) == 0
    for i in range(1, cap):
        sim.io.write(type_dir(sim, vfs[i], "A100-40GB", "A100-20C") / "create", str(uuidlib.uuid4()))
    # the physical GPU is full: every other VF reads 0
    assert all(avail(type_dir(sim, vf, "A100-40GB", "A100-20C")) == 0 for vf in vfs[cap:])
    # MIG-backed types need MIG mode, which the simulated GPU does not have
    assert avail(type_dir(sim, vfs[-1], "A100-40GB", "A100-1-5C")) == 0


def test_sriov_enoent_without_a_driver(sim):
    a100 = gpu_of(sim, "A100-40GB")
    sim.io.write(sim.env.pci_drivers / "nvidia" / "unbind", a100)
    assert not os.path.lexists(sim.env.pci(a100) / "driver")
    assert write_err(sim, sim.env.pci(a100) / "sriov_numvfs", "4\n") == errno.ENOENT
    assert write_err(sim, sim.env.pci(a100) / "sriov_numvfs", "99\n") == errno.ERANGE  # range is checked first


def test_pf_cannot_unbind_with_vfs_enabled(sim):
    a100 = gpu_of(sim, "A100-40GB")
    enable_vfs(sim, a100, 2)
    assert write_err(sim, sim.env.pci_drivers / "nvidia" / "unbind", a100) == errno.EBUSY
    assert link_base(sim.env.pci(a100) / "driver") == "nvidia"


# --------------------------------------------------------------------------- vfio-pci binding
def _bind(sim, addr: str, driver: str | None) -> None:
    current = os.path.lexists(sim.env.pci(addr) / "driver") and link_base(sim.env.pci(addr) / "driver")
    sim.io.write(sim.env.pci(addr) / "driver_override", f"{driver or ''}\n")
    if current:
        sim.io.write(sim.env.pci_drivers / current / "unbind", addr)
    sim.io.write(sim.env.drivers_probe, addr)


def test_bind_every_group_function_to_vfio_pci_creates_the_group_node(make_sim):
    sim = make_sim("workstation")
    t4 = gpu_of(sim, "T4")
    d = sim.env.pci(t4)
    group = link_base(d / "iommu_group")
    members = sorted(os.listdir(sim.env.iommu_groups / group / "devices"))
    assert len(members) == 2 and t4 in members  # the GPU and its HDA audio function
    audio = next(m for m in members if m != t4)
    node = sim.env.vfio_group(group)
    assert not node.exists()

    sim.io.write(d / "driver_override", "vfio-pci\n")
    assert read(d / "driver_override").strip() == "vfio-pci"
    sim.io.write(sim.env.pci_drivers / "nvidia" / "unbind", t4)
    assert not os.path.lexists(d / "driver")
    assert not (d / "mdev_supported_types").exists()  # the vendor driver's types leave with it
    sim.io.write(sim.env.drivers_probe, t4)
    assert link_base(d / "driver") == "vfio-pci"
    assert os.path.lexists(sim.env.pci_drivers / "vfio-pci" / t4)
    # the audio function is still on its own driver: the group is not usable yet
    assert not node.exists()

    _bind(sim, audio, "vfio-pci")
    assert link_base(sim.env.pci(audio) / "driver") == "vfio-pci"
    assert node.exists()
    assert (sim.env.vfio_dir / "vfio").exists()  # the container node beside it

    # undo: empty override, unbind, probe returns each function to its native driver
    _bind(sim, t4, None)
    assert read(d / "driver_override").strip() == "(null)"
    assert link_base(d / "driver") == "nvidia"
    assert (d / "mdev_supported_types").is_dir()
    assert not node.exists()
    _bind(sim, audio, None)
    assert link_base(sim.env.pci(audio) / "driver") == "snd_hda_intel"


def test_unbind_vfio_pci_is_ebusy_while_the_group_is_open(sim, holder):
    t4 = gpu_of(sim, "T4", 1)
    _bind(sim, t4, "vfio-pci")
    node = sim.env.vfio_group(link_base(sim.env.pci(t4) / "iommu_group"))
    assert node.exists()
    h = holder(sim, node)
    assert write_err(sim, sim.env.pci_drivers / "vfio-pci" / "unbind", t4) == errno.EBUSY
    assert link_base(sim.env.pci(t4) / "driver") == "vfio-pci"
    h.release()
    sim.io.write(sim.env.pci_drivers / "vfio-pci" / "unbind", t4)
    assert not node.exists()


def test_unbind_from_the_wrong_driver_is_enodev(sim):
    t4 = gpu_of(sim, "T4")
    assert write_err(sim, sim.env.pci_drivers / "vfio-pci" / "unbind", t4) == errno.ENODEV
    assert link_base(sim.env.pci(t4) / "driver") == "nvidia"


def test_iommufd_host_gets_vfio_cdevs(make_sim):
    sim = make_sim("l40s-node")
    assert sim.env.iommufd.exists()
    pf = gpu_of(sim, "L40S")
    _bind(sim, pf, "vfio-pci")
    cdevs = os.listdir(sim.env.pci(pf) / "vfio-dev")
    assert len(cdevs) == 1 and cdevs[0].startswith("vfio")
    assert (sim.env.vfio_dir / "devices" / cdevs[0]).exists()
    _bind(sim, pf, None)
    assert not (sim.env.pci(pf) / "vfio-dev").exists()
    assert not (sim.env.vfio_dir / "devices" / cdevs[0]).exists()


IOMMUFD_HOST = HostSpec(iommufd=True, gpus=[GpuGroup(board="T4"), GpuGroup(board="L40S"),
                                             GpuGroup(board="L40S", driver="vfio-pci")])


def cdev_of(sim, device_dir: Path) -> Path:
    """``/dev/vfio/devices/vfioN`` of the one vfio cdev registered under ``device_dir``."""
    (name,) = os.listdir(device_dir / "vfio-dev")
    return sim.env.vfio_cdev_dir / name


def test_a_vfio_cdev_names_its_device_in_sysfs(make_sim):
    """``/sys/class/vfio-dev/vfioN/device`` leads to the mdev, VF or function it belongs to."""
    sim = make_sim(IOMMUFD_HOST)
    t4, l40s, pt = gpu_of(sim, "T4"), gpu_of(sim, "L40S"), gpu_of(sim, "L40S", 1)
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    vf = enable_vfs(sim, l40s)[0]
    sim.io.write(sim.env.pci(vf) / "nvidia/current_vgpu_type", f"{spec('L40S', 'L40S-8Q').num}\n")
    for device_dir in (sim.env.pci(t4) / U1, sim.env.pci(vf), sim.env.pci(pt)):
        cdev = cdev_of(sim, device_dir)
        assert cdev.exists()
        assert os.path.realpath(sim.env.vfio_dev_class / cdev.name / "device") == os.path.realpath(device_dir)
    names = os.listdir(sim.env.vfio_dev_class)
    sim.io.write(sim.env.pci(t4) / U1 / "remove", "1\n")
    sim.io.write(sim.env.pci(vf) / "nvidia/current_vgpu_type", "0\n")
    _bind(sim, pt, None)
    assert len(os.listdir(sim.env.vfio_dev_class)) == len(names) - 3  # each device's cdev goes with it


def test_an_open_vfio_cdev_keeps_its_device(make_sim, holder):
    """An iommufd user holds the device's cdev, not its group: remove, unbind, clearing a
    vendor vGPU and disabling VFs are EBUSY all the same."""
    sim = make_sim(IOMMUFD_HOST)
    t4, l40s, pt = gpu_of(sim, "T4"), gpu_of(sim, "L40S"), gpu_of(sim, "L40S", 1)
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    vf = enable_vfs(sim, l40s)[0]
    nv = sim.env.pci(vf) / "nvidia/current_vgpu_type"
    sim.io.write(nv, f"{spec('L40S', 'L40S-8Q').num}\n")
    mdir = sim.env.pci(t4) / U1
    h = holder(sim, sim.env.iommufd, cdev_of(sim, mdir), cdev_of(sim, sim.env.pci(vf)), cdev_of(sim, sim.env.pci(pt)))
    assert write_err(sim, mdir / "remove", "1\n") == errno.EBUSY
    assert write_err(sim, sim.env.pci_drivers / "nvidia" / "unbind", t4) == errno.EBUSY
    assert write_err(sim, nv, "0\n") == errno.EBUSY
    assert write_err(sim, sim.env.pci(l40s) / "sriov_numvfs", "0\n") == errno.EBUSY
    assert write_err(sim, sim.env.pci_drivers / "vfio-pci" / "unbind", pt) == errno.EBUSY
    assert mdir.is_dir() and read(nv).strip() != "0" and link_base(sim.env.pci(pt) / "driver") == "vfio-pci"
    h.release()
    sim.io.write(mdir / "remove", "1\n")
    sim.io.write(sim.env.pci(l40s) / "sriov_numvfs", "0\n")
    sim.io.write(sim.env.pci_drivers / "vfio-pci" / "unbind", pt)
    assert not mdir.exists() and not sim.env.pci(vf).exists() and not (sim.env.pci(pt) / "driver").exists()


# --------------------------------------------------------------------------- vendor-specific VFIO
def creatable(sim, vf: str) -> list[str]:
    text = read(sim.env.pci(vf) / "nvidia" / "creatable_vgpu_types")
    lines = text.splitlines()
    assert lines[0] == "ID    : vGPU Name"
    return [line.split(":")[0].strip() for line in lines[1:]]


def test_vendor_vfio_create_destroy_and_shrinking_lists(sim, holder):
    pf = gpu_of(sim, "L40S")
    board = catalog.board("L40S")
    vfs = enable_vfs(sim, pf)
    assert len(vfs) == board.sriov_total_vfs
    for vf in vfs[:2]:
        nv = sim.env.pci(vf) / "nvidia"
        assert read(nv / "current_vgpu_type").strip() == "0"
        assert not (sim.env.pci(vf) / "mdev_supported_types").exists()  # no mdev on this framework
        assert sorted(creatable(sim, vf)) == sorted(str(t.num) for t in board.types)
    q8 = spec("L40S", "L40S-8Q")
    nv0 = sim.env.pci(vfs[0]) / "nvidia"
    group0 = link_base(sim.env.pci(vfs[0]) / "iommu_group")
    sim.io.write(nv0 / "current_vgpu_type", f"{q8.num}\n")
    assert read(nv0 / "current_vgpu_type").strip() == str(q8.num)
    assert sim.env.vfio_group(group0).exists()
    assert link_base(sim.env.pci(vfs[0]) / "driver") == "nvidia"  # stays on nvidia
    assert creatable(sim, vfs[0]) == []  # the VF holds its vGPU
    # other VFs: only types of the same framebuffer size remain
    same = sorted(str(t.num) for t in board.types if t.fb_mib == q8.fb_mib)
    assert sorted(creatable(sim, vfs[1])) == same
    # an unlisted id (another size now, or no such type): the configured errno
    q1 = spec("L40S", "L40S-1Q")
    assert write_err(sim, sim.env.pci(vfs[1]) / "nvidia/current_vgpu_type", f"{q1.num}\n") == simkernel.UNLISTED_TYPE_ERRNO
    assert write_err(sim, sim.env.pci(vfs[1]) / "nvidia/current_vgpu_type", "99999\n") == simkernel.UNLISTED_TYPE_ERRNO
    assert write_err(sim, sim.env.pci(vfs[1]) / "nvidia/current_vgpu_type", "abc\n") == errno.EINVAL
    # a new type over a set one
    assert write_err(sim, nv0 / "current_vgpu_type", f"{q8.num}\n") == errno.EBUSY
    # fill the GPU: every list shrinks to the header alone
    for vf in vfs[1:q8.max_instances]:
        sim.io.write(sim.env.pci(vf) / "nvidia/current_vgpu_type", f"{q8.num}\n")
    assert all(creatable(sim, vf) == [] for vf in vfs)
    assert write_err(sim, sim.env.pci(vfs[-1]) / "nvidia/current_vgpu_type", f"{q8.num}\n") == simkernel.UNLISTED_TYPE_ERRNO
    # destroy: EBUSY while open, then 0 clears
    h = holder(sim, sim.env.vfio_group(group0))
    assert write_err(sim, nv0 / "current_vgpu_type", "0\n") == errno.EBUSY
    h.release()
    sim.io.write(nv0 / "current_vgpu_type", "0\n")
    assert read(nv0 / "current_vgpu_type").strip() == "0"
    assert not sim.env.vfio_group(group0).exists()
    assert sorted(creatable(sim, vfs[0])) == same  # one 8 GB slot free again
    assert str(q8.num) in creatable(sim, vfs[-1])


# --------------------------------------------------------------------------- read-only attributes
@pytest.mark.parametrize("attr", ["vendor", "device", "class", "numa_node", "sriov_totalvfs"])
def test_read_only_pci_attributes_are_eacces(sim, attr):
    a100 = gpu_of(sim, "A100-40GB")
    before = read(sim.env.pci(a100) / attr)
    assert write_err(sim, sim.env.pci(a100) / attr, "1\n") == errno.EACCES
    assert read(sim.env.pci(a100) / attr) == before


def test_read_only_type_attributes_are_eacces(sim):
    tdir = type_dir(sim, gpu_of(sim, "T4"), "T4", "T4-2Q")
    for attr in ("available_instances", "name", "device_api", "description"):
        assert write_err(sim, tdir / attr, "99\n") == errno.EACCES
    assert avail(tdir) == spec("T4", "T4-2Q").max_instances
    assert write_err(sim, tdir / "no_such_attribute", "1") == errno.ENOENT


# --------------------------------------------------------------------------- reboot
def test_reboot_drops_vfs_and_vgpus_keeps_definitions(sim):
    t4, t4b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    a100, l40s = gpu_of(sim, "A100-40GB"), gpu_of(sim, "L40S")
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    avf = enable_vfs(sim, a100)
    sim.io.write(type_dir(sim, avf[0], "A100-40GB", "A100-4C") / "create", U2 + "\n")
    groups_before = {vf: link_base(sim.env.pci(vf) / "iommu_group") for vf in avf}
    lvf = enable_vfs(sim, l40s)
    sim.io.write(sim.env.pci(lvf[0]) / "nvidia/current_vgpu_type", f"{spec('L40S', 'L40S-8Q').num}\n")
    _bind(sim, t4b, "vfio-pci")
    saved = sim.env.mdevctl_root / t4 / U1
    saved.parent.mkdir(parents=True)
    saved.write_text('{"mdev_type": "nvidia-231", "start": "auto", "attrs": []}\n')

    sim.host.reboot()

    assert os.listdir(sim.env.mdev_devices) == []
    assert not (sim.env.pci(t4) / U1).exists()
    for pf in (a100, l40s):
        assert int(read(sim.env.pci(pf) / "sriov_numvfs")) == 0
        assert not any(n.startswith("virtfn") for n in os.listdir(sim.env.pci(pf)))
    for vf in avf + lvf:
        assert not os.path.lexists(sim.env.pci(vf))
    assert sorted(os.listdir(sim.env.vfio_dir)) == ["vfio"]
    assert saved.exists()  # /etc survives a reboot
    # drivers are back to the boot-time binding, overrides cleared
    assert link_base(sim.env.pci(t4b) / "driver") == "nvidia"
    assert read(sim.env.pci(t4b) / "driver_override").strip() == "(null)"
    # and the GPUs offer everything again
    assert avail(type_dir(sim, t4, "T4", "T4-1Q")) == spec("T4", "T4-1Q").max_instances
    # VFs come back with the same addresses and IOMMU groups when enabled again
    groups = {vf: link_base(sim.env.pci(vf) / "iommu_group") for vf in enable_vfs(sim, a100)}
    assert groups == groups_before


# --------------------------------------------------------------------------- simulated processes
def test_a_simulated_process_looks_like_a_real_one_in_proc(sim):
    t4 = gpu_of(sim, "T4")
    sim.io.write(type_dir(sim, t4, "T4", "T4-2Q") / "create", U1 + "\n")
    node = sim.env.vfio_group(link_base(sim.env.pci(t4) / U1 / "iommu_group"))
    pid = sim.host.spawn_holder([node], comm="qemu-system-x86_64", cmdline=["qemu-system-x86_64", "-name", "vm1"])
    proc = sim.env.proc_root / str(pid)
    assert proc.parent == sim.root / "proc"
    assert read(proc / "comm") == "qemu-system-x86\n"  # the kernel keeps 15 characters
    assert read(proc / "cmdline") == "qemu-system-x86_64\0-name\0vm1\0"
    assert sorted(os.listdir(proc / "fd")) == ["0", "1", "2", "3"]
    assert os.readlink(proc / "fd/0") == "/dev/null"
    assert os.readlink(proc / "fd/3") == os.path.realpath(node)
    assert sim.host.holders({str(node)}) == [pid]
    other = sim.host.spawn_holder([node])
    assert other > pid and sim.host.procs.pids() == [pid, other]
    sim.host.kill(pid)
    assert not proc.exists() and sim.host.holders({str(node)}) == [other]
    with pytest.raises(ProcessLookupError):
        sim.host.kill(pid)
    sim.host.kill(other)
    assert sim.host.spawn_holder([node]) > other  # pids are not handed out again
    with pytest.raises(FileNotFoundError):
        sim.host.spawn_holder([sim.env.vfio_group(999)])  # only what exists can be opened


def test_a_simulated_process_can_hold_a_vfio_cdev(make_sim):
    sim = make_sim("l40s-node")
    pf = gpu_of(sim, "L40S")
    _bind(sim, pf, "vfio-pci")
    (cdev,) = os.listdir(sim.env.pci(pf) / "vfio-dev")
    path = sim.env.vfio_dir / "devices" / cdev
    pid = sim.host.spawn_holder([sim.env.iommufd, path])
    fds = sim.env.proc_root / str(pid) / "fd"
    assert [os.readlink(fds / n) for n in ("3", "4")] == [os.path.realpath(sim.env.iommufd), os.path.realpath(path)]
    assert sim.host.holders({str(path)}) == [pid]


def test_reboot_ends_every_simulated_process(sim):
    pids = [sim.host.spawn_holder([sim.env.vfio_dir / "vfio"]) for _ in range(2)]
    assert sim.host.procs.pids() == pids
    sim.host.reboot()
    assert sim.host.procs.pids() == [] and [n for n in os.listdir(sim.env.proc_root) if n.isdigit()] == []
