"""KubeVirt's own CustomResourceDefinitions on the real control plane (issue #40.2).

``tests/kubevirt/crds/`` is a Go program that prints KubeVirt's CRDs (VirtualMachineInstance,
VirtualMachine, VirtualMachineInstanceMigration, KubeVirt) with KubeVirt's own virt-operator code at
the release its go.mod pins, so the server validates our objects by the schemas virt-operator
installs on a cluster. ``.ci/run`` builds it into ``build/kubevirt/``; :func:`binary` builds it here
when it is missing and Go is installed. Without Go the tests skip, and fail under ``CI=true``, as the
control plane's do (:func:`tests.support.controlplane.unavailable`).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.controlplane import ROOT, go_missing, unavailable

SOURCE = ROOT / "tests" / "kubevirt" / "crds"
BINARY = ROOT / "build" / "kubevirt" / "kubevirt-crds"
KINDS = ("VirtualMachineInstance", "VirtualMachine", "VirtualMachineInstanceMigration", "KubeVirt")


def binary() -> Path:
    """The built program; built now when missing. Skips (fails under CI=true) without Go."""
    if BINARY.exists():
        return BINARY
    if go_missing():
        unavailable("Go is not installed (KubeVirt's CRDs are printed by KubeVirt's own code, built with Go: "
                    "tests/kubevirt/crds)")
    try:
        subprocess.run([str(ROOT / "tests" / "kubevirt" / "build.sh")], check=True)
    except subprocess.CalledProcessError as exc:  # a build failure is a failure, not a skip
        pytest.fail(f"building {SOURCE} failed: {exc}")
    return BINARY


def release() -> str:
    """The KubeVirt release the generator is pinned to (its go.mod's kubevirt.io/kubevirt)."""
    for line in (SOURCE / "go.mod").read_text().splitlines():
        words = line.split()
        if words[:1] == ["require"] and words[1:2] == ["kubevirt.io/kubevirt"]:
            return words[2]
        if words[:1] == ["kubevirt.io/kubevirt"] and len(words) >= 2 and words[1].startswith("v"):
            return words[1]
    raise AssertionError(f"{SOURCE / 'go.mod'} names no kubevirt.io/kubevirt release")


def crds() -> list[dict]:
    """KubeVirt's CRDs as its generator prints them."""
    out = subprocess.run([str(binary())], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def install(cp) -> list[dict]:
    """Create KubeVirt's CRDs on ``cp`` (a RealControlPlane) and wait, by a watch, until each is
    Established (served); the stored CRDs."""
    from kubernetes import watch

    made = [cp.rest("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd) for crd in crds()]
    names = {m["metadata"]["name"] for m in made}
    stored: dict[str, dict] = {}
    api = _apiextensions(cp)
    w = watch.Watch()
    for ev in w.stream(api.list_custom_resource_definition, _preload_content=False, timeout_seconds=120):
        obj = ev["raw_object"]
        if obj["metadata"]["name"] in names and established(obj):
            stored[obj["metadata"]["name"]] = obj
        if set(stored) == names:
            w.stop()
    assert set(stored) == names, f"not established within 120 s: {sorted(names - set(stored))}"
    cp._paths = None  # the new resources are served now: read the discovery again
    return [stored[m["metadata"]["name"]] for m in made]


def _apiextensions(cp):
    from kubernetes import client

    return client.ApiextensionsV1Api(cp.client)


class VirtController(threading.Thread):
    """virt-controller's part in a live migration, played on the real API server: it watches
    VirtualMachineInstanceMigrations and takes each through KubeVirt's phases (Pending, Scheduling,
    Scheduled, PreparingTarget, TargetReady, Running), then Succeeded, or Failed where ``plans`` says
    ``fail:REASON`` for the VMI; the VMI's ``status.migrationState`` follows, as KubeVirt writes it. A
    successful migration deletes the VM's source virt-launcher pod (its GPU is released; no kubelet
    runs here, so the deletion is immediate) and moves the VMI to the target node."""

    PHASES = ("Pending", "Scheduling", "Scheduled", "PreparingTarget", "TargetReady", "Running")

    def __init__(self, cp, plans: dict[str, str], target: str = "node-b"):
        super().__init__(name="virt-controller", daemon=True)
        self.cp, self.plans, self.target = cp, plans, target
        self.done: dict[str, str] = {}  # VMI (ns/name) -> the phase its migration ended in
        self.seen_phases: dict[str, list[str]] = {}
        self.errors: list[BaseException] = []
        self._halt = threading.Event()
        self._watch = None

    def stop(self) -> None:
        self._halt.set()
        if self._watch is not None:
            self._watch.stop()
        self.join(30)

    def run(self) -> None:
        from kubernetes import client, watch

        api = client.CustomObjectsApi(self.cp.client)
        try:
            while not self._halt.is_set():
                self._watch = watch.Watch()
                for ev in self._watch.stream(api.list_cluster_custom_object, "kubevirt.io", "v1",
                                             "virtualmachineinstancemigrations", timeout_seconds=5):
                    if self._halt.is_set():
                        break
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._step(ev["object"])
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            if not self._halt.is_set():  # stopping closes the watch under the stream
                self.errors.append(exc)

    def _step(self, m: dict) -> None:
        """One migration to its end; each phase written on the status subresource."""
        ns, name = m["metadata"]["namespace"], m["metadata"]["name"]
        vmi_name = m["spec"]["vmiName"]
        key = f"{ns}/{vmi_name}"
        if (m.get("status") or {}).get("phase") or key in self.done:
            return
        plan = self.plans.get(key, f"succeed:{self.target}")
        kind, _, arg = plan.partition(":")
        mig_path = f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}"
        vmi_path = f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{vmi_name}"
        uid = m["metadata"]["uid"]
        target = arg if kind == "succeed" and arg else self.target
        for phase in self.PHASES:
            self._status(mig_path, {"phase": phase})
            self.seen_phases.setdefault(key, []).append(phase)
        started, source = _now(), self._vmi_node(vmi_path)
        self._merge(vmi_path, {"status": {"migrationState": {
            "migrationUid": uid, "sourceNode": source, "targetNode": target,
            "startTimestamp": started, "completed": False}}})
        if kind == "fail":
            self._merge(vmi_path, {"status": {"migrationState": {
                "endTimestamp": _now(), "completed": True, "failed": True, "failureReason": arg}}})
            self._status(mig_path, {"phase": "Failed", "conditions": [
                {"type": "Failed", "status": "True", "reason": "MigrationFailed", "message": arg}]})
            self.done[key] = "Failed"
            return
        for p in self.cp.objects("pods", ns):
            if (p["metadata"].get("labels") or {}).get("vm.kubevirt.io/name") == vmi_name:
                self.cp.rest("DELETE", self.cp.path("pods", p["metadata"]["name"], ns) + "?gracePeriodSeconds=0")
        self._merge(vmi_path, {"status": {"nodeName": target, "migrationState": {
            "endTimestamp": _now(), "completed": True, "targetNodeDomainDetected": True}}})
        self._status(mig_path, {"phase": "Succeeded", "migrationState": {
            "migrationUid": uid, "sourceNode": source, "targetNode": target, "completed": True}})
        self.done[key] = "Succeeded"

    def _vmi_node(self, vmi_path: str) -> str:
        return (self.cp.rest("GET", vmi_path).get("status") or {}).get("nodeName", "")

    def _merge(self, path: str, body: dict) -> dict:
        return _patch(self.cp, path, body)

    def _status(self, mig_path: str, status: dict) -> dict:
        return _patch(self.cp, mig_path + "/status", {"status": status})


def _patch(cp, path: str, body: dict) -> dict:
    """A JSON merge patch with strict field validation: a field KubeVirt's schema lacks is refused."""
    import json

    from kubernetes.client.exceptions import ApiException

    m, url, headers, data, _ = cp.client.param_serialize(
        "PATCH", path + "?fieldValidation=Strict",
        header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"])
    r = cp.client.call_api(m, url, headers, data)
    payload = r.read()
    if not 200 <= r.status < 300:
        raise ApiException(status=r.status, reason=r.reason, body=payload)
    return json.loads(payload)


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
