"""Transport tests of dra_bridge.kubelet.dra_grpc against a fake kubelet over real sockets.

The driver here is a toy: what is tested is the gRPC layer (sockets, registration,
both API versions, error mapping, health stream), not the driver logic.
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import grpc
import pytest

from dra_bridge.kubelet import dra_client
from dra_bridge.kubelet.dra_grpc import (
    ClaimRef,
    DeviceHealthRecord,
    KubeletPlugin,
    PreparedDevice,
    PrepareResult,
)
from tests.support.kubelet.fake_kubelet import DraClient, FakeKubelet, short_root

DRIVER = "vgpu.example.com"
VERSIONS = ["v1", "v1beta1"]


class ToyDriver:
    def __init__(self) -> None:
        self.prepared: dict[str, ClaimRef] = {}
        self.fail: BaseException | None = None
        self.skip: set[str] = set()
        self._health = [
            DeviceHealthRecord(pool="node-a", device="vgpu-0", healthy=True),
            DeviceHealthRecord(pool="node-a", device="vgpu-1", healthy=None),
        ]
        self._lock = threading.Lock()

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        if self.fail is not None:
            raise self.fail
        out: dict[str, PrepareResult] = {}
        for c in claims:
            assert isinstance(c, ClaimRef)
            if c.uid in self.skip:
                continue
            if c.name == "broken":
                out[c.uid] = PrepareResult(error=f"claim {c.name} is broken")
                continue
            self.prepared[c.uid] = c
            out[c.uid] = PrepareResult(
                devices=[
                    PreparedDevice(
                        request_names=["vgpu"],
                        pool_name="node-a",
                        device_name=f"vgpu-{c.name}",
                        cdi_device_ids=[f"{DRIVER}/vgpu={c.uid}-vgpu-{c.name}"],
                        share_id="0b8c3a5e-6f0e-4a51-9f5b-6a1e9d7c2f10" if c.name == "shared" else None,
                    )
                ]
            )
        return out

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        if self.fail is not None:
            raise self.fail
        out: dict[str, str | None] = {}
        for c in claims:
            if c.uid in self.prepared:
                del self.prepared[c.uid]
                out[c.uid] = None
            else:
                out[c.uid] = f"claim {c.uid} not prepared"
        return out

    def health(self) -> list[DeviceHealthRecord]:
        with self._lock:
            if isinstance(self.fail, Exception):
                raise self.fail
            return list(self._health)

    def set_health(self, records: list[DeviceHealthRecord]) -> None:
        with self._lock:
            self._health = list(records)


class NoHealthDriver:
    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return {c.uid: PrepareResult() for c in claims}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        return {c.uid: None for c in claims}


class FakeRpcError(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "apiserver unreachable"


@pytest.fixture
def root(tmp_path: Path):
    d, cleanup = short_root(tmp_path)
    yield d
    cleanup()


@pytest.fixture
def driver() -> ToyDriver:
    return ToyDriver()


@pytest.fixture
def plugin(root: Path, driver: ToyDriver):
    p = KubeletPlugin(DRIVER, driver, kubelet_root=root, health_poll_interval=0.05)
    p.start()
    yield p
    p.stop(grace=0)


@pytest.fixture
def kubelet(root: Path) -> FakeKubelet:
    # Only the DRA plugin-watcher side is used here: no kubelet.sock server needed.
    return FakeKubelet(root)


def test_socket_paths_and_registration(plugin: KubeletPlugin, kubelet: FakeKubelet, root: Path) -> None:
    reg = root / "plugins_registry" / f"{DRIVER}-reg.sock"
    svc = root / "plugins" / DRIVER / "dra.sock"
    assert plugin.registration_socket == reg and plugin.dra_socket == svc
    assert reg.is_socket() and svc.is_socket()
    assert kubelet.discover_dra_plugins() == [reg]

    assert not plugin.registered
    registration = kubelet.register_dra_plugin(reg)
    assert registration.info == {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": str(svc),
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }
    assert plugin.wait_registered(5)
    assert plugin.registered
    assert plugin.registration_status is not None and plugin.registration_status.error == ""


def test_registration_rejected_is_recorded_and_logged(
    plugin: KubeletPlugin, kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dra_bridge.kubelet.dra_grpc")
    kubelet.register_dra_plugin(plugin.registration_socket, accept=False, error="version not supported")
    assert not plugin.wait_registered(5)
    status = plugin.registration_status
    assert status is not None and not status.plugin_registered and status.error == "version not supported"
    assert any("version not supported" in r.getMessage() for r in caplog.records)
    # A later successful notification flips it.
    kubelet.register_dra_plugin(plugin.registration_socket)
    assert plugin.registered


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_unprepare_round_trip(plugin: KubeletPlugin, kubelet: FakeKubelet, driver: ToyDriver, version: str) -> None:
    registration = kubelet.register_dra_plugin(plugin.registration_socket)
    with registration.client(version) as client:
        got = client.prepare([("default", "uid-1", "claim1"), ("tenant", "uid-2", "shared"), ("default", "uid-3", "broken")])
        assert set(got) == {"uid-1", "uid-2", "uid-3"}
        assert got["uid-1"] == {
            "error": "",
            "devices": [
                {
                    "request_names": ["vgpu"],
                    "pool_name": "node-a",
                    "device_name": "vgpu-claim1",
                    "cdi_device_ids": [f"{DRIVER}/vgpu=uid-1-vgpu-claim1"],
                    "share_id": None,
                }
            ],
        }
        assert got["uid-2"]["devices"][0]["share_id"] == "0b8c3a5e-6f0e-4a51-9f5b-6a1e9d7c2f10"
        assert got["uid-3"] == {"error": "claim broken is broken", "devices": []}
        assert driver.prepared["uid-2"] == ClaimRef(namespace="tenant", uid="uid-2", name="shared")

        assert client.unprepare([("default", "uid-1", "claim1"), ("tenant", "uid-2", "shared")]) == {
            "uid-1": "",
            "uid-2": "",
        }
        assert driver.prepared == {}
        again = client.unprepare([("default", "uid-1", "claim1")])
        assert again == {"uid-1": "claim uid-1 not prepared"}
        assert client.prepare([]) == {}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "exc, text",
    [(FakeRpcError(), "UNAVAILABLE: apiserver unreachable"), (RuntimeError("boom"), "RuntimeError: boom")],
)
def test_driver_exception_becomes_per_claim_error(
    plugin: KubeletPlugin, driver: ToyDriver, version: str, exc: Exception, text: str
) -> None:
    driver.fail = exc
    with DraClient(plugin.dra_socket, version) as client:
        got = client.prepare([("ns", "u1", "a"), ("ns", "u2", "b")])
        assert set(got) == {"u1", "u2"}
        for r in got.values():
            assert r["devices"] == [] and text in r["error"] and r["error"].startswith("prepare failed")
        un = client.unprepare([("ns", "u1", "a")])
        assert text in un["u1"] and un["u1"].startswith("unprepare failed")
        # The server survived.
        driver.fail = None
        assert client.prepare([("ns", "u1", "a")])["u1"]["error"] == ""


@pytest.mark.parametrize("version", VERSIONS)
def test_our_generated_stubs_speak_the_kubelet_wire_format(
    plugin: KubeletPlugin, driver: ToyDriver, root: Path, version: str
) -> None:
    """The one kubelet client with its default stubs (ours, as the simulated cluster uses it)
    answers exactly as with the test side's own protos."""
    info, refused = dra_client.register_plugin(plugin.registration_socket)
    assert refused is None and info.endpoint == str(plugin.dra_socket) and plugin.wait_registered(5)
    claims = [("default", "uid-1", "claim1"), ("tenant", "uid-2", "shared"), ("default", "uid-3", "broken")]
    with dra_client.DraClient(info.endpoint, version) as ours:
        got = ours.prepare(claims)
        assert ours.unprepare(claims[:2]) == {"uid-1": "", "uid-2": ""}
    with DraClient(plugin.dra_socket, version) as theirs:
        assert theirs.prepare(claims) == got
        assert got["uid-2"]["devices"][0]["share_id"] == "0b8c3a5e-6f0e-4a51-9f5b-6a1e9d7c2f10"
        theirs.unprepare(claims[:2])
    refuse = dra_client.register_plugin(plugin.registration_socket, lambda i: "not today")
    assert refuse[1] == "not today" and not plugin.registered


