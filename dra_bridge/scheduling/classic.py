"""The device-plugin (classic) side of the cluster's GPUs, as the API server shows it, and where a VM
holding one of its vGPUs could live-migrate to. Pure: built from Node and Pod objects.

On the device-plugin path the kubelet does the accounting: a Node's ``status.allocatable`` counts
the healthy devices of each extended resource (``nvidia.com/GRID_T4-8Q``), and a resource is in use
as long as a pod bound to the node asks for it and has not ended (a terminating pod still holds its
devices). Free is the difference, as the scheduler's NodeResourcesFit computes it, so a vGPU a pod
holds is never counted free.

KubeVirt's vGPU live migration (VGPULiveMigration, one mdev vGPU per VM) starts a target
virt-launcher pod asking for the same resource; a node is a target only when it offers that
resource with one free, is schedulable, and carries the same host driver version label
(``vgpu-host-driver-version.kubevirt.io/nvidia``, which the node agent sets) as the VM's node: NVIDIA
migrates a vGPU only between identical vGPU managers (KubeVirt alpha requires it; VEP 109).
:func:`migration_targets` says, per other node, why it is or is not one, so ``kubectl vgpu`` can
show it and ``vgpuctl drain --migrate`` can refuse before anything moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from dra_bridge.api.names import DEFAULT_RESOURCE_PREFIX, LABEL_VGPU_HOST_DRIVER, LABEL_VM_NAME
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.scheduling.capacity import camel_keys
from dra_bridge.scheduling.gpuview import GpuView, Holder, migration_state

ENDED = ("Succeeded", "Failed")


@dataclass
class ClassicHolder:
    """A pod bound to a node that asks for classic devices (one resource)."""

    pod: str  # namespace/name
    resource: str
    count: int
    phase: str | None = None
    vm: str | None = None  # namespace/name of the VM whose virt-launcher pod it is
    migration: str | None = None  # the VM's migration state (gpuview.migration_state)


@dataclass
class ClassicResource:
    """One extended resource on one node: the kubelet's allocatable and what pods ask of it."""

    name: str
    allocatable: int
    used: int = 0
    holders: list[ClassicHolder] = field(default_factory=list)

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.used)


@dataclass
class ClassicNode:
    node: str
    driver_version: str | None = None  # the node's host driver label (None: not labelled)
    unschedulable: bool = False
    resources: dict[str, ClassicResource] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """camelCase keys, as every ``-o json`` of the CLI; each resource with its free count."""
        resources = []
        for r in self.resources.values():
            one = camel_keys({**asdict(r), "free": r.free})
            assert isinstance(one, dict)
            resources.append(one)
        return {"node": self.node, "driverVersion": self.driver_version, "unschedulable": self.unschedulable,
                "resources": resources}


def _ns_name(meta: dict) -> str:
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_requests(pod: dict, prefix: str = DEFAULT_RESOURCE_PREFIX) -> dict[str, int]:
    """The pod's extended resources under ``prefix``: what its containers ask (limits, where extended
    resources are set; requests else), the larger of that and any one init container's ask."""

    def ask(c: dict) -> dict[str, int]:
        res = c.get("resources") or {}
        want = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        return {k: int(parse_quantity(v)) for k, v in want.items() if k.startswith(prefix)}

    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, n in ask(c).items():
            total[k] = total.get(k, 0) + n
    for c in spec.get("initContainers") or []:
        for k, n in ask(c).items():
            total[k] = max(total.get(k, 0), n)
    return {k: n for k, n in total.items() if n > 0}


def classic_nodes(nodes: Iterable[dict], pods: Iterable[dict], vmis: Sequence[dict] = (), *,
                  prefix: str = DEFAULT_RESOURCE_PREFIX) -> list[ClassicNode]:
    """Every node that offers or uses a resource under ``prefix``, or whose agent labelled it with its host
    driver version, with its resources and holders."""
    vmi_of = {_ns_name(v.get("metadata") or {}): v for v in vmis}
    out: dict[str, ClassicNode] = {}
    for n in nodes:
        meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
        cn = ClassicNode(node=meta.get("name", ""), driver_version=(meta.get("labels") or {}).get(LABEL_VGPU_HOST_DRIVER),
                         unschedulable=bool(spec.get("unschedulable")))
        for k, v in sorted((status.get("allocatable") or {}).items()):
            if k.startswith(prefix):
                cn.resources[k] = ClassicResource(k, int(parse_quantity(v)))
        out[cn.node] = cn
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        node = (p.get("spec") or {}).get("nodeName")
        if not node or status.get("phase") in ENDED or node not in out:
            continue
        vm = (meta.get("labels") or {}).get(LABEL_VM_NAME)
        ns = meta.get("namespace", "")
        for k, count in sorted(pod_requests(p, prefix).items()):
            r = out[node].resources.setdefault(k, ClassicResource(k, 0))
            r.used += count
            r.holders.append(ClassicHolder(pod=_ns_name(meta), resource=k, count=count, phase=status.get("phase"),
                                           vm=f"{ns}/{vm}" if vm else None,
                                           migration=migration_state(vmi_of.get(f"{ns}/{vm}")) if vm else None))
    # a node without GPUs is left out; one the agent labelled with its host driver stays, offering nothing
    return sorted((c for c in out.values() if c.resources or c.driver_version), key=lambda c: c.node)


def short(resource: str, prefix: str = DEFAULT_RESOURCE_PREFIX) -> str:
    return resource.removeprefix(prefix)


