"""``vgpuctl serve`` end to end: a simulated host, a local API server, a fake kubelet on real sockets."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import LABEL_ROLE
from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.kubelet import node_object
from mdev_manager.executor import Executor
from mdev_manager.sim import SimIO
from tests.support.dra import (
    DRIVER,
    VERSIONS,
    add_claim,
    assert_consistent_pool,
    cdi_device,
    claim_object,
    gpu_addresses,
    make_node,
    pool_slices,
    published_devices,
    schema_validate,
    short_tmp,
    strip_server_fields,
)
from tests.support.kubelet.fake_kubelet import DraClient, FakeKubelet
from tests.support.simnodes import EXAMPLE_LAYOUT

WAIT = 30.0


def wait_until(pred, timeout: float = WAIT, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout}s")


def is_socket(p: Path) -> bool:
    try:
        return stat.S_ISSOCK(p.lstat().st_mode)
    except FileNotFoundError:
        return False


def sockets(kubelet_root: Path) -> list[Path]:
    return [p for p in kubelet_root.rglob("*.sock") if is_socket(p)]


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str, labels: str = "", default: float | None = None) -> float:
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    if default is not None:
        return default
    raise KeyError(key)


class Running:
    """A Daemon started, with its resync loop in a thread (as ``vgpuctl serve`` runs it)."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon.start()
        self.thread = threading.Thread(target=daemon.run, name="daemon-run", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the daemon did not stop"


@contextmanager
def running(daemon: Daemon):
    r = Running(daemon)
    try:
        yield r
    finally:
        if r.thread.is_alive():
            r.stop()


def make_daemon(node, srv, base: Path, *, resync: float = 30.0, io=None, **kw) -> Daemon:
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=0,
                      resync_seconds=resync, health_poll_seconds=0.1, **kw)
    return Daemon(cfg, node.env, io or SimIO(node.host), srv.api_client())


@pytest.fixture
def node(base):
    return make_node(base, "default")


def register(kubelet_root: Path) -> tuple[FakeKubelet, object]:
    kubelet = FakeKubelet(kubelet_root)
    (reg_sock,) = wait_until(lambda: kubelet.discover_dra_plugins(), 10, "registration socket")
    assert reg_sock.name == f"{DRIVER}-reg.sock"
    reg = kubelet.register_dra_plugin(reg_sock)
    return kubelet, reg


# --------------------------------------------------------------------------- the kubelet round trip


