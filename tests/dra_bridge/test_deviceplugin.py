"""The classic device plugin (dra_bridge.deviceplugin) end to end, on a simulated host.

The kubelet side is tests/kubelet's FakeKubelet (its own protos, real unix sockets): it
records registrations and keeps a ListAndWatch stream per resource, as the kubelet does.
The host is the default simulated node with examples/layout.yaml applied: T4-2Q on GPU 0,
GPU 1 (a second T4) for passthrough, A100-4C on the A100's VFs, L40S-8Q vendor-VFIO VFs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dra_bridge.api.names import (
    normalize_prefix,
    nvidia_device_name,
    passthrough_name,
    resource_env_var,
    vgpu_type_name,
)
from dra_bridge.deviceplugin.backend import VgpuResource, preferred_devices
from dra_bridge.deviceplugin.manager import DevicePluginManager
from dra_bridge.deviceplugin.resources import DeviceInfo, compute_resources
from dra_bridge.rpc.deviceplugin_grpc import socket_name_for
from dra_bridge.rpc.podresources import allocated_devices
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2 as pr_pb2
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2_grpc as pr_grpc
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.watch import HostWatcher
from mdev_manager.models import Inventory
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import GpuGroup, HostSpec, load_host
from mdev_manager.sim.io import SimIO
from mdev_manager.sim.kernel import SimHost
from mdev_manager.sim.node import sim_node
from tests.support.kubelet.fake_kubelet import FakeKubelet

T4_2Q = "nvidia.com/GRID_T4-2Q"
T4_PT = "nvidia.com/TU104GL_TESLA_T4"
A100_4C = "nvidia.com/NVIDIA_A100-4C"
L40S_8Q = "nvidia.com/NVIDIA_L40S-8Q"
ALL = sorted([A100_4C, L40S_8Q, T4_2Q, T4_PT])

PCI_IDS = """\
# a few lines of pci.ids, so names do not depend on the machine's copy
10de  NVIDIA Corporation
\t1eb8  TU104GL [Tesla T4]
\t20f1  GA100 [A100 PCIe 40GB]
\t26b9  AD102GL [L40S]
"""

LAYOUT = {
    "version": "vgpuctl/v1",
    "layouts": {
        "default": [
            {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}},
            {"index": 1, "mode": "passthrough"},
            {"model": "A100", "mode": "vgpu", "vgpus": {"A100-4C": 6}},
            {"pciAddress": "0000:19:00.0", "mode": "vgpu", "vgpus": {"NVIDIA L40S-8Q": 4}},
        ]
    },
}

WAIT = 10.0


# --------------------------------------------------------------------------- fixtures


@dataclass
class Node:
    root: Path
    host: SimHost
    env: HostEnv
    io: SimIO

    def inventory(self) -> Inventory:
        return discover(self.env, self.io, node="sim-node-1")

    def vgpus(self, type_name: str) -> list:
        return sorted((v for v in self.inventory().all_vgpus() if v.type_name == type_name), key=lambda v: v.id)

    def ids(self, type_name: str) -> list[str]:
        return [v.id for v in self.vgpus(type_name)]


def _node(root: Path, spec: HostSpec | None) -> Node:
    """The simulated host under ``root/host`` (built from ``spec``, or the one there), with the
    pci.ids file beside it."""
    sim = sim_node(root / "host", spec)
    return Node(root, sim.host, sim.env.with_(pci_ids=(root / "pci.ids",)), sim.io)


def _build(root: Path, spec: HostSpec, layout: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pci.ids").write_text(PCI_IDS)
    node = _node(root, spec)
    out = reconcile(node.env, node.io, parse_config(layout), node="sim-node-1")
    assert out.ok, out.rounds


def _open(pristine: Path, dest: Path) -> Node:
    """A private copy of a prepared host (building one takes seconds; copying, milliseconds)."""
    shutil.copytree(pristine, dest, symlinks=True)
    return _node(dest, None)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("default-node")
    _build(root, load_host("default"), LAYOUT)
    return root


@pytest.fixture
def node(pristine: Path, tmp_path: Path) -> Node:
    return _open(pristine, tmp_path / "node")


@pytest.fixture(scope="module")
def numa_pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("numa-node")
    spec = HostSpec(name="numa", gpus=[GpuGroup(board="T4", count=2, numa_node=0), GpuGroup(board="T4", count=1, numa_node=1)])
    _build(root, spec, {"version": "vgpuctl/v1",
                        "layouts": {"default": [{"all": True, "mode": "vgpu", "vgpus": {"T4-2Q": 4}}]}})
    return root


@pytest.fixture
def sock_root() -> Iterator[Path]:
    """Sockets live in a short /tmp dir (sun_path holds 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="vdp", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(sock_root: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(sock_root / "kubelet")
    k.start()
    yield k
    k.stop()


def _manager(node: Node, kubelet: FakeKubelet, **kw) -> DevicePluginManager:
    kw.setdefault("poll_interval", 60.0)  # health changes must come from inotify, not the poll
    return DevicePluginManager(
        node.env, node.io, node.inventory, "nvidia.com/", kubelet.device_plugin_dir,
        host_dev_root=Path("/dev"), pod_resources_socket=None, kubelet_poll_interval=0.05,
        watch_timeout=0.2, resync_interval=None, register_timeout=2.0, **kw,
    )


@pytest.fixture
def manager(node: Node, kubelet: FakeKubelet) -> Iterator[DevicePluginManager]:
    m = _manager(node, kubelet).start()
    try:
        yield m
    finally:
        m.stop()


def _registered(kubelet: FakeKubelet, resources: list[str], count: int = 1) -> None:
    for r in resources:
        kubelet.wait_for_registration(r, count=count)


def _health(kubelet: FakeKubelet, resource: str, dev_id: str, want: str, timeout: float = WAIT) -> list[dict]:
    """Wait until the kubelet's latest list for ``resource`` shows ``dev_id`` as ``want``."""
    return kubelet.wait_for_devices(
        resource, lambda devs: any(d["id"] == dev_id and d["health"] == want for d in devs), timeout=timeout
    )


def _vfio(group: int | str) -> dict[str, str]:
    return {"container_path": f"/dev/vfio/{group}", "host_path": f"/dev/vfio/{group}", "permissions": "rw"}


VFIO_CTL = {"container_path": "/dev/vfio/vfio", "host_path": "/dev/vfio/vfio", "permissions": "rw"}


# --------------------------------------------------------------------------- naming


def test_resource_names() -> None:
    assert nvidia_device_name("TU104GL [Tesla T4]") == "TU104GL_TESLA_T4"
    assert nvidia_device_name("GA100 [A100 PCIe 40GB]") == "GA100_A100_PCIE_40GB"
    assert nvidia_device_name("AD102GL [L40S]") == "AD102GL_L40S"
    assert nvidia_device_name("TU102GL [Quadro RTX 6000/8000]") == "TU102GL_QUADRO_RTX_6000_8000"
    assert passthrough_name("TU104GL [Tesla T4]", "0x1eb8") == "TU104GL_TESLA_T4"
    assert passthrough_name(None, "0x1eb8") == "1eb8"
    assert passthrough_name("[]", "0x1EB8") == "1eb8"
    assert vgpu_type_name("GRID T4-1Q") == "GRID_T4-1Q"
    assert vgpu_type_name("NVIDIA  A100-4C\n") == "NVIDIA_A100-4C"
    assert vgpu_type_name("GVTg_V5_4") == "GVTg_V5_4"
    assert vgpu_type_name("odd (type) name!") == "odd__type__name"
    assert resource_env_var("nvidia.com/GRID_T4-1Q", "mdev") == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"
    assert resource_env_var("nvidia.com/TU104GL_TESLA_T4", "pci") == "PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4"
    assert resource_env_var("gpu.example.org/NVIDIA_L40S-8Q", "pci") == "PCI_RESOURCE_GPU_EXAMPLE_ORG_NVIDIA_L40S-8Q"
    assert normalize_prefix("nvidia.com") == normalize_prefix("nvidia.com/") == "nvidia.com/"
    for bad in ("", "Nvidia.com/", "a_b.com/", "kubernetes.io/", "x.k8s.io/"):
        with pytest.raises(ValueError):
            normalize_prefix(bad)


def test_compute_resources(node: Node) -> None:
    inv = node.inventory()
    specs, warnings = compute_resources(inv)
    assert warnings == []
    assert list(specs) == ALL
    assert {n: s.kind for n, s in specs.items()} == {A100_4C: "mdev", L40S_8Q: "pci", T4_2Q: "mdev", T4_PT: "pci"}
    assert [d.id for d in specs[T4_2Q].devices] == node.ids("GRID T4-2Q") and len(specs[T4_2Q].devices) == 8
    assert [d.id for d in specs[A100_4C].devices] == node.ids("NVIDIA A100-4C") and len(specs[A100_4C].devices) == 6
    assert [d.id for d in specs[L40S_8Q].devices] == ["0000:19:00.4", "0000:19:00.5", "0000:19:00.6", "0000:19:00.7"]
    assert [d.id for d in specs[T4_PT].devices] == ["0000:13:00.0"]
    assert {d.gpu for d in specs[A100_4C].devices} == {"0000:16:00.0"}  # the PF, not the VF parents

    # Another prefix; GPUs and devices left out (e.g. the GPUs handed to DRA).
    l40s_vf = "0000:19:00.5"
    specs2, _ = compute_resources(inv, "gpu.example.org", exclude=["0000:10:00.0", l40s_vf])
    assert list(specs2) == ["gpu.example.org/NVIDIA_A100-4C", "gpu.example.org/NVIDIA_L40S-8Q",
                            "gpu.example.org/TU104GL_TESLA_T4"]
    assert l40s_vf not in [d.id for d in specs2["gpu.example.org/NVIDIA_L40S-8Q"].devices]

    # Without pci.ids a catalog board keeps its name (the catalog carries pci.ids' name), so
    # resource names do not change with the host's pci.ids; a board known to neither falls
    # back to the hex device id.
    bare = node.env.with_(pci_ids=(node.root / "missing.ids",))
    inv3 = discover(bare, node.io)
    assert T4_PT in compute_resources(inv3)[0]
    pt = next(g for g in inv3.gpus if g.address == "0000:13:00.0")
    pt.product_name, pt.device_id = None, "0x1eb9"
    specs3, _ = compute_resources(inv3)
    assert "nvidia.com/1eb9" in specs3 and T4_PT not in specs3


# --------------------------------------------------------------------------- kubelet end to end


def test_register_list_and_allocate(node: Node, kubelet: FakeKubelet, manager: DevicePluginManager) -> None:
    _registered(kubelet, ALL)
    for r in ALL:
        reg = kubelet.registrations_for(r)[0]
        assert reg["version"] == "v1beta1"
        assert reg["endpoint"] == socket_name_for(r)
        assert reg["options"] == {"pre_start_required": False, "get_preferred_allocation_available": True}
        assert (kubelet.device_plugin_dir / reg["endpoint"]).is_socket()
    assert sorted(r["resource_name"] for r in kubelet.registrations) == ALL

    expected = {
        T4_2Q: node.ids("GRID T4-2Q"),
        A100_4C: node.ids("NVIDIA A100-4C"),
        L40S_8Q: ["0000:19:00.4", "0000:19:00.5", "0000:19:00.6", "0000:19:00.7"],
        T4_PT: ["0000:13:00.0"],
    }
    for r, ids in expected.items():
        devs = kubelet.wait_for_devices(r)
        assert sorted(d["id"] for d in devs) == sorted(ids)
        assert {d["health"] for d in devs} == {"Healthy"}
        assert all(d["numa"] == [] for d in devs)  # the default node reports no NUMA node

    t4 = node.vgpus("GRID T4-2Q")
    a100 = node.vgpus("NVIDIA A100-4C")
    l40s = node.vgpus("NVIDIA L40S-8Q")
    pt = node.inventory().gpu("0000:13:00.0")
    with kubelet.device_plugin(T4_2Q) as c:
        got = c.allocate([[t4[0].id, t4[1].id], [t4[2].id]])
        assert got[0]["envs"] == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q": f"{t4[0].id},{t4[1].id}"}
        assert got[0]["devices"] == [VFIO_CTL, _vfio(t4[0].iommu_group), _vfio(t4[1].iommu_group)]
        assert got[0]["mounts"] == [] and got[0]["annotations"] == {} and got[0]["cdi_devices"] == []
        assert got[1]["envs"] == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q": t4[2].id}
        assert got[1]["devices"] == [VFIO_CTL, _vfio(t4[2].iommu_group)]
        # An id that is not ours fails the admission, the server lives on.
        with pytest.raises(grpc.RpcError) as err:
            c.allocate([["0000:99:00.0"]])
        assert err.value.code() == grpc.StatusCode.INTERNAL and "not a device of" in err.value.details()
    with kubelet.device_plugin(A100_4C) as c:
        got = c.allocate([[a100[3].id]])
        assert got[0]["envs"] == {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A100-4C": a100[3].id}
        assert got[0]["devices"] == [VFIO_CTL, _vfio(a100[3].iommu_group)]
    with kubelet.device_plugin(L40S_8Q) as c:
        got = c.allocate([["0000:19:00.6", "0000:19:00.4"]])
        groups = {v.id: v.iommu_group for v in l40s}
        assert got[0]["envs"] == {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-8Q": "0000:19:00.6,0000:19:00.4"}
        assert got[0]["devices"] == [VFIO_CTL, _vfio(groups["0000:19:00.6"]), _vfio(groups["0000:19:00.4"])]
    with kubelet.device_plugin(T4_PT) as c:
        got = c.allocate([["0000:13:00.0"]])
        assert got[0]["envs"] == {"PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4": "0000:13:00.0"}
        assert got[0]["devices"] == [VFIO_CTL, _vfio(pt.iommu_group)]
        c.pre_start(["0000:13:00.0"])

    # Status for the CLI / logs.
    status = {s.resource: s for s in manager.status()}
    assert status[T4_2Q].running and status[T4_2Q].env_var == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q"
    assert set(status[T4_PT].devices.values()) == {None}


def test_host_paths_default_to_env(node: Node) -> None:
    """Without host_dev_root, device specs name the env's /dev (here the simulated one)."""
    specs, _ = compute_resources(node.inventory())
    b = VgpuResource(T4_PT, "pci", node.env, node.io, HostWatcher([]), specs[T4_PT].devices)
    group = node.inventory().gpu("0000:13:00.0").iommu_group
    alloc = b.allocate(["0000:13:00.0"])
    assert [(d.container_path, d.host_path, d.permissions) for d in alloc.devices] == [
        ("/dev/vfio/vfio", str(node.env.vfio_dir / "vfio"), "rw"),
        (f"/dev/vfio/{group}", str(node.env.vfio_group(group)), "rw"),
    ]


def test_allocate_adds_iommufd_nodes(tmp_path: Path) -> None:
    (tmp_path / "pci.ids").write_text(PCI_IDS)
    node = _node(tmp_path, HostSpec(iommufd=True, gpus=[GpuGroup(board="T4", driver="vfio-pci")]))
    env, io = node.env, node.io
    specs, _ = compute_resources(discover(env, io))
    gpu = specs[T4_PT].devices[0]
    b = VgpuResource(T4_PT, "pci", env, io, HostWatcher([]), specs[T4_PT].devices, host_dev_root=Path("/dev"))
    alloc = b.allocate([gpu.id])
    assert alloc.envs == {"PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4": gpu.id}
    assert [(d.container_path, d.host_path) for d in alloc.devices] == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio"),
        (f"/dev/vfio/{gpu.iommu_group}", f"/dev/vfio/{gpu.iommu_group}"),
        ("/dev/iommu", "/dev/iommu"),
        ("/dev/vfio/devices/vfio0", "/dev/vfio/devices/vfio0"),
    ]
    assert {d.permissions for d in alloc.devices} == {"rw"}


def test_allocate_adds_a_vgpus_own_iommufd_node(tmp_path: Path) -> None:
    (tmp_path / "pci.ids").write_text(PCI_IDS)
    node = _node(tmp_path, HostSpec(iommufd=True, gpus=[GpuGroup(board="T4")]))
    env, io = node.env, node.io
    layout = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "vgpus": {"T4-2Q": 2}}]}})
    assert reconcile(env, io, layout).ok
    specs, _ = compute_resources(discover(env, io))
    vgpu = specs[T4_2Q].devices[0]
    b = VgpuResource(T4_2Q, "mdev", env, io, HostWatcher([]), specs[T4_2Q].devices, host_dev_root=Path("/dev"))
    (cdev,) = os.listdir(env.mdev_devices / vgpu.id / "vfio-dev")
    paths = [d.container_path for d in b.allocate([vgpu.id]).devices]
    assert paths == ["/dev/vfio/vfio", f"/dev/vfio/{vgpu.iommu_group}", "/dev/iommu", f"/dev/vfio/devices/{cdev}"]


