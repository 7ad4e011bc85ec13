"""On a real control plane (issue #31): etcd, kube-apiserver, kube-scheduler and
kube-controller-manager of Kubernetes 1.37, and of 1.34 (issue #39.2: the newest and the oldest
supported minor, each with its default gates), in one Go process (tests/controlplane/k8s-X.Y), with
Node objects and no kubelet; the kubelet's side is the kubelet model of the other tests, over the
agent's real sockets, or (the pods the scheduler binds) the node side of tests/controlplane/nodeside.py
beside ``vgpuctl serve`` as processes, as in test_e2e_serve.py: no test writes a pod's phase.

- ``vgpuctl serve`` publishes its ResourceSlices there, for every preset;
- DeviceClasses and claim templates rendered by ``vgpuctl render`` go in with real kubectl; the real
  scheduler allocates a pod's claim (the agent confirms the binding conditions it publishes), the
  real ResourceClaim controller makes the claim from the template, the plugin prepares it;
- ``kubectl apply -k deploy/overlays/<each>`` with server validation;
- the same objects written to the local API server (``vgpuctl sim apiserver``, as the same minor)
  and to the real one are stored alike;
- ``vgpuctl doctor`` gives the same verdicts on both, gates as shipped and flipped.

Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.kubelet import node_object
from mdev_manager.discovery import discover
from mdev_manager.sim import SimIO
from mdev_manager.sim.hostspec import preset_names
from mdev_manager.sim.node import sim_node
from tests.support.controlplane import MINOR_PARAMS, RealControlPlane, poll
from tests.support.deploy import NAMESPACE, OVERLAYS, Kubectl, needs_kubectl
from tests.support.dra import DRIVER, assert_consistent_pool, make_node, pool_slices, short_tmp

pytestmark = [pytest.mark.go, needs_kubectl]

VGPUCTL = [sys.executable, "-m", "vgpuctl.main"]
WAIT = 60.0
# bench-large is the benchmark's 1,000-device host: its publishing is the benchmark's business
PRESETS = [p for p in preset_names() if p != "bench-large"]


def wait_for(pred, what: str, timeout: float = WAIT):
    return poll(pred, what, timeout)


def render(*args: str) -> str:
    return subprocess.run([*VGPUCTL, "render", *args], capture_output=True, text=True, check=True).stdout


def node_for(name: str, version: tuple[int, int] = (1, 37)) -> dict:
    """The Node a kubelet of ``version`` would register: the model's, with what the scheduler reads
    (allocatable)."""
    obj = node_object(name, kubelet_version=f"v{version[0]}.{version[1]}.0")
    obj["status"]["capacity"] = obj["status"]["allocatable"] = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return obj


def make_daemon(node, srv, base: Path) -> Daemon:
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=0,
                      resync_seconds=3600, health_poll_seconds=0.1)
    return Daemon(cfg, node.env, SimIO(node.host), srv.api_client())


class Serving:
    """``vgpuctl serve``'s daemon: started (it publishes), its loop in a thread (it confirms binding
    conditions from its watch); stopped on exit."""

    def __init__(self, daemon: Daemon):
        import threading

        self.daemon = daemon
        self.thread = threading.Thread(target=daemon.run, name="daemon-run", daemon=True)

    def __enter__(self) -> Daemon:
        self.daemon.start()
        self.thread.start()
        return self.daemon

    def __exit__(self, *exc: object) -> None:
        self.daemon.stop()
        self.thread.join(WAIT)


SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def stored(obj: dict) -> dict:
    """What a server kept of an object, less what only a server writes (ids, times)."""
    out = json.loads(json.dumps(obj))
    for k in SERVER_FIELDS:
        out["metadata"].pop(k, None)
    return out


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ, as ``path: a != b`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: local={json.dumps(a)[:200]} real={json.dumps(b)[:200]}"]


@pytest.fixture(scope="module", params=MINOR_PARAMS)
def cp(request):
    """The real control plane of each minor with its default gates, one per minor for the module."""
    with RealControlPlane(minor=request.param) as c:
        yield c


@pytest.fixture(scope="module")
def local(cp):
    """The local API server as ``vgpuctl sim apiserver --version <cp's minor>`` serves it."""
    with LocalApiServer(version=cp.minor, feature_gates={}) as s:
        yield s


