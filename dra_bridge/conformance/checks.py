"""``vgpuctl conformance``: the automated tests KAR-0003 and KAR-0004 propose, as five checks.

1. One physical GPU is exposed as several allocatable logical GPUs.
2. Several workloads using one ResourceClaimTemplate for logical GPUs all land on that GPU's node
   and run on the same physical GPU.
3. Asking for one logical GPU more than the GPU holds is blocked: the extra workload stays pending
   with the scheduler's reason, and nothing already running is disturbed.
4. Workloads requesting vGPUs and workloads requesting physical devices (a whole GPU through vfio)
   through the same DRA mechanism are allocated, isolated (distinct devices, distinct IOMMU groups)
   and accounted (against the same per-GPU counters) with identical semantics.
5. Every workload runs the shipped accelerator health check (:mod:`dra_bridge.conformance.healthcheck`), which
   reports Pass, Fail, or Unknown for an accelerator it does not recognise (not a failure).

The checks talk to a cluster only through its API (:class:`KubeBackend`): in their own namespace
they create a ConfigMap with the health check, ResourceClaimTemplates and pods, wait with
timeouts, read pod status, claims, slices and logs, and delete all of it at the end. Against a
real cluster (``--kubeconfig``) that is all; by default the same code runs against the simulated
cluster (:class:`~dra_bridge.sim.cluster.SimCluster` with its :class:`~dra_bridge.sim.cluster.ControlPlane`),
where the checks also compare what the workloads got with the simulated host itself.

The physical GPU a workload runs on is judged twice: from the ResourceSlice (the device's
``parentPciBusID`` / ``pciBusID``) and from inside the workload (the health check reports the PCI
address of the GPU behind every vfio group it was given); they must agree.
"""

from __future__ import annotations

import logging
import random
import string
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dra_bridge.scheduling import capacity

from dra_bridge.conformance import healthcheck
from dra_bridge.kube.objects import raw
from dra_bridge.scheduling.objects import dev_attr, dev_gpu, devices_by_key
from dra_bridge.kubeletplugin.paths import DEFAULT_DRIVER

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
MANAGED = {"app.kubernetes.io/managed-by": "vgpuctl-conformance"}
CONFIGMAP = "vgpuctl-healthcheck"
SCRIPT_DIR = "/opt/vgpuctl"
DONE = "vgpuctl-conformance: health check finished"

TITLES = {
    1: "One physical GPU is exposed as several allocatable logical GPUs",
    2: "Workloads from one ResourceClaimTemplate land on that GPU's node and run on the same physical GPU",
    3: "One logical GPU more than the GPU holds is blocked; nothing running is disturbed",
    4: "vGPU and whole-GPU (vfio) workloads: allocated, isolated and accounted with identical semantics",
    5: "Every workload runs the accelerator health check: Pass, Fail or Unknown (Unknown is not a failure)",
}


class CheckFailed(Exception):
    """A check's property does not hold; the message says which evidence contradicts it."""


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
    devices: list[dict] = field(default_factory=list)  # {claim, device, pool, driver, gpu, kind, profile, counter_set}
    health: healthcheck.HealthResult | None = None
    restarts: int = 0

    def line(self) -> str:
        if self.phase != "Running":
            return f"{self.name}: {self.phase}" + (f" ({self.reason})" if self.reason else "")
        devs = ", ".join(f"{d['device']} on {d['gpu']}" for d in self.devices)
        return f"{self.name}: Running on {self.bound_node}: {devs}; health {self.health.result if self.health else '-'}"


