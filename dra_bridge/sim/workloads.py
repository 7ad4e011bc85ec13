"""The workloads of the simulated cluster and the objects the control plane writes for them.

Pure data and pure builders: the demo layout, a :class:`Workload` (a VM or a pod, its claims,
what it got), and the API objects the controllers of a real cluster would write (virt-launcher
pods, claims made from templates, events), so :mod:`dra_bridge.sim.cluster` only sends them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the type only: this module stays pure data
    from dra_bridge.conformance.healthcheck import HealthResult

#: The node layout of the simulated cluster: every GPU handed to the DRA bridge, one vGPU
#: profile each (the equal-size choice on servers before 1.37; the L40S in mixed-size mode offers
#: two sizes at their placements), and each whole GPU offered for passthrough too. The counts are
#: what the layout allows at most; in ``dra`` mode the bridge creates each vGPU when a claim is
#: prepared.
DEMO_LAYOUT = """\
version: vgpuctl/v1
layouts:
  demo:
    - index: 0                 # Tesla T4, mdev on the PF
      mode: dra
      vgpus: {T4-8Q: 2}
      passthrough: true
    - index: 1                 # second Tesla T4
      mode: dra
      vgpus: {T4-8Q: 2}
      passthrough: true
    - model: A100              # A100 40GB, mdev on SR-IOV VFs, in MIG mode: MIG-backed vGPUs
      mode: dra                #   at their GPU-instance placements
      migMode: true
      vgpus: {A100-3-20C: 0, A100-1-5C: 0}
      passthrough: true
    - model: L40S              # L40S, NVIDIA vendor-specific VFIO on VFs, in mixed-size mode: 12 and
      mode: dra                #   8 GiB vGPUs side by side, each at a placement on its 48 slots of 1 GiB
      mixedSize: true
      vgpus: {L40S-12Q: 4, L40S-8Q: 4}
      passthrough: true
  all:                         # every GPU, every profile (servers >= 1.37 publish them all);
    - all: true                #   GPUs with MIG in MIG mode: MIG-backed vGPUs beside time-sliced ones
      mode: dra
      migMode: true
      passthrough: true
  mixed:                       # as all, but the L40S in mixed-size mode: every size >= 2 GiB at once,
    - index: 0                 #   at its placements (vgpuctl conformance runs three sizes on it)
      mode: dra
      passthrough: true
    - index: 1
      mode: dra
      passthrough: true
    - model: A100
      mode: dra
      migMode: true
      passthrough: true
    - model: L40S
      mode: dra
      mixedSize: true
      passthrough: true
