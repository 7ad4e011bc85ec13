"""Who uses a device: real processes on the real /proc, simulated ones on a simulated host's,
libvirt domains, and the merged view the planner reads."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdev_manager import catalog
from mdev_manager.config import GpuLayout
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import RealIO
from mdev_manager.models import CdevHolder, Holder, Usage
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from mdev_manager.usage import collect_usage, libvirt_devices, parse_domain_devices, scan_vfio_holders

MDEV = "5f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"

try:
    import libvirt  # noqa: F401

    _LIBVIRT_MISSING = None
except ImportError as e:  # pragma: no cover - depends on the machine
    _LIBVIRT_MISSING = f"libvirt-python not importable: {e}"

libvirt_only = pytest.mark.skipif(_LIBVIRT_MISSING is not None, reason=_LIBVIRT_MISSING or "")
IO = RealIO()


def real_env(root, **kw) -> HostEnv:
    """Host paths below ``root``, processes from the real /proc (children of this test)."""
    return HostEnv.under(root, proc_root=Path("/proc"), **kw)


def _hold_open(path, ready):
    code = (
        "import sys, time\n"
        f"f = open({str(path)!r})\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for(path, timeout=10.0):
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, "child never opened the file"
        time.sleep(0.02)


def test_child_holding_group_is_found_then_gone(tmp_path):
    env = real_env(tmp_path)
    env.vfio_dir.mkdir(parents=True)
    group = env.vfio_group(12)
    group.write_text("")
    (env.vfio_dir / "vfio").write_text("")  # the container node is not a group
    ready = tmp_path / "ready"
    child = _hold_open(group, ready)
    try:
        _wait_for(ready)
        held = scan_vfio_holders(env, IO)
        assert 12 in held
        mine = [h for h in held[12] if h.pid == child.pid]
        assert len(mine) == 1 and mine[0].comm.startswith("python")
        assert all(h.pid != os.getpid() for h in held[12])
        usage = collect_usage(env, IO)
        reasons = usage.mdev_users(MDEV, 12)
        assert any(f"pid {child.pid} " in r and r.endswith(f"holds {group}") for r in reasons)
        assert usage.mdev_users(MDEV, 13) == []
        assert usage.pci_users("0000:65:00.0", None) == []
    finally:
        child.kill()
        child.wait()
    assert child.pid not in [h.pid for h in scan_vfio_holders(env, IO).get(12, [])]


def test_same_file_through_another_path_is_found(tmp_path):
    """A process in another mount namespace sees the group under its own /dev/vfio."""
    env = real_env(tmp_path / "host")
    env.vfio_dir.mkdir(parents=True)
    env.vfio_group(7).write_text("")
    other = tmp_path / "container/dev/vfio"
    other.mkdir(parents=True)
    os.link(env.vfio_group(7), other / "7")  # same inode, different path
    ready = tmp_path / "ready"
    child = _hold_open(other / "7", ready)
    try:
        _wait_for(ready)
        assert any(h.pid == child.pid for h in scan_vfio_holders(env, IO).get(7, []))
    finally:
        child.kill()
        child.wait()


def test_missing_vfio_dir_and_proc(tmp_path):
    env = HostEnv.under(tmp_path, proc_root=tmp_path / "noproc")
    assert scan_vfio_holders(env, IO) == {}
    usage = collect_usage(env, IO)
    assert usage.warnings and "not checked" in usage.warnings[0]


# --- simulated processes: the same scan, through SimIO, on the simulated host's /proc ------

def _group_of_new_mdev(sim) -> int:
    t4 = next(g for g in sim.discover().gpus if g.framework == "mdev")
    tdir = sim.env.pci(t4.address) / "mdev_supported_types" / t4.types[0].id
    sim.io.write(tdir / "create", MDEV)
    return next(v.iommu_group for v in sim.discover().all_vgpus() if v.id == MDEV)


def test_simulated_qemu_holding_a_group_is_found_then_gone(sim):
    group = _group_of_new_mdev(sim)
    pid = sim.host.spawn_holder([sim.env.vfio_group(group)], comm="qemu-kvm")
    assert scan_vfio_holders(sim.env, sim.io) == {group: [Holder(pid=pid, comm="qemu-kvm")]}
    usage = collect_usage(sim.env, sim.io)
    assert usage.warnings == []
    assert usage.mdev_users(MDEV, group) == [f"pid {pid} (qemu-kvm) holds {sim.env.vfio_group(group)}"]
    sim.host.kill(pid)
    assert scan_vfio_holders(sim.env, sim.io) == {}
    assert collect_usage(sim.env, sim.io).mdev_users(MDEV, group) == []


def test_simulated_holder_in_another_mount_namespace_is_found(sim):
    """A virt-launcher's own /dev/vfio: the fd names another path to the same node."""
    group = _group_of_new_mdev(sim)
    other = sim.root / "container/dev/vfio"
    other.mkdir(parents=True)
    os.link(sim.env.vfio_group(group), other / str(group))
    pid = sim.host.spawn_holder([other / str(group)])
    assert scan_vfio_holders(sim.env, sim.io) == {group: [Holder(pid=pid, comm="qemu-kvm")]}


