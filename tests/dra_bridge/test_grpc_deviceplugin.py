"""Transport tests of dra_bridge.rpc.deviceplugin_grpc against a fake kubelet over real sockets.

The backend is a toy: what is tested is the gRPC layer (sockets, registration,
ListAndWatch updates, Allocate mapping, re-registration after a kubelet restart).
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from dra_bridge.rpc.deviceplugin_grpc import DevicePluginServer, KubeletWatcher, socket_name_for
from dra_bridge.rpc.types import ContainerAllocation, DeviceSpec, DpDevice, MountSpec
from tests.support.kubelet.fake_kubelet import DevicePluginClient, FakeKubelet, short_root

RESOURCE = "nvidia.com/GRID_T4-1Q"
RESOURCE2 = "nvidia.com/GRID_T4-2Q"


class ToyBackend:
    def __init__(self, resource_name: str, devices: list[DpDevice]) -> None:
        self.resource_name = resource_name
        self._devices = list(devices)
        self._version = 0
        self._cond = threading.Condition()
        self._seen = threading.local()
        self.fail_allocate = False
        self.allocations: list[list[str]] = []

    def devices(self) -> list[DpDevice]:
        with self._cond:
            self._seen.version = self._version
            return list(self._devices)

    def set_devices(self, devices: list[DpDevice]) -> None:
        with self._cond:
            self._devices = list(devices)
            self._version += 1
            self._cond.notify_all()

    def touch(self) -> None:
        """Signal a change without changing anything."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def wait_for_change(self, timeout: float) -> bool:
        with self._cond:
            seen = getattr(self._seen, "version", None)
            return self._cond.wait_for(lambda: self._version != seen, timeout)

    def allocate(self, device_ids: list[str]) -> ContainerAllocation:
        if self.fail_allocate:
            raise RuntimeError("no such vGPU")
        self.allocations.append(device_ids)
        return ContainerAllocation(
            envs={"VGPU_IDS": ",".join(device_ids)},
            devices=[DeviceSpec(container_path="/dev/vfio/vfio", host_path="/dev/vfio/vfio", permissions="rwm")]
            + [DeviceSpec(container_path=f"/dev/vfio/{i}", host_path=f"/dev/vfio/{i}", permissions="rwm") for i in device_ids],
            mounts=[MountSpec(container_path="/etc/vgpu", host_path="/run/vgpu", read_only=True)],
            annotations={"vgpu.example.com/ids": ",".join(device_ids)},
            cdi_devices=[f"vgpu.example.com/vgpu={i}" for i in device_ids],
        )

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        rest = [d for d in sorted(available, reverse=True) if d not in must_include]
        return (list(must_include) + rest)[:size]


def _devs(*spec: tuple[str, bool]) -> list[DpDevice]:
    return [DpDevice(id=i, healthy=h, numa_node=0 if n == 0 else None) for n, (i, h) in enumerate(spec)]


@pytest.fixture
def root(tmp_path: Path):
    d, cleanup = short_root(tmp_path)
    yield d
    cleanup()


@pytest.fixture
def kubelet(root: Path):
    k = FakeKubelet(root)
    k.start()
    yield k
    k.stop()


@pytest.fixture
def backend() -> ToyBackend:
    return ToyBackend(RESOURCE, _devs(("12", True), ("13", True)))


@pytest.fixture
def server(kubelet: FakeKubelet, backend: ToyBackend):
    s = DevicePluginServer(backend, kubelet.device_plugin_dir, watch_timeout=0.1, register_timeout=5)
    s.start()
    yield s
    s.stop(grace=0)


def test_socket_name() -> None:
    assert socket_name_for(RESOURCE) == "vgpuctl-nvidia.com_GRID_T4-1Q.sock"
    assert socket_name_for("example.com/a b:c", prefix="x-") == "x-example.com_a_b_c.sock"


def test_register_and_list_and_watch(kubelet: FakeKubelet, server: DevicePluginServer, backend: ToyBackend) -> None:
    assert server.socket_path == kubelet.device_plugin_dir / "vgpuctl-nvidia.com_GRID_T4-1Q.sock"
    assert server.socket_path.is_socket()
    server.register()
    reg = kubelet.wait_for_registration(RESOURCE)
    assert reg["version"] == "v1beta1"
    assert reg["endpoint"] == "vgpuctl-nvidia.com_GRID_T4-1Q.sock"
    assert reg["resource_name"] == RESOURCE
    assert reg["options"] == {"pre_start_required": False, "get_preferred_allocation_available": True}

    # The fake kubelet connected back and got the initial list.
    first = kubelet.wait_for_devices(RESOURCE)
    assert first == [
        {"id": "12", "health": "Healthy", "numa": [0]},
        {"id": "13", "health": "Healthy", "numa": []},
    ]
    kubelet.wait_for(lambda: RESOURCE in kubelet.options)
    assert kubelet.options[RESOURCE]["get_preferred_allocation_available"] is True

    # A backend change produces a new list.
    backend.set_devices(_devs(("12", True), ("13", False), ("14", True)))
    latest = kubelet.wait_for_devices(RESOURCE, lambda devs: len(devs) == 3)
    assert [(d["id"], d["health"]) for d in latest] == [("12", "Healthy"), ("13", "Unhealthy"), ("14", "Healthy")]