def test_register_prepare_repeat_restart_unprepare_over_sockets(srv, node, base):
    kl = base / "kl"
    with running(make_daemon(node, srv, base)) as r1:
        d1 = r1.daemon
        slices = pool_slices(srv, node=node.node)
        assert_consistent_pool(slices)
        published = published_devices(slices)

        kubelet, reg = register(kl)
        assert reg.accepted
        assert reg.info["type"] == "DRAPlugin" and reg.info["name"] == DRIVER
        assert reg.info["endpoint"] == str(kl / "plugins" / DRIVER / "dra.sock")
        assert "v1.DRAPlugin" in reg.info["supported_versions"]
        # the health services are listed too, or the kubelet never watches device health
        assert {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} <= set(reg.info["supported_versions"])
        assert reg.health_version == "v1"
        assert d1.plugin.wait_registered(5)

        vgpu_dev = next(n for n in sorted(published) if n.startswith("gpu-0-vgpu-"))
        pt_dev = "gpu-1-passthrough"
        assert pt_dev in published
        c_vgpu = add_claim(srv, "vm-vgpu", [("vgpu", vgpu_dev)], node=node.node)
        c_pt = add_claim(srv, "vm-pt", [("gpu", pt_dev)], node=node.node)
        claims = [(c.namespace, c.uid, c.name) for c in (c_vgpu, c_pt)]

        with reg.client("v1") as client:
            first = client.prepare(claims)
            assert {u: v["error"] for u, v in first.items()} == {c_vgpu.uid: "", c_pt.uid: ""}
            (dv,) = first[c_vgpu.uid]["devices"]
            assert dv["device_name"] == vgpu_dev and dv["pool_name"] == node.node and dv["request_names"] == ["vgpu"]
            for cid in dv["cdi_device_ids"]:
                cdi_device(base / "cdi", cid)  # each id resolves to exactly one device on disk
            (v,) = node.gpu("0000:10:00.0").vgpus
            assert v.id in node.mdevs()
            assert node.driver_of("0000:13:00.0") == "vfio-pci"
            mdevs = node.mdevs()

            assert client.prepare(claims) == first, "a repeated prepare must answer the same"
            assert node.mdevs() == mdevs
        with reg.client("v1beta1") as client:
            assert client.prepare(claims) == first

        d1.resync()  # the gauges follow the checkpoint at each resync
        code, text = http_get(d1.probes.port, "/metrics")
        assert code == 200
        assert metric(text, "vgpuctl_prepare_seconds_count") == 3 * 2  # three prepares of two claims
        assert metric(text, "vgpuctl_prepare_errors_total") == 0
        assert metric(text, "vgpuctl_prepared_claims") == 2
        assert metric(text, "vgpuctl_vgpus") == 1
        r1.stop()

    # stopped mid-way: sockets gone, devices and files stay
    assert sockets(kl) == []
    assert node.mdevs() == mdevs and node.driver_of("0000:13:00.0") == "vfio-pci"
    assert list((base / "cdi").glob("*.json"))
    with pytest.raises(grpc.RpcError):
        with DraClient(kl / "plugins" / DRIVER / "dra.sock", timeout=1) as gone:
            gone.prepare(claims)

    with running(make_daemon(node, srv, base)) as r2:
        kubelet, reg = register(kl)
        with reg.client("v1") as client:
            assert client.prepare(claims) == first, "the restarted plugin must answer from its checkpoint"
            assert node.mdevs() == mdevs
            assert client.unprepare(claims) == {c_vgpu.uid: "", c_pt.uid: ""}
            assert node.mdevs() == set() and node.gpu("0000:10:00.0").vgpus == []
            assert node.driver_of("0000:13:00.0") == "nvidia"
            assert list((base / "cdi").glob("*.json")) == []
            unknown = ("default", "00000000-0000-4000-8000-000000000001", "never")
            assert client.unprepare([unknown]) == {unknown[1]: ""}
        code, _ = http_get(r2.daemon.probes.port, "/readyz")
        assert code == 200
        r2.stop()
    assert sockets(kl) == []


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_first_available_claim_is_answered_with_the_parent_request_over_sockets(srv, node, base, version):
    """What ``render claim-template --set first_available=[...]`` gives a VM: the allocation names
    the sub-request (``vgpu/small``), but the kubelet hands the container only devices whose
    request_names contain the container's request, ``vgpu``; so the plugin answers ``vgpu``, as
    upstream's kubelet plugin helper does (kubeletplugin/draplugin.go, stripSubrequestNames)."""
    kl = base / "kl"
    with running(make_daemon(node, srv, base)):
        _, reg = register(kl)
        dev_name = next(n for n in sorted(published_devices(pool_slices(srv, node=node.node)))
                        if n.startswith("gpu-0-vgpu-"))
        obj = claim_object("vm-first", [("vgpu/small", dev_name)], node=node.node)
        obj["spec"]["devices"]["requests"] = [{"name": "vgpu", "firstAvailable": [
            {"name": "small", "deviceClassName": "vgpu.kubevirt.io"}]}]
        uid = srv.add(obj)["metadata"]["uid"]
        with reg.client(version) as client:
            got = client.prepare([("default", uid, "vm-first")])[uid]
            assert got["error"] == ""
            (dev,) = got["devices"]
            assert (dev["device_name"], dev["request_names"]) == (dev_name, ["vgpu"])
            for cid in dev["cdi_device_ids"]:
                cdi_device(base / "cdi", cid)
            assert client.unprepare([("default", uid, "vm-first")]) == {uid: ""}


def test_bad_claim_over_the_socket_is_an_error_not_a_crash(srv, node, base):
    kl = base / "kl"
    with running(make_daemon(node, srv, base)):
        _, reg = register(kl)
        bad = add_claim(srv, "elsewhere", [("vgpu", "gpu-0-vgpu-1gb-0")], node="sim-node-2")
        missing = ("default", "00000000-0000-4000-8000-000000000002", "missing")
        with reg.client("v1") as client:
            out = client.prepare([(bad.namespace, bad.uid, bad.name), missing])
            assert out[bad.uid]["error"] and out[bad.uid]["devices"] == []
            assert out[missing[1]]["error"]
            # still serving
            good = add_claim(srv, "good", [("vgpu", "gpu-0-vgpu-1gb-0")], node=node.node)
            assert client.prepare([(good.namespace, good.uid, good.name)])[good.uid]["error"] == ""