def _rand(n: int = 5) -> str:
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def _cel(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# =========================================================================== the cluster, through its API


class KubeBackend:
    """A cluster through its API (official client), in a namespace of its own.

    ``host_problems(namespace, pod) -> list[str] | None`` may be given when the host can be looked
    at (the simulated cluster); a real cluster is judged from the API and the workloads only.
    """

    def __init__(self, api_client, *, namespace: str | None = None, image: str = DEFAULT_IMAGE,
                 driver: str = DEFAULT_DRIVER, vgpu_class: str | None = None, passthrough_class: str | None = None,
                 timeout: float = 300.0, settle: float = 10.0, poll: float = 0.5, selectors=None,
                 host_problems: Callable[[str, str], list[str] | None] | None = None, label: str = "cluster"):
        from kubernetes import client

        from kubevirt_templates.names import PASSTHROUGH_CLASS, VGPU_CLASS

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.namespace = namespace or f"vgpuctl-conformance-{_rand()}"
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

    def _san(self, obj) -> dict:
        return self.api_client.sanitize_for_serialization(obj)

    # ------------------------------------------------------------ setup / cleanup
    def setup(self) -> None:
        from kubernetes.client.exceptions import ApiException

        missing = []
        for cls in (self.vgpu_class, self.passthrough_class):
            try:
                self.resource.read_device_class(cls)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                missing.append(cls)
        if missing:
            raise CheckFailed(f"DeviceClass {', '.join(missing)} not found: install vgpuctl's DeviceClasses "
                              f"(deploy/base/deviceclasses.yaml) or name yours with --vgpu-class/--passthrough-class")
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": self.namespace, "labels": dict(MANAGED)}})
        self.created_namespace = True
        self.core.create_namespaced_config_map(self.namespace, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "labels": dict(MANAGED)},
            "data": {"healthcheck.sh": healthcheck.SCRIPT}})

    def cleanup(self) -> list[str]:
        """Delete everything this run made (pods first, then templates, the ConfigMap, the namespace);
        returns what could not be deleted in time."""
        from kubernetes.client.exceptions import ApiException

        problems = []
        if not self.created_namespace:
            return problems
        for r in list(self.runs):
            try:
                self.stop(r, wait=False)
            except ApiException as exc:
                if exc.status != 404:
                    problems.append(f"pod {r.name}: {exc.status} {exc.reason}")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            pods = raw(self.core.list_namespaced_pod, self.namespace)["items"]
            claims = raw(self.resource.list_namespaced_resource_claim, self.namespace)["items"]
            if not pods and not claims:
                break
            time.sleep(self.poll)
        else:
            problems.append(f"namespace {self.namespace}: pods or claims still present after {self.timeout}s")
        for fn, name in ((self.resource.delete_collection_namespaced_resource_claim_template, None),
                         (self.core.delete_namespaced_config_map, CONFIGMAP)):
            try:
                fn(name, self.namespace) if name else fn(self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    problems.append(f"{exc.status} {exc.reason}")
        try:
            self.core.delete_namespace(self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                problems.append(f"namespace {self.namespace}: {exc.status} {exc.reason}")
        self.created_namespace = False
        return problems

    # ------------------------------------------------------------ reading
    def slices(self) -> list[dict]:
        return raw(self.resource.list_resource_slice)["items"]

    def claims(self) -> list[dict]:
        return raw(self.resource.list_resource_claim_for_all_namespaces)["items"]

    def capacity(self) -> capacity.CapacityReport:
        return capacity.compute(self.slices(), self.claims(), driver=self.driver, selectors=self.selectors)

    def slice_devices(self) -> dict[tuple[str, str, str], dict]:
        return devices_by_key(self.slices())

    # ------------------------------------------------------------ objects
    def template(self, name: str, device_class: str, selectors: list[str], request: str = "gpu") -> str:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": self.namespace, "labels": dict(MANAGED)},
                "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": {
                    "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1,
                    "selectors": [{"cel": {"expression": e}} for e in selectors]}}]}}}}
        self.resource.create_namespaced_resource_claim_template(self.namespace, body)
        return name

    def pod_body(self, name: str, template: str, node: str | None) -> dict:
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "volumes": [{"name": "healthcheck", "configMap": {"name": CONFIGMAP, "defaultMode": 0o555}}],
            "containers": [{
                "name": "check", "image": self.image,
                "command": ["sh", "-c", f"sh {SCRIPT_DIR}/healthcheck.sh; echo '{DONE}'; exec sleep 86400"],
                "resources": {"claims": [{"name": "gpu"}]},
                "volumeMounts": [{"name": "healthcheck", "mountPath": SCRIPT_DIR, "readOnly": True}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
        if node:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": dict(MANAGED)}, "spec": spec}

    # ------------------------------------------------------------ workloads
    def create(self, name: str, template: str, node: str | None = None) -> Run:
        self.core.create_namespaced_pod(self.namespace, self.pod_body(name, template, node))
        r = Run(name=name, template=template, node=node)
        self.runs.append(r)
        return r

    def start(self, name: str, template: str, node: str | None = None, *, expect: str = "Running") -> Run:
        return self.wait(self.create(name, template, node), expect=expect)

    def _events(self, pod: str) -> list[Any]:
        try:
            return raw(self.core.list_namespaced_event, self.namespace,
                       field_selector=f"involvedObject.name={pod}")["items"]
        except Exception:  # events are a hint only
            return []

    def refresh(self, r: Run) -> Run:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = raw(self.core.read_namespaced_pod, r.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                r.phase = "Deleted"
                return r
            raise
        status = pod.get("status") or {}
        r.bound_node = (pod.get("spec") or {}).get("nodeName")
        r.claims = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or []
                    if s.get("resourceClaimName")]
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
            claim = raw(self.resource.read_namespaced_resource_claim, cname, self.namespace)
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            for res in results:
                if index is None:
                    index = self.slice_devices()
                dev = index.get((res["driver"], res["pool"], res["device"]), {})
                out.append({"claim": cname, "request": res.get("request"), "driver": res["driver"], "pool": res["pool"],
                            "device": res["device"], "gpu": dev_gpu(dev), "kind": dev_attr(dev, "type", res["driver"]),
                            "profile": dev_attr(dev, "profile", res["driver"]), "node": dev.get("_node"),
                            "counter_set": (dev.get("consumesCounters") or [{}])[0].get("counterSet")})
        return out

    def wait(self, r: Run, *, expect: str = "Running") -> Run:
        """Until the pod runs and its health check reported (``expect="Running"``), or the scheduler
        declared it unschedulable (``expect="Pending"``; then it is watched for ``settle`` seconds to
        stay so). A timeout leaves ``phase="Timeout"``."""
        deadline = time.monotonic() + self.timeout
        while True:
            self.refresh(r)
            if r.phase == "Running":
                if self._read_health(r):
                    return r
            elif r.phase == "Failed":
                return r
            elif r.phase == "Pending" and r.reason and not r.bound_node and expect == "Pending":
                return self.confirm_pending(r)
            if time.monotonic() > deadline:
                r.phase, r.reason = "Timeout", f"not {expect} after {self.timeout:.0f}s" + (
                    f" (last: {r.reason})" if r.reason else "")
                return r
            time.sleep(self.poll)

    def confirm_pending(self, r: Run) -> Run:
        deadline = time.monotonic() + self.settle
        while time.monotonic() < deadline:
            time.sleep(self.poll)
            self.refresh(r)
            if r.phase != "Pending" or r.bound_node:
                return r
        return r

    def _read_health(self, r: Run) -> bool:
        try:
            text = self.core.read_namespaced_pod_log(r.name, self.namespace)
        except Exception:
            return False
        if "RESULT:" not in text:
            return False
        r.health = healthcheck.parse(text)
        return True

    def stop(self, r: Run, *, wait: bool = True) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(r.name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        if wait:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                pods = [p for p in raw(self.core.list_namespaced_pod, self.namespace)["items"]
                        if p["metadata"]["name"] == r.name]
                claims = [c for c in raw(self.resource.list_namespaced_resource_claim, self.namespace)["items"]
                          if c["metadata"]["name"] in r.claims]
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


# =========================================================================== the checks


@dataclass
class CheckResult:
    number: int
    title: str
    status: str = "skipped"  # passed | failed | error | skipped
    detail: str = ""
    evidence: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"number": self.number, "title": self.title, "status": self.status, "detail": self.detail,
                "evidence": self.evidence, "seconds": round(self.seconds, 3)}


@dataclass
class Target:
    node: str | None
    gpu: str
    index: int | None
    product: str | None
    counter_set: str | None
    profile: str
    fits: int
    published: int


@dataclass
class ConformanceReport:
    cluster: str
    namespace: str
    checks: list[CheckResult]
    cleanup: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.status == "passed" for c in self.checks) and not self.cleanup

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "namespace": self.namespace, "ok": self.ok,
                "checks": [c.to_dict() for c in self.checks], "cleanup": self.cleanup, "seconds": self.seconds}


class Conformance:
    def __init__(self, backend: KubeBackend, *, profile: str | None = None, node: str | None = None,
                 max_workloads: int = 8):
        self.b = backend
        self.profile = profile
        self.node = node
        self.max_workloads = max_workloads
        self.results = {n: CheckResult(n, TITLES[n]) for n in TITLES}
        self.target: Target | None = None
        self.ran: list[Run] = []  # every run that reached Running (for check 5)
        self.check2_runs: list[Run] = []
        self._tmpl_vgpu: str | None = None

    # ------------------------------------------------------------ helpers
    def _gpu_sel(self, index: int | None, gpu: str, kind: str) -> str:
        d = _cel(self.b.driver)
        if index is not None:
            return f"device.attributes[{d}].gpuIndex == {int(index)}"
        if kind == "vgpu":
            return f"device.attributes[{d}].parentPciBusID == {_cel(gpu)}"
        return f'device.attributes["resource.kubernetes.io"].pciBusID == {_cel(gpu)}'

    def _profile_sel(self, profile: str) -> str:
        return f"device.attributes[{_cel(self.b.driver)}].profile == {_cel(profile)}"

    def _require_running(self, r: Run, what: str) -> None:
        if r.phase != "Running":
            raise CheckFailed(f"{what} {r.name} did not run: {r.phase}: {r.reason}")
        self.ran.append(r)

    def _same_gpu(self, r: Run, gpu: str) -> list[str]:
        """Where the workload's view (health check) or the host contradict the slice's GPU."""
        problems = []
        for d in r.devices:
            if d["gpu"] != gpu:
                problems.append(f"{r.name}: device {d['device']} is published on GPU {d['gpu']}, not {gpu}")
        seen = r.health.gpus if r.health else set()
        if not seen:
            problems.append(f"{r.name}: the health check saw no GPU")
        elif seen != {gpu}:
            problems.append(f"{r.name}: inside the workload the devices belong to GPU {', '.join(sorted(seen))}, "
                            f"the slice says {gpu}")
        host = self.b.host(r)
        if host:
            problems += host
        return problems

    def _groups(self, r: Run) -> set[int]:
        return r.health.groups if r.health else set()

    def _run(self, n: int, fn) -> None:
        res = self.results[n]
        t0 = time.perf_counter()
        try:
            res.detail = fn(res) or ""
            res.status = "passed"
        except CheckFailed as exc:
            res.status, res.detail = "failed", str(exc)
        except Exception as exc:  # the check could not be carried out
            log.exception("check %s", n)
            res.status, res.detail = "error", f"{type(exc).__name__}: {exc}"
        res.seconds = time.perf_counter() - t0

    def _skip(self, n: int, why: str) -> None:
        self.results[n].status, self.results[n].detail = "skipped", why

    # ------------------------------------------------------------ check 1
    def check1(self, res: CheckResult) -> str:
        cap = self.b.capacity()
        cands = []
        for g in cap.gpus:
            if self.node and g.node != self.node:
                continue
            for p in g.profiles:
                if p.kind != "vgpu" or (self.profile and p.profile != self.profile):
                    continue
                res.evidence.append(f"node {g.node} GPU {g.index} {g.gpu} ({g.product}): {p.published} {p.profile} "
                                    f"devices published, {p.fits} allocatable now")
                if p.fits >= 2 and p.fits <= self.max_workloads:
                    cands.append((p.fits, g.node or "", g.index if g.index is not None else 1 << 30, g, p))
        if not cands:
            raise CheckFailed("no physical GPU exposes two or more allocatable logical GPUs"
                              + (f" of profile {self.profile}" if self.profile else "")
                              + (f" on node {self.node}" if self.node else "")
                              + f" (at most {self.max_workloads} considered)")
        fits, _, _, g, p = min(cands, key=lambda c: c[:3])
        self.target = Target(node=g.node, gpu=g.gpu, index=g.index, product=g.product, counter_set=g.counter_set,
                             profile=p.profile, fits=fits, published=p.published)
        return (f"GPU {g.index} {g.gpu} ({g.product}) on node {g.node} publishes {p.published} {p.profile} devices "
                f"consuming counter set {g.counter_set}; the scheduler model allocates {fits} of them at once")

    # ------------------------------------------------------------ check 2
    @property
    def tmpl_vgpu(self) -> str:
        """The ResourceClaimTemplate for one logical GPU of the target profile on the target GPU."""
        if self._tmpl_vgpu is None:
            t = self.target
            sels = [self._profile_sel(t.profile), self._gpu_sel(t.index, t.gpu, "vgpu")]
            self._tmpl_vgpu = self.b.template(f"logical-gpu-{_rand()}", self.b.vgpu_class, sels)
        return self._tmpl_vgpu

    def stop_all(self) -> None:
        for r in list(self.b.runs):
            self.b.stop(r)

    def check2(self, res: CheckResult) -> str:
        t = self.target
        runs = [self.b.create(f"logical-{i}-{_rand()}", self.tmpl_vgpu, t.node) for i in range(t.fits)]
        self.check2_runs = runs
        problems = []
        for r in runs:
            self.b.wait(r)
            res.evidence.append(r.line())
            self._require_running(r, "workload")
            problems += self._same_gpu(r, t.gpu)
            if r.bound_node != t.node:
                problems.append(f"{r.name}: runs on node {r.bound_node}, the GPU is on {t.node}")
        devices = [d["device"] for r in runs for d in r.devices]
        if len(set(devices)) != len(devices):
            problems.append(f"devices allocated twice: {devices}")
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"{len(runs)} workloads from ResourceClaimTemplate {self.tmpl_vgpu} run on node {t.node}, "
                f"all on GPU {t.gpu} (by the slices, inside the workloads" +
                (", and on the host)" if self.b.host_problems else ")") + f": {', '.join(devices)}")

    # ------------------------------------------------------------ check 3
    def check3(self, res: CheckResult) -> str:
        t = self.target
        before = {r.name: [d["device"] for d in r.devices] for r in self.check2_runs}
        extra = self.b.start(f"one-more-{_rand()}", self.tmpl_vgpu, t.node, expect="Pending")
        res.evidence.append(extra.line())
        tmpl_any = self.b.template(f"any-logical-gpu-{_rand()}", self.b.vgpu_class,
                                   [self._gpu_sel(t.index, t.gpu, "vgpu")])
        any_run = self.b.start(f"one-more-any-{_rand()}", tmpl_any, t.node, expect="Pending")
        res.evidence.append(any_run.line())
        problems = []
        for r, what in ((extra, f"one more {t.profile}"), (any_run, "one more logical GPU of any profile")):
            if r.phase == "Running":
                self.ran.append(r)
            if r.phase == "Running" or r.bound_node:
                problems.append(f"{what} was allocated although the GPU was full ({r.line()})")
            elif r.phase != "Pending" or not r.reason:
                problems.append(f"{what}: {r.phase} without the scheduler's reason ({r.reason})")
        for r in self.check2_runs:
            self.b.refresh(r)
            now = [d["device"] for d in r.devices]
            if r.phase != "Running" or r.restarts or now != before[r.name]:
                problems.append(f"{r.name} was disturbed: {r.phase}, restarts {r.restarts}, devices {now} "
                                f"(were {before[r.name]})")
            host = self.b.host(r)
            if host:
                problems += host
        for r in (extra, any_run, *self.check2_runs):
            self.b.stop(r)
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"the extra workload stays Pending: {extra.reason}; a request for any logical GPU of GPU {t.gpu} "
                f"stays Pending too; the {len(self.check2_runs)} running workloads kept their devices")

    # ------------------------------------------------------------ check 4
    def check4(self, res: CheckResult) -> str:
        t = self.target
        cap = self.b.capacity()
        whole = [(g, p) for g in cap.gpus for p in g.profiles
                 if p.kind == "passthrough" and p.fits >= 1 and g.node == t.node]
        a_whole = next((p for g, p in whole if g.gpu == t.gpu), None)
        if a_whole is None:
            raise CheckFailed(f"GPU {t.gpu} publishes no allocatable whole-GPU device")
        others = sorted((g for g, _ in whole if g.gpu != t.gpu),
                        key=lambda g: (g.product != t.product, g.index if g.index is not None else 1 << 30))
        tmpl_whole_a = self.b.template(f"whole-gpu-a-{_rand()}", self.b.passthrough_class,
                                       [self._gpu_sel(t.index, t.gpu, "passthrough")])
        problems: list[str] = []
        notes: list[str] = []

        def expect_pending(r: Run, what: str) -> None:
            res.evidence.append(r.line())
            if r.phase == "Running":
                self.ran.append(r)
            if r.phase == "Running" or r.bound_node:
                problems.append(f"{what} was allocated ({r.line()}): the whole GPU and its vGPUs are not "
                                "accounted against the same counters")
            elif r.phase != "Pending" or not r.reason:
                problems.append(f"{what}: {r.phase} ({r.reason})")

        v = self.b.start(f"vgpu-{_rand()}", self.tmpl_vgpu, t.node)
        res.evidence.append(v.line())
        self._require_running(v, "vGPU workload")
        problems += self._same_gpu(v, t.gpu)
        # accounted: the whole GPU of A waits while one of its vGPUs is allocated
        wait_a = self.b.start(f"whole-a-{_rand()}", tmpl_whole_a, t.node, expect="Pending")
        expect_pending(wait_a, f"a whole GPU {t.gpu} while a vGPU of it runs")
        p = None
        if others:
            b = others[0]
            tmpl_whole_b = self.b.template(f"whole-gpu-b-{_rand()}", self.b.passthrough_class,
                                           [self._gpu_sel(b.index, b.gpu, "passthrough")])
            p = self.b.start(f"whole-{_rand()}", tmpl_whole_b, t.node)
            res.evidence.append(p.line())
            self._require_running(p, "whole-GPU workload")
            problems += self._same_gpu(p, b.gpu)
            tmpl_vgpu_b = self.b.template(f"any-vgpu-b-{_rand()}", self.b.vgpu_class,
                                          [self._gpu_sel(b.index, b.gpu, "vgpu")])
            wait_b = self.b.start(f"vgpu-b-{_rand()}", tmpl_vgpu_b, t.node, expect="Pending")
            expect_pending(wait_b, f"a vGPU of GPU {b.gpu} while the whole GPU is passed through")
            self.b.stop(wait_b)
            # isolated: distinct devices and IOMMU groups, seen from inside the workloads
            dv, dp = {d["device"] for d in v.devices}, {d["device"] for d in p.devices}
            gv, gp = self._groups(v), self._groups(p)
            if dv & dp:
                problems.append(f"the vGPU and whole-GPU workloads share devices {sorted(dv & dp)}")
            if not gv or not gp or gv & gp:
                problems.append(f"IOMMU groups not distinct: vGPU workload {sorted(gv)}, whole-GPU workload {sorted(gp)}")
            notes.append(f"isolated: vGPU {sorted(dv)} in IOMMU group {sorted(gv)}, whole GPU {sorted(dp)} in "
                         f"IOMMU group {sorted(gp)}")
        # released the same way: when the vGPU workload ends, the whole GPU it blocked is allocated
        self.b.stop(v)
        wait_a = self.b.wait(wait_a)
        res.evidence.append("after the vGPU workload ended: " + wait_a.line())
        if wait_a.phase != "Running":
            problems.append(f"the whole GPU {t.gpu} was not allocated after its vGPU was released: "
                            f"{wait_a.phase} ({wait_a.reason})")
        else:
            self.ran.append(wait_a)
            problems += self._same_gpu(wait_a, t.gpu)
            again = self.b.start(f"vgpu-again-{_rand()}", self.tmpl_vgpu, t.node, expect="Pending")
            expect_pending(again, f"a vGPU of GPU {t.gpu} while it is passed through whole")
            self.b.stop(again)
            if p is None:  # one GPU only: isolation between the two kinds, one after the other
                gv, gp = self._groups(v), self._groups(wait_a)
                if not gv or not gp or gv & gp:
                    problems.append(f"IOMMU groups not distinct: vGPU {sorted(gv)}, whole GPU {sorted(gp)}")
                notes.append(f"isolated: vGPU in IOMMU group {sorted(gv)}, whole GPU in {sorted(gp)}")
        # identical semantics: same driver, same claim mechanism, same counter set per GPU
        kinds = {}
        for r in [x for x in (v, p, wait_a) if x is not None and x.devices]:
            for d in r.devices:
                kinds.setdefault(d["kind"], set()).add((d["driver"], d["counter_set"] is not None))
        if set(kinds) != {"vgpu", "passthrough"}:
            problems.append(f"not both kinds were allocated: {sorted(kinds)}")
        if any(k != {(self.b.driver, True)} for k in kinds.values()):
            problems.append(f"the kinds differ in driver or counters: {kinds}")
        sets = {d["counter_set"] for r in (v, wait_a) for d in r.devices}
        if len(sets) != 1:
            problems.append(f"the vGPU and the whole GPU {t.gpu} consume different counter sets: {sorted(sets)}")
        for r in [x for x in (p, wait_a) if x is not None]:
            self.b.stop(r)
        if problems:
            raise CheckFailed("; ".join(problems))
        return ("both kinds are requested by ResourceClaimTemplates of driver " + self.b.driver +
                f", allocated from the same pool and counter set {sets.pop()} of GPU {t.gpu} (a vGPU blocks the "
                "whole GPU, the whole GPU blocks its vGPUs, and releasing one lets the other run), prepared by the "
                "same plugin; " + "; ".join(notes))

    # ------------------------------------------------------------ check 5
    def check5(self, res: CheckResult) -> str:
        if not self.ran:
            raise CheckFailed("no workload ran")
        counts = {"Pass": 0, "Fail": 0, "Unknown": 0}
        problems = []
        for r in self.ran:
            if r.health is None:
                problems.append(f"{r.name}: no health check result")
                continue
            counts[r.health.result] += 1
            res.evidence.append(f"{r.name}: {r.health.summary()}")
            if r.health.result == "Fail":
                problems.append(f"{r.name}: {r.health.summary()}")
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"{len(self.ran)} workloads ran the health check: {counts['Pass']} Pass, {counts['Unknown']} Unknown "
                f"(an accelerator the check does not recognise), 0 Fail")

    # ------------------------------------------------------------ all
    def run(self) -> list[CheckResult]:
        self._run(1, self.check1)
        if self.results[1].status != "passed":
            for n in (2, 3, 4):
                self._skip(n, "needs check 1 (a GPU with several allocatable logical GPUs)")
        else:
            self._run(2, self.check2)
            if self.results[2].status == "passed":
                self._run(3, self.check3)
            else:
                self._skip(3, "needs check 2 (the GPU filled with workloads)")
            self.stop_all()
            self._run(4, self.check4)
            self.stop_all()
        if not self.ran and self.results[1].status != "passed":
            self._skip(5, "no workload ran (needs check 1)")
        else:
            self._run(5, self.check5)
        return [self.results[n] for n in sorted(self.results)]


def run_conformance(backend: KubeBackend, **kw) -> ConformanceReport:
    t0 = time.perf_counter()
    checks: list[CheckResult] = []
    cleanup: list[str] = []
    try:
        backend.setup()
        checks = Conformance(backend, **kw).run()
    except CheckFailed as exc:  # setup
        checks = [CheckResult(n, TITLES[n], "error" if n == 1 else "skipped", str(exc) if n == 1 else "setup failed")
                  for n in TITLES]
    finally:
        cleanup = backend.cleanup()
    return ConformanceReport(cluster=backend.label, namespace=backend.namespace, checks=checks, cleanup=cleanup,
                             seconds=round(time.perf_counter() - t0, 2))
