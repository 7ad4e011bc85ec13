"""The cluster's GPUs as an admin looks at them (``kubectl vgpu``, ``vgpuctl drain``): per node and
physical GPU, what it publishes, whether it is cordoned and how, who holds it (claim, pod, VM) and
how many more of each profile fit. Pure: built from the objects the API server sent.

Free capacity is :func:`~dra_bridge.scheduling.capacity.compute` on the slices as the scheduler sees
them (DeviceTaintRules' taints added, :mod:`.taints`), so a cordoned GPU fits nothing more. A
holder is an allocated ResourceClaim on one of the GPU's devices; its pods come from
``status.reservedFor``, its VM from the virt-launcher pod's ``vm.kubevirt.io/name`` label, and the
VM's migration state from its VirtualMachineInstance (``status.migrationState`` and the
``LiveMigratable`` condition).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from dra_bridge.api.attributes import ATTR_MIG_BACKED, ATTR_PLACEMENT_SIZE, ATTR_PLACEMENT_START, ATTR_TYPE
from dra_bridge.api.names import DEFAULT_DRIVER, LABEL_VM_NAME, TAINT_KEY_CORDON
from dra_bridge.pool.cordon import NODE, CordonEntry, entry_for, parse_cordon
from dra_bridge.pool.health import KINDS
from dra_bridge.scheduling.capacity import ProfileFit, camel_keys, compute
from dra_bridge.scheduling.objects import dev_attr, dev_gpu, devices_by_key
from dra_bridge.scheduling.taints import selects, tainted_slices


@dataclass
class Holder:
    claim: str  # namespace/name
    device: str
    profile: str
    placement: str | None = None  # MIG / mixed-size: "start+size" (memory slices, GiB)
    pods: list[str] = field(default_factory=list)  # namespace/name of the pods it is reserved for
    phase: str | None = None  # the first pod's phase
    vm: str | None = None  # namespace/name of the VM whose virt-launcher pod holds it
    migration: str | None = None  # migratable | not migratable (reason) | migrating to N | migration failed


@dataclass
class GpuView:
    node: str | None
    index: int | None
    address: str | None
    product: str | None
    kinds: list[str] = field(default_factory=list)  # vgpu | mig | passthrough: what it publishes
    devices: int = 0
    cordon: str | None = None  # the effect, when cordoned
    cordon_how: str | None = None  # taint | rule | withdrawn | pending (the agent has not republished yet)
    reason: str | None = None
    health: str | None = None  # what makes the GPU unhealthy (the agent's health taints or annotation): None healthy
    holders: list[Holder] = field(default_factory=list)
    profiles: list[ProfileFit] = field(default_factory=list)

    def to_dict(self) -> dict:
        """As a Kubernetes-style object's fields: camelCase keys (``cordonHow``, ``freeDevices``)."""
        out = camel_keys(asdict(self))
        assert isinstance(out, dict)
        return out

    def name(self) -> str:
        """``NODE/INDEX``; ``NODE/device-plugin`` for a node's classic devices (not attributed to a GPU)."""
        return f"{self.node}/{self.index if self.index is not None else self.address or 'device-plugin'}"


def _ns_name(meta: dict) -> str:
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def migration_state(vmi: dict | None) -> str:
    """What KubeVirt says about moving the VM away: a migration in flight or failed, else whether it can."""
    if vmi is None:
        return "no VMI"
    status = vmi.get("status") or {}
    mig = status.get("migrationState") or {}
    if mig and not mig.get("completed"):
        return f"migrating to {mig.get('targetNode') or '?'}"
    if mig.get("failed"):
        return "migration failed"
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "LiveMigratable"), None)
    if cond is None:
        return "migratable: unknown"
    if cond.get("status") == "True":
        return "migratable"
    return "not migratable" + (f" ({cond['reason']})" if cond.get("reason") else "")


def _holders(claims: Iterable[dict], pods: Iterable[dict], vmis: Iterable[dict]) -> dict[tuple, list[Holder]]:
    """(driver, pool, device) -> who holds it."""
    by_uid = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    by_name = {_ns_name(p.get("metadata") or {}): p for p in pods}
    vmi_of = {_ns_name(v.get("metadata") or {}): v for v in vmis}
    out: dict[tuple, list[Holder]] = {}
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        ns = meta.get("namespace", "")
        pod_objs = []
        for ref in status.get("reservedFor") or []:
            if ref.get("resource", "pods") == "pods":
                p = by_uid.get(ref.get("uid")) or by_name.get(f"{ns}/{ref.get('name')}")
                pod_objs.append(p or {"metadata": {"namespace": ns, "name": ref.get("name")}})
        vm = next((((p.get("metadata") or {}).get("labels") or {}).get(LABEL_VM_NAME) for p in pod_objs
                   if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_VM_NAME)), None)
        for r in results:
            h = Holder(claim=_ns_name(meta), device=r.get("device", ""), profile="",
                       pods=[_ns_name(p.get("metadata") or {}) for p in pod_objs],
                       phase=((pod_objs[0].get("status") or {}).get("phase") if pod_objs else None),
                       vm=f"{ns}/{vm}" if vm else None,
                       migration=migration_state(vmi_of.get(f"{ns}/{vm}")) if vm else None)
            out.setdefault((r.get("driver"), r.get("pool"), r.get("device")), []).append(h)
    return out