def test_crash_left_vgpu_is_removed_when_the_daemon_starts(srv, node, base):
    """A vGPU recorded as 'preparing' (the process died after creating it) is gone after start()."""
    from tests.support.dra import DictClaims, claim_object, make_driver

    class Crash(BaseException):
        pass

    class CrashAfterCreate(SimIO):
        def write(self, path, data):
            super().write(path, data)
            if Path(path).name == "create":
                raise Crash()

    d = make_daemon(node, srv, base)
    pool = node.build_pool()
    claims = DictClaims()
    ref = claims.add(claim_object("vm", [("vgpu", "gpu-0-vgpu-1gb-0")], node=node.node),
                     uid="00000000-0000-4000-8000-0000000000c1")
    with pytest.raises(Crash):
        make_driver(node, d.paths, claims, pool, io=CrashAfterCreate(node.host)).prepare([ref])
    assert len(node.mdevs()) == 1
    with running(make_daemon(node, srv, base)) as r:
        assert node.mdevs() == set()
        assert r.daemon.driver.cp.claims == {}


# --------------------------------------------------------------------------- health and metrics


def test_gpu_that_disappears_leaves_the_pool_within_one_resync(srv, node, base):
    gone = "0000:13:00.0"
    with running(make_daemon(node, srv, base)) as r:
        d = r.daemon
        before_slices = pool_slices(srv)
        before = published_devices(before_slices)
        lost = {n for n in before if n.startswith("gpu-1-")}
        assert lost
        _, reg = register(base / "kl")
        with reg.client("v1") as client:
            # a kubelet on health v1 and one still on v1alpha1 hear the same
            streams = {v: client.watch_health(timeout=WAIT, version=v) for v in ("v1", "v1alpha1")}
            for stream in streams.values():
                first = stream.get()
                assert {DraClient.health_dict(first)[(node.node, n)] for n in lost} == {"HEALTHY"}
                assert all(DraClient.health_messages(first).values()), "DeviceHealth.message is empty"
            node.host.remove_gpu(gone)
            # before the resync the kubelet already hears the devices are unhealthy
            for stream in streams.values():
                while True:
                    resp = stream.get()
                    state = DraClient.health_dict(resp)
                    if state.get((node.node, "gpu-1-passthrough")) == "UNHEALTHY":
                        break
                assert {state[(node.node, n)] for n in lost} == {"UNHEALTHY"}
                assert all(DraClient.health_messages(resp)[(node.node, n)] for n in lost)
                stream.cancel()
        d.resync()
        after = pool_slices(srv)
        assert_consistent_pool(after)
        assert gpu_addresses(after) == gpu_addresses(before_slices) - {gone}
        assert len(published_devices(after)) == len(before) - len(lost)
        assert all(dev.gpu != gone for dev in d._pool.devices)


def test_gpu_that_changes_driver_leaves_the_pool_within_one_resync(srv, node, base):
    gpu = "0000:10:00.0"
    with running(make_daemon(node, srv, base)) as r:
        before = published_devices(pool_slices(srv))
        vgpus = {n for n in before if n.startswith("gpu-0-vgpu-")}
        assert vgpus
        Executor(node.env, node.io).bind(gpu, "vfio-pci")  # someone took the GPU away from nvidia
        r.daemon.resync()
        after = published_devices(pool_slices(srv))
        assert not (after & vgpus), "vGPUs of a GPU no longer on its vGPU driver are still offered"
        assert_consistent_pool(pool_slices(srv))


