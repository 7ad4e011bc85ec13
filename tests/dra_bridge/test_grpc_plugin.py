"""Transport tests of dra_bridge.rpc.dra_grpc against a fake kubelet over real sockets.

The driver here is a toy: what is tested is the gRPC layer (sockets, registration,
both API versions, error mapping, health streams, sub-request names), not the driver logic.
The kubelet side speaks through messages compiled at test time from the upstream kubelet
protos (:data:`tests.support.kubelet.protos.SOURCE` says where they came from).
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import grpc
import pytest

from dra_bridge.rpc import dra_client
from dra_bridge.rpc.dra_grpc import KubeletPlugin
from dra_bridge.rpc.types import ClaimRef, DeviceHealthRecord, PreparedDevice, PrepareResult
from tests.support.kubelet import protos
from tests.support.kubelet.fake_kubelet import DraClient, FakeKubelet, short_root

DRIVER = "vgpu.example.com"
VERSIONS = ["v1", "v1beta1"]
HEALTH_VERSIONS = ["v1", "v1alpha1"]
DRA_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
HEALTH_SERVICES = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
# The share ID the kubelet receives for the claim named "shared". Only v1's Device has share_id:
# upstream v1beta1 has no field 5 (the kubelet's v1 -> v1beta1 conversion drops it). Our own protos
# once gave v1beta1 a share_id too, and tests on our copies asserted it arrived; built from the
# upstream protos, the kubelet side shows that a v1beta1 kubelet never sees it.
SHARE_ID = {"v1": "0b8c3a5e-6f0e-4a51-9f5b-6a1e9d7c2f10", "v1beta1": None}


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
            if c.name == "first-available":  # allocated through sub-request a100 of request gpu
                self.prepared[c.uid] = c
                out[c.uid] = PrepareResult(devices=[
                    PreparedDevice(request_names=["gpu/a100"], pool_name="node-a", device_name="gpu-0-vgpu-0",
                                   cdi_device_ids=[f"{DRIVER}/vgpu={c.uid}-0"]),
                    PreparedDevice(request_names=["gpu/a100", "extra"], pool_name="node-a",
                                   device_name="gpu-0-vgpu-1", cdi_device_ids=[f"{DRIVER}/vgpu={c.uid}-1"]),
                ])
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
    # Every service the plugin serves, health included: the kubelet opens a health stream only on
    # a DRAResourceHealth listed here, and picks v1 when both versions are.
    assert registration.info == {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": str(svc),
        "supported_versions": DRA_SERVICES + HEALTH_SERVICES,
    }
    assert registration.health_version == "v1"
    assert plugin.wait_registered(5)
    assert plugin.registered
    assert plugin.registration_status is not None and plugin.registration_status.error == ""


def test_registration_lists_no_health_service_without_health(root: Path, kubelet: FakeKubelet) -> None:
    """A driver without health(): NodeWatchResources would be UNIMPLEMENTED, so it is not listed."""
    with KubeletPlugin(DRIVER, NoHealthDriver(), kubelet_root=root) as p:
        registration = kubelet.register_dra_plugin(p.registration_socket)
        assert registration.info["supported_versions"] == DRA_SERVICES
        assert registration.health_version is None


def test_registration_rejected_is_recorded_and_logged(
    plugin: KubeletPlugin, kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dra_bridge.rpc.dra_grpc")
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
        assert got["uid-2"]["devices"][0]["share_id"] == SHARE_ID[version]
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
        assert got["uid-2"]["devices"][0]["share_id"] == SHARE_ID[version]
        theirs.unprepare(claims[:2])
    refuse = dra_client.register_plugin(plugin.registration_socket, lambda i: "not today")
    assert refuse[1] == "not today" and not plugin.registered


@pytest.mark.parametrize("version", VERSIONS)
def test_first_available_claim_is_answered_with_the_parent_request(
    plugin: KubeletPlugin, kubelet: FakeKubelet, driver: ToyDriver, version: str
) -> None:
    """A firstAvailable claim's allocation result names the sub-request (``gpu/a100``); the kubelet
    gives a container only the devices whose request_names contain the container's request, which
    is always the parent (``gpu``). Answering ``gpu/a100`` would leave the VM without its device,
    so the answer carries ``gpu``, as the upstream kubelet plugin helper answers
    (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go, stripSubrequestNames). A test
    with our own protos on both sides asserted ``gpu/a100`` before: the kubelet side now comes from
    the upstream protos and the assertion from upstream's behaviour."""
    claim = ("vms", "uid-fa", "first-available")
    with kubelet.register_dra_plugin(plugin.registration_socket).client(version) as client:
        got = client.prepare([claim])["uid-fa"]
    assert got["error"] == ""
    assert [(d["device_name"], d["request_names"]) for d in got["devices"]] == [
        ("gpu-0-vgpu-0", ["gpu"]),
        ("gpu-0-vgpu-1", ["gpu", "extra"]),
    ]
    with dra_client.DraClient(plugin.dra_socket, version) as ours:  # our stubs agree
        assert ours.prepare([claim])["uid-fa"] == got