def test_list_and_watch_sends_only_real_changes(server: DevicePluginServer, backend: ToyBackend) -> None:
    with DevicePluginClient(server.socket_path) as client:
        stream = client.list_and_watch(timeout=30)
        try:
            assert [d["id"] for d in DevicePluginClient.devices(stream.get(timeout=5))] == ["12", "13"]
            backend.touch()  # "may have changed" but did not
            stream.expect_nothing(within=0.3)
            backend.set_devices(_devs(("12", False)))
            assert DevicePluginClient.devices(stream.get(timeout=5)) == [{"id": "12", "health": "Unhealthy", "numa": [0]}]
            # The stream ends when the server stops.
            server.stop(grace=0.5)
            assert stream.ended.wait(5)
        finally:
            stream.cancel()


def test_allocate_preferred_prestart(kubelet: FakeKubelet, server: DevicePluginServer, backend: ToyBackend) -> None:
    server.register()
    kubelet.wait_for_registration(RESOURCE)
    with kubelet.device_plugin(RESOURCE) as client:
        assert client.options() == {"pre_start_required": False, "get_preferred_allocation_available": True}
        got = client.allocate([["12"], ["13", "14"]])
        assert len(got) == 2
        assert got[0]["envs"] == {"VGPU_IDS": "12"}
        assert got[0]["devices"] == [
            {"container_path": "/dev/vfio/vfio", "host_path": "/dev/vfio/vfio", "permissions": "rwm"},
            {"container_path": "/dev/vfio/12", "host_path": "/dev/vfio/12", "permissions": "rwm"},
        ]
        assert got[0]["mounts"] == [{"container_path": "/etc/vgpu", "host_path": "/run/vgpu", "read_only": True}]
        assert got[0]["annotations"] == {"vgpu.example.com/ids": "12"}
        assert got[1]["cdi_devices"] == ["vgpu.example.com/vgpu=13", "vgpu.example.com/vgpu=14"]
        assert backend.allocations == [["12"], ["13", "14"]]

        assert client.preferred(["11", "12", "13"], ["11"], 2) == ["11", "13"]
        client.pre_start(["12"])

        # A backend failure is a gRPC error for that call, not a dead server.
        backend.fail_allocate = True
        with pytest.raises(grpc.RpcError) as err:
            client.allocate([["99"]])
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "no such vGPU" in err.value.details()
        backend.fail_allocate = False
        assert client.allocate([["12"]])[0]["envs"] == {"VGPU_IDS": "12"}


def test_register_fails_without_kubelet(root: Path, backend: ToyBackend) -> None:
    s = DevicePluginServer(backend, root / "device-plugins", register_timeout=0.5)
    s.start()
    try:
        with pytest.raises(grpc.RpcError):
            s.register()
    finally:
        s.stop(grace=0)


def test_watcher_reregisters_after_kubelet_restart(kubelet: FakeKubelet, backend: ToyBackend) -> None:
    backend2 = ToyBackend(RESOURCE2, _devs(("20", True)))
    servers = [
        DevicePluginServer(b, kubelet.device_plugin_dir, watch_timeout=0.1, register_timeout=2)
        for b in (backend, backend2)
    ]
    watcher = KubeletWatcher(servers, kubelet.device_plugin_dir, poll_interval=0.05)
    watcher.start()
    try:
        # The watcher starts the servers and registers both.
        kubelet.wait_for_registration(RESOURCE)
        kubelet.wait_for_registration(RESOURCE2)
        kubelet.wait_for_devices(RESOURCE2)
        assert all(s.running and s.socket_present() for s in servers)

        # Kubelet restart: kubelet.sock re-created, plugin sockets wiped.
        kubelet.restart(wipe_plugin_sockets=True)
        reg = kubelet.wait_for_registration(RESOURCE, count=2)
        reg2 = kubelet.wait_for_registration(RESOURCE2, count=2)
        assert reg["generation"] == reg2["generation"] == kubelet.generation == 2
        assert all(s.socket_present() for s in servers)
        assert watcher.kubelet_restarts == 1
        # The new kubelet gets a device list over the re-created socket.
        kubelet.wait_for(lambda: len(kubelet.device_lists.get(RESOURCE2, [])) >= 2)
        with kubelet.device_plugin(RESOURCE) as client:
            assert client.allocate([["12"]])[0]["envs"] == {"VGPU_IDS": "12"}

        # Restart without wiping: sockets kept, registration repeated.
        kubelet.restart(wipe_plugin_sockets=False)
        kubelet.wait_for_registration(RESOURCE, count=3)
        kubelet.wait_for_registration(RESOURCE2, count=3)
    finally:
        watcher.stop(stop_servers=True)
    assert not any(s.socket_path.exists() for s in servers)


def test_watcher_waits_for_kubelet_socket(root: Path, backend: ToyBackend) -> None:
    k = FakeKubelet(root)
    s = DevicePluginServer(backend, k.device_plugin_dir, watch_timeout=0.1, register_timeout=2)
    watcher = KubeletWatcher([s], k.device_plugin_dir, poll_interval=0.05)
    watcher.start()
    try:
        watcher.check_once()  # no kubelet.sock yet: nothing happens
        assert watcher.registrations == 0 and not s.running
        k.start()
        try:
            k.wait_for_registration(RESOURCE)
            assert s.running
            assert watcher.kubelet_restarts == 0
        finally:
            k.stop()
    finally:
        watcher.stop(stop_servers=True)


def test_stop_removes_socket(kubelet: FakeKubelet, backend: ToyBackend) -> None:
    s = DevicePluginServer(backend, kubelet.device_plugin_dir)
    # A stale socket file from a previous run is replaced.
    s.socket_path.parent.mkdir(parents=True, exist_ok=True)
    s.socket_path.write_text("stale")
    s.start()
    assert s.socket_present()
    s.stop(grace=0)
    assert not s.socket_path.exists()
    assert kubelet.kubelet_socket.is_socket()  # not ours to remove
