"""``vgpuctl doctor`` against the local API server of each version, gates as shipped and flipped
(issue #14): the DRA fields it reports as kept are the ones the server really keeps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kubernetes import client

from dra_bridge.api.names import LABEL_CONFIG, LABEL_CONFIG_STATE, PASSTHROUGH_CLASS, VGPU_CLASS
from dra_bridge.apiclient.clusterfacts import ClusterFacts, KubeVirtFacts, gather
from dra_bridge.doctor.checks import diagnose, exit_code
from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.apiserver.resources import ResourceType

DRIVER = "vgpu.kubevirt.io"
KUBEVIRT = ResourceType("kubevirt.io", "v1", "kubevirts", "KubeVirt", namespaced=True, singular="kubevirt")


def by_check(findings) -> dict[str, object]:
    return {f.check: f for f in findings}


@pytest.mark.parametrize("version,gates,counters,groups,shape", [
    ("1.34", {}, "FAIL", "PASS", "safe shape"),   # DRAPartitionableDevices alpha: counters dropped
    ("1.35", {}, "FAIL", "PASS", "safe shape"),
    ("1.35", {"DRAPartitionableDevices": True}, "PASS", "PASS", "one vGPU size per GPU"),  # binding: alpha, off
    ("1.35", {"DRAPartitionableDevices": True, "DRADeviceBindingConditions": True}, "PASS", "PASS",
     "every vGPU size of an empty GPU"),
    ("1.36", {}, "PASS", "PASS", "every vGPU size of an empty GPU"),   # beta, on by default
    ("1.36", {"DRADeviceBindingConditions": False}, "PASS", "PASS", "one vGPU size per GPU"),
    ("1.36", {"DRAPartitionableDevices": False}, "FAIL", "PASS", "safe shape"),
    ("1.37", {}, "PASS", "PASS", "every vGPU size of an empty GPU"),  # groups dropped (alpha), binding kept
    ("1.37", {"DRADeviceBindingConditions": False}, "PASS", "WARN", "one vGPU size per GPU"),
    # kept by the server; the scheduler needs the gate too (it cannot be probed): said, as a warning
    ("1.37", {"DRADeviceCompatibilityGroups": True}, "PASS", "WARN", "sizes apart by compatibility groups"),
])
def test_fields_kept_are_found_by_effect(version, gates, counters, groups, shape):
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        facts = gather(srv.api_client(), DRIVER)
        found = by_check(diagnose(facts))
        assert facts.version == tuple(int(x) for x in version.split("."))
        assert found["shared counters"].status == counters
        assert found["compatibility groups"].status == groups
        assert shape in found["published shape"].detail
        if counters == "FAIL":
            assert "DRAPartitionableDevices" in found["shared counters"].fix
        if gates.get("DRADeviceCompatibilityGroups"):
            assert "kube-scheduler" in found["compatibility groups"].fix
        assert srv.writes == [], "the probe is a dry run"
        assert not client.ResourceV1Api(srv.api_client()).list_resource_slice().items


def test_nodes_classes_and_kubevirt_are_judged():
    with LocalApiServer(version="1.36", extra_resources=[KUBEVIRT]) as srv:
        api = srv.api_client()
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        sel = [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
        for name in (VGPU_CLASS, PASSTHROUGH_CLASS):
            res.create_device_class({"metadata": {"name": name}, "spec": {"selectors": sel}})
        for name, state in (("gpu-a", "success"), ("gpu-b", "pending"), ("cpu-only", None)):
            labels = {LABEL_CONFIG: "default", LABEL_CONFIG_STATE: state} if state else {}
            core.create_node({"metadata": {"name": name, "labels": labels}})
        res.create_resource_slice({"metadata": {"name": "gpu-a-0"}, "spec": {
            "driver": DRIVER, "nodeName": "gpu-a", "pool": {"name": "gpu-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-passthrough"}]}})
        client.CustomObjectsApi(api).create_namespaced_custom_object("kubevirt.io", "v1", "kubevirt", "kubevirts", {
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"developerConfiguration": {"featureGates": ["GPUsWithDRA"]},
                                       "mediatedDevicesConfiguration": {"mediatedDeviceTypes": ["nvidia-222"]}}}})
        found = by_check(diagnose(gather(api, DRIVER)))
    assert found["DeviceClasses"].status == "PASS"
    assert found["node gpu-a"].status == "PASS" and "1 slices, 1 devices" in found["node gpu-a"].detail
    assert found["node gpu-b"].status == "WARN"  # pending, and it publishes nothing yet
    assert "node cpu-only" not in found
    assert found["KubeVirt"].status == "PASS"
    assert found["KubeVirt DRA gates"].status == "WARN" and "HostDevicesWithDRA" in found["KubeVirt DRA gates"].detail
    assert found["KubeVirt mdev management"].status == "FAIL"
    assert "enabled: false" in found["KubeVirt mdev management"].fix


def test_a_bare_cluster_fails_on_classes_and_warns_on_the_rest():
    facts = ClusterFacts(driver=DRIVER, version=(1, 36), git_version="v1.36.0", kubevirt=KubeVirtFacts())
    facts.kept.counters = facts.kept.binding_conditions = True
    findings = diagnose(facts)
    found = by_check(findings)
    assert found["DeviceClasses"].status == "FAIL" and "kubectl apply -k deploy/overlays/dra" in found["DeviceClasses"].fix
    assert found["KubeVirt"].status == "WARN" and found["GPU nodes"].status == "WARN"
    assert exit_code(findings) == 1


def test_the_command(tmp_path):
    with LocalApiServer(version="1.35", feature_gates={}) as srv:
        kc = srv.kubeconfig(tmp_path / "kc")
        out = subprocess.run([sys.executable, "-m", "vgpuctl.main", "doctor", "--kubeconfig", str(kc)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out.stderr
        lines = out.stdout.splitlines()
        assert any(line.startswith("FAIL") and "shared counters" in line for line in lines)
        assert any("fix: enable the DRAPartitionableDevices" in line for line in lines)
        assert lines[-1].endswith("failed") and out.stderr == ""
        js = subprocess.run([sys.executable, "-m", "vgpuctl.main", "doctor", "--kubeconfig", str(kc), "--json"],
                            capture_output=True, text=True, timeout=120)
        assert {f["check"]: f["status"] for f in json.loads(js.stdout)}["shared counters"] == "FAIL"


# --------------------------------------------------------------------------- kubernetes#140434

@pytest.mark.parametrize("git_version,affected", [
    ("v1.34.13", False),  # counter sets kept per slice then
    ("v1.35.0", True), ("v1.35.10", True),  # the newest 1.35 patch on the module proxy is still affected
    ("v1.36.0", True), ("v1.36.3", True), ("v1.36.2-gke.1200", True), ("v1.36.3+k3s1", True),
    ("v1.36.4", False), ("v1.36.6", False), ("v1.37.0", False), ("v1.37.2", False),
    (None, False), ("unknown", False),
])
def test_the_releases_whose_allocator_keys_counters_by_pool_name(git_version, affected):
    from dra_bridge.api.compat import counters_keyed_by_pool_name

    assert counters_keyed_by_pool_name(git_version) is affected


def _slice(driver: str, pool: str, *, counters: bool) -> dict:
    spec: dict = {"driver": driver, "nodeName": "node-a", "pool": {"name": pool, "generation": 1,
                                                                      "resourceSliceCount": 1}}
    if counters:
        spec["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    else:
        spec["devices"] = [{"name": "gpu-0"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{driver}-{pool}-" + ("counters" if counters else "devices")}, "spec": spec}


def test_other_drivers_pools_that_share_a_pool_name_with_ours():
    from dra_bridge.apiclient.clusterfacts import pool_name_clashes

    ours = [_slice(DRIVER, "node-a", counters=True)]
    every = ours + [_slice("gpu.nvidia.com", "node-a", counters=True),   # the clash
                    _slice("other.example.com", "node-a", counters=False),  # no counters: nothing shared
                    _slice("net.example.com", "node-b", counters=True)]     # another pool name
    assert pool_name_clashes(ours, every, DRIVER) == ["gpu.nvidia.com/node-a"]


@pytest.mark.parametrize("git_version,clashes,status", [
    ("v1.36.2", ["gpu.nvidia.com/node-a"], "FAIL"),
    ("v1.36.2", [], "WARN"),
    ("v1.36.4", ["gpu.nvidia.com/node-a"], None),   # fixed: nothing to say
    ("v1.37.0", [], None),
])
def test_doctor_names_the_pool_name_counter_bug_and_its_fixed_releases(git_version, clashes, status):
    facts = ClusterFacts(driver=DRIVER, version=(1, 36), git_version=git_version, kubevirt=KubeVirtFacts(),
                         pool_name_clashes=clashes)
    facts.kept.counters = facts.kept.binding_conditions = True
    found = by_check(diagnose(facts)).get("pool names")
    if status is None:
        assert found is None
        return
    assert found.status == status
    assert "kubernetes#140434" in found.fix and "1.36.4 or 1.37.0" in found.fix
    if clashes:
        assert "gpu.nvidia.com/node-a" in found.detail
    facts.kept.counters = False  # a server without counters shares none
    assert "pool names" not in by_check(diagnose(facts))


def test_the_command_finds_a_clash_on_an_affected_server(tmp_path):
    """The whole command against a server that says it is 1.36.2: another driver's pool named as ours."""
    with LocalApiServer(version="1.36.2") as srv:
        kc = srv.kubeconfig(tmp_path / "kc")
        api = client.ResourceV1Api(srv.api_client())
        for s in (_slice(DRIVER, "node-a", counters=True), _slice("gpu.nvidia.com", "node-a", counters=True)):
            api.create_resource_slice(s)
        js = subprocess.run([sys.executable, "-m", "vgpuctl.main", "doctor", "--kubeconfig", str(kc), "-o", "json"],
                            capture_output=True, text=True, timeout=120)
        found = {f["check"]: f for f in json.loads(js.stdout)}["pool names"]
        assert found["status"] == "FAIL" and "gpu.nvidia.com/node-a" in found["detail"], found
        assert js.returncode == 1
