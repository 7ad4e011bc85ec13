"""The cluster the conformance checks run on, through its API only (:class:`KubeBackend`).

In a namespace of its own it creates a ConfigMap with the health check, ResourceClaimTemplates and
pods, waits with timeouts, reads pod status, claims, slices and logs, and deletes all of it at the
end. Against a real cluster (``--kubeconfig``) that is all; the simulated cluster also passes a
``host_problems`` callback that compares what a workload got with the simulated host itself.
The API calls themselves are :class:`dra_bridge.apiclient.workloads.WorkloadApi`'s.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dra_bridge.api.attributes import (
    ATTR_MIG_BACKED,
    ATTR_PLACEMENT_SIZE,
    ATTR_PLACEMENT_START,
    ATTR_PROFILE,
    ATTR_TYPE,
)
from dra_bridge.api.names import DEFAULT_DRIVER, PASSTHROUGH_CLASS, VGPU_CLASS
from dra_bridge.apiclient.errors import api_exception, brief
from dra_bridge.apiclient.workloads import WorkloadApi
from dra_bridge.conformance import DEFAULT_IMAGE, healthcheck
from dra_bridge.conformance.report import CheckFailed
from dra_bridge.scheduling import capacity
from dra_bridge.scheduling.objects import dev_attr, dev_gpu, devices_by_key
from dra_bridge.scheduling.selectors import Selectors

if TYPE_CHECKING:
    from dra_bridge.apiclient.objects import ApiClient

MANAGED = {"app.kubernetes.io/managed-by": "vgpuctl-conformance"}
CONFIGMAP = "vgpuctl-healthcheck"
SCRIPT_DIR = "/opt/vgpuctl"
DONE = "vgpuctl-conformance: health check finished"


def placed_slots(dev: dict, driver: str) -> tuple[int, int] | None:
    """(first slot, slots) of a vGPU device of a GPU in mixed-size mode; None for any other device."""
    start, size = dev_attr(dev, ATTR_PLACEMENT_START, driver), dev_attr(dev, ATTR_PLACEMENT_SIZE, driver)
    if dev_attr(dev, ATTR_MIG_BACKED, driver) is True or not isinstance(start, int) or not isinstance(size, int):
        return None
    return start, size


def random_suffix(n: int = 5) -> str:
    """Lower-case letters and digits, for names that must not collide with an earlier run's."""
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


# =========================================================================== what a workload got


@dataclass
class Run:
    name: str
    template: str
    node: str | None = None  # requested node
    phase: str = "Pending"  # Running | Pending | Failed | Timeout | Deleted
    reason: str | None = None  # the scheduler's (or kubelet's) words when not Running
    bound_node: str | None = None
    claims: list[str] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)  # {claim, device, pool, driver, gpu, kind, profile, counter_set,
    #                                                    mig_backed, memory_slices, slots}
    health: healthcheck.HealthResult | None = None
    restarts: int = 0

    def line(self) -> str:
        if self.phase != "Running":
            return f"{self.name}: {self.phase}" + (f" ({self.reason})" if self.reason else "")
        devs = ", ".join(f"{d['device']} on {d['gpu']}" for d in self.devices)
        return f"{self.name}: Running on {self.bound_node}: {devs}; health {self.health.result if self.health else '-'}"


# =========================================================================== the cluster, through its API