def test_periodic_resync_and_metrics(srv, node, base):
    with running(make_daemon(node, srv, base, resync=0.2)) as r:
        port = r.daemon.probes.port
        assert http_get(port, "/readyz")[0] == 200
        assert http_get(port, "/healthz")[0] == 200
        assert http_get(port, "/nope")[0] == 404
        text = wait_until(lambda: (t := http_get(port, "/metrics")[1]) and
                          metric(t, "vgpuctl_resyncs_total", 'result="ok"') >= 3 and t, 10, "three resyncs")
        n_pool = len(r.daemon._pool.devices)
        assert metric(text, "vgpuctl_published_devices", 'kind="vgpu"') + \
            metric(text, "vgpuctl_published_devices", 'kind="passthrough"') == n_pool
        assert metric(text, "vgpuctl_gpus") == 4
        assert metric(text, "vgpuctl_api_writes_total", 'verb="create"') == len(pool_slices(srv))
        # unchanged resyncs wrote nothing more
        srv.reset_counters()
        wait_until(lambda: metric(http_get(port, "/metrics")[1], "vgpuctl_resyncs_total", 'result="ok"') >= 5,
                   10, "two more resyncs")
        assert srv.writes == []
        # ... nor read: the publisher watches its slices instead of listing them (#15)
        assert [r for r in srv.request_log if r.resource == "resourceslices" and r.verb != "watch"] == []
        # a slice deleted behind its back while the API refuses writes: an error resync, and the
        # loop keeps going until the slice is back
        srv.inject("create", "resourceslices", 403, times=None)
        victim = pool_slices(srv)[0]["metadata"]["name"]
        client.ResourceV1Api(srv.api_client()).delete_resource_slice(victim)
        wait_until(lambda: metric(http_get(port, "/metrics")[1], "vgpuctl_resyncs_total", 'result="error"', 0) >= 1,
                   10, "an error resync")
        srv.clear_injections()
        wait_until(lambda: victim in {s["metadata"]["name"] for s in pool_slices(srv)}, 10,
                   "recovery after the API error")


@pytest.mark.parametrize("version", VERSIONS)
def test_daemon_publishes_valid_slices_per_version(node, base, version):
    with LocalApiServer(version=version) as srv, running(make_daemon(node, srv, base)) as r:
        slices = pool_slices(srv, node=node.node)
        assert_consistent_pool(slices)
        for s in slices:
            schema_validate(strip_server_fields(s), version)
        assert published_devices(slices) == {d.name for d in r.daemon._pool.devices}
        assert r.daemon.publisher.version == tuple(int(x) for x in version.split("."))


# --------------------------------------------------------------------------- the real command