def test_real_and_simulated_processes_are_seen_each_on_their_own_proc(sim, hold):
    group = _group_of_new_mdev(sim)
    node = sim.env.vfio_group(group)
    real = hold(node)
    simulated = sim.host.spawn_holder([node])
    assert [h.pid for h in scan_vfio_holders(sim.env, sim.io)[group]] == [simulated]
    seen_real = scan_vfio_holders(sim.with_real_proc().env, sim.io)[group]
    assert real.pid in [h.pid for h in seen_real] and simulated not in [h.pid for h in seen_real]
    assert sorted(sim.host.holders({str(node)})) == sorted([real.pid, simulated])  # the kernel sees both


def test_a_simulated_host_without_proc_is_not_checked(sim):
    os.rmdir(sim.env.proc_root)
    usage = collect_usage(sim.env, sim.io)
    assert usage.warnings == [f"{sim.env.proc_root} is not readable; open VFIO groups not checked"]


# --- iommufd: a VM holds its device's vfio cdev (/dev/vfio/devices/vfioN), not the group ------

IOMMUFD_HOST = HostSpec(iommufd=True, gpus=[GpuGroup(board="T4"), GpuGroup(board="L40S")])


def _iommufd_vgpus(sim) -> tuple[str, Path, Path]:
    """An mdev on the T4 and a vendor-VFIO vGPU on an L40S VF: (the VF, the mdev's cdev, the VF's cdev)."""
    t4, l40s = (next(g["pf"] for g in sim.host.gpus() if g["board"] == b) for b in ("T4", "L40S"))
    t4_type = catalog.board("T4").types[0].mdev_id(catalog.board("T4").driver)
    sim.io.write(sim.env.pci(t4) / "mdev_supported_types" / t4_type / "create", MDEV)
    sim.io.write(sim.env.pci(l40s) / "sriov_numvfs", "1\n")
    vf = os.path.basename(os.readlink(sim.env.pci(l40s) / "virtfn0"))
    sim.io.write(sim.env.pci(vf) / "nvidia/current_vgpu_type", f"{catalog.board('L40S').types[0].num}\n")
    cdevs = []
    for d in (sim.env.pci(t4) / MDEV, sim.env.pci(vf)):
        (name,) = os.listdir(d / "vfio-dev")
        cdevs.append(sim.env.vfio_cdev_dir / name)
    return vf, *cdevs


def test_simulated_qemu_holding_vfio_cdevs_is_found_then_gone(make_sim):
    sim = make_sim(IOMMUFD_HOST)
    vf, mdev_cdev, vf_cdev = _iommufd_vgpus(sim)
    pid = sim.host.spawn_holder([sim.env.iommufd, mdev_cdev, vf_cdev])
    assert scan_vfio_holders(sim.env, sim.io) == {}  # no group is open: only the cdevs say it
    usage = collect_usage(sim.env, sim.io)
    assert usage.warnings == []
    assert usage.mdev_users(MDEV.upper()) == [f"pid {pid} (qemu-kvm) holds {mdev_cdev}"]
    assert usage.pci_users(vf) == [f"pid {pid} (qemu-kvm) holds {vf_cdev}"]
    sim.host.kill(pid)
    usage = collect_usage(sim.env, sim.io)
    assert usage.mdev_users(MDEV) == [] and usage.pci_users(vf) == []


