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

import json
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

import yaml

from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable, read_pools
from dra_bridge.kubeletplugin.paths import DEFAULT_DRIVER
from dra_bridge.api.quantity import format_quantity, parse_quantity

CAPACITY_CLASS = "vgpuctl-capacity-probe"
WHOLE_GPU = "whole GPU"


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
        return {"gpus": [g.to_dict() for g in self.gpus], "incomplete_pools": self.incomplete_pools,
                "notes": self.notes}

    def gpu(self, node: str | None, index_or_address) -> GpuCapacity | None:
        return next((g for g in self.gpus if (node is None or g.node == node)
                     and index_or_address in (g.index, g.gpu)), None)

    def fits(self, node: str | None, gpu, profile: str) -> int | None:
        g = self.gpu(node, gpu)
        p = next((p for p in g.profiles if p.profile == profile), None) if g else None
        return p.fits if p else None


def _attr(dev: dict, name: str, driver: str):
    attrs = dev.get("attributes") or {}
    v = attrs.get(name) or attrs.get(f"{driver}/{name}")
    return next(iter(v.values())) if isinstance(v, dict) and v else None


def _cel_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _probe(driver: str, kind: str, profile_attr: str | None, index: int | None, gpu: str | None) -> dict:
    """A claim for one device of ``profile`` on one GPU (by index, else by PCI address)."""
    d = _cel_str(driver)
    sels = [f"device.attributes[{d}].type == {_cel_str(kind)}"]
    if profile_attr is not None:
        sels.append(f"device.attributes[{d}].profile == {_cel_str(profile_attr)}")
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