def test_claim_missing_from_driver_answer(plugin: KubeletPlugin, driver: ToyDriver) -> None:
    driver.skip = {"u2"}
    with DraClient(plugin.dra_socket, "v1") as client:
        got = client.prepare([("ns", "u1", "a"), ("ns", "u2", "b")])
    assert got["u1"]["error"] == ""
    assert "no result for claim ns/b (u2)" in got["u2"]["error"]


def test_health_stream_initial_state_and_changes(plugin: KubeletPlugin, driver: ToyDriver) -> None:
    with DraClient(plugin.dra_socket) as client:
        stream = client.watch_health(timeout=30)
        try:
            first = stream.get(timeout=5)
            assert DraClient.health_dict(first) == {
                ("node-a", "vgpu-0"): "HEALTHY",
                ("node-a", "vgpu-1"): "UNKNOWN",
            }
            assert all(d.last_updated_time > 0 for d in first.devices)
            # Nothing changes -> nothing is sent (the driver is polled every 50 ms).
            stream.expect_nothing(within=0.3)
            driver.set_health(
                [
                    DeviceHealthRecord(pool="node-a", device="vgpu-0", healthy=False),
                    DeviceHealthRecord(pool="node-a", device="vgpu-1", healthy=True),
                ]
            )
            second = stream.get(timeout=5)
            assert DraClient.health_dict(second) == {
                ("node-a", "vgpu-0"): "UNHEALTHY",
                ("node-a", "vgpu-1"): "HEALTHY",
            }
            # A failing health() turns the known devices to UNKNOWN instead of killing the stream.
            driver.fail = RuntimeError("nvml gone")
            third = stream.get(timeout=5)
            assert set(DraClient.health_dict(third).values()) == {"UNKNOWN"}
        finally:
            stream.cancel()