def build_views(slices: list[dict], claims: list[dict], pods: Sequence[dict] = (), vmis: Sequence[dict] = (),
                rules: Sequence[dict] = (), cordons: Mapping[str, str] | None = None,
                applied: Mapping[str, str] | None = None, *, driver: str = DEFAULT_DRIVER,
                nodes: list[str] | None = None, healths: Mapping[str, str] | None = None) -> list[GpuView]:
    """One :class:`GpuView` per physical GPU of ``driver`` (``nodes``: only theirs), in node and index
    order; a cordoned GPU whose devices were all withdrawn is shown from its cordon entry. ``applied``
    (node -> the cordon its agent says it published; None: not known) tells a cordon not yet
    published (``pending``)."""
    seen = tainted_slices(slices, rules)
    report = compute(seen, claims, driver=driver, nodes=nodes)
    devs = devices_by_key(seen)
    holders = _holders(claims, pods, vmis)
    parsed = {n: _parse(t) for n, t in (cordons or {}).items()}
    by_gpu: dict[tuple, list] = {}  # (pool, GPU) -> its devices, in one pass (not one per GPU: 100 nodes)
    for k, d in devs.items():
        if k[0] == driver:
            by_gpu.setdefault((k[1], dev_gpu(d)), []).append((k, d))
    views = []
    for g in report.gpus:
        mine = by_gpu.get((g.pool, g.gpu), [])
        v = GpuView(node=g.node, index=g.index, address=g.gpu, product=g.product, devices=len(mine),
                    profiles=g.profiles)
        v.kinds = sorted({"mig" if dev_attr(d, ATTR_MIG_BACKED, driver) else dev_attr(d, ATTR_TYPE, driver) or "?"
                          for _, d in mine})
        for k, d in mine:
            for h in holders.get(k, []):
                start, size = dev_attr(d, ATTR_PLACEMENT_START, driver), dev_attr(d, ATTR_PLACEMENT_SIZE, driver)
                h.profile = next((x["profile"] for x in g.holders if x["device"] == k[2]), "")
                h.placement = f"{start}+{size}" if start is not None and size is not None else None
                v.holders.append(h)
        acted = applied is None or (applied.get(g.node or "") == (cordons or {}).get(g.node or ""))
        _cordon_of(v, parsed.get(g.node or "", {}), mine, rules, driver, g.pool, acted)
        v.health = _health_of(mine, driver) or parse_health((healths or {}).get(g.node or "")).get(g.gpu or "")
        views.append(v)
    shown = {(v.node, v.address) for v in views}
    for node, cordon in sorted(parsed.items()):
        for addr, entry in sorted(cordon.items()):
            if addr != NODE and (node, addr) not in shown and (not nodes or node in nodes):
                views.append(GpuView(node=node, index=entry.index, address=addr, product=None, cordon=entry.effect,
                                     cordon_how="withdrawn", reason=entry.reason))
    return sorted(views, key=lambda v: (v.node or "", v.index if v.index is not None else 1 << 30, v.address or ""))


HEALTH_KINDS = KINDS  # the agent's health taints (dra_bridge.pool.health)
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _health_of(mine: list, driver: str) -> str | None:
    """The agent's health taints on the GPU's devices (``<driver>/xid`` with the Xid as value, ...)."""
    found = sorted({f"{t['key'].rsplit('/', 1)[1]}{' ' + t['value'] if t.get('value') else ''}"
                    for _, d in mine for t in d.get("taints") or []
                    if t.get("key") in {f"{driver}/{k}" for k in HEALTH_KINDS}})
    return ", ".join(found) or None


def parse_health(text: str | None) -> dict[str, str]:
    """The node annotation ``vgpu.kubevirt.io/health`` (``ADDRESS: problem, ...; ADDRESS: ...``) per GPU."""
    out: dict[str, str] = {}
    for part in (text or "").split("; "):
        addr, _, what = part.partition(": ")
        if _PCI.match(addr.strip()):
            out[addr.strip()] = what.strip()
    return out