@pytest.fixture
def k(cp, tmp_path):
    return Kubectl(cp.kubeconfig_path, tmp_path)


@pytest.fixture
def klocal(local, tmp_path):
    home = tmp_path / "local-home"
    home.mkdir()
    return Kubectl(local.kubeconfig(tmp_path / "local.kubeconfig"), home)


# --------------------------------------------------------------------------- the control plane itself


def test_the_control_plane_is_its_kubernetes_minor_with_its_dra_api(cp, k):
    version = json.loads(k("version", "-o", "json").stdout)["serverVersion"]
    assert (version["major"], version["minor"]) == tuple(cp.minor.split(".")), version
    assert version["gitVersion"].startswith(f"v{cp.minor}."), version
    resources = k("api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout.split()
    assert {"deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io",
            "resourceclaimtemplates.resource.k8s.io", "resourceslices.resource.k8s.io"} <= set(resources)
    print(f"control plane: {version['gitVersion']}, ready in {cp.started_in:.1f}s, RSS {cp.rss_kib() // 1024} MiB")


# --------------------------------------------------------------------------- serve publishes there


def _publish(node, srv, base: Path) -> list[dict]:
    with Serving(make_daemon(node, srv, base)):
        slices = pool_slices(srv, node=node.node)
    return slices


def _shape(slices: list[dict]) -> list[str]:
    return sorted(json.dumps({"labels": s["metadata"].get("labels"), "spec": s["spec"]}, sort_keys=True)
                  for s in slices)


def test_serve_publishes_every_preset_and_both_servers_keep_the_same(cp, local):
    """Each preset's agent publishes to the real server, then the same node to the local one: the
    slices each server keeps are the same (the agent picks its shape from what the server keeps)."""
    found = {}
    with short_tmp("cp") as base:
        for preset in PRESETS:
            node = make_node(base / preset, preset, version=cp.version)
            for srv in (cp, local):
                srv.add(node_for(node.node, cp.version))
            real = _publish(node, cp, base / preset / "r")
            assert real, f"{preset}: nothing published on the real server"
            assert_consistent_pool(real)
            mine = _publish(node, local, base / preset / "l")
            found[preset] = differences(_shape(mine), _shape(real))
            # no agent serves this node any more: its devices must not be offered to later tests
            for s in real:
                cp.remove("resourceslices", s["metadata"]["name"])
            cp.remove("nodes", node.node)
    assert found == {p: [] for p in PRESETS}


# --------------------------------------------------------------------------- scheduled by the real scheduler


def _vgpu_pod(name: str, template: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never",
                     "resourceClaims": [{"name": "vgpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "vm", "image": "registry.invalid/virt-launcher",
                                     "resources": {"claims": [{"name": "vgpu"}]}}]}}