def test_cdev_holder_in_another_mount_namespace_is_found(make_sim):
    """A virt-launcher's own /dev/vfio/devices: the fd names another path to the same node."""
    sim = make_sim(IOMMUFD_HOST)
    _, mdev_cdev, _ = _iommufd_vgpus(sim)
    other = sim.root / "container/dev/vfio/devices"
    other.mkdir(parents=True)
    os.link(mdev_cdev, other / "vfio0")  # another name, too: the node identity decides
    pid = sim.host.spawn_holder([other / "vfio0"], comm="virt-launcher")
    assert collect_usage(sim.env, sim.io).mdev_users(MDEV) == [f"pid {pid} (virt-launcher) holds {mdev_cdev}"]


def test_real_process_holding_a_vfio_cdev_is_found(make_sim, hold):
    sim = make_sim(IOMMUFD_HOST)
    vf, _, vf_cdev = _iommufd_vgpus(sim)
    real = hold(sim.env.iommufd, vf_cdev)
    users = collect_usage(sim.with_real_proc().env, sim.io).pci_users(vf)
    assert any(u.startswith(f"pid {real.pid} (") and u.endswith(f"holds {vf_cdev}") for u in users)
    assert collect_usage(sim.env, sim.io).pci_users(vf) == []  # the simulated /proc has no such process


def test_a_held_cdev_of_unknown_device_is_a_warning(make_sim):
    sim = make_sim(IOMMUFD_HOST)
    _, mdev_cdev, _ = _iommufd_vgpus(sim)
    os.unlink(sim.env.vfio_dev_class / mdev_cdev.name)  # sysfs does not say whose it is
    pid = sim.host.spawn_holder([mdev_cdev])
    usage = collect_usage(sim.env, sim.io)
    assert usage.mdev_users(MDEV) == []
    (w,) = usage.warnings
    assert f"pid {pid} (qemu-kvm) holds {mdev_cdev}" in w and "which device" in w



# --- a held function answers for its GPU: IOMMU group mates, a VF's PF (issue 12) ------------

COMPANION_HOST = HostSpec(iommufd=True, gpus=[GpuGroup(board="T4", audio_function=True), GpuGroup(board="L40S")])


def _passed_through_with_audio(sim) -> tuple[str, str, Path]:
    """The T4 and its audio function passed through (both on vfio-pci): (GPU, audio, the audio's cdev)."""
    t4 = next(g["pf"] for g in sim.host.gpus() if g["board"] == "T4")
    audio = t4[:-1] + "1"
    out = reconcile(sim.env, sim.io, [GpuLayout(pci_address=t4, mode="passthrough")])
    assert out.ok and out.blocked == [], out
    assert {_driver(sim, a) for a in (t4, audio)} == {"vfio-pci"}
    (name,) = os.listdir(sim.env.pci(audio) / "vfio-dev")
    return t4, audio, sim.env.vfio_cdev_dir / name


def _driver(sim, address: str) -> str | None:
    link = sim.env.pci(address) / "driver"
    return os.path.basename(os.readlink(link)) if os.path.lexists(link) else None


def test_a_held_companion_cdev_holds_its_gpu(make_sim):
    """A VM on the GPU's audio function (its cdev, iommufd) holds the GPU: one DMA owner per group."""
    sim = make_sim(COMPANION_HOST)
    t4, audio, cdev = _passed_through_with_audio(sim)
    gpu = sim.discover().gpu(t4)
    pid = sim.host.spawn_holder([sim.env.iommufd, cdev], comm="virt-launcher")
    usage = collect_usage(sim.env, sim.io)
    assert usage.warnings == []
    assert usage.pci_users(audio) == [f"pid {pid} (virt-launcher) holds {cdev}"]
    assert usage.pci_users(t4, gpu.iommu_group) == [
        f"pid {pid} (virt-launcher) holds {cdev} of {audio}, in IOMMU group {gpu.iommu_group} with it"]
    sim.host.kill(pid)
    assert collect_usage(sim.env, sim.io).pci_users(t4, gpu.iommu_group) == []