def test_claim_missing_from_driver_answer(plugin: KubeletPlugin, driver: ToyDriver) -> None:
    driver.skip = {"u2"}
    with DraClient(plugin.dra_socket, "v1") as client:
        got = client.prepare([("ns", "u1", "a"), ("ns", "u2", "b")])
    assert got["u1"]["error"] == ""
    assert "no result for claim ns/b (u2)" in got["u2"]["error"]


@pytest.mark.parametrize("health_version", HEALTH_VERSIONS)
def test_health_stream_initial_state_and_changes(plugin: KubeletPlugin, driver: ToyDriver, health_version: str) -> None:
    with DraClient(plugin.dra_socket) as client:
        stream = client.watch_health(timeout=30, version=health_version)
        try:
            first = stream.get(timeout=5)
            assert DraClient.health_dict(first) == {
                ("node-a", "vgpu-0"): "HEALTHY",
                ("node-a", "vgpu-1"): "UNKNOWN",
            }
            # DeviceHealth.message is always filled: the driver's words, else what the status means.
            assert DraClient.health_messages(first) == {
                ("node-a", "vgpu-0"): "healthy",
                ("node-a", "vgpu-1"): "health unknown",
            }
            assert all(d.last_updated_time > 0 for d in first.devices)
            # Nothing changes -> nothing is sent (the driver is polled every 50 ms).
            stream.expect_nothing(within=0.3)
            driver.set_health(
                [
                    DeviceHealthRecord(pool="node-a", device="vgpu-0", healthy=False,
                                       message="GPU 0000:10:00.0 is gone from the PCI bus"),
                    DeviceHealthRecord(pool="node-a", device="vgpu-1", healthy=True),
                ]
            )
            second = stream.get(timeout=5)
            assert DraClient.health_dict(second) == {
                ("node-a", "vgpu-0"): "UNHEALTHY",
                ("node-a", "vgpu-1"): "HEALTHY",
            }
            gone = DraClient.health_messages(second)[("node-a", "vgpu-0")]
            assert gone == "GPU 0000:10:00.0 is gone from the PCI bus"
            # A new message alone is a change the kubelet hears.
            driver.set_health(
                [
                    DeviceHealthRecord(pool="node-a", device="vgpu-0", healthy=False, message="still gone"),
                    DeviceHealthRecord(pool="node-a", device="vgpu-1", healthy=True),
                ]
            )
            assert DraClient.health_messages(stream.get(timeout=5))[("node-a", "vgpu-0")] == "still gone"
            # A failing health() turns the known devices to UNKNOWN instead of killing the stream.
            driver.fail = RuntimeError("nvml gone")
            third = stream.get(timeout=5)
            assert set(DraClient.health_dict(third).values()) == {"UNKNOWN"}
            assert set(DraClient.health_messages(third).values()) == {"health check failed: RuntimeError: nvml gone"}
        finally:
            stream.cancel()