def test_the_real_scheduler_allocates_rendered_claims_and_the_plugin_prepares(cp, k):
    """Rendered objects applied with kubectl; ``vgpuctl serve`` and the node side as processes (the
    node side, not this test, prepares each bound pod's claim and sets the pod Running). Where the
    server keeps no counters (1.34's defaults) a GPU that offers vGPUs does not offer itself whole
    (dra_bridge/pool/safe.py): the passthrough pod stays Pending with the scheduler's reason."""
    import shutil

    from tests.controlplane.up import SimulatedNode
    from tests.support.controlplane import unavailable

    if shutil.which("openssl") is None:
        unavailable("openssl not installed: the node side makes its kubelet certificate with it (apt install openssl)")
    with short_tmp("cpe") as base:
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C"))
        k("apply", "-f", "-", stdin=render("passthrough-pod"))  # its template and its pod
        k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod("vm-a100", "vgpu-a100-4c")))
        whole = bool(cp.kept().counters)
        with SimulatedNode(cp.kubeconfig_path, "default", base / "n") as node:
            for name in ("vm-a100", "vfio-gpu") if whole else ("vm-a100",):
                pod = wait_for(lambda n=name: (p := cp.get_object("pods", n, "default")) and
                               (p.get("status") or {}).get("phase") == "Running" and p, f"pod {name} Running", 120)
                assert pod["spec"]["nodeName"] == node.node
                (claim_name,) = [s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]]
                claim = cp.get_object("resourceclaims", claim_name, "default")
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["pool"]) == (DRIVER, node.node)
                # the claim is reserved for the pod and made from the template by the controller
                assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
                assert claim["metadata"]["ownerReferences"][0]["name"] == name
                if result.get("bindingConditions"):  # confirmed by the agent before the bind
                    conds = {c["type"]: c["status"] for e in claim["status"].get("devices") or []
                             for c in e.get("conditions") or []}
                    assert all(conds.get(c) == "True" for c in result["bindingConditions"]), conds
            # what the plugin prepared is on the host: the A100's vGPU, the whole GPU on vfio-pci
            sim = sim_node(node.host_dir, None)
            inv = discover(sim.env, sim.io, node=node.node)
            assert [v.type_name.split()[-1] for v in inv.all_vgpus()] == ["A100-4C"], inv.all_vgpus()
            if whole:
                assert sum(g.driver == "vfio-pci" for g in inv.gpus) >= 1
            else:
                # the pod was made before the node joined: its first attempt's "no nodes available to
                # schedule pods" stands until the scheduler tries it again on the node's arrival
                reason = wait_for(lambda: next((m for c in (cp.get_object(
                    "pods", "vfio-gpu", "default").get("status") or {}).get("conditions") or []
                    if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                    and "no nodes available" not in (m := c.get("message") or "")), None), "vfio-gpu Pending", 120)
                assert "cannot allocate all claims" in reason, reason
                assert not cp.get_object("pods", "vfio-gpu", "default")["spec"].get("nodeName")
                assert not [g for g in inv.gpus if g.driver == "vfio-pci"], inv.gpus
            got = k("get", "pods", "-o", "wide").stdout
            assert "Running" in got and node.node in got
            k("delete", "pods", "vm-a100", "vfio-gpu", "--timeout=60s")  # confirmed by the node side


# --------------------------------------------------------------------------- deploy/ with server validation


def _split(diffs: list[str]) -> tuple[list[str], list[str]]:
    """(fields only kube-apiserver has: its defaults, which the local server does not apply by
    design, dra_bridge/sim/apiserver/dra_claims.py; every other difference)."""
    defaults = [d for d in diffs if ': local="<absent>" real=' in d]
    return defaults, [d for d in diffs if d not in defaults]