def test_health_stream_ends_on_stop(root: Path, driver: ToyDriver) -> None:
    p = KubeletPlugin(DRIVER, driver, kubelet_root=root, health_poll_interval=0.05)
    p.start()
    try:
        with DraClient(p.dra_socket) as client:
            stream = client.watch_health(timeout=30)
            stream.get(timeout=5)
            p.stop(grace=0.5)
            assert stream.ended.wait(5)
    finally:
        p.stop(grace=0)


def test_health_unimplemented_without_health_method(root: Path) -> None:
    with KubeletPlugin(DRIVER, NoHealthDriver(), kubelet_root=root) as p:
        with DraClient(p.dra_socket) as client:
            stream = client.watch_health(timeout=5)
            with pytest.raises(EOFError):
                stream.get(timeout=5)
            assert stream.error is not None and stream.error.code() == grpc.StatusCode.UNIMPLEMENTED
            # Prepare still works.
            assert client.prepare([("ns", "u", "n")]) == {"u": {"error": "", "devices": []}}


def test_stale_sockets_replaced_and_removed_on_stop(root: Path, driver: ToyDriver, kubelet: FakeKubelet) -> None:
    p = KubeletPlugin(DRIVER, driver, kubelet_root=root)
    # Leave stale socket files behind, as a crashed plugin would.
    for path in (p.registration_socket, p.dra_socket):
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
        assert path.is_socket()
    p.start()
    try:
        client = kubelet.register_dra_plugin(p.registration_socket).client("v1beta1")
        with client:
            assert client.prepare([("ns", "u", "n")])["u"]["error"] == ""
    finally:
        p.stop(grace=0)
    assert not p.registration_socket.exists()
    assert not p.dra_socket.exists()
    assert not p.running and not p.registered
    # Restartable.
    p.start()
    try:
        assert p.dra_socket.is_socket()
    finally:
        p.stop(grace=0)


def test_rejects_bad_driver_name_and_long_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        KubeletPlugin("../evil", NoHealthDriver(), kubelet_root=tmp_path)
    with pytest.raises(ValueError, match="longer than"):
        KubeletPlugin(DRIVER, NoHealthDriver(), kubelet_root=tmp_path / ("x" * 120))
