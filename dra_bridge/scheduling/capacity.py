"""``vgpuctl capacity``: how many more instances of each profile fit, per node and physical GPU, now.

Read from a cluster's ResourceSlices and ResourceClaims (through the API, a file of objects, or the
simulated cluster). For every physical GPU (one counter set) and every profile it publishes (a
vGPU type, or ``whole GPU`` for passthrough), the answer is found by asking the scheduler model
(:class:`~dra_bridge.scheduling.allocator.Allocator`) to allocate one more claim for that profile on that GPU,
again and again, with every allocated claim already reserved, until it refuses. So the answer
honours everything the scheduler honours: the GPU's counters (framebuffer, vGPU count), the
equal-size rule (compatibility groups on 1.37+; before 1.37 a GPU publishes one size only, so
other sizes do not appear at all), devices already taken, and incomplete pools (not counted).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from dra_bridge.api.attributes import (
    ATTR_GPU_INDEX,
    ATTR_PARENT_PCI_BUS_ID,
    ATTR_PCI_BUS_ID,
    ATTR_PRODUCT_NAME,
    ATTR_PROFILE,
    ATTR_TYPE,
    ATTR_VGPU_TYPES,
)
from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.quantity import format_quantity, parse_quantity
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.objects import dev_attr
from dra_bridge.scheduling.pools import Amount, Device, State, read_pools
from dra_bridge.scheduling.probesel import ProbeSelectors
from dra_bridge.scheduling.selectors import Selectors
from mdev_manager.yamlfile import load_yaml

CAPACITY_CLASS = "vgpuctl-capacity-probe"
WHOLE_GPU = "whole GPU"


def camel_keys(value: object) -> object:
    """``value`` with every dict key in camelCase (``free_devices`` -> ``freeDevices``), as Kubernetes
    objects spell fields: what the CLI's ``-o json`` of a GPU report uses everywhere."""
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


@dataclass
class ProfileFit:
    profile: str  # vGPU profile (T4-8Q), or "whole GPU"
    kind: str  # vgpu | passthrough
    memory: int | None  # bytes per instance
    published: int  # devices of this profile on this GPU
    free_devices: int  # of them, not allocated
    fits: int  # how many more claims for one of them the scheduler would allocate now


@dataclass
class GpuCapacity:
    node: str | None
    pool: str
    driver: str
    gpu: str | None  # PCI address
    index: int | None
    product: str | None
    counter_set: str | None
    totals: dict[str, str] = field(default_factory=dict)  # counter -> quantity
    used: dict[str, str] = field(default_factory=dict)
    holders: list[dict] = field(default_factory=list)  # {"claim": ns/name, "device", "profile"}
    profiles: list[ProfileFit] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CapacityReport:
    gpus: list[GpuCapacity]
    incomplete_pools: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """As ``kubectl vgpu -o json`` writes a GPU: camelCase keys (``freeDevices``, ``counterSet``)."""
        out = camel_keys({"gpus": [g.to_dict() for g in self.gpus], "incomplete_pools": self.incomplete_pools,
                          "notes": self.notes})
        assert isinstance(out, dict)
        return out


    def gpu(self, node: str | None, index_or_address: int | str | None) -> GpuCapacity | None:
        return next((g for g in self.gpus if (node is None or g.node == node)
                     and index_or_address in (g.index, g.gpu)), None)

    def fits(self, node: str | None, gpu: int | str | None, profile: str) -> int | None:
        g = self.gpu(node, gpu)
        p = next((p for p in g.profiles if p.profile == profile), None) if g else None
        return p.fits if p else None


def _cel_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _probe(driver: str, kind: str, profile_attr: str | None, index: int | None, gpu: str | None) -> dict:
    """A claim for one device of ``profile`` on one GPU (by index, else by PCI address)."""
    d = _cel_str(driver)
    sels = [f"device.attributes[{d}].type == {_cel_str(kind)}"]
    if profile_attr is not None:  # a slot that can become it (vgpuTypes), or a device of that profile
        sels.append(f"has(device.attributes[{d}].vgpuTypes) ? "
                    f"device.attributes[{d}].vgpuTypes.contains({_cel_str(' ' + profile_attr + ' ')}) : "
                    f"device.attributes[{d}].profile == {_cel_str(profile_attr)}")
    if index is not None:
        sels.append(f"device.attributes[{d}].gpuIndex == {int(index)}")
    elif gpu is not None and kind == "vgpu":
        sels.append(f"device.attributes[{d}].parentPciBusID == {_cel_str(gpu)}")
    elif gpu is not None:
        sels.append(f'device.attributes["resource.kubernetes.io"].pciBusID == {_cel_str(gpu)}')
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "capacity-probe", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "probe", "exactly": {
                "deviceClassName": CAPACITY_CLASS, "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": e}} for e in sels]}}]}}}