class KubeBackend:
    """A cluster through its API (official client), in a namespace of its own.

    ``host_problems(namespace, pod) -> list[str] | None`` may be given when the host can be looked
    at (the simulated cluster); a real cluster is judged from the API and the workloads only.
    """

    def __init__(self, api_client: ApiClient, *, namespace: str | None = None, image: str = DEFAULT_IMAGE,
                 driver: str = DEFAULT_DRIVER, vgpu_class: str | None = None, passthrough_class: str | None = None,
                 timeout: float = 300.0, settle: float = 10.0, poll: float = 0.5, selectors: Selectors | None = None,
                 host_problems: Callable[[str, str], list[str] | None] | None = None, label: str = "cluster") -> None:
        self.api_client = api_client
        self.api = WorkloadApi(api_client)
        self.namespace = namespace or f"vgpuctl-conformance-{random_suffix()}"
        self.image = image
        self.driver = driver
        self.vgpu_class = vgpu_class or VGPU_CLASS
        self.passthrough_class = passthrough_class or PASSTHROUGH_CLASS
        self.timeout = timeout
        self.settle = settle
        self.poll = poll
        self.selectors = selectors
        self.host_problems = host_problems
        self.label = label
        self.runs: list[Run] = []
        self.created_namespace = False

    # ------------------------------------------------------------ setup / cleanup
    def setup(self) -> None:
        missing = [cls for cls in (self.vgpu_class, self.passthrough_class) if not self.api.device_class_exists(cls)]
        if missing:
            raise CheckFailed(f"DeviceClass {', '.join(missing)} not found: install vgpuctl's DeviceClasses "
                              f"(deploy/base/deviceclasses.yaml) or name yours with --vgpu-class/--passthrough-class")
        self.api.create_namespace(self.namespace, MANAGED)
        self.created_namespace = True
        self.api.create_config_map(self.namespace, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "labels": dict(MANAGED)},
            "data": {"healthcheck.sh": healthcheck.SCRIPT}})

    def cleanup(self) -> list[str]:
        """Delete everything this run made (pods first, then templates, the ConfigMap, the namespace);
        returns what could not be deleted in time. (What is already gone is not a problem.)"""
        problems: list[str] = []
        if not self.created_namespace:
            return problems
        for r in list(self.runs):
            try:
                self.stop(r, wait=False)
            except api_exception() as exc:
                problems.append(f"pod {r.name}: {exc.status} {exc.reason}")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if not self.api.pods(self.namespace) and not self.api.claims(self.namespace):
                break
            time.sleep(self.poll)
        else:
            problems.append(f"namespace {self.namespace}: pods or claims still present after {self.timeout}s")
        for delete in (lambda: self.api.delete_claim_templates(self.namespace),
                       lambda: self.api.delete_config_map(CONFIGMAP, self.namespace)):
            try:
                delete()
            except api_exception() as exc:
                problems.append(f"{exc.status} {exc.reason}")
        try:
            self.api.delete_namespace(self.namespace)
        except api_exception() as exc:
            problems.append(f"namespace {self.namespace}: {exc.status} {exc.reason}")
        self.created_namespace = False
        return problems

    # ------------------------------------------------------------ reading
    def slices(self) -> list[dict]:
        return self.api.slices()

    def claims(self) -> list[dict]:
        return self.api.all_claims()

    def capacity(self) -> capacity.CapacityReport:
        return capacity.compute(self.slices(), self.claims(), driver=self.driver, selectors=self.selectors)

    def slice_devices(self) -> dict[tuple[str, str, str], dict]:
        return devices_by_key(self.slices())

    # ------------------------------------------------------------ objects
    def template(self, name: str, device_class: str, selectors: list[str], request: str = "gpu",
                 vgpu_type: str | None = None) -> str:
        """``vgpu_type``: the type a size slot becomes (the claim's opaque VgpuConfig for this driver)."""
        devices: dict[str, Any] = {"requests": [{"name": request, "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": e}} for e in selectors]}}]}
        if vgpu_type:
            devices["config"] = [{"requests": [request], "opaque": {"driver": self.driver, "parameters": {
                "apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": vgpu_type}}}]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": self.namespace, "labels": dict(MANAGED)},
                "spec": {"spec": {"devices": devices}}}
        self.api.create_claim_template(self.namespace, body)
        return name

    def node_allocatable(self, node: str) -> dict[str, str]:
        return self.api.node_allocatable(node)

    def extended_resource_classes(self) -> list[dict]:
        """DeviceClasses that map an extended resource name (KEP-5004 ``extendedResourceName``)."""
        return [c for c in self.api.device_classes() if (c.get("spec") or {}).get("extendedResourceName")]

    def pod_body(self, name: str, template: str | None, node: str | None, *, resource: str | None = None) -> dict:
        """A workload pod: the claim from ``template``, or (``resource``) one of an extended resource
        in its limits, as KAR-0004's pods ask (``nvidia.com/GRID_T4-1Q: 1``), with no claim of its own."""
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}] if template else [],
            "volumes": [{"name": "healthcheck", "configMap": {"name": CONFIGMAP, "defaultMode": 0o555}}],
            "containers": [{
                "name": "check", "image": self.image,
                "command": ["sh", "-c", f"sh {SCRIPT_DIR}/healthcheck.sh; echo '{DONE}'; exec sleep 86400"],
                # a pod with no claim names none (kube-apiserver refuses a claim the pod does not have)
                "resources": {"limits": {resource: "1"}} if resource else {"claims": [{"name": "gpu"}]} if template else {},
                "volumeMounts": [{"name": "healthcheck", "mountPath": SCRIPT_DIR, "readOnly": True}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
        if node:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": dict(MANAGED)}, "spec": spec}

    # ------------------------------------------------------------ workloads
    def create(self, name: str, template: str | None, node: str | None = None, *, resource: str | None = None) -> Run:
        self.api.create_pod(self.namespace, self.pod_body(name, template, node, resource=resource))
        r = Run(name=name, template=template or resource or "", node=node)
        self.runs.append(r)
        return r

    def start(self, name: str, template: str | None, node: str | None = None, *, expect: str = "Running",
              resource: str | None = None) -> Run:
        return self.wait(self.create(name, template, node, resource=resource), expect=expect)

    def _events(self, pod: str) -> list[Any]:
        try:
            return self.api.events_of(pod, self.namespace)
        except Exception:  # events are a hint only
            return []

    def refresh(self, r: Run) -> Run:
        pod = self.api.read_pod(r.name, self.namespace)
        if pod is None:
            r.phase = "Deleted"
            return r
        status = pod.get("status") or {}
        r.bound_node = (pod.get("spec") or {}).get("nodeName")
        r.claims = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or []
                    if s.get("resourceClaimName")]
        ext = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if ext:  # the claim the scheduler made for the pod's extended resources (KEP-5004)
            r.claims.append(ext)
        r.restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
        phase = status.get("phase") or "Pending"
        if phase == "Running":
            r.phase, r.reason = "Running", None
        elif phase in ("Failed", "Succeeded"):
            r.phase, r.reason = "Failed", status.get("message") or status.get("reason") or phase
        else:
            r.phase = "Pending"
            cond = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
            if cond and cond.get("status") == "False":
                r.reason = cond.get("message") or cond.get("reason")
            elif r.bound_node:
                bad = [e for e in self._events(r.name) if e.get("reason") in ("FailedPrepareDynamicResources", "Failed")]
                r.reason = bad[-1].get("message") if bad else None
                if bad:
                    r.phase = "Failed"
        if r.phase == "Running" and (not r.devices or {d["claim"] for d in r.devices} != set(r.claims)):
            r.devices = self._devices(r.claims)
        return r

    def _devices(self, claim_names: list[str]) -> list[dict]:
        index = None
        out = []
        for cname in claim_names:
            claim = self.api.read_claim(cname, self.namespace)
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            for res in results:
                if index is None:
                    index = self.slice_devices()
                dev = index.get((res["driver"], res["pool"], res["device"]), {})
                out.append({"claim": cname, "request": res.get("request"), "driver": res["driver"], "pool": res["pool"],
                            "device": res["device"], "gpu": dev_gpu(dev), "kind": dev_attr(dev, ATTR_TYPE, res["driver"]),
                            "profile": dev_attr(dev, ATTR_PROFILE, res["driver"]), "node": dev.get("_node"),
                            "counter_set": (dev.get("consumesCounters") or [{}])[0].get("counterSet"),
                            "mig_backed": dev_attr(dev, ATTR_MIG_BACKED, res["driver"]) is True,
                            "memory_slices": sorted(k for c in dev.get("consumesCounters") or []
                                                    for k in c.get("counters") or {} if k.startswith("memory-slice-")),
                            "slots": placed_slots(dev, res["driver"])})
        return out

    def wait(self, r: Run, *, expect: str = "Running") -> Run:
        """Until the pod runs and its health check reported (``expect="Running"``), the scheduler bound
        it with its claims allocated (``expect="Scheduled"``; running counts too), or the scheduler
        declared it unschedulable (``expect="Pending"``; then it is watched for ``settle`` seconds to
        stay so). A timeout leaves ``phase="Timeout"``."""
        deadline = time.monotonic() + self.timeout
        unread: str | None = None  # why the running pod's health check was not read yet
        while True:
            self.refresh(r)
            if r.phase == "Running" and expect == "Scheduled" and r.devices:
                return r
            if r.phase == "Running":
                unread = self._read_health(r)
                if unread is None:
                    return r
            elif r.phase == "Failed":
                return r
            elif expect == "Scheduled" and r.bound_node and r.claims:
                r.devices = self._devices(r.claims)  # the scheduler's allocation, written before the bind
                if r.devices:
                    return r
            elif r.phase == "Pending" and r.reason and not r.bound_node and expect in ("Pending", "Scheduled"):
                return self.confirm_pending(r) if expect == "Pending" else r
            if time.monotonic() > deadline:
                r.reason = (self._unread(r, unread) if r.phase == "Running" and unread else
                            f"not {expect} after {self.timeout:.0f}s" + (f" (last: {r.reason})" if r.reason else "")
                            + f"; {self._hint(r)}")
                r.phase = "Timeout"
                return r
            time.sleep(self.poll)

    def _unread(self, r: Run, why: str) -> str:
        """A pod that runs but whose log gave no health check result: the log is what is missing."""
        logs = f"kubectl -n {self.namespace} logs {r.name}"
        return (f"Running on node {r.bound_node}, but no health check result in its log after {self.timeout:.0f}s "
                f"({why}): the API server reads pod logs from the node's kubelet; check that it serves them "
                f"({logs})")

    def _hint(self, r: Run) -> str:
        """Where to look for a workload that timed out, from how far it got."""
        describe = f"kubectl -n {self.namespace} describe pod {r.name}"
        if not r.bound_node and not r.reason:
            return (f"no scheduler placed it or said why (no PodScheduled condition): check that kube-scheduler "
                    f"runs, with DynamicResourceAllocation enabled ({describe})")
        if r.bound_node:
            return (f"bound to node {r.bound_node} but not running: check its kubelet and the vgpuctl agent there "
                    f"({describe})")
        return f"{describe} says more"

    def confirm_pending(self, r: Run) -> Run:
        deadline = time.monotonic() + self.settle
        while time.monotonic() < deadline:
            time.sleep(self.poll)
            self.refresh(r)
            if r.phase != "Pending" or r.bound_node:
                return r
        return r

    def _read_health(self, r: Run) -> str | None:
        """Read the pod's health check from its log: ``None`` once read, else why not (one line)."""
        try:
            text = self.api.pod_log(r.name, self.namespace)
        except Exception as exc:  # noqa: BLE001 - not served (yet): said if it stays so
            return f"reading it failed: {' '.join(brief(exc).split()) or type(exc).__name__}"
        if "RESULT:" not in text:
            return "the log has no RESULT line yet" if text.strip() else "the log is empty"
        r.health = healthcheck.parse(text)
        return None

    def stop(self, r: Run, *, wait: bool = True) -> None:
        """Delete the workload's pod (already gone is fine); with ``wait``, until it and its claims are gone.
        Gracefully (its 1 s): the kubelet unprepares the claims before the pod goes, and only then are
        they deallocated; a forced delete lets the scheduler give a device to the next claim while
        the node still holds it for the last one, whose prepare then fails until the kubelet catches up."""
        self.api.delete_pod(r.name, self.namespace)
        if wait:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                pods = [p for p in self.api.pods(self.namespace) if p["metadata"]["name"] == r.name]
                claims = [c for c in self.api.claims(self.namespace) if c["metadata"]["name"] in r.claims]
                if not pods and not claims:
                    break
                time.sleep(self.poll)
            else:
                raise CheckFailed(f"pod {r.name} or its claims still present {self.timeout:.0f}s after deletion")
        r.phase = "Deleted"
        if r in self.runs:
            self.runs.remove(r)

    def host(self, r: Run) -> list[str] | None:
        return self.host_problems(self.namespace, r.name) if self.host_problems else None