def test_apply_leaves_a_gpu_bound_while_its_companion_cdev_is_held(make_sim):
    """The layout wants the T4 back for vGPUs; its audio function's cdev is open: the apply says the
    GPU is blocked, by whom, and rebinds nothing (the kernel would unbind the GPU, then fail its
    probe on nvidia: the group's DMA owner is the VM). Released, the next apply goes through."""
    sim = make_sim(COMPANION_HOST)
    t4, audio, cdev = _passed_through_with_audio(sim)
    pid = sim.host.spawn_holder([sim.env.iommufd, cdev])
    layout = [GpuLayout(pci_address=t4, mode="vgpu", vgpus={catalog.board("T4").types[0].name: 1})]
    out = reconcile(sim.env, sim.io, layout)
    (blocked,) = out.blocked
    assert (blocked.device, blocked.gpu) == (t4, t4)
    assert any(f"pid {pid} (qemu-kvm) holds {cdev} of {audio}" in h for h in blocked.held_by), blocked
    assert not out.matches
    assert all(not r.report or not r.report.results for r in out.rounds), "a step ran under the VM"
    assert (_driver(sim, t4), _driver(sim, audio)) == ("vfio-pci", "vfio-pci")
    sim.host.kill(pid)
    out = reconcile(sim.env, sim.io, layout)
    assert out.matches, out
    assert _driver(sim, t4) == "nvidia" and len(sim.discover().gpu(t4).vgpus) == 1


def test_a_held_vf_is_credited_to_its_pf(make_sim):
    """A VF's holder (its cdev, or its group the legacy way) holds the PF too: disabling SR-IOV or
    rebinding the PF would take the VF away."""
    sim = make_sim(IOMMUFD_HOST)
    vf, _, vf_cdev = _iommufd_vgpus(sim)
    pf = next(g["pf"] for g in sim.host.gpus() if g["board"] == "L40S")
    by_cdev = sim.host.spawn_holder([sim.env.iommufd, vf_cdev])
    usage = collect_usage(sim.env, sim.io)
    assert usage.pci_users(vf) == [f"pid {by_cdev} (qemu-kvm) holds {vf_cdev}"]
    assert usage.pci_users(pf) == [f"pid {by_cdev} (qemu-kvm) holds {vf_cdev} of its VF {vf}"]
    sim.host.kill(by_cdev)
    group = int(os.path.basename(os.readlink(sim.env.pci(vf) / "iommu_group")))
    by_group = sim.host.spawn_holder([sim.env.vfio_group(group)])
    usage = collect_usage(sim.env, sim.io)
    assert usage.pci_users(pf) == [f"pid {by_group} (qemu-kvm) holds {sim.env.vfio_group(group)} of its VF {vf}"]
    sim.host.kill(by_group)
    assert collect_usage(sim.env, sim.io).pci_users(pf) == []


def test_an_mdev_holder_is_not_credited_to_its_parent(make_sim):
    """An mdev has an IOMMU group of its own: a VM on one vGPU does not hold the GPU's other vGPUs."""
    sim = make_sim(IOMMUFD_HOST)
    _, mdev_cdev, _ = _iommufd_vgpus(sim)
    t4 = next(g["pf"] for g in sim.host.gpus() if g["board"] == "T4")
    sim.host.spawn_holder([sim.env.iommufd, mdev_cdev])
    usage = collect_usage(sim.env, sim.io)
    assert usage.mdev_users(MDEV) and usage.pci_users(t4) == []

def test_parse_domain_devices_normalises():
    xml = f"""
    <domain type='kvm'><name>x</name><devices>
      <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
        <source><address uuid='{MDEV.upper()}'/></source></hostdev>
      <hostdev mode='subsystem' type='pci' managed='yes'>
        <source><address domain='0x0000' bus='0x65' slot='0x00' function='0x0'/></source></hostdev>
      <hostdev mode='subsystem' type='pci'>
        <source><address bus='0x66' slot='0x1f' function='0x7'/></source></hostdev>
      <interface type='hostdev'>
        <source><address type='pci' domain='0x0000' bus='0x17' slot='0x02' function='0x1'/></source>
      </interface>
      <hostdev mode='capabilities' type='storage'><source><block>/dev/sdb</block></source></hostdev>
    </devices></domain>"""
    mdevs, pci = parse_domain_devices(xml)
    assert mdevs == {MDEV}
    assert pci == {"0000:65:00.0", "0000:66:1f.7", "0000:17:02.1"}