def test_both_health_versions_stream_at_once_and_long_messages_are_cut(
    plugin: KubeletPlugin, driver: ToyDriver
) -> None:
    """A kubelet on v1 and one still on v1alpha1 (a node upgrade) each get the same state; a
    message over 1024 characters arrives cut as the kubelet itself would cut it."""
    driver.set_health([DeviceHealthRecord(pool="node-a", device="vgpu-0", healthy=False, message="x" * 5000)])
    with DraClient(plugin.dra_socket) as client:
        streams = {v: client.watch_health(timeout=30, version=v) for v in HEALTH_VERSIONS}
        try:
            got = {v: s.get(timeout=5) for v, s in streams.items()}
        finally:
            for s in streams.values():
                s.cancel()
    for resp in got.values():
        assert DraClient.health_dict(resp) == {("node-a", "vgpu-0"): "UNHEALTHY"}
        (message,) = DraClient.health_messages(resp).values()
        assert len(message) == 1024 and message.endswith("...") and message.startswith("x" * 1021)


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


@pytest.mark.parametrize("health_version", HEALTH_VERSIONS)
def test_health_unimplemented_without_health_method(root: Path, health_version: str) -> None:
    with KubeletPlugin(DRIVER, NoHealthDriver(), kubelet_root=root) as p:
        with DraClient(p.dra_socket) as client:
            stream = client.watch_health(timeout=5, version=health_version)
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


# --------------------------------------------------------------------------- the kubelet side's protos


def test_kubelet_side_is_built_from_the_upstream_protos() -> None:
    """The fake kubelet's messages come from kubernetes/kubelet's own .proto files (skipped, naming
    the fallback, when the upstream copies are not beside the repository)."""
    if not protos.UPSTREAM:
        pytest.skip(f"kubelet side built from {protos.SOURCE}")
    pool = protos.pool()
    for message, upstream_file in [
        ("k8s.io.kubelet.pkg.apis.dra.v1.Device", "k8s_kubelet_apis/dra/v1/api.proto"),
        ("k8s.io.kubelet.pkg.apis.dra.v1beta1.Device", "k8s_kubelet_apis/dra/v1beta1/api.proto"),
        ("pluginregistration.PluginInfo", "k8s_kubelet_apis/pluginregistration/v1/api.proto"),
        ("v1.DeviceHealth", "k8s_kubelet_apis/dra_health/v1/api.proto"),
        ("v1alpha1.DeviceHealth", "k8s_kubelet_apis/dra_health/v1alpha1/api.proto"),
        ("v1beta1.RegisterRequest", "k8s_kubelet_apis/deviceplugin/v1beta1/api.proto"),
    ]:
        assert pool.FindMessageTypeByName(message).file.name == upstream_file


def test_upstream_protos_importing_gogo_compile_with_a_stub(tmp_path: Path) -> None:
    """Older kubelet protos import gogo.proto; a stub declaring the options they use stands in
    for it, and the upstream file itself stays untouched."""
    api = tmp_path / "k8s_kubelet_apis" / "dra" / "v1alpha9" / "api.proto"
    api.parent.mkdir(parents=True)
    api.write_text(
        'syntax = "proto3";\npackage k8s.io.kubelet.pkg.apis.dra.v1alpha9;\n'
        f'import "{protos.GOGO_IMPORT}";\n'
        "option (gogoproto.marshaler_all) = true;\noption (gogoproto.goproto_stringer_all) = false;\n"
        'message Device { repeated string cdi_device_ids = 4 [(gogoproto.customname) = "CDIDeviceIDs"]; }\n'
    )
    before = api.read_bytes()
    from google.protobuf import descriptor_pb2

    names = [f.name for f in descriptor_pb2.FileDescriptorSet.FromString(protos._compile(tmp_path)).file]
    assert names[-1] == "k8s_kubelet_apis/dra/v1alpha9/api.proto" and protos.GOGO_IMPORT in names
    assert api.read_bytes() == before
    with pytest.raises(ValueError, match="not_a_gogo_option"):
        protos.gogo_stub({"marshaler_all", "not_a_gogo_option"})
