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