def compute(slices: list[dict], claims: list[dict], *, driver: str = DEFAULT_DRIVER, selectors=None,
            nodes: list[str] | None = None) -> CapacityReport:
    """Per node and GPU of ``driver``: counters used, who holds what, and how many more of each
    published profile the scheduler would allocate now."""
    if selectors is None:
        from dra_bridge.sim.cluster import default_selectors

        selectors = default_selectors()
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
    raw: dict[tuple, dict] = {}
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
        groups: dict[str, list] = {}
        for d in pool.devices:  # one group per physical GPU: its counter set, else its PCI address
            rd = raw.get(d.key, {})
            gpu_attr = _attr(rd, "parentPciBusID", driver) or _attr(rd, "resource.kubernetes.io/pciBusID", driver)
            cs = d.consumes[0]["counterSet"] if d.consumes else f"gpu:{gpu_attr or d.name}"
            groups.setdefault(cs, []).append(d)
        for cs, devs in sorted(groups.items(), key=lambda kv: (kv[1][0].node or "", _gpu_index(kv[1], driver), kv[0])):
            first = raw.get(devs[0].key, {})
            gpu = _attr(first, "parentPciBusID", driver) or _attr(first, "resource.kubernetes.io/pciBusID", driver)
            index = _attr(first, "gpuIndex", driver)
            g = GpuCapacity(node=devs[0].node, pool=pool_name, driver=drv, gpu=gpu, index=index,
                            product=_attr(first, "productName", driver),
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
            by_profile: dict[tuple, list] = {}
            for d in devs:
                rd = raw.get(d.key, {})
                kind = _attr(rd, "type", driver) or "?"
                by_profile.setdefault((kind, _attr(rd, "profile", driver) if kind == "vgpu" else None), []).append(d)
            for (kind, prof), pdevs in sorted(by_profile.items(), key=lambda kv: _profile_order(kv[0], kv[1], raw)):
                rd = raw.get(pdevs[0].key, {})
                mem = (rd.get("capacity") or {}).get("memory")
                taken = sum(1 for d in pdevs if d.key in held)
                fits = _fits(alloc, now, driver, kind, prof, index, gpu, pdevs[0].node, limit=len(pdevs))
                g.profiles.append(ProfileFit(profile=prof if kind == "vgpu" else WHOLE_GPU, kind=kind,
                                             memory=int(parse_quantity(mem["value"])) if mem else None,
                                             published=len(pdevs), free_devices=len(pdevs) - taken, fits=fits))
            report.gpus.append(g)
    if nodes:
        report.gpus = [g for g in report.gpus if g.node in nodes]
    return report


def _gpu_index(devs: list, driver: str) -> int:
    v = devs[0].attribute("gpuIndex")
    return v if isinstance(v, int) else 1 << 30


def _profile_name(rd: dict, driver: str) -> str:
    kind = _attr(rd, "type", driver)
    return (_attr(rd, "profile", driver) or rd.get("name", "?")) if kind == "vgpu" else WHOLE_GPU


def _profile_order(key: tuple, devs: list, raw: dict):
    kind, prof = key
    mem = (raw.get(devs[0].key, {}).get("capacity") or {}).get("memory")
    size = parse_quantity(mem["value"]) if mem else 0
    return (kind != "vgpu", size, prof or "")


def _fits(alloc: Allocator, now, driver, kind, profile, index, gpu, node, *, limit: int) -> int:
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
    slices, claims = [], []

    def take(obj):
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


def from_file(path: str | Path) -> tuple[list[dict], list[dict]]:
    text = Path(path).read_text()
    try:
        docs = [json.loads(text)]
    except ValueError:
        docs = list(yaml.safe_load_all(text))
    return from_objects(docs)


def from_api(api_client) -> tuple[list[dict], list[dict]]:
    """Slices and claims through the official client (list calls; read-only)."""
    from kubernetes import client

    from dra_bridge.sim.cluster import raw as plain

    api = client.ResourceV1Api(api_client)
    return plain(api.list_resource_slice)["items"], plain(api.list_resource_claim_for_all_namespaces)["items"]


# --------------------------------------------------------------------------- output


def _human(q: str | None) -> str:
    if q is None:
        return "-"
    return format_quantity(parse_quantity(q), human=True)


def usage_text(g: GpuCapacity) -> str:
    if "memory" in g.totals:
        out = f"{_human(g.used.get('memory'))} of {_human(g.totals['memory'])}"
    elif "share" in g.totals:
        out = f"{g.used.get('share')} of {g.totals['share']} shares"
    else:
        out = "-"
    if "vgpus" in g.totals:
        out += f", {g.used.get('vgpus', 0)} of {g.totals['vgpus']} vGPUs"
    return out


def table(report: CapacityReport, *, only_fitting: bool = False) -> str:
    rows = [("NODE", "GPU", "ADDRESS", "MODEL", "IN USE", "PROFILE", "SIZE", "FITS", "OF")]
    for g in report.gpus:
        first = True
        for p in g.profiles:
            if only_fitting and not p.fits:
                continue
            head = (g.node or "*", "" if g.index is None else str(g.index), g.gpu or "?", g.product or "?",
                    usage_text(g)) if first else ("", "", "", "", "")
            rows.append(head + (p.profile, _human(str(p.memory)) if p.memory else "-", str(p.fits), str(p.published)))
            first = False
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    notes = list(report.notes)
    if report.incomplete_pools:
        notes.append("incomplete pools, not counted: " + ", ".join(report.incomplete_pools))
    if not report.gpus:
        notes.append("no GPU published by this driver")
    lines += [f"note: {n}" for n in notes]
    lines.append("FITS: more claims for one device of that profile the scheduler would allocate on that GPU now "
                 "(each profile alone); OF: devices of the profile published.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def add_parser(sub) -> None:
    c = sub.add_parser("capacity", help="how many more vGPUs of each profile (or whole GPUs) fit, per node and GPU",
                       description="Reads ResourceSlices and ResourceClaims from a cluster (--kubeconfig), from a "
                                   "file of objects (--from), or runs the simulated demo cluster with its workloads.")
    src = c.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE",
                     help="read the cluster (FILE, or $KUBECONFIG / ~/.kube/config / in-cluster when omitted)")
    src.add_argument("--from", dest="from_file", metavar="FILE",
                     help="objects in YAML/JSON, e.g. kubectl get resourceslices,resourceclaims -A -o yaml")
    c.add_argument("--empty", action="store_true", help="simulated cluster: without the demo workloads")
    c.add_argument("--server-version", default="1.35", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="simulated cluster: Kubernetes version (1.37 publishes every profile, with compatibility groups)")
    c.add_argument("--layout", default=None, choices=["demo", "all"],
                   help="simulated cluster: layout (default demo; all = every GPU offers every profile)")
    c.add_argument("--driver", default=DEFAULT_DRIVER)
    c.add_argument("--node", action="append", help="only this node (repeatable)")
    c.add_argument("--fitting", action="store_true", help="list only profiles of which at least one more fits")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_capacity)


def simulated(version: str = "1.35", layout: str | None = None, workloads: bool = True) -> CapacityReport:
    """Capacity of the simulated cluster of ``vgpuctl demo``, with its workloads running (or none)."""
    from dra_bridge.sim.cluster import SimCluster
    from dra_bridge.sim.demo import WORKLOADS, render_workload

    with SimCluster(version=version, layout_name=layout or "demo", health=False) as c:
        if workloads:
            for w in WORKLOADS:
                c.launch(render_workload(w), name=w.name)
        report = compute(c.slices(), c.claims(), driver=c.driver, selectors=c.selectors)
        report.notes.append(f"simulated cluster ({c.preset} node, layout {c.layout_name}, Kubernetes {version})"
                            + (", with the demo's workloads running" if workloads else ", empty"))
        return report


def cmd_capacity(args) -> int:
    if args.from_file:
        slices, claims = from_file(args.from_file)
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif args.kubeconfig is not None:
        from mdev_manager.cli.main import api_client_from

        slices, claims = from_api(api_client_from(args.kubeconfig or None))
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    else:
        report = simulated(args.server_version, args.layout, workloads=not args.empty)
        if args.node:
            report.gpus = [g for g in report.gpus if g.node in args.node]
    print(json.dumps(report.to_dict(), indent=2) if args.json else table(report, only_fitting=args.fitting))
    return 0