def _probe_class(driver: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CAPACITY_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == {_cel_str(driver)}"}}]}}


def _allocated(claims: Iterable[dict]) -> list[dict]:
    return [c for c in claims if ((c.get("status") or {}).get("allocation") or {}).get("devices")]


def compute(slices: list[dict], claims: list[dict], *, driver: str = DEFAULT_DRIVER, selectors: Selectors | None = None,
            nodes: list[str] | None = None) -> CapacityReport:
    """Per node and GPU of ``driver``: counters used, who holds what, and how many more of each
    published profile the scheduler would allocate now."""
    if selectors is None:  # the probes' own selectors in Python where CEL would answer the same
        selectors = ProbeSelectors()
    claims = _allocated(claims)
    pools = read_pools(slices)
    report = CapacityReport(gpus=[])
    report.incomplete_pools = sorted(f"{p.driver}/{p.name}" for p in pools.values()
                                     if p.driver == driver and not p.complete)
    # what each allocated device is held by
    held: dict[tuple, list[str]] = {}
    for c in claims:
        for r in c["status"]["allocation"]["devices"]["results"]:
            held.setdefault((r["driver"], r["pool"], r["device"]), []).append(
                f"{c['metadata'].get('namespace', '')}/{c['metadata']['name']}")
    # the raw slice devices of the newest generation of each complete pool
    raw: dict[tuple[str, str, str], dict[str, Any]] = {}
    gens = {k: p.generation for k, p in pools.items()}
    for s in slices:
        spec = s["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        if spec["driver"] != driver or spec["pool"].get("generation", 0) != gens.get(key):
            continue
        for d in spec.get("devices") or []:
            raw[(spec["driver"], spec["pool"]["name"], d["name"])] = {**d, "_node": spec.get("nodeName")}
    classes = [_probe_class(driver)]
    alloc = Allocator(slices, classes, selectors)
    for c in claims:
        alloc.reserve(c)
    now = alloc.state.copy()
    for (drv, pool_name), pool in sorted(pools.items()):
        if drv != driver or not pool.complete:
            continue
        groups: dict[str, list[Device]] = {}
        for d in pool.devices:  # one group per physical GPU: its counter set, else its PCI address
            rd = raw.get(d.key, {})
            cs = d.consumes[0]["counterSet"] if d.consumes else f"gpu:{_gpu_address(rd, driver) or d.name}"
            groups.setdefault(cs, []).append(d)
        for cs, devs in sorted(groups.items(), key=lambda kv: (kv[1][0].node or "", _gpu_index(kv[1], driver), kv[0])):
            first = raw.get(devs[0].key, {})
            gpu = _gpu_address(first, driver)
            index = dev_attr(first, ATTR_GPU_INDEX, driver)
            g = GpuCapacity(node=devs[0].node, pool=pool_name, driver=drv, gpu=gpu, index=index,
                            product=dev_attr(first, ATTR_PRODUCT_NAME, driver),
                            counter_set=None if cs.startswith("gpu:") else cs)
            totals = pool.counters.get(cs, {})
            used: dict[str, Fraction] = {}
            for d in devs:
                if d.key not in held:
                    continue
                for c in d.consumes:
                    if c["counterSet"] == cs:
                        for k, v in (c.get("counters") or {}).items():
                            used[k] = used.get(k, Fraction(0)) + parse_quantity(v["value"] if isinstance(v, dict) else v)
            g.totals = {k: format_quantity(Fraction(v)) for k, v in totals.items()}
            g.used = {k: format_quantity(used.get(k, Fraction(0))) for k in totals}
            for d in devs:
                for who in held.get(d.key, []):
                    g.holders.append({"claim": who, "device": d.name,
                                      "profile": _profile_name(raw.get(d.key, {}), driver)})
            by_profile: dict[tuple[str, str | None], list[Device]] = {}
            for d in devs:
                rd = raw.get(d.key, {})
                kind = dev_attr(rd, ATTR_TYPE, driver) or "?"
                # a size slot (or MIG placement) counts for every type it can become (vgpuTypes)
                names = (dev_attr(rd, ATTR_VGPU_TYPES, driver) or "").split() if kind == "vgpu" else []
                for prof in names or [dev_attr(rd, ATTR_PROFILE, driver) if kind == "vgpu" else None]:
                    by_profile.setdefault((kind, prof), []).append(d)
            for (kind, prof), pdevs in sorted(by_profile.items(), key=lambda kv: _profile_order(kv[0], kv[1], raw)):
                rd = raw.get(pdevs[0].key, {})
                mem = (rd.get("capacity") or {}).get("memory")
                taken = sum(1 for d in pdevs if d.key in held)
                fits = _fits(alloc, now, driver, kind, prof, index, gpu, pdevs[0].node, limit=len(pdevs))
                # a vGPU device publishing neither vgpuTypes nor profile: "?", as in the holders
                g.profiles.append(ProfileFit(profile=(prof or "?") if kind == "vgpu" else WHOLE_GPU, kind=kind,
                                             memory=int(parse_quantity(mem["value"])) if mem else None,
                                             published=len(pdevs), free_devices=len(pdevs) - taken, fits=fits))
            report.gpus.append(g)
    if nodes:
        report.gpus = [g for g in report.gpus if g.node in nodes]
    return report


def _gpu_address(dev: dict, driver: str) -> str | None:
    """The physical GPU a published device belongs to: a vGPU's parent, else the device itself."""
    return dev_attr(dev, ATTR_PARENT_PCI_BUS_ID, driver) or dev_attr(dev, ATTR_PCI_BUS_ID, driver)


def _gpu_index(devs: list[Device], driver: str) -> int:
    v = devs[0].attribute(ATTR_GPU_INDEX)
    return v if isinstance(v, int) else 1 << 30


def _profile_name(rd: dict, driver: str) -> str:
    kind = dev_attr(rd, ATTR_TYPE, driver)
    return (dev_attr(rd, ATTR_PROFILE, driver) or rd.get("name", "?")) if kind == "vgpu" else WHOLE_GPU


def _profile_order(key: tuple[str, str | None], devs: list[Device],
                   raw: dict[tuple[str, str, str], dict[str, Any]]) -> tuple[bool, Amount, str]:
    kind, prof = key
    mem = (raw.get(devs[0].key, {}).get("capacity") or {}).get("memory")
    size = parse_quantity(mem["value"]) if mem else 0
    return (kind != "vgpu", size, prof or "")


def _fits(alloc: Allocator, now: State, driver: str, kind: str, profile: str | None, index: int | None, gpu: str | None,
          node: str | None, *, limit: int) -> int:
    """Allocate probes for one profile of one GPU until refused, then put the state back. (Each probe
    shape is tried in this one loop only, so the allocator's per-shape "known full" memo, which
    assumes the state only grows, stays true.)"""
    probe = _probe(driver, kind, profile, index, gpu)
    n = 0
    try:
        while n < limit:
            try:
                alloc.allocate([probe], node=node)
            except Unsatisfiable:
                break
            n += 1
    finally:
        alloc.state = now.copy()
    return n


# --------------------------------------------------------------------------- sources


def from_objects(docs: Iterable[Any]) -> tuple[list[dict], list[dict]]:
    """(slices, claims) from API objects: single objects or ``List`` documents (``kubectl get -o yaml``)."""
    slices: list[dict] = []
    claims: list[dict] = []

    def take(obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        if obj.get("kind", "").endswith("List") or ("items" in obj and "kind" not in obj):
            for item in obj.get("items") or []:
                take(item)
        elif obj.get("kind") == "ResourceSlice":
            slices.append(obj)
        elif obj.get("kind") == "ResourceClaim":
            claims.append(obj)

    for doc in docs:
        take(doc)
    return slices, claims


OBJECTS_MAX_BYTES = 256 << 20  # `kubectl get resourceslices -o json` of a thousand GPU nodes fits


def from_file(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(slices, claims) from a file of objects, JSON or YAML (``-``: stdin); YamlFileError names the line."""
    docs = load_yaml(path, what="file of API objects", max_bytes=OBJECTS_MAX_BYTES, all_documents=True,
                     json_first=True)
    return from_objects(docs)
