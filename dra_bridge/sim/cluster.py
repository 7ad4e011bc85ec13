"""A simulated cluster in one process: what ``vgpuctl demo``, ``capacity`` and ``conformance`` run on.

Every part is the real one except the hardware, the API server and the scheduler:

* a simulated GPU node (:func:`mdev_manager.sim.node.sim_node`, a sysfs tree with the kernel's
  write rules);
* the node agent (:class:`dra_bridge.agent.daemon.Daemon`): it reconciles the layout with the node
  manager, publishes ResourceSlices and serves the kubelet plugin on real unix sockets;
* an in-process Kubernetes API server (:mod:`dra_bridge.sim.apiserver`) reached through the official
  ``kubernetes`` client;
* the scheduler's allocation is :class:`dra_bridge.scheduling.allocator.Allocator` (a model of it)
  with the real CEL engine (:mod:`dra_bridge.scheduling.cel`); the ResourceClaim controller is a
  few lines here, building its objects with :mod:`dra_bridge.sim.workloads`; the kubelet
  (:mod:`dra_bridge.sim.kubelet`) finds the plugin through its registration socket and calls
  ``NodePrepareResources`` / ``NodeUnprepareResources`` over gRPC, and "running" a workload
  means resolving the CDI ids the plugin answered into device nodes and mounts, as a container
  runtime would. :class:`~dra_bridge.sim.controlplane.ControlPlane` runs these controllers in a
  loop for pods created by API clients.

The objects vgpuctl's templates make (DeviceClasses here; VMs, claim templates and pods in the demo)
come from a :data:`Render` its caller hands in (``vgpuctl`` wires :func:`kubevirt_templates.render.render`),
so the simulator sits beside the templates, not above them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_bridge.api.compat import taint_rule_api, version_tuple
from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.apiclient.errors import api_exception, missing_ok
from dra_bridge.apiclient.objects import body, raw, sanitize
from dra_bridge.apiclient.workloads import WorkloadApi
from dra_bridge.conformance import healthcheck
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.objects import devices_by_key
from dra_bridge.scheduling.pools import Features
from dra_bridge.scheduling.selectors import Selectors, default_selectors
from dra_bridge.scheduling.taints import tainted_slices
from dra_bridge.sim.kubelet import KubeletClient, node_object, prepare_errors, workload_devices
from dra_bridge.sim.workloads import (
    DEMO_LAYOUT,
    Workload,
    claim_from_template,
    extended_resource_claim,
    launcher_pod,
    pod_event,
    unschedulable_status,
)
from mdev_manager.discovery import discover
from mdev_manager.models import Inventory

if TYPE_CHECKING:  # loaded by start(): see there
    from dra_bridge.agent.daemon import Daemon
    from dra_bridge.sim.apiserver import LocalApiServer, ResourceType


#: ``render(kind, values) -> objects``: vgpuctl's templates (``deviceclasses``, ``vm``, ``claim-template``,
#: ``passthrough-pod``) rendered from their values, as ``vgpuctl render KIND`` renders them
Render = Callable[[str, Mapping[str, Any]], list[dict[str, Any]]]


def _resource_types() -> tuple[ResourceType, ...]:
    from dra_bridge.sim.apiserver import ResourceType  # start-up cost, as in start()

    return (
        ResourceType("kubevirt.io", "v1", "virtualmachines", "VirtualMachine", namespaced=True,
                     singular="virtualmachine", status_subresource=True, has_generation=True, short_names=("vm",)),
        # their instances: where `vgpuctl drain` reads a VM's live-migration state
        ResourceType("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", namespaced=True,
                     singular="virtualmachineinstance", status_subresource=True, short_names=("vmi",)),
        # what `vgpuctl drain --migrate` creates; the control plane's migration model moves them along
        ResourceType("kubevirt.io", "v1", "virtualmachineinstancemigrations", "VirtualMachineInstanceMigration",
                     namespaced=True, singular="virtualmachineinstancemigration", status_subresource=True,
                     short_names=("vmim",)),
    )


class SimCluster:
    """One simulated GPU node with the whole vgpuctl node agent, an in-process API server and the
    models of the control plane (see the module docstring). Use as a context manager."""

    def __init__(self, *, render: Render, preset: str = "default", layout: str = DEMO_LAYOUT, layout_name: str = "demo",
                 version: str = "1.35", namespace: str = "default", driver: str = DEFAULT_DRIVER,
                 selectors: Selectors | None = None, validate: bool = True, base: Path | None = None, health: bool = True,
                 device_classes: dict | None = None, feature_gates: dict[str, bool] | None = None,
                 serve_options: dict | None = None) -> None:
        self.render = render
        self.preset = preset
        self.layout_text = layout
        self.layout_name = layout_name
        self.version = version
        self.namespace = namespace
        self.driver = driver
        self.selectors = selectors or default_selectors()
        self.validate = validate
        self.health = health
        self.device_classes = dict(device_classes or {})  # render deviceclasses values beyond the driver
        self.feature_gates = feature_gates  # None: every gate of the version on; {}: the version's defaults
        self.serve_options = dict(serve_options or {})  # more ServeConfig fields for the node agent
        self._base_arg = base
        self.base: Path | None = None
        self.srv: LocalApiServer | None = None
        self.daemon: Daemon | None = None
        self.kubelet: KubeletClient | None = None
        self.workloads: list[Workload] = []
        self.prebind_failures = 0  # scheduling attempts failed by a binding failure condition (KEP-5007)
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------ lifecycle
    def start(self) -> SimCluster:
        # start-up cost (the node agent's grpc and kubernetes client, the API server: ~1 s):
        # loaded when a cluster starts, not for `vgpuctl demo --help`
        from dra_bridge.agent.daemon import Daemon, ServeConfig
        from dra_bridge.sim.apiserver import LocalApiServer
        from mdev_manager.sim.node import sim_node

        t0 = time.perf_counter()
        # a short path: unix socket addresses must stay under 108 bytes
        self.base = Path(tempfile.mkdtemp(prefix="vgpuctl-", dir=self._base_arg or "/tmp"))
        sim = sim_node(self.base / "host", self.preset)
        self.node, self.host, self.env, self.io = sim.node, sim.host, sim.env, sim.io
        layout_file = self.base / "layout.yaml"
        layout_file.write_text(self.layout_text)
        self.srv = LocalApiServer(version=self.version, validate=self.validate, feature_gates=self.feature_gates,
                                  extra_resources=_resource_types()).start()
        self.api = self.srv.api_client()
        self.resource = WorkloadApi(self.api).resource  # the typed resource.k8s.io/v1 client
        self.rest("POST", "/api/v1/nodes", node_object(self.node, kubelet_version=self.srv.git_version))
        if self.namespace not in ("default", "kube-system"):
            self.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": self.namespace}})
        self.timings["api"] = time.perf_counter() - t0
        minor = int(self.version.lstrip("v").split(".")[1])
        cfg = ServeConfig(node_name=self.node, driver=self.driver, layout_file=layout_file, layout=self.layout_name,
                          resync_seconds=3600, server_version=(1, minor), metrics_port=None,
                          kubelet_root=self.base / "kl", cdi_root=self.base / "cdi", health_poll_seconds=60,
                          **self.serve_options)
        self.daemon = Daemon(cfg, self.env, self.io, self.api)
        self.daemon.start()  # reconcile the layout, publish the slices, serve the kubelet
        self.timings["node agent"] = time.perf_counter() - t0 - self.timings["api"]
        self.kubelet = KubeletClient(self.base / "kl", self.driver).register()
        values = {**({"driver": self.driver} if self.driver != DEFAULT_DRIVER else {}), **self.device_classes}
        for obj in self.render("deviceclasses", values):
            self.resource.create_device_class(body(obj))
        return self

    def stop(self) -> None:
        if self.kubelet:
            self.kubelet.close()
            self.kubelet = None
        if self.daemon:
            self.daemon.stop()
            # what Daemon.run() does on its way out (here run() never ran): servers down, sockets gone
            getattr(self.daemon, "_shutdown", self.daemon.plugin.stop)()
            self.daemon = None
        if self.srv:
            self.srv.stop()
            self.srv = None
        if self.base:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> SimCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ reading the API
    def rest(self, method: str, path: str, body: dict | None = None, *, patch: bool = False) -> dict:
        """One request through the client's transport (the typed CoreV1Api costs a second to import);
        ``patch`` sends a JSON merge patch. Non-2xx answers raise ``ApiException``."""
        ctype = "application/merge-patch+json" if patch else "application/json"
        m, url, headers, data, _ = self.api.param_serialize(
            method, path, header_params={"Content-Type": ctype, "Accept": "application/json"}, body=body,
            auth_settings=["BearerToken"])
        r = self.api.call_api(m, url, headers, data)
        payload = r.read()  # the body, kept as r.data too
        if not 200 <= r.status < 300:
            raise api_exception()(status=r.status, reason=r.reason, body=payload)
        return json.loads(payload)

    def pod_path(self, namespace: str, name: str = "", sub: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def pod(self, namespace: str, name: str) -> dict:
        return self.rest("GET", self.pod_path(namespace, name))

    def slices(self) -> list[dict]:
        return raw(self.resource.list_resource_slice)["items"]

    def classes(self) -> list[dict]:
        return raw(self.resource.list_device_class)["items"]

    def claims(self, namespace: str | None = None) -> list[dict]:
        if namespace:
            return raw(self.resource.list_namespaced_resource_claim, namespace)["items"]
        return raw(self.resource.list_resource_claim_for_all_namespaces)["items"]

    def inventory(self) -> Inventory:
        return discover(self.env, self.io, node=self.node)

    def taint_rules(self) -> list[dict]:
        """The DeviceTaintRules, where the server serves them (KEP-5055; none elsewhere)."""
        try:
            return self.rest("GET", f"/apis/{taint_rule_api(self.version)}/devicetaintrules")["items"]
        except api_exception() as exc:
            if exc.status != 404:
                raise
            return []

    def scheduler_features(self) -> Features:
        """What kube-scheduler of this cluster's minor acts on: the server's resolved gates (a
        cluster's components run with the same gates) and the minor's own result shape."""
        assert self.srv is not None
        return Features.from_gates(self.srv.feature_gates, version_tuple(self.version))

    def allocator(self) -> Allocator:
        """The scheduler model over the API's current slices (with the DeviceTaintRules' taints, as
        kube-scheduler sees them) and classes, with every allocated claim reserved; gated and shaped
        as this cluster's minor (:meth:`scheduler_features`)."""
        alloc = Allocator(tainted_slices(self.slices(), self.taint_rules()), self.classes(), self.selectors,
                          features=self.scheduler_features())
        for c in self.claims():
            alloc.reserve(c)
        return alloc

    def devices_by_key(self) -> dict[tuple[str, str, str], dict]:
        return devices_by_key(self.slices())

    # ------------------------------------------------------------ workloads
    def submit(self, objects: list[dict], name: str | None = None) -> Workload:
        """Create rendered objects (ResourceClaimTemplates, a VirtualMachine or a Pod), the pod that
        holds the claims (virt-launcher for a VM), and the claims the ResourceClaim controller makes
        from the templates."""
        main = None
        for obj in objects:
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["namespace"] = self.namespace
            kind = obj["kind"]
            if kind == "ResourceClaimTemplate":
                try:
                    self.resource.create_namespaced_resource_claim_template(self.namespace, obj)
                except api_exception() as exc:
                    if exc.status != 409:  # the template is there already
                        raise
            elif kind == "ResourceClaim":
                self.resource.create_namespaced_resource_claim(self.namespace, body(obj))
            elif kind in ("VirtualMachine", "Pod"):
                main = obj
            else:
                raise ValueError(f"submit: cannot run a {kind}")
        if main is None:
            raise ValueError("submit: no VirtualMachine or Pod among the objects")
        if main["kind"] == "VirtualMachine":
            vm = self.rest("POST", f"/apis/kubevirt.io/v1/namespaces/{self.namespace}/virtualmachines", main)
            pod = launcher_pod(main, vm, self.namespace)
        else:
            pod = main
        stored = self.rest("POST", self.pod_path(self.namespace), pod)
        return self.adopt(stored, name=name or main["metadata"]["name"], kind=main["kind"], objects=objects)

    def adopt(self, pod: dict, *, name: str | None = None, kind: str = "Pod",
              objects: Sequence[dict] = ()) -> Workload:
        """The ResourceClaim controller for a stored pod: a claim per ``resourceClaimTemplateName``
        (named ``<pod>-<claim>-<random>``, annotated with the pod claim name, owned by the pod), the
        pod's ``status.resourceClaimStatuses``; returns the workload."""
        meta = pod["metadata"]
        ns = meta.get("namespace") or self.namespace
        w = Workload(name=name or meta["name"], kind=kind, namespace=ns, pod=meta["name"], pod_uid=meta["uid"],
                     objects=list(objects))
        statuses = []
        for pc in pod["spec"].get("resourceClaims") or []:
            if pc.get("resourceClaimTemplateName"):
                tmpl = sanitize(self.api, self.resource.read_namespaced_resource_claim_template(
                    pc["resourceClaimTemplateName"], ns))
                claim = claim_from_template(w, pc["name"], tmpl)
                made = sanitize(self.api, self.resource.create_namespaced_resource_claim(ns, body(claim)))
            else:
                made = sanitize(self.api, self.resource.read_namespaced_resource_claim(pc["resourceClaimName"], ns))
            w.claims.append((made["metadata"]["name"], made["metadata"]["uid"]))
            statuses.append({"name": pc["name"], "resourceClaimName": made["metadata"]["name"]})
        status: dict = {"resourceClaimStatuses": statuses} if statuses else {}
        special = extended_resource_claim(w, pod, self.classes())
        if special is not None:  # the scheduler's claim for the pod's classic resources (KEP-5004)
            claim, ext = special
            made = sanitize(self.api, self.resource.create_namespaced_resource_claim(ns, body(claim)))
            w.claims.append((made["metadata"]["name"], made["metadata"]["uid"]))
            status["extendedResourceClaimStatus"] = {"resourceClaimName": made["metadata"]["name"], **ext}
        if status:
            self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": status}, patch=True)
        self.workloads.append(w)
        return w

    def claim_objects(self, w: Workload) -> list[dict]:
        return [raw(self.resource.read_namespaced_resource_claim, n, w.namespace) for n, _ in w.claims]

    def schedule(self, w: Workload, node: str | None = None) -> bool:
        """The scheduler: allocate the pod's claims together (the model), write ``status.allocation``
        and ``reservedFor``, bind the pod; or leave it Pending with the reason, as the scheduler
        reports it (condition PodScheduled=False, reason Unschedulable, and a FailedScheduling event)."""
        claims = self.claim_objects(w)
        alloc = self.allocator()
        try:
            if w.unmet:  # no node advertises them and no DeviceClass maps them (NodeResourcesFit)
                raise Unsatisfiable(", ".join(f"Insufficient {r}" for r in w.unmet))
            chosen, allocations = alloc.allocate(claims, node=node)
        except Unsatisfiable as exc:
            n = len(alloc.nodes) if node is None else 1
            if w.phase == "Pending" and w.reason == str(exc):
                return False  # reported already
            w.phase, w.reason = "Pending", str(exc)
            msg = (f"0/{n} nodes are available: {n} {exc}." if w.unmet else
                   f"0/{n} nodes are available: {n} cannot allocate all claims. {exc}")
            self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), unschedulable_status(msg), patch=True)
            self.rest("POST", f"/api/v1/namespaces/{w.namespace}/events",
                      pod_event(w, "FailedScheduling", msg, {"component": "default-scheduler"}))
            return False
        self._reserve(w, claims, allocations)
        return self._bind(w, claims, allocations, chosen)

    def schedule_together(self, ws: list[Workload]) -> list[bool]:
        """Several pods allocated from one snapshot of the slices before any of them binds (two
        scheduler instances, or one scheduler's binding cycles running behind its allocations): the
        race in which a GPU's sizes could be mixed. Each then goes through PreBind in turn."""
        alloc = self.allocator()
        planned: list[tuple[Workload, list[dict], list[dict], str] | None] = []
        for w in ws:
            claims = self.claim_objects(w)
            try:
                chosen, allocations = alloc.allocate(claims)
            except Unsatisfiable as exc:
                w.phase, w.reason = "Pending", str(exc)
                planned.append(None)
                continue
            self._reserve(w, claims, allocations)
            planned.append((w, claims, allocations, chosen))
        return [self._bind(*p) if p else False for p in planned]

    def _reserve(self, w: Workload, claims: list[dict], allocations: list[dict]) -> None:
        for claim, allocation in zip(claims, allocations, strict=False):
            self.resource.patch_namespaced_resource_claim_status(
                claim["metadata"]["name"], w.namespace,
                {"status": {"allocation": allocation,
                            "reservedFor": [{"resource": "pods", "name": w.pod, "uid": w.pod_uid}]}})

    def _bind(self, w: Workload, claims: list[dict], allocations: list[dict], chosen: str) -> bool:
        failed = self._pre_bind(w, claims, allocations)
        if failed:
            self.prebind_failures += 1
            w.phase, w.reason = "Pending", failed
            self.rest("POST", f"/api/v1/namespaces/{w.namespace}/events",
                      pod_event(w, "FailedScheduling", failed, {"component": "default-scheduler"}))
            return False
        self.rest("PATCH", self.pod_path(w.namespace, w.pod), {"spec": {"nodeName": chosen}}, patch=True)
        self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"}]}}, patch=True)
        w.node, w.reason = chosen, None
        return True

    def _pre_bind(self, w: Workload, claims: list[dict], allocations: list[dict]) -> str | None:
        """kube-scheduler's PreBind for devices with binding conditions (KEP-5007): wait until the
        driver's ``status.devices`` conditions say so (here the agent is asked at once, as its watch
        would react); a True failure condition fails the attempt and the allocation is dropped
        (Unreserve, then PostFilter's deallocation), so the pod is tried again. The error, or None."""
        waiting = [(c, r) for c, a in zip(claims, allocations, strict=False) for r in a["devices"]["results"]
                   if r.get("bindingConditions")]
        if not waiting:
            return None
        assert self.daemon is not None, "start() the cluster first"
        self.daemon.bind()
        for claim, r in waiting:
            name = claim["metadata"]["name"]
            stored = raw(self.resource.read_namespaced_resource_claim, name, w.namespace)
            entry: dict = next((e for e in (stored.get("status") or {}).get("devices") or []
                          if (e["driver"], e["pool"], e["device"]) == (r["driver"], r["pool"], r["device"])), {})
            state = {c["type"]: c for c in entry.get("conditions") or []}
            bad = next((state[t] for t in r["bindingFailureConditions"] if state.get(t, {}).get("status") == "True"),
                       None)
            ok = all(state.get(t, {}).get("status") == "True" for t in r["bindingConditions"])
            if bad is not None or not ok:
                for c in claims:  # deallocate: the next attempt allocates afresh
                    self.resource.patch_namespaced_resource_claim_status(
                        c["metadata"]["name"], w.namespace,
                        {"status": {"allocation": None, "reservedFor": None, "devices": None}})
                if bad is not None:
                    return f"claim {name} binding failed: reason={bad.get('reason')}, message={bad.get('message')!r}"
                return "device binding timeout"
        return None

    def run(self, w: Workload) -> bool:
        """The kubelet: prepare the pod's claims through the plugin's socket, resolve the CDI ids it
        answers as the runtime would, read the KEP-5304 metadata the workload would read."""
        assert self.kubelet is not None and self.base is not None, "start() the cluster first"
        answers = self.kubelet.prepare(w.claim_refs())
        errors = prepare_errors(w.claims, answers)
        if errors:
            w.phase, w.reason = "Failed", "; ".join(errors)
            self.rest("POST", f"/api/v1/namespaces/{w.namespace}/events", pod_event(
                w, "FailedPrepareDynamicResources", w.reason, {"component": "kubelet", "host": w.node or ""}))
            return False
        w.devices = workload_devices(w.claims, answers, self.devices_by_key(), self.driver, self.base / "cdi")
        self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": {"phase": "Running"}}, patch=True)
        w.phase = "Running"
        if self.health:
            self.check_health(w)
        return True

    def check_health(self, w: Workload) -> healthcheck.HealthResult:
        """The workload runs the shipped health check on the device nodes it was given (their host
        paths), with the simulated host's sysfs as /sys."""
        w.health = healthcheck.run(w.device_paths(), sys_root=self.env.sys_root)
        return w.health

    def deviceless_output(self) -> str:
        """What the health check prints in a container given no device: the host's sysfs, but no
        vfio or GPU device node (KAR-0049's negative case)."""
        if not self.health:
            return ""
        assert self.base is not None, "start() the cluster first"
        empty = self.base / "empty-dev"
        empty.mkdir(exist_ok=True)
        return healthcheck.run([], sys_root=self.env.sys_root,
                               env={"VGPUCTL_HC_VFIO": str(empty), "VGPUCTL_HC_DEV": str(empty)}).output

    def launch(self, objects: list[dict], name: str | None = None, node: str | None = None) -> Workload:
        """submit + schedule + run."""
        w = self.submit(objects, name)
        if self.schedule(w, node=node):
            self.run(w)
        return w

    def host_problems(self, w: Workload) -> list[str]:
        """What the simulated host contradicts: every vGPU the workload got exists on the GPU the
        slice named (a mixed-size device's at its placement, a MIG-backed one's on a GPU instance at
        its placement, and at its placement inside a shared instance); every whole GPU is bound to
        vfio-pci; every device node exists."""
        inv = self.inventory()
        vgpus = {v.id: v for v in inv.all_vgpus()}
        out = []
        for d in w.devices:
            if d.kind == "vgpu":
                v = vgpus.get(d.host_id or "")
                if v is None:
                    out.append(f"{w.name}: vGPU {d.host_id} of device {d.device} is not on the host")
                elif v.gpu != d.gpu:
                    out.append(f"{w.name}: vGPU {d.host_id} lives on GPU {v.gpu}, the slice said {d.gpu}")
                elif d.slots is not None and v.placement_id != d.slots[0]:
                    out.append(f"{w.name}: vGPU {d.host_id} sits at placement {v.placement_id}, the slice said "
                               f"{d.slots[0]} ({d.device})")
                elif d.instance is not None:
                    g = inv.gpu(v.gpu)
                    gi = next((i for i in g.mig.instances if i.id == v.gpu_instance), None) if g and g.mig else None
                    at = (gi.placement.start, gi.placement.size) if gi else None
                    if at != d.instance:
                        out.append(f"{w.name}: vGPU {d.host_id} lives on a GPU instance at {at}, the slice said "
                                   f"{d.instance} ({d.device})")
                    elif d.inside is not None and v.placement_id != d.inside:
                        out.append(f"{w.name}: vGPU {d.host_id} sits at placement {v.placement_id} inside its GPU "
                                   f"instance, the slice said {d.inside} ({d.device})")
            else:
                g = inv.gpu(d.gpu or "")
                if g is None or g.driver != "vfio-pci":
                    out.append(f"{w.name}: GPU {d.gpu} is bound to {g.driver if g else 'nothing'}, not vfio-pci")
            for n in d.device_nodes:
                if not Path(n["hostPath"]).exists():
                    out.append(f"{w.name}: device node {n['hostPath']} does not exist")
        return out

    def release(self, w: Workload) -> None:
        """The kubelet unprepares the workload's claims, the garbage collector deletes them."""
        if w.phase == "Running":
            assert self.kubelet is not None, "start() the cluster first"
            errs = self.kubelet.unprepare(w.claim_refs())
            bad = {uid: e for uid, e in errs.items() if e}
            if bad:
                raise RuntimeError(f"unprepare of {w.name} failed: {bad}")
        for n, _ in w.claims:
            missing_ok(self.resource.delete_namespaced_resource_claim, n, w.namespace)
        w.phase = "Deleted"
        if w in self.workloads:
            self.workloads.remove(w)

    def teardown(self, w: Workload) -> None:
        """Stop the workload: the kubelet unprepares its claims, then the pod, its claims and the VM go."""
        self.release(w)
        paths = [self.pod_path(w.namespace, w.pod)]
        if w.kind == "VirtualMachine":
            paths.append(f"/apis/kubevirt.io/v1/namespaces/{w.namespace}/virtualmachines/{w.name}")
        for path in paths:
            missing_ok(self.rest, "DELETE", path)

    def workload_of_pod(self, namespace: str, name: str) -> Workload | None:
        return next((w for w in list(self.workloads) if w.namespace == namespace and w.pod == name), None)