@pytest.mark.parametrize("version", VERSIONS)
def test_vgpuctl_serve_subprocess(version):
    with short_tmp("vc") as d, LocalApiServer(version=version) as srv:
        srv.add(node_object("sim-node-1", kubelet_version=srv.git_version))  # what the kubelet registers
        kc = srv.kubeconfig(d / "kubeconfig")
        kl, cdi_root = d / "kl", d / "cdi"
        env = {**os.environ, "VGPUCTL_SIM_DIR": str(d / "sim"), "NODE_NAME": "sim-node-1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        cmd = [sys.executable, "-m", "vgpuctl.main", "--simulate", "serve", "--kubeconfig", str(kc),
               "--kubelet-root", str(kl), "--cdi-root", str(cdi_root), "--metrics-port", "0", "--resync", "1"]
        log = open(d / "serve.log", "w+")
        proc = subprocess.Popen(cmd, env=env, cwd=str(Path(__file__).resolve().parents[2]),
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_until(lambda: proc.poll() is not None or (
                    pool_slices(srv, node="sim-node-1") and len(sockets(kl)) == 2), 60, "slices and sockets")
            except AssertionError:
                log.seek(0)
                raise AssertionError(log.read()[-3000:]) from None
            assert proc.poll() is None, (log.seek(0), log.read()[-3000:])[1]
            slices = pool_slices(srv, node="sim-node-1")
            assert_consistent_pool(slices)
            for s in slices:
                schema_validate(strip_server_fields(s), version)
            roles = {s["metadata"]["labels"][LABEL_ROLE] for s in slices}
            if version == "1.34":
                assert "combined" in roles
            else:
                assert roles == {"counters", "devices"}
            kubelet = FakeKubelet(kl)
            (reg_sock,) = kubelet.discover_dra_plugins()
            reg = kubelet.register_dra_plugin(reg_sock)
            assert reg.info["name"] == DRIVER
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            log.seek(0)
            output = log.read()
            log.close()
        assert rc == 0, output[-3000:]
        assert sockets(kl) == [], "sockets left behind after SIGTERM"
        assert "HTTP response headers" not in output, output[-3000:]  # API errors are logged in one line
        assert srv.get_object("nodes", "sim-node-1")["metadata"]["annotations"].get("vgpu.kubevirt.io/dra-fields")


@pytest.mark.parametrize("version,gates,counters,groups", [
    ("1.35", {}, 0, None),  # DRAPartitionableDevices off by default: counters dropped
    ("1.37", {}, 1, 0),  # DRADeviceCompatibilityGroups alpha: groups dropped
    ("1.37", {"DRADeviceCompatibilityGroups": True}, 1, 1),
])
def test_the_agent_finds_what_the_server_keeps(base, version, gates, counters, groups):
    major, minor = (int(x) for x in version.split("."))
    node = make_node(base, "default", version=(major, minor))
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        client.CoreV1Api(srv.api_client()).create_node({"metadata": {"name": node.node}})
        with running(make_daemon(node, srv, base)) as r:
            text = http_get(r.daemon.probes.port, "/metrics")[1]
            assert metric(text, "vgpuctl_api_fields_kept", 'field="counters"') == counters
            if groups is not None:
                assert metric(text, "vgpuctl_api_fields_kept", 'field="compatibility_groups"') == groups
            note = client.CoreV1Api(srv.api_client()).read_node(node.node).metadata.annotations
            assert note["vgpu.kubevirt.io/dra-fields"].startswith(f"counters={'kept' if counters else 'dropped'}")
            slices = pool_slices(srv, node=node.node)
            has_groups = any(c.get("compatibilityGroups") for s in slices for d in s["spec"].get("devices") or []
                             for c in d.get("consumesCounters") or [])
            assert has_groups == bool(groups)  # a server dropping the groups gets the one-size-per-GPU shape
            if not counters:  # ... and one dropping the counters gets the whole GPU or one type per GPU
                kinds: dict[str, set] = {}
                for d in (d for s in slices for d in s["spec"].get("devices") or []):
                    attrs = d["attributes"]
                    kinds.setdefault(attrs["gpuIndex"]["int"], set()).add(
                        attrs["type"]["string"] + "/" + attrs.get("typeId", {}).get("string", ""))
                assert kinds and all(len(k) == 1 for k in kinds.values()), kinds
            srv.reset_counters()
            r.daemon.resync()
            assert srv.writes == []  # nothing rewritten although the server stores less than was sent


class CountingIO(SimIO):
    """The simulated host's transport, counting directory listings (discovery makes hundreds)."""

    def __init__(self, host):
        super().__init__(host)
        self.listings = 0

    def listdir(self, path):
        self.listings += 1
        return super().listdir(path)


def test_idle_periodic_resyncs_skip_discovery_and_the_api_until_something_changes(srv, node, base):
    io = CountingIO(node.host)
    with running(make_daemon(node, srv, base, resync=0.1, io=io, full_resync_seconds=3600)) as r:
        port = r.daemon.probes.port
        resyncs = lambda result: metric(http_get(port, "/metrics")[1], "vgpuctl_resyncs_total",  # noqa: E731
                                        f'result="{result}"', 0)
        wait_until(lambda: resyncs("unchanged") >= 1, 10, "an unchanged resync")
        ok, listings = resyncs("ok"), io.listings
        srv.reset_counters()
        wait_until(lambda: resyncs("unchanged") >= 5, 10, "more unchanged resyncs")
        assert resyncs("ok") == ok, "a periodic resync with nothing changed did everything again"
        per_idle = (io.listings - listings) / 4
        assert per_idle < 10, f"{per_idle} directory listings per idle resync: discovery ran"
        assert [q for q in srv.request_log if q.verb != "watch"] == []
        # a vGPU made by hand (mdevctl start, say): the next periodic resync sees it
        t4 = next(g for g in r.daemon.inventory.gpus if g.framework == "mdev")
        t = t4.type_by_ref("T4-4Q")
        io.write(node.env.pci(t4.address) / "mdev_supported_types" / t.id / "create",
                 "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c")
        wait_until(lambda: resyncs("ok") > ok, 10, "a full resync after the change")
        assert any(v.id == "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c" for v in r.daemon.inventory.all_vgpus())


def test_the_running_agent_answers_binding_conditions_from_a_watch(base):
    """1.36 defaults: the running agent (one LIST, then a watch of the claims) confirms the first
    size allocated on an empty GPU and refuses a second size on it, within the scheduler's wait."""
    from tests.support.dra import claim_object

    node = make_node(base, "default", version=(1, 36))
    with LocalApiServer(version="1.36", feature_gates={}) as srv:
        client.CoreV1Api(srv.api_client()).create_node({"metadata": {"name": node.node}})
        with running(make_daemon(node, srv, base, resync=3600)) as r:
            devs = [d for s in pool_slices(srv, node=node.node) for d in s["spec"].get("devices") or []
                    if d.get("bindingConditions") and d["attributes"]["gpuIndex"]["int"] == 0]
            by_size = {}
            for d in devs:
                by_size.setdefault(d["capacity"]["memory"]["value"], d)
            first, second = by_size["8Gi"], by_size["1Gi"]

            def allocate(name, dev):
                obj = claim_object(name, [("vgpu", dev["name"])], node=node.node)
                res = obj["status"]["allocation"]["devices"]["results"][0]
                res["bindingConditions"], res["bindingFailureConditions"] = (dev["bindingConditions"],
                                                                            dev["bindingFailureConditions"])
                srv.add(obj)

            def conditions(name):
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    c = client.ResourceV1Api(srv.api_client()).read_namespaced_resource_claim(name, "default")
                    for e in (c.status.devices or []):
                        got = {x.type: x.status for x in e.conditions or []}
                        if got:
                            return got
                    time.sleep(0.1)
                raise AssertionError(f"no binding condition on {name}")

            allocate("first", first)
            assert conditions("first") == {"vgpu.kubevirt.io/SizeAssigned": "True",
                                           "vgpu.kubevirt.io/SizeConflict": "False"}
            allocate("second", second)
            assert conditions("second") == {"vgpu.kubevirt.io/SizeAssigned": "False",
                                            "vgpu.kubevirt.io/SizeConflict": "True"}
            assert r.daemon.claim_cache.lists == 1  # the watch, not a LIST per round
            # the GPU is republished with its size only
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                sizes = {d["capacity"]["memory"]["value"] for s in pool_slices(srv, node=node.node)
                         for d in s["spec"].get("devices") or [] if d["attributes"]["gpuIndex"]["int"] == 0
                         and d["attributes"]["type"]["string"] == "vgpu"}
                if sizes == {"8Gi"}:
                    break
                time.sleep(0.1)
            assert sizes == {"8Gi"}


def test_an_agent_whose_node_object_is_missing_is_told_so_in_one_line(node, base, caplog):
    """No Node object of the agent's name (issue #36): the agent's log says the Node object is missing,
    one line each at WARNING (not the client's headers and body, not at INFO); ``doctor`` says the same
    of its slices instead of claiming the agent no longer runs there."""
    from dra_bridge.apiclient.clusterfacts import gather
    from dra_bridge.doctor.checks import diagnose

    caplog.set_level("INFO")
    with LocalApiServer(version="1.37") as srv:
        with running(make_daemon(node, srv, base)):
            pool_slices(srv, node=node.node)  # published: the agent runs
            found = {f.check: f for f in diagnose(gather(srv.api_client(), DRIVER))}
        daemon = make_daemon(node, srv, base, layout_label="vgpu.kubevirt.io/config",
                             layout_file=EXAMPLE_LAYOUT)
        with running(daemon):
            pass
    mine = found[f"node {node.node}"]
    assert mine.status == "WARN" and f"no Node object '{node.node}'" in mine.detail, mine
    assert "no longer runs" not in mine.detail and "NODE_NAME" in mine.fix, mine
    said = [r for r in caplog.records if node.node in r.getMessage() and "404" in r.getMessage()]
    assert said and all(f"no Node object '{node.node}'" in r.getMessage() for r in said), said
    assert all(r.levelname in ("WARNING", "ERROR") and "\n" not in r.getMessage() for r in said), said