def test_health_follows_the_host(node: Node, kubelet: FakeKubelet, manager: DevicePluginManager) -> None:
    _registered(kubelet, ALL)
    assert manager.watcher.inotify_active, manager.watcher.inotify_error
    assert set(manager.watcher.watched) == {node.env.vfio_dir, node.env.mdev_devices, node.env.pci_devices}
    env, io = node.env, node.io

    # An mdev removed behind the plugin's back: Unhealthy at once; back when re-created.
    victim = node.vgpus("GRID T4-2Q")[3]
    _health(kubelet, T4_2Q, victim.id, "Healthy")
    t0 = time.monotonic()
    io.write(env.mdev_devices / victim.id / "remove", "1")
    devs = _health(kubelet, T4_2Q, victim.id, "Unhealthy")
    assert time.monotonic() - t0 < 5.0  # the host poll is 60 s: inotify did it
    assert [d["id"] for d in devs if d["health"] == "Unhealthy"] == [victim.id]
    with kubelet.device_plugin(T4_2Q) as c, pytest.raises(grpc.RpcError) as err:
        c.allocate([[victim.id]])
    assert "unhealthy" in err.value.details()
    io.write(env.pci(victim.parent) / "mdev_supported_types" / victim.type_id / "create", victim.id)
    _health(kubelet, T4_2Q, victim.id, "Healthy")
    new_group = int(os.path.basename(os.readlink(env.mdev_devices / victim.id / "iommu_group")))
    with kubelet.device_plugin(T4_2Q) as c:  # the re-created mdev has a new IOMMU group
        assert c.allocate([[victim.id]])[0]["devices"] == [VFIO_CTL, _vfio(new_group)]

    # /dev/vfio/<group> of a vendor-VFIO vGPU renamed away and back.
    vf = node.vgpus("NVIDIA L40S-8Q")[1]
    node_path = env.vfio_group(vf.iommu_group)
    os.rename(node_path, node_path.with_name(f"{vf.iommu_group}.away"))
    devs = _health(kubelet, L40S_8Q, vf.id, "Unhealthy")
    assert sum(d["health"] == "Unhealthy" for d in devs) == 1
    os.rename(node_path.with_name(f"{vf.iommu_group}.away"), node_path)
    _health(kubelet, L40S_8Q, vf.id, "Healthy")

    # /dev/vfio/<group> of the passthrough GPU deleted and re-created.
    pt = node.inventory().gpu("0000:13:00.0")
    env.vfio_group(pt.iommu_group).unlink()
    _health(kubelet, T4_PT, pt.address, "Unhealthy")
    env.vfio_group(pt.iommu_group).touch()
    _health(kubelet, T4_PT, pt.address, "Healthy")

    # An mdev of the A100 (on a VF) is unaffected by all that.
    assert {d["health"] for d in kubelet.wait_for_devices(A100_4C)} == {"Healthy"}

    # The passthrough GPU leaves the bus: vfio-pci lets go of it and, the group's last device gone, its
    # /dev/vfio node goes too; the reason named is the one that matters, the bus.
    node.host.remove_gpu(pt.address)
    assert not env.vfio_group(pt.iommu_group).exists()
    _health(kubelet, T4_PT, pt.address, "Unhealthy")
    status = {s.resource: s for s in manager.status()}
    assert status[T4_PT].devices == {pt.address: f"GPU {pt.address} is not on the PCI bus"}

    # The next refresh drops the resource: its plugin stops and its socket goes.
    sock = manager.servers[T4_PT].socket_path
    result = manager.refresh()
    assert result.removed == [T4_PT] and result.added == []
    assert T4_PT not in manager.servers and not sock.exists()
    assert manager.watcher.events > 0