"""

LAUNCHER_IMAGE = "quay.io/kubevirt/virt-launcher:v1.9.0"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def rand_suffix(n: int = 5) -> str:
    """The random suffix Kubernetes controllers append to generated names."""
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


@dataclass
class WorkloadDevice:
    """One device a workload got: what the scheduler allocated and what the node made of it."""

    claim: str
    request: str
    pool: str
    device: str
    kind: str  # vgpu | passthrough
    gpu: str | None  # PCI address of the physical GPU, from the slice
    profile: str | None
    memory: Fraction | None  # bytes
    counter_set: str | None
    node: str | None
    host_id: str | None = None  # mdevUUID or PCI address, from the KEP-5304 metadata the workload reads
    iommu_group: int | None = None
    device_nodes: list[dict] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # NAME=value from the CDI edits (virt-launcher's resource variables)
    slots: tuple[int, int] | None = None  # mixed-size: (placementStart, placementSize) of the device
    instance: tuple[int, int] | None = None  # MIG-backed: the GPU-instance placement (start, size) of the device
    inside: int | None = None  # MIG time-slicing: the vGPU's placement id inside its GPU instance

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("claim", "request", "pool", "device", "kind", "gpu", "profile",
                                            "counter_set", "node", "host_id", "iommu_group", "cdi_ids", "env",
                                            "slots")}
        d["memory"] = int(self.memory) if self.memory is not None else None
        d["device_nodes"] = [{"path": n.get("path"), "hostPath": n.get("hostPath")} for n in self.device_nodes]
        return d


@dataclass
class Workload:
    name: str
    kind: str  # VirtualMachine | Pod
    namespace: str
    pod: str  # the pod that holds the claims (virt-launcher-... for a VM)
    pod_uid: str = ""
    claims: list[tuple[str, str]] = field(default_factory=list)  # (claim name, uid)
    phase: str = "Pending"  # Pending | Running | Failed | Deleted
    node: str | None = None
    reason: str | None = None
    devices: list[WorkloadDevice] = field(default_factory=list)
    objects: list[dict] = field(default_factory=list)
    health: HealthResult | None = None  # once the workload ran the health check
    unmet: list[str] = field(default_factory=list)  # extended resources no DeviceClass maps (no node has them)

    def claim_refs(self) -> list[tuple[str, str, str]]:
        """(namespace, uid, name) of each claim, as the kubelet names them to the plugin."""
        return [(self.namespace, uid, name) for name, uid in self.claims]

    def device_paths(self) -> list[str]:
        """Host paths of the device nodes the workload got (what a container sees), once each."""
        return list(dict.fromkeys(n["hostPath"] for d in self.devices for n in d.device_nodes))

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "namespace": self.namespace, "pod": self.pod,
                "claims": [c for c, _ in self.claims], "phase": self.phase, "node": self.node,
                "reason": self.reason, "devices": [d.to_dict() for d in self.devices],
                **({"health": self.health.to_dict()} if self.health is not None else {})}


def pod_node(pod: dict) -> str | None:
    """The node a pod asks for: ``spec.nodeName``, a ``kubernetes.io/hostname`` node selector, or a
    required node affinity on ``metadata.name`` (the first value)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    if (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname"):
        return spec["nodeSelector"]["kubernetes.io/hostname"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for t in terms:
        for f in t.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return f["values"][0]
    return None


# --------------------------------------------------------------------------- what the controllers write


def launcher_pod(vm: dict, stored_vm: dict, namespace: str) -> dict:
    """The virt-launcher pod KubeVirt makes for a VirtualMachine: it holds the VM's claims, and its
    compute container asks for one of each classic ``deviceName`` its GPUs and host devices name
    (as virt-controller's template service does)."""
    spec = vm["spec"]["template"]["spec"]
    claims = spec.get("resourceClaims") or []
    name = vm["metadata"]["name"]
    devices = (spec.get("domain") or {}).get("devices") or {}
    limits: dict[str, int] = {}
    for d in (devices.get("gpus") or []) + (devices.get("hostDevices") or []):
        if d.get("deviceName"):
            limits[d["deviceName"]] = limits.get(d["deviceName"], 0) + 1
    resources: dict[str, Any] = {"claims": [{"name": c["name"]} for c in claims]}
    if limits:
        resources["limits"] = {k: str(v) for k, v in limits.items()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"virt-launcher-{name}-{rand_suffix()}", "namespace": namespace,
        "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name},
        "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                             "name": stored_vm["metadata"]["name"], "uid": stored_vm["metadata"]["uid"]}]},
        "spec": {"resourceClaims": claims, "restartPolicy": "Never", "containers": [{
            "name": "compute", "image": LAUNCHER_IMAGE, "command": ["/usr/bin/virt-launcher-monitor"],
            "resources": resources}]}}


#: The annotation the scheduler puts on the claim it makes for a pod's extended resources (KEP-5004).
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
#: Every DeviceClass is also an extended resource of this domain (KEP-5004, implicit name).
IMPLICIT_DOMAIN = "deviceclass.resource.kubernetes.io/"


def _extended(resource: str) -> bool:
    """An extended resource name (``domain/name``), not a native one."""
    return "/" in resource and not resource.startswith("hugepages-")


def asks_extended_resources(pod: dict) -> bool:
    """Whether a container of ``pod`` asks for an extended resource (``domain/name``)."""
    spec = pod.get("spec") or {}
    return any(_extended(k) for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
               for part in ("requests", "limits") for k in ((c.get("resources") or {}).get(part) or {}))


def extended_resource_claim(w: Workload, pod: dict, classes: list[dict]) -> tuple[dict, dict] | None:
    """The claim kube-scheduler makes for a pod's extended resources backed by DRA (KEP-5004):
    one request ``container-<i>-request-<j>`` per (container, resource) that a DeviceClass maps
    (``spec.extendedResourceName``, or the implicit ``deviceclass.resource.kubernetes.io/<class>``),
    and the pod's ``status.extendedResourceClaimStatus``; None when the pod asks for none. (The
    real scheduler makes it once the pod fits; the simulation makes it first, then allocates.)"""
    by_name: dict[str, str] = {}
    for c in sorted(classes, key=lambda c: c["metadata"]["name"]):
        by_name.setdefault(IMPLICIT_DOMAIN + c["metadata"]["name"], c["metadata"]["name"])
        ext = (c.get("spec") or {}).get("extendedResourceName")
        if ext:
            by_name[ext] = c["metadata"]["name"]
    requests, mappings = [], []
    spec = pod.get("spec") or {}
    for i, ctr in enumerate((spec.get("initContainers") or []) + (spec.get("containers") or [])):
        res = ctr.get("resources") or {}
        wanted = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        w.unmet += [k for k in wanted if _extended(k) and k not in by_name and k not in w.unmet]
        for j, (name, count) in enumerate((k, v) for k, v in wanted.items() if k in by_name):
            req = f"container-{i}-request-{j}"
            requests.append({"name": req, "exactly": {"deviceClassName": by_name[name], "allocationMode": "ExactCount",
                                                      "count": int(count)}})
            mappings.append({"containerName": ctr["name"], "resourceName": name, "requestName": req})
    if not requests:
        return None
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
        "name": f"{w.pod}-extended-resources-{rand_suffix()}", "namespace": w.namespace,
        "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": w.pod, "uid": w.pod_uid,
                             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": requests}}}
    return claim, {"requestMappings": mappings}


def claim_from_template(w: Workload, pod_claim: str, template: dict) -> dict:
    """The ResourceClaim controller's claim for one pod claim: ``<pod>-<claim>-<random>``,
    annotated with the pod claim name, owned by the pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
        "name": f"{w.pod}-{pod_claim}-{rand_suffix()}", "namespace": w.namespace,
        "annotations": {POD_CLAIM_NAME: pod_claim},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": w.pod, "uid": w.pod_uid,
                             "controller": True, "blockOwnerDeletion": True}]},
        "spec": template["spec"]["spec"]}


def pod_event(w: Workload, reason: str, message: str, source: dict) -> dict:
    """A Warning event about the workload's pod."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{w.pod}.{rand_suffix(10)}", "namespace": w.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": w.pod, "namespace": w.namespace,
                               "uid": w.pod_uid},
            "reason": reason, "message": message, "type": "Warning", "source": source}


def unschedulable_status(message: str) -> dict:
    """The pod status the scheduler writes when it cannot place the pod."""
    return {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


__all__ = ["DEMO_LAYOUT", "EXTENDED_RESOURCE_CLAIM", "asks_extended_resources", "extended_resource_claim",
           "LAUNCHER_IMAGE", "POD_CLAIM_NAME", "Workload", "WorkloadDevice", "claim_from_template", "launcher_pod",
           "pod_event", "pod_node", "rand_suffix", "unschedulable_status"]