def test_usage_merge_and_reasons():
    base = Usage(vfio_dir="/dev/vfio", vfio_groups={3: [Holder(pid=10, comm="qemu-kvm")]},
                 mdevs={MDEV: ["libvirt domain vm1"]})
    extra = Usage(mdevs={MDEV: ["libvirt domain vm1", "ResourceClaim ns/c1"]},
                  pci={"0000:65:00.0": ["ResourceClaim ns/c2"]}, warnings=["w"])
    u = base.merged(extra)
    assert u.mdev_users(MDEV.upper(), 3) == [
        "pid 10 (qemu-kvm) holds /dev/vfio/3",
        "libvirt domain vm1 references it",
        "ResourceClaim ns/c1 references it",
    ]
    assert u.pci_users("65:00.0") == ["ResourceClaim ns/c2 references it"]
    assert u.warnings == ["w"]
    cdev = Usage(vfio_devices={MDEV: [CdevHolder(pid=11, comm="qemu-kvm", node="/dev/vfio/devices/vfio2")],
                               "0000:65:00.0": [CdevHolder(pid=12, comm="qemu", node="/dev/vfio/devices/vfio3")]})
    both = u.merged(cdev).merged(cdev)
    assert both.mdev_users(MDEV, 3)[:2] == ["pid 10 (qemu-kvm) holds /dev/vfio/3",
                                           "pid 11 (qemu-kvm) holds /dev/vfio/devices/vfio2"]
    assert both.pci_users("65:00.0") == ["pid 12 (qemu) holds /dev/vfio/devices/vfio3",
                                         "ResourceClaim ns/c2 references it"]
    assert base.mdevs[MDEV] == ["libvirt domain vm1"]  # inputs untouched


NODE_XML = f"""<?xml version='1.0'?>
<node>
  <domain type='test'>
    <name>vm1</name>
    <memory>1048576</memory>
    <os><type>hvm</type></os>
    <devices>
      <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
        <source><address uuid='{MDEV}'/></source>
      </hostdev>
      <hostdev mode='subsystem' type='pci' managed='yes'>
        <source><address domain='0x0000' bus='0x65' slot='0x00' function='0x0'/></source>
      </hostdev>
    </devices>
  </domain>
  <domain type='test'>
    <name>idle</name>
    <memory>1048576</memory>
    <os><type>hvm</type></os>
  </domain>
</node>
"""


@pytest.mark.libvirt
@libvirt_only
def test_libvirt_test_driver(tmp_path):
    node = tmp_path / "node.xml"
    node.write_text(NODE_XML)
    lv = libvirt_devices(f"test://{node}")
    assert lv.warning is None
    assert lv.mdevs == {MDEV: ["vm1"]}
    assert lv.pci == {"0000:65:00.0": ["vm1"]}
    assert lv.active["vm1"] is True

    env = real_env(tmp_path, libvirt_uri=f"test://{node}")
    u = collect_usage(env, IO)
    assert u.mdev_users(MDEV, None) == ["libvirt domain vm1 references it"]
    assert u.pci_users("0000:65:00.0", None) == ["libvirt domain vm1 references it"]
    assert u.pci_users("0000:66:00.0", None) == []


@pytest.mark.libvirt
@libvirt_only
def test_libvirt_unreachable_is_a_warning(tmp_path, caplog):
    lv = libvirt_devices(f"test://{tmp_path}/nonexistent/file.xml")
    assert lv.mdevs == {} and lv.pci == {}
    assert lv.warning and "cannot connect" in lv.warning
    assert any("cannot connect" in r.getMessage() for r in caplog.records)
    u = collect_usage(real_env(tmp_path, libvirt_uri=f"test://{tmp_path}/nonexistent/file.xml"), IO)
    assert u.warnings == [lv.warning]


def test_libvirt_none_uri_is_silent():
    lv = libvirt_devices(None)
    assert lv.warning is None and lv.mdevs == {} and lv.pci == {}