def _parse(text: str) -> dict[str, CordonEntry]:
    try:
        return parse_cordon(text)
    except ValueError:
        return {}


def _cordon_of(v: GpuView, cordon: Mapping[str, CordonEntry], mine: list, rules: Sequence[dict], driver: str,
               pool: str, acted: bool = True) -> None:
    """How the GPU is kept from new allocations, if it is: a rule, its devices' taints, withdrawal."""
    entry = entry_for(cordon, v.address or "")
    ruled = [r for r in rules if ((r.get("spec") or {}).get("taint") or {}).get("key") == TAINT_KEY_CORDON
             and any(selects(r, driver, pool, k[2]) for k, _ in mine)]
    if ruled:
        v.cordon, v.cordon_how = ruled[0]["spec"]["taint"].get("effect"), "rule"
    elif mine and all(any(t.get("key") == TAINT_KEY_CORDON for t in d.get("taints") or []) for _, d in mine):
        v.cordon, v.cordon_how = next(t.get("effect") for t in mine[0][1]["taints"] if t.get("key") == TAINT_KEY_CORDON), "taint"
    elif entry is not None:
        held = {h.device for h in v.holders}
        v.cordon = entry.effect
        v.cordon_how = "withdrawn" if acted and all(k[2] in held for k, _ in mine) else "pending"
    if entry is not None:
        v.reason = entry.reason


@dataclass
class DrainPlan:
    """What draining some GPUs does now: pods to evict, holders to wait for."""

    evict: list[str] = field(default_factory=list)  # namespace/pod
    wait: list[Holder] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.evict and not self.wait


def plan_drain(views: Iterable[GpuView], *, evict: bool, migrate: bool = False) -> DrainPlan:
    """Evict (when asked) the pods holding the GPUs; a VM's virt-launcher pod only when the VM can
    live-migrate (KubeVirt answers its eviction with a migration); every other holder is waited for."""
    plan = DrainPlan()
    for v in views:
        for h in v.holders:
            # with ``migrate`` a VM moves by its own migration object: its pod is not evicted too
            movable = evict and h.pods and (h.vm is None or (h.migration == "migratable" and not migrate))
            if movable:
                plan.evict.extend(p for p in h.pods if p not in plan.evict)
            plan.wait.append(h)
    return plan


@dataclass(frozen=True)
class MigrationOutcome:
    """Where a ``drain --migrate`` migration of one VM stands: running, migrated (to ``node``), failed
    (``reason``), timed out, or not migratable (``reason``)."""

    vm: str
    result: str  # running | migrated | failed | timed-out | not-migratable
    node: str | None = None
    reason: str | None = None

    def text(self) -> str:
        if self.result == "migrated":
            return f"VM {self.vm}: migrated to node {self.node or '?'}"
        if self.result == "running":
            return f"VM {self.vm}: migrating" + (f" ({self.reason})" if self.reason else "")
        what = {"failed": "migration failed", "timed-out": "migration not finished in time",
                "not-migratable": "not migratable"}[self.result]
        return f"VM {self.vm}: {what}" + (f" ({self.reason})" if self.reason else "")

    def to_dict(self) -> dict:
        return {k: v for k, v in (("result", self.result), ("node", self.node), ("reason", self.reason)) if v}


FINAL_PHASES = ("Succeeded", "Failed")


def migration_outcome(vm: str, vmim: dict | None, vmi: dict | None) -> MigrationOutcome:
    """KubeVirt's VirtualMachineInstanceMigration (``status.phase``: Pending .. Running, Succeeded,
    Failed) and the VMI's ``status.migrationState`` (``targetNode``, ``failed``, ``failureReason``), read
    together; a migration deleted before it ended counts as failed."""
    mig = ((vmi or {}).get("status") or {}).get("migrationState") or {}
    if vmim is None:
        return MigrationOutcome(vm, "failed", reason="the migration object was deleted")
    status = vmim.get("status") or {}
    phase = status.get("phase") or "Pending"
    target = ((status.get("migrationState") or {}).get("targetNode")) or mig.get("targetNode")
    if phase == "Succeeded":
        return MigrationOutcome(vm, "migrated", node=target)
    if phase == "Failed":
        why = mig.get("failureReason") or next((c.get("message") or c.get("reason") for c in status.get("conditions") or []
                                                if c.get("status") == "True" and (c.get("message") or c.get("reason"))),
                                               None)
        return MigrationOutcome(vm, "failed", node=target, reason=why or "KubeVirt gave no reason")
    return MigrationOutcome(vm, "running", node=target, reason=f"phase {phase}")