def target_problem(resource: str, count: int, source: ClassicNode, target: ClassicNode,
                   prefix: str = DEFAULT_RESOURCE_PREFIX) -> str | None:
    """Why ``target`` cannot take a VM holding ``count`` of ``resource`` on ``source`` (None: it can)."""
    name = short(resource, prefix)
    if target.unschedulable:
        return "unschedulable (cordoned)"
    r = target.resources.get(resource)
    if r is None or r.allocatable == 0:
        return f"offers no {name}"
    if source.driver_version is None:
        return f"host driver version of {source.node} unknown (no {LABEL_VGPU_HOST_DRIVER} label)"
    if target.driver_version is None:
        return f"host driver version unknown (no {LABEL_VGPU_HOST_DRIVER} label)"
    if target.driver_version != source.driver_version:
        return f"host driver {target.driver_version}, {source.node} has {source.driver_version}"
    if r.free < count:
        return f"no free {name} ({r.used} of {r.allocatable} in use)"
    return None


@dataclass
class VmTargets:
    """Where one VM holding classic vGPUs could live-migrate: every other node, None where it can go."""

    vm: str
    node: str
    resource: str
    migration: str | None
    targets: dict[str, str | None] = field(default_factory=dict)  # node -> why not (None: a target)
    count: int = 1  # how many of ``resource`` the VM's pod holds

    @property
    def possible(self) -> list[str]:
        return [n for n, why in self.targets.items() if why is None]

    def text(self, prefix: str = DEFAULT_RESOURCE_PREFIX) -> str:
        where = f"VM {self.vm} ({short(self.resource, prefix)} on {self.node})"
        nots = "; ".join(f"{n}: {why}" for n, why in self.targets.items() if why is not None)
        if self.possible:
            return f"{where}: can move to {', '.join(self.possible)}" + (f"; not to {nots}" if nots else "")
        return f"{where}: no node can take it" + (f": {nots}" if nots else " (no other node)")

    def to_dict(self) -> dict:
        return {"vm": self.vm, "node": self.node, "resource": self.resource, "migration": self.migration,
                "targets": [n for n in self.possible], "notTargets": {n: w for n, w in self.targets.items() if w}}


def migration_targets(cnodes: Sequence[ClassicNode], *, only: Iterable[str] | None = None,
                      draining: Iterable[str] = (), prefix: str = DEFAULT_RESOURCE_PREFIX) -> list[VmTargets]:
    """For each VM whose virt-launcher pod holds classic devices (on the nodes ``only`` names, or on
    any), every other node with whether it can take the VM and why not (a node in ``draining`` is
    being emptied itself: no target)."""
    wanted = set(only) if only is not None else None
    leaving = set(draining)
    out = []
    for src in cnodes:
        if wanted is not None and src.node not in wanted:
            continue
        for r in src.resources.values():
            for h in r.holders:
                if h.vm is None:
                    continue
                vt = VmTargets(vm=h.vm, node=src.node, resource=r.name, migration=h.migration, count=h.count)
                for dst in cnodes:
                    if dst.node != src.node:
                        vt.targets[dst.node] = ("being drained too" if dst.node in leaving else
                                                target_problem(r.name, h.count, src, dst, prefix))
                out.append(vt)
    return sorted(out, key=lambda v: (v.vm, v.node))


def drain_targets(cnodes: Sequence[ClassicNode], nodes: Iterable[str], prefix: str = DEFAULT_RESOURCE_PREFIX
                  ) -> list[VmTargets]:
    """:func:`migration_targets` of the LiveMigratable VMs on ``nodes``, all leaving together: each VM in
    turn takes its vGPUs on the possible target with the most left free, so two VMs never count on one
    free vGPU; a target whose free ones the VMs before took is said so."""
    nodes = list(nodes)
    by_name = {c.node: c for c in cnodes}
    taken: dict[tuple[str, str], int] = {}
    out = [t for t in migration_targets(cnodes, only=nodes, draining=nodes, prefix=prefix) if t.migration == "migratable"]
    for t in out:
        def left(n: str, t: VmTargets = t) -> int:
            return by_name[n].resources[t.resource].free - taken.get((n, t.resource), 0)

        fits = [n for n in t.possible if left(n) >= t.count]
        for n in t.possible:
            if n not in fits:
                t.targets[n] = f"its free {short(t.resource, prefix)} go to the VMs drained before this one"
        if fits:
            best = min(fits, key=lambda n: (-left(n), n))
            taken[(best, t.resource)] = taken.get((best, t.resource), 0) + t.count
    return out


def classic_views(cnodes: Sequence[ClassicNode], nodes: Iterable[str], prefix: str = DEFAULT_RESOURCE_PREFIX
                  ) -> list[GpuView]:
    """A node's classic holders as one :class:`GpuView` (``NODE/device-plugin``), so a drain waits for
    them and migrates their VMs as it does a GPU's: from the API alone a device-plugin vGPU is not
    attributed to its GPU (the kubelet keeps that), so they count for a whole node's drain."""
    wanted = set(nodes)
    out = []
    for cn in cnodes:
        if cn.node not in wanted:
            continue
        holders = [Holder(claim="-", device=r.name, profile=short(r.name, prefix), pods=[h.pod], phase=h.phase,
                          vm=h.vm, migration=h.migration) for r in cn.resources.values() for h in r.holders]
        if holders:
            out.append(GpuView(node=cn.node, index=None, address=None, product=None, kinds=["device-plugin"],
                               devices=sum(r.allocatable for r in cn.resources.values()), holders=holders))
    return out


__all__ = ["ClassicHolder", "ClassicNode", "ClassicResource", "VmTargets", "classic_nodes", "classic_views",
           "drain_targets", "migration_targets", "pod_requests", "target_problem"]