def test_health_by_polling_without_inotify(node: Node, kubelet: FakeKubelet) -> None:
    m = _manager(node, kubelet, use_inotify=False, poll_interval=0.1).start()
    try:
        assert not m.watcher.inotify_active
        _registered(kubelet, [T4_2Q])
        victim = node.vgpus("GRID T4-2Q")[0]
        _health(kubelet, T4_2Q, victim.id, "Healthy")
        node.io.write(node.env.mdev_devices / victim.id / "remove", "1")
        _health(kubelet, T4_2Q, victim.id, "Unhealthy")
    finally:
        m.stop()


def test_reregisters_after_kubelet_restart(node: Node, kubelet: FakeKubelet, manager: DevicePluginManager) -> None:
    _registered(kubelet, ALL)
    for r in ALL:
        kubelet.wait_for_devices(r)
    before = {r: len(kubelet.device_lists[r]) for r in ALL}
    kubelet.restart(wipe_plugin_sockets=True)
    _registered(kubelet, ALL, count=2)
    assert {r["generation"] for r in kubelet.registrations if r["resource_name"] in ALL} == {1, 2}
    assert manager.kubelet.kubelet_restarts == 1
    assert all(s.socket_present() for s in manager.servers.values())
    # The new kubelet gets lists over the re-created sockets and can allocate.
    kubelet.wait_for(lambda: all(len(kubelet.device_lists[r]) > before[r] for r in ALL))
    with kubelet.device_plugin(L40S_8Q) as c:
        assert c.allocate([["0000:19:00.7"]])[0]["envs"] == {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-8Q": "0000:19:00.7"}


def test_refresh_starts_and_stops_plugins(node: Node, kubelet: FakeKubelet, manager: DevicePluginManager) -> None:
    _registered(kubelet, ALL)
    vfs = [v.id for v in node.vgpus("NVIDIA L40S-8Q")]
    type_id = node.vgpus("NVIDIA L40S-8Q")[0].type_id
    sock = manager.servers[L40S_8Q].socket_path

    for vf in vfs:  # the node manager destroys the L40S vGPUs
        node.io.write(node.env.pci(vf) / "nvidia/current_vgpu_type", "0")
    result = manager.refresh()
    assert result.removed == [L40S_8Q] and result.added == [] and result.updated == []
    assert L40S_8Q not in manager.resources and not sock.exists()

    for vf in vfs[:2]:  # ... and creates two again
        node.io.write(node.env.pci(vf) / "nvidia/current_vgpu_type", type_id)
    result = manager.refresh()
    assert result.added == [L40S_8Q]
    kubelet.wait_for_registration(L40S_8Q, count=2)
    devs = kubelet.wait_for_devices(L40S_8Q, lambda d: len(d) == 2)
    assert sorted(d["id"] for d in devs) == vfs[:2]

    # One more T4-2Q removed and refreshed: same plugin, shorter list.
    victim = node.vgpus("GRID T4-2Q")[0]
    node.io.write(node.env.mdev_devices / victim.id / "remove", "1")
    result = manager.refresh()
    assert result.updated == [T4_2Q]
    devs = kubelet.wait_for_devices(T4_2Q, lambda d: len(d) == 7)
    assert victim.id not in [d["id"] for d in devs] and {d["health"] for d in devs} == {"Healthy"}
    assert len(kubelet.registrations_for(T4_2Q)) == 1


def test_stop_removes_sockets(node: Node, kubelet: FakeKubelet) -> None:
    m = _manager(node, kubelet).start()
    _registered(kubelet, ALL)
    socks = [s.socket_path for s in m.servers.values()]
    assert all(p.is_socket() for p in socks)
    m.stop()
    assert not any(p.exists() for p in socks)
    assert kubelet.kubelet_socket.is_socket()


# --------------------------------------------------------------------------- preferred allocation


def test_preferred_allocation_packs_one_gpu_and_numa_node(
    numa_pristine: Path, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    node = _open(numa_pristine, tmp_path / "numa")
    inv = node.inventory()
    gpus = {g.address: g for g in inv.gpus}
    assert [(g.address, g.numa_node, len(g.vgpus)) for g in inv.gpus] == [
        ("0000:10:00.0", 0, 4), ("0000:13:00.0", 0, 4), ("0000:16:00.0", 1, 4)]
    on = {a: sorted(v.id for v in g.vgpus) for a, g in gpus.items()}
    gpu_of = {v: a for a, ids in on.items() for v in ids}
    a, b, c = on["0000:10:00.0"], on["0000:13:00.0"], on["0000:16:00.0"]

    m = _manager(node, kubelet).start()
    try:
        kubelet.wait_for_registration(T4_2Q)
        devs = kubelet.wait_for_devices(T4_2Q)
        assert {d["id"]: d["numa"] for d in devs} == {**{i: [0] for i in a + b}, **{i: [1] for i in c}}
        with kubelet.device_plugin(T4_2Q) as client:
            everything = a + b + c
            got = client.preferred(everything, [], 3)
            assert len(got) == 3 and len({gpu_of[i] for i in got}) == 1
            # The tightest single GPU wins: C has exactly three left.
            assert sorted(client.preferred(a[:2] + b + c[:3], [], 3)) == c[:3]
            # Must-include pins the GPU.
            got = client.preferred(everything, [b[2]], 4)
            assert got[0] == b[2] and sorted(got) == b
            # No GPU holds 6: fill one NUMA node (A and B are on node 0).
            got = client.preferred(everything, [], 6)
            assert len(got) == 6 and {gpus[gpu_of[i]].numa_node for i in got} == {0}
            assert len({gpu_of[i] for i in got}) == 2
            # Must-include on node 1: the rest comes from its GPU first.
            got = client.preferred(everything, [c[0]], 4)
            assert sorted(got) == c
    finally:
        m.stop()


def test_preferred_devices_unit() -> None:
    def info(i: str, gpu: str, numa: int | None) -> DeviceInfo:
        return DeviceInfo(id=i, kind="mdev", gpu=gpu, numa_node=numa)

    infos = {d.id: d for d in [info("a1", "A", 0), info("a2", "A", 0), info("b1", "B", 1), info("b2", "B", 1),
                               info("b3", "B", 1), info("c1", "C", 1)]}
    assert preferred_devices(infos, list(infos), [], 2) == ["a1", "a2"]
    assert preferred_devices(infos, list(infos), [], 3) == ["b1", "b2", "b3"]
    assert preferred_devices(infos, list(infos), ["c1"], 2) == ["c1", "b1"]  # same NUMA node as c1
    assert preferred_devices(infos, list(infos), [], 4) == ["b1", "b2", "b3", "c1"]  # node 1 holds 4
    assert preferred_devices(infos, ["x9", "a1"], [], 2) == ["a1", "x9"]  # unknown ids last
    assert preferred_devices(infos, list(infos), ["a1", "b1"], 1) == ["a1", "b1"]


# --------------------------------------------------------------------------- inotify watcher


def test_host_watcher_inotify(tmp_path: Path) -> None:
    d = tmp_path / "vfio"
    d.mkdir()
    later = tmp_path / "later"
    with HostWatcher([d, later], poll_interval=60.0) as w:
        assert w.inotify_active and w.watched == [d]
        v = w.version
        (d / "7").touch()
        assert w.wait(v, 5.0)
        v = w.version
        assert not w.wait(v, 0.2)
        (d / "7").rename(d / "8")
        assert w.wait(v, 5.0)
        assert w.events >= 2
    with HostWatcher([later], poll_interval=0.05, use_inotify=False) as w:
        v = w.version
        later.mkdir()
        (later / "x").touch()
        assert w.wait(v, 5.0)
        assert not w.inotify_active


# --------------------------------------------------------------------------- PodResources


class FakePodResources(pr_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources service, answering what the test puts in ``pods``."""

    def __init__(self) -> None:
        self.pods: list[tuple[str, str, list[tuple[str, list[str]]]]] = []
        self.fail: grpc.StatusCode | None = None
        self.calls = 0

    def List(self, request, context):  # noqa: N802 - gRPC method name
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "pod resources unavailable")
        resp = pr_pb2.ListPodResourcesResponse()
        for ns, name, devices in self.pods:
            pod = resp.pod_resources.add(name=name, namespace=ns)
            ctr = pod.containers.add(name="compute")
            for resource, ids in devices:
                ctr.devices.add(resource_name=resource, device_ids=ids)
            pod.containers.add(name="sidecar")
        return resp


@pytest.fixture
def pod_resources(sock_root: Path) -> Iterator[tuple[FakePodResources, Path]]:
    path = sock_root / "pod-resources" / "kubelet.sock"
    path.parent.mkdir(parents=True)
    svc = FakePodResources()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(svc, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    yield svc, path
    server.stop(0).wait(5)


def test_pod_resources_mark_devices_in_use(node: Node, pod_resources: tuple[FakePodResources, Path]) -> None:
    svc, path = pod_resources
    t4 = node.ids("GRID T4-2Q")
    pt_group = node.inventory().gpu("0000:13:00.0").iommu_group
    svc.pods = [
        ("default", "virt-launcher-vm1-x7k2p", [(T4_2Q, [t4[0].upper()]), ("example.com/other", [t4[1]])]),
        ("vms", "virt-launcher-vm2-abcde", [(L40S_8Q, ["0000:19:00.5"]), (T4_PT, ["13:00.0"])]),
        ("legacy", "virt-launcher-old-00000", [(T4_PT, [str(pt_group)])]),  # NVIDIA's plugin: group ids
    ]
    usage = allocated_devices(path, "nvidia.com/", env=node.env)
    assert usage.warnings == []
    assert usage.mdevs == {t4[0]: ["pod default/virt-launcher-vm1-x7k2p"]}
    assert usage.pci == {"0000:19:00.5": ["pod vms/virt-launcher-vm2-abcde"],
                         "0000:13:00.0": ["pod vms/virt-launcher-vm2-abcde", "pod legacy/virt-launcher-old-00000"]}
    assert usage.mdev_users(t4[0]) == ["pod default/virt-launcher-vm1-x7k2p references it"]
    assert usage.mdev_users(t4[1]) == []

    # Through the manager, and into the node manager: the allocated vGPU survives a
    # layout that no longer wants any T4-2Q.
    m = DevicePluginManager(node.env, node.io, node.inventory, device_plugin_dir=path.parent.parent / "dp",
                            pod_resources_socket=path)
    assert m.usage().mdevs == usage.mdevs
    layout = {"version": "vgpuctl/v1", "layouts": {"default": [{"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 0}}]}}
    out = reconcile(node.env, node.io, parse_config(layout), usage_extra=m.usage())
    assert out.ok
    assert node.ids("GRID T4-2Q") == [t4[0]]
    skipped = [s for r in out.rounds for s in r.plan.skipped]
    assert any(s.device == t4[0] and "pod default/virt-launcher-vm1-x7k2p" in s.reason for s in skipped)


def test_pod_resources_absent_or_failing(sock_root: Path, pod_resources: tuple[FakePodResources, Path]) -> None:
    svc, path = pod_resources
    absent = allocated_devices(sock_root / "nowhere" / "kubelet.sock")
    assert absent.mdevs == {} and absent.pci == {}
    assert len(absent.warnings) == 1 and "absent" in absent.warnings[0]

    svc.fail = grpc.StatusCode.UNAVAILABLE
    failed = allocated_devices(path, timeout=2.0)
    assert failed.mdevs == {} and failed.pci == {}
    assert len(failed.warnings) == 1 and "UNAVAILABLE" in failed.warnings[0]
    assert svc.calls == 1

    not_a_socket = sock_root / "plain"
    not_a_socket.write_text("")
    assert allocated_devices(not_a_socket).warnings
