"""The control loop of the simulated cluster: what a real cluster does with pods created
through its API, so a client that only talks to the API (``vgpuctl conformance --kubeconfig``)
sees a working cluster."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from dra_bridge.apiclient.errors import missing_ok
from dra_bridge.scheduling.taints import tainted_slices, to_evict
from dra_bridge.sim.workloads import Workload, asks_extended_resources, pod_node

log = logging.getLogger(__name__)

WAIT = 20.0
#: a simulated VMI's annotation: what its migration does (see ControlPlane._migrate)
MIGRATION_PLAN = "sim.vgpuctl.io/migration"


class Cluster(Protocol):
    """What the loop uses of a :class:`~dra_bridge.sim.cluster.SimCluster` (named here, not
    imported: the cluster module offers this one)."""

    srv: Any  # the LocalApiServer: pod logs
    workloads: list[Workload]

    def rest(self, method: str, path: str, body: dict | None = None, *, patch: bool = False) -> dict: ...
    def pod_path(self, namespace: str, name: str = "", sub: str = "") -> str: ...
    def adopt(self, pod: dict) -> Workload: ...
    def schedule(self, w: Workload, node: str | None = None) -> bool: ...
    def run(self, w: Workload) -> bool: ...
    def release(self, w: Workload) -> None: ...
    def deviceless_output(self) -> str: ...
    def slices(self) -> list[dict]: ...
    def taint_rules(self) -> list[dict]: ...
    def claims(self, namespace: str | None = None) -> list[dict]: ...


class ControlPlane:
    """What a cluster does with pods created through the API of a :class:`SimCluster`, in a thread:
    the ResourceClaim controller makes their claims, the scheduler (model) allocates them, retrying
    pending pods, the kubelet prepares them through the plugin and the container runs the health
    check (its output becomes the pod's log); when a pod is deleted the kubelet unprepares its
    claims and the garbage collector deletes them; the device-taint controller deletes a pod whose
    device got a NoExecute taint it does not tolerate. Pods without claims just run."""

    def __init__(self, cluster: Cluster, *, interval: float = 0.1, retry: float = 0.5):
        self.c = cluster
        self.interval = interval
        self.retry = retry
        self.lock = threading.Lock()  # held while a step changes the host; hold it to look at the host
        self.by_uid: dict[str, Workload] = {}
        self._tried: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self._evicted: set[str] = set()  # pods the device-taint controller deleted

    def start(self) -> ControlPlane:
        self._thread = threading.Thread(target=self._loop, name="sim-control-plane", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(WAIT)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.step()
            except Exception as exc:  # keep going, as a controller would; the tests read the errors
                if self._stop.is_set():
                    break
                log.exception("control plane step failed")
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def step(self) -> None:
        managed = {w.pod_uid for w in self.c.workloads if w.pod_uid not in self.by_uid}
        pods = self.c.rest("GET", "/api/v1/pods")["items"]
        seen = set()
        now = time.monotonic()
        for p in pods:
            uid = p["metadata"]["uid"]
            seen.add(uid)
            if uid in managed:
                continue  # driven by SimCluster's own calls (the demo)
            w = self.by_uid.get(uid)
            if w is None:
                if not p["spec"].get("resourceClaims") and not asks_extended_resources(p):
                    if (p.get("status") or {}).get("phase") != "Running":
                        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
                        self.c.rest("PATCH", self.c.pod_path(ns, name, "status"), {"status": {"phase": "Running"}},
                                    patch=True)
                        self.c.srv.set_pod_log(ns, name, self.c.deviceless_output())
                    continue
                w = self.by_uid[uid] = self.c.adopt(p)
            if w.phase == "Pending" and now - self._tried.get(uid, -1e9) >= self.retry:
                self._tried[uid] = now
                if self.c.schedule(w, node=pod_node(p)):
                    self.c.run(w)
                    out = w.health.output if w.health is not None else ""
                    if w.phase != "Running":
                        out = f"container not started: {w.reason}\n"
                    self.c.srv.set_pod_log(w.namespace, w.pod, out)
        for uid in [u for u in self.by_uid if u not in seen]:
            w = self.by_uid.pop(uid)
            self._tried.pop(uid, None)
            self.c.release(w)
        self._evict_untolerated()
        self._migrate()

    def _migrate(self) -> None:
        """KubeVirt's migration controller, enough to test a drain: each VirtualMachineInstanceMigration
        goes Pending, Scheduling, Running, then Succeeded (the VMI's source virt-launcher pod is deleted,
        so its GPU is released; the VMI names the target node) or Failed (the VMI says why), one phase a
        step. The VMI's annotation ``sim.vgpuctl.io/migration`` decides: ``succeed:NODE`` (the default,
        to sim-node-2), ``fail:REASON``, or ``hang`` (it stays Running)."""
        try:
            items = self.c.rest("GET", "/apis/kubevirt.io/v1/virtualmachineinstancemigrations")["items"]
        except Exception:  # noqa: BLE001 - KubeVirt's kinds not served here
            return
        for m in items:
            ns, name = m["metadata"]["namespace"], m["metadata"]["name"]
            phase = (m.get("status") or {}).get("phase") or ""
            if phase in ("Succeeded", "Failed"):
                continue
            vmi_name = (m.get("spec") or {}).get("vmiName", "")
            vmi_path = f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{vmi_name}"
            status_path = f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}/status"
            vmis = [v for v in self.c.rest("GET", f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances")["items"]
                    if v["metadata"]["name"] == vmi_name]
            if not vmis:
                self.c.rest("PATCH", status_path, {"status": {"phase": "Failed", "conditions": [
                    {"type": "Failed", "status": "True", "message": f"VMI {vmi_name} not found"}]}}, patch=True)
                continue
            vmi = vmis[0]
            plan = ((vmi["metadata"].get("annotations") or {}).get(MIGRATION_PLAN) or "succeed:sim-node-2")
            nxt = {"": "Pending", "Pending": "Scheduling", "Scheduling": "Running"}.get(phase)
            if nxt is not None:
                self.c.rest("PATCH", status_path, {"status": {"phase": nxt}}, patch=True)
                if nxt == "Running" and not plan.startswith("fail"):
                    target = plan.partition(":")[2] or "sim-node-2"
                    self.c.rest("PATCH", f"{vmi_path}/status", {"status": {"migrationState": {
                        "targetNode": target, "completed": False}}}, patch=True)
                continue
            if plan == "hang":
                continue
            kind, _, arg = plan.partition(":")
            if kind == "fail":
                why = arg or "migration failed"
                self.c.rest("PATCH", f"{vmi_path}/status", {"status": {"migrationState": {
                    "completed": True, "failed": True, "failureReason": why}}}, patch=True)
                self.c.rest("PATCH", status_path, {"status": {"phase": "Failed", "conditions": [
                    {"type": "Failed", "status": "True", "message": why}]}}, patch=True)
                continue
            target = arg or "sim-node-2"
            for p in self.c.rest("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
                if (p["metadata"].get("labels") or {}).get("vm.kubevirt.io/name") == vmi_name:
                    missing_ok(self.c.rest, "DELETE", self.c.pod_path(ns, p["metadata"]["name"]))
            self.c.rest("PATCH", f"{vmi_path}/status", {"status": {"nodeName": target, "migrationState": {
                "targetNode": target, "completed": True}}}, patch=True)
            self.c.rest("PATCH", status_path, {"status": {"phase": "Succeeded",
                                                          "migrationState": {"targetNode": target}}}, patch=True)

    def _evict_untolerated(self) -> None:
        """The device-taint eviction controller (KEP-5055): a running pod whose claim holds a device
        with a NoExecute taint it does not tolerate is deleted (the next step releases its claims)."""
        running = [w for w in self.by_uid.values() if w.phase == "Running" and w.pod_uid not in self._evicted]
        if not running:
            return
        evict = to_evict(self.c.claims(), tainted_slices(self.c.slices(), self.c.taint_rules()))
        for w in running:
            why = next((evict[(w.namespace, n)] for n, _ in w.claims if (w.namespace, n) in evict), None)
            if why is not None:
                log.info("evicting pod %s/%s: %s", w.namespace, w.pod, why)
                self._evicted.add(w.pod_uid)
                missing_ok(self.c.rest, "DELETE", self.c.pod_path(w.namespace, w.pod))


__all__ = ["ControlPlane"]