def _applied(kc: Kubectl, root: Path) -> list[dict]:
    return json.loads(kc("get", "-k", str(root), "-o", "json").stdout)["items"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_apply_k_each_overlay_with_server_validation_and_both_servers_keep_the_same(overlay, k, klocal):
    """Each overlay applied (its DaemonSet afresh; strict field validation, the server's) to both servers: what
    they store differs only by kube-apiserver's defaults."""
    root = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / overlay
    for kc in (k, klocal):
        # afresh: the DaemonSet is what overlays change (deleting the namespace would terminate it)
        kc("delete", "daemonset", "-n", NAMESPACE, "--all", "--ignore-not-found")
        kc("apply", "-k", str(root), "--validate=strict")
    diffs = []
    for a, b in zip(sorted(_applied(klocal, root), key=_key), sorted(_applied(k, root), key=_key), strict=True):
        diffs += [f"{_key(a)}{d}" for d in differences(_comparable(a), _comparable(b))]
    defaults, other = _split(diffs)
    print("\n".join(diffs))
    # kube-apiserver omits an empty list and a false bool the client sent (Go's omitempty: the dev
    # overlay's capabilities.add: [] and hostPID: false); the local server keeps them as sent
    omitted = {"local=[] real=\"<absent>\"", "local=false real=\"<absent>\""}
    assert [d for d in other if d.split(": ", 1)[1] not in omitted] == []


@pytest.mark.xfail(strict=True, reason="the local server's strategic merge patch differs from kube-apiserver's "
                   "when kubectl apply switches overlays: volumes keep their old order, hostPID: false and "
                   "capabilities.add: [] (dropped from the new overlay) stay (REPORT-controlplane.md)")
def test_switching_overlays_by_kubectl_apply_merges_alike(k, klocal):
    overlays = Path(__file__).resolve().parents[2] / "deploy" / "overlays"
    for kc in (k, klocal):
        for overlay in ("dev", "dra"):
            kc("apply", "-k", str(overlays / overlay), "--validate=strict")
    root = overlays / "dra"
    diffs = []
    for a, b in zip(sorted(_applied(klocal, root), key=_key), sorted(_applied(k, root), key=_key), strict=True):
        diffs += [f"{_key(a)}{d}" for d in differences(_comparable(a), _comparable(b))]
    assert _split(diffs)[1] == []


def _key(o: dict) -> str:
    return f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"


def _comparable(o: dict) -> dict:
    out = stored(o)
    out["metadata"].get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
    if not out["metadata"].get("annotations"):
        out["metadata"].pop("annotations", None)
    if o["kind"] in ("DaemonSet", "Namespace"):  # no kubelet, no controllers for these: status is the server's own
        out.pop("status", None)
    return out


# --------------------------------------------------------------------------- render's objects on both servers


def test_rendered_objects_are_stored_alike(cp, local, k, klocal):
    docs = (render("deviceclasses") + render("claim-template", "--set", "min_memory=8Gi")
            + render("claim-template", "--set", "first_available=[A100-4C,L40S-8Q]")
            + render("claim-template", "--set", "passthrough=true", "--set", "name=pt-compare"))
    objs = [d for d in yaml.safe_load_all(docs) if d]
    diffs = []
    for obj in objs:
        obj["metadata"]["name"] += "-cmp"
        text = yaml.safe_dump(obj)
        got = []
        for kc in (klocal, k):
            got.append(json.loads(kc("create", "-f", "-", "-o", "json", stdin=text).stdout))
        diffs += [f"{_key(obj)}{d}" for d in differences(stored(got[0]), stored(got[1]))]
    defaults, other = _split(diffs)
    print("\n".join(diffs))
    # kube-apiserver defaults a firstAvailable subrequest's allocationMode (ExactCount) and count (1)
    # and a template's spec.metadata ({}); the local server stores them as sent (it validates them as
    # defaulted): the same claim either way
    assert all(".firstAvailable[" in d or d.endswith(".spec.metadata: local=\"<absent>\" real={}") for d in defaults)
    assert other == []


# --------------------------------------------------------------------------- doctor, gates as shipped and flipped


# (minor, gates): 1.37's as shipped and flipped, and 1.34's as shipped (its every DRA field of ours dropped)
GATES = [("1.37", {}), ("1.37", {"DRADeviceBindingConditions": False}), ("1.37", {"DRADeviceCompatibilityGroups": True}),
         ("1.34", {})]


def _doctor(kubeconfig: Path) -> tuple[int, dict[str, tuple[str, str]]]:
    p = subprocess.run([*VGPUCTL, "doctor", "--kubeconfig", str(kubeconfig), "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.stdout, p.stderr
    return p.returncode, {f["check"]: (f["status"], f["detail"]) for f in json.loads(p.stdout)}


@pytest.mark.parametrize(("minor", "gates"), GATES, ids=lambda g: g if isinstance(g, str) else
                         ",".join(f"{k}={v}" for k, v in g.items()) or "defaults")
def test_doctor_says_the_same_on_both(minor, gates, tmp_path):
    """``vgpuctl doctor --kubeconfig`` on a fresh kube-apiserver (alone: the doctor reads the API)
    and on the local server, same minor, same gates: the same verdicts, in the same words but for the
    patch version each reports."""
    with RealControlPlane(gates, extra=["--no-scheduler", "--no-controller-manager"], minor=minor) as real, \
            LocalApiServer(version=minor, feature_gates=gates) as mine:
        code_l, local_v = _doctor(mine.kubeconfig(tmp_path / "local.kubeconfig"))
        code_r, real_v = _doctor(real.kubeconfig_path)
    assert {c: s for c, (s, _) in local_v.items()} == {c: s for c, (s, _) in real_v.items()}
    assert {c: d for c, (_, d) in local_v.items() if c != "API server"} == \
        {c: d for c, (_, d) in real_v.items() if c != "API server"}
    assert code_l == code_r


# --------------------------------------------------------------------------- cordon, by device taints


def test_cordon_is_honoured_by_the_real_scheduler(cp, k):
    """``vgpuctl cordon`` of the node's A100 (by device taints where the server keeps them, 1.37; by
    withdrawing its free devices where it does not, 1.34's defaults): the real scheduler leaves a pod
    asking for an A100 vGPU pending; ``uncordon``: it is scheduled there."""
    with short_tmp("cpc") as base:
        node = make_node(base / "n", "default", version=cp.version)
        if cp.get_object("nodes", node.node) is None:
            cp.add(node_for(node.node, cp.version))
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C", "--set", "name=a100-c"))
        with Serving(make_daemon(node, cp, base)):
            gpu = f"{node.node}/2"  # the A100 40GB
            out = subprocess.run([*VGPUCTL, "cordon", gpu, "--kubeconfig", str(cp.kubeconfig_path), "--wait", "30"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
            k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod("cordoned", "a100-c")))
            pending = wait_for(lambda: any(
                c.get("reason") == "Unschedulable" for c in
                (cp.get_object("pods", "cordoned", "default").get("status") or {}).get("conditions") or []),
                "the real scheduler's verdict", 60)
            assert pending and not cp.get_object("pods", "cordoned", "default")["spec"].get("nodeName")
            out = subprocess.run([*VGPUCTL, "uncordon", gpu, "--kubeconfig", str(cp.kubeconfig_path), "--wait", "30"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
            wait_for(lambda: cp.get_object("pods", "cordoned", "default")["spec"].get("nodeName") == node.node,
                     "scheduled after uncordon", 90)
        k("delete", "pod", "cordoned", "--wait=false")


def test_no_execute_cordon_evicts_through_the_real_controller(cp, k):
    """``vgpuctl cordon --effect NoExecute``: upstream's device-taint-eviction controller deletes
    the pod holding the GPU's device (no kubelet here: the pod is left terminating)."""
    if not cp.kept().taints:
        pytest.skip(f"Kubernetes {cp.minor}'s default gates keep no device taints (DRADeviceTaints is off): "
                    "nothing evicts; a cordon withdraws the free devices (test_cordon_is_honoured...)")
    with short_tmp("cpx") as base:
        node = make_node(base / "n", "default", version=cp.version)
        if cp.get_object("nodes", node.node) is None:
            cp.add(node_for(node.node, cp.version))
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=L40S-8Q", "--set", "name=l40s-x"))
        with Serving(make_daemon(node, cp, base)):
            k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod("evicted", "l40s-x")))
            wait_for(lambda: cp.get_object("pods", "evicted", "default")["spec"].get("nodeName"), "scheduled", 90)
            gpu = f"{node.node}/3"  # the L40S
            kc = ["--kubeconfig", str(cp.kubeconfig_path), "--wait", "30"]
            out = subprocess.run([*VGPUCTL, "cordon", gpu, "--effect", "NoExecute", *kc],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
            try:
                seen: list[dict] = []
                wait_for(lambda: evicted(cp, "evicted", seen), "evicted", 60)
                if seen:  # seen terminating (a pod deleted outright is only seen gone)
                    reasons = {c["type"]: c.get("reason") for c in seen[-1]["status"].get("conditions") or []}
                    assert reasons.get("DisruptionTarget") == "DeletionByDeviceTaintManager", reasons
            finally:
                subprocess.run([*VGPUCTL, "uncordon", gpu, *kc], capture_output=True, text=True, timeout=120)


def evicted(cp, name: str, seen: list[dict]) -> bool:
    """The pod is deleted or terminating; a terminating look at it is appended to ``seen``. (A pod
    deleted outright, as a node side that confirms the deletion leaves it, is just gone: an earlier
    form of this wait returned True then, and the test read ``True["status"]``: TypeError.)"""
    p = cp.get_object("pods", name, "default")
    if p is not None and p["metadata"].get("deletionTimestamp"):
        seen.append(p)
    return p is None or bool(p["metadata"].get("deletionTimestamp"))


# --------------------------------------------------------------------------- opaque config over JSON


def test_a_claim_with_an_opaque_config_made_by_our_client_takes_the_agents_status_write(cp):
    """kube-apiserver keeps an opaque config's parameters byte for byte and copies them into the
    allocation; a status write over JSON re-encodes them compactly, so parameters that came with the
    Kubernetes client's default ``", "`` / ``": "`` spacing made every later status write fail (422
    "status.allocation: field cannot be modified once set"): the agent could not confirm a binding
    condition on a claim whose template ``vgpuctl conformance`` had made. Our client sends compact JSON."""
    from kubernetes import client as k8s

    from dra_bridge.apiclient.claims import ApiClaimSource
    from dra_bridge.apiclient.client import connect

    api = connect(str(cp.kubeconfig_path))
    resource = k8s.ResourceV1Api(api)
    opaque = {"driver": DRIVER, "parameters": {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig",
                                                "vgpuType": "T4-2Q"}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "opaque-config", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.kubevirt.io"}}],
                                  "config": [{"requests": ["vgpu"], "opaque": opaque}]}}}
    resource.create_namespaced_resource_claim("default", claim)
    try:
        made = api.sanitize_for_serialization(resource.read_namespaced_resource_claim("opaque-config", "default"))
        made["status"] = {"allocation": {  # as the scheduler writes it: the claim's config copied in
            "devices": {"results": [{"request": "vgpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0",
                                     "bindingConditions": ["vgpu.kubevirt.io/size"],
                                     "bindingFailureConditions": ["vgpu.kubevirt.io/size-refused"]}],
                        "config": [{"source": "FromClaim", "requests": ["vgpu"], "opaque": opaque}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
        resource.replace_namespaced_resource_claim_status("opaque-config", "default", made)
        entry = {"driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0",
                 "conditions": [{"type": "vgpu.kubevirt.io/size", "status": "True", "reason": "SizeConfirmed",
                                 "message": "2 GiB", "lastTransitionTime": "2026-12-07T00:00:00Z"}]}
        assert ApiClaimSource(api).set_device_status("default", "opaque-config", [entry])
        got = resource.read_namespaced_resource_claim("opaque-config", "default").status.devices
        assert [c.type for c in got[0].conditions] == ["vgpu.kubevirt.io/size"]
    finally:
        resource.delete_namespaced_resource_claim("opaque-config", "default")


def test_parameters_first_sent_spaced_make_every_json_status_write_fail_and_the_agent_says_why(cp):
    """The other side of the test above, on kube-apiserver 1.37.2 itself (the local server models it:
    tests/dra_bridge/test_apiserver_opaque_bytes.py): a claim whose opaque parameters were first sent
    with spaces takes no status write over JSON, a merge patch of ``status.devices`` alone included;
    the agent's client names the claim, the cause and the fix in one line."""
    from dra_bridge.apiclient.claims import ApiClaimSource, UnwritableClaimStatus
    from dra_bridge.apiclient.client import connect

    api = connect(str(cp.kubeconfig_path))
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    opaque = {"driver": DRIVER, "parameters": {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig",
                                                "vgpuType": "T4-2Q"}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "spaced-config", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.kubevirt.io"}}],
                                  "config": [{"requests": ["vgpu"], "opaque": opaque}]}}}

    def send(method: str, url: str, obj: dict) -> int:
        """The bytes as ``json.dumps`` spaces them, through the client's own connection pool."""
        m, full, headers, _, _ = api.param_serialize(method, url, header_params={
            "Content-Type": "application/json", "Accept": "application/json"}, auth_settings=["BearerToken"])
        return api.rest_client.pool_manager.request(m, full, headers=headers, body=json.dumps(obj).encode()).status

    assert send("POST", path, claim) == 201
    try:
        made = cp.rest("GET", f"{path}/spaced-config")
        made["status"] = {"allocation": {
            "devices": {"results": [{"request": "vgpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0"}],
                        "config": [{"source": "FromClaim", "requests": ["vgpu"], "opaque": opaque}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
        assert send("PUT", f"{path}/spaced-config/status", made) == 200  # the same bytes: taken
        entry = {"driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0",
                 "conditions": [{"type": "vgpu.kubevirt.io/size", "status": "True", "reason": "SizeConfirmed",
                                 "message": "2 GiB", "lastTransitionTime": "2026-12-07T00:00:00Z"}]}
        with pytest.raises(UnwritableClaimStatus, match="byte for byte"):
            ApiClaimSource(api).set_device_status("default", "spaced-config", [entry])
    finally:
        cp.rest("DELETE", f"{path}/spaced-config")
