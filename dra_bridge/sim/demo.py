"""``vgpuctl demo``: the whole system on a simulated cluster, in seconds, with nothing to install.

One simulated node from the catalog (two Tesla T4 with mdev, an A100 with mdev on SR-IOV VFs, an
L40S with NVIDIA vendor-specific VFIO), the node manager applying the demo layout, the DRA bridge
publishing ResourceSlices to an in-process API server, and a set of workloads as real objects:
VirtualMachines asking for vGPUs of two profiles through ResourceClaimTemplates, a VM with a whole
GPU passed through, a pod consuming a vfio device, and one workload too many. Each workload's
claims are made from its templates, allocated by the scheduler model, prepared by the kubelet
plugin over its real sockets (the vGPUs appear on the simulated host, which is checked), and run
the shipped health check on the device nodes they got. Then everything is torn down and the host
is checked to be clean again. The report shows, per physical GPU, who holds what and what is left,
and why the extra workload was refused.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any
from xml.sax.saxutils import escape

from dra_bridge.scheduling import capacity
from dra_bridge.sim.cluster import DEMO_LAYOUT, SimCluster, Workload
from dra_bridge.api.quantity import format_quantity


@dataclass(frozen=True)
class DemoWorkload:
    name: str
    what: str  # one line for people
    kind: str  # vm | pod
    values: dict
    expect: str = "Running"  # Running | Pending


WORKLOADS: tuple[DemoWorkload, ...] = (
    DemoWorkload("vm-t4-a", "VM: T4-8Q vGPU", "vm", {"gpus": {"T4-8Q": 1}}),
    DemoWorkload("vm-t4-b", "VM: T4-8Q vGPU", "vm", {"gpus": {"T4-8Q": 1}}),
    DemoWorkload("vm-a100", "VM: A100-10C vGPU", "vm", {"gpus": {"A100-10C": 1}}),
    DemoWorkload("vm-passthrough", "VM: a whole T4", "vm", {"passthrough": "TU104GL [Tesla T4]"}),
    DemoWorkload("vfio-pod", "pod: vfio device", "pod", {"profile": "L40S-12Q"}),
    DemoWorkload("vm-t4-c", "VM: T4-8Q vGPU", "vm", {"gpus": {"T4-8Q": 1}}, expect="Pending"),
)

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def render_workload(w: DemoWorkload) -> list[dict]:
    from kubevirt_templates.render import render

    if w.kind == "vm":
        return render("vm", {"name": w.name, "mode": "dra", **w.values})
    template = render("claim-template", {"profile": w.values["profile"]})
    name = template[0]["metadata"]["name"]
    return template + render("passthrough-pod", {"name": w.name, "claim_template": name})


# --------------------------------------------------------------------------- the report


@dataclass
class Holder:
    workload: str
    kind: str  # vgpu | passthrough
    profile: str
    memory: int | None
    device: str
    host_id: str | None
    iommu_group: int | None


@dataclass
class GpuView:
    index: int | None
    address: str | None
    model: str | None
    framework: str
    counter_set: str | None
    memory_total: int | None  # bytes
    memory_used: int
    vgpus_total: int | None
    vgpus_used: int
    holders: list[Holder] = field(default_factory=list)
    left: list[dict] = field(default_factory=list)  # {"profile", "fits", "of"}


@dataclass
class DemoReport:
    node: str
    preset: str
    kubernetes: str
    cel: str
    layout: dict = field(default_factory=dict)
    slices: dict = field(default_factory=dict)
    workloads: list[dict] = field(default_factory=list)
    gpus: list[GpuView] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    host_problems: list[str] = field(default_factory=list)
    teardown: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _bytes(q: str | None) -> int | None:
    from dra_bridge.api.quantity import parse_quantity

    return int(parse_quantity(q)) if q is not None else None


def _human(b: int | Fraction | None) -> str:
    return "-" if b is None else format_quantity(Fraction(b), human=True)


def _gpu_views(c: SimCluster, owners: dict[str, Workload], frameworks: dict[str, str]) -> list[GpuView]:
    """Per physical GPU: the counters (from the slices), who holds what (claims -> workloads, and
    the host identity the workload got), and what more fits (the capacity module)."""
    report = capacity.compute(c.slices(), c.claims(), driver=c.driver, selectors=c.selectors)
    out = []
    for g in report.gpus:
        view = GpuView(index=g.index, address=g.gpu, model=g.product, framework=frameworks.get(g.gpu or "", "?"),
                       counter_set=g.counter_set, memory_total=_bytes(g.totals.get("memory")),
                       memory_used=_bytes(g.used.get("memory")) or 0,
                       vgpus_total=int(g.totals["vgpus"]) if "vgpus" in g.totals else None,
                       vgpus_used=int(g.used.get("vgpus", 0) or 0))
        for h in g.holders:
            claim = h["claim"].split("/", 1)[-1]
            w = owners.get(claim)
            dev = next((d for d in (w.devices if w else []) if d.device == h["device"]), None)
            view.holders.append(Holder(workload=w.name if w else claim, kind=dev.kind if dev else "?",
                                       profile=h["profile"], memory=int(dev.memory) if dev and dev.memory else None,
                                       device=h["device"], host_id=dev.host_id if dev else None,
                                       iommu_group=dev.iommu_group if dev else None))
        view.left = [{"profile": p.profile, "fits": p.fits, "of": p.published} for p in g.profiles]
        out.append(view)
    return out


def _refusal_detail(w: Workload, gpus: list[GpuView], profile: str) -> list[str]:
    """Per GPU that publishes the profile the workload asked for: why it cannot take it."""
    lines = []
    for g in gpus:
        if not any(left["profile"] == profile for left in g.left):
            continue
        whole = [h for h in g.holders if h.kind == "passthrough"]
        label = f"GPU {g.index} ({g.address})"
        if whole:
            lines.append(f"{label}: the whole GPU is passed through to {whole[0].workload}")
        elif g.holders:
            held = ", ".join(f"{h.workload} ({h.profile}, {_human(h.memory)})" for h in g.holders)
            free = (g.memory_total or 0) - g.memory_used
            lines.append(f"{label}: {_human(g.memory_used)} of {_human(g.memory_total)} in use by {held}; "
                         + (f"{_human(free)} left" if free else "nothing left"))
        else:
            lines.append(f"{label}: free, yet refused (unexpected)")
    others = sorted({g.model or "?" for g in gpus if not any(left["profile"] == profile for left in g.left)})
    if others:
        lines.append(f"{', '.join(others)}: no {profile} devices published")
    return lines


def run_demo(version: str = "1.35", *, selectors=None, progress=None) -> DemoReport:
    """Run the demo end to end; ``progress(str)`` is called as steps complete."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    with SimCluster(version=version, selectors=selectors) as c:
        inv = c.inventory()
        rep = DemoReport(node=c.node, preset=c.preset, kubernetes=c.srv.git_version,
                         cel=type(c.selectors).__name__)
        rep.layout = {"name": c.layout_name, "gpus": [
            {"index": g.index, "address": g.address, "model": g.model, "framework": g.framework,
             "vfs": g.sriov_num_vfs} for g in inv.gpus], "text": DEMO_LAYOUT}
        slices = c.slices()
        rep.slices = {"count": len(slices),
                      "devices": sum(len(s["spec"].get("devices") or []) for s in slices),
                      "counter_sets": sum(len(s["spec"].get("sharedCounters") or []) for s in slices),
                      "generation": max((s["spec"]["pool"]["generation"] for s in slices), default=0),
                      "plugin_socket": c.kubelet.endpoint}
        say("node and DRA bridge up")
        owners: dict[str, Workload] = {}
        launched: list[tuple[DemoWorkload, Workload]] = []
        for spec in WORKLOADS:
            w = c.launch(render_workload(spec), name=spec.name)
            for claim, _ in w.claims:
                owners[claim] = w
            launched.append((spec, w))
            if w.phase != spec.expect:
                rep.problems.append(f"{spec.name}: {w.phase} ({w.reason}), expected {spec.expect}")
            if w.health is not None and w.health.result == "Fail":
                rep.problems.append(f"{spec.name}: health check failed: {w.health.summary()}")
            say(f"{spec.name}: {w.phase}")
        for spec, w in launched:
            rep.host_problems += c.host_problems(w)
        rep.problems += rep.host_problems
        rep.gpus = _gpu_views(c, owners, {g.address: g.framework for g in inv.gpus})
        for spec, w in launched:
            d = w.to_dict()
            d["what"] = spec.what
            rep.workloads.append(d)
            if w.phase == "Pending":
                profile = next(iter(spec.values.get("gpus", {}) or {}), None) or spec.values.get("profile") or "?"
                rep.refused.append({"workload": w.name, "asked": profile, "reason": w.reason,
                                    "per_gpu": _refusal_detail(w, rep.gpus, profile)})
        # ---- teardown
        before = {v.id for v in c.inventory().all_vgpus()}
        passed_through = [d.gpu for _, w in launched for d in w.devices if d.kind == "passthrough"]
        for _, w in reversed(launched):
            c.teardown(w)
        after = c.inventory()
        leftovers = [v.id for v in after.all_vgpus()]
        still_vfio = [a for a in passed_through if (g := after.gpu(a)) is not None and g.driver == "vfio-pci"]
        rep.teardown = {"workloads": len(launched), "vgpus_removed": len(before) - len(leftovers),
                        "gpus_returned": [a for a in passed_through if a not in still_vfio],
                        "claims_left": len(c.claims()), "prepared_left": len(c.daemon.driver.cp.claims),
                        "cdi_files_left": len(list((c.base / "cdi").glob("*.json"))),
                        "vgpus_left": leftovers, "still_on_vfio": still_vfio}
        for key in ("claims_left", "prepared_left", "cdi_files_left"):
            if rep.teardown[key]:
                rep.problems.append(f"teardown: {key} = {rep.teardown[key]}")
        if leftovers or still_vfio:
            rep.problems.append(f"teardown: host not clean: vGPUs {leftovers}, on vfio-pci {still_vfio}")
        say("torn down")
    rep.seconds = round(time.perf_counter() - t0, 2)
    return rep


# --------------------------------------------------------------------------- text


def _bar(used: int, total: int | None, width: int = 20) -> str:
    if not total:
        return "[" + "?" * width + "]"
    n = round(width * used / total)
    return "[" + "#" * n + "." * (width - n) + "]"


def _identity(d: dict) -> str:
    if d["kind"] == "passthrough":
        return f"{d['host_id']} on vfio-pci"
    hid = d.get("host_id") or "?"
    return f"VF {hid}" if hid.count(":") == 2 else f"mdev {hid}"


def text(rep: DemoReport) -> str:
    L: list[str] = []
    models = {}
    for g in rep.layout["gpus"]:
        models[g["model"]] = models.get(g["model"], 0) + 1
    hw = ", ".join(f"{n} x {m}" if n > 1 else m for m, n in models.items())
    L.append(f"vgpuctl demo: simulated node {rep.node} ({hw}); in-process Kubernetes {rep.kubernetes} API")
    L.append("")
    vfs = [f"{g['vfs']} VFs on {g['address']}" for g in rep.layout["gpus"] if g["vfs"]]
    L.append(f"[1] node manager  applied layout {rep.layout['name']!r}: {len(rep.layout['gpus'])} GPUs handed to the "
             f"DRA bridge" + (f"; SR-IOV enabled: {', '.join(vfs)}" if vfs else ""))
    s = rep.slices
    L.append(f"[2] DRA bridge    published {s['count']} ResourceSlices (pool {rep.node}, generation {s['generation']}): "
             f"{s['devices']} devices, {s['counter_sets']} counter sets (one per GPU)")
    L.append(f"                  kubelet plugin registered; serving {s['plugin_socket']}")
    L.append("[3] workloads     claims from ResourceClaimTemplates, allocated by the scheduler model, prepared "
             "by the plugin over gRPC, health-checked")
    width = max(len(w["name"]) for w in rep.workloads)
    for w in rep.workloads:
        head = f"    {w['name']:<{width}}  {w['what']:<17}"
        if w["phase"] != "Running":
            L.append(f"{head}  {w['phase']}")
            continue
        for d in w["devices"]:
            nodes = " ".join(n["path"] for n in d["device_nodes"] if n["path"] != "/dev/vfio/vfio")
            health = (w.get("health") or {}).get("result", "-")
            L.append(f"{head}  Running  {d['device']} -> {_identity(d)}, {nodes}, health {health}")
            head = " " * len(head)
    if rep.host_problems:
        L += [f"    host check FAILED: {p}" for p in rep.host_problems]
    else:
        running = [d for w in rep.workloads for d in w["devices"]]
        nv = sum(1 for d in running if d["kind"] == "vgpu")
        L.append(f"    host check: all {nv} vGPUs exist on the simulated host on the GPU the slice named; "
                 f"{len(running) - nv} whole GPU bound to vfio-pci")
    L.append("[4] per physical GPU (memory counter: used of total)")
    for g in rep.gpus:
        L.append(f"    GPU {g.index}  {g.address}  {g.model}  ({g.framework})  {_bar(g.memory_used, g.memory_total)} "
                 f"{_human(g.memory_used)} of {_human(g.memory_total)}, {g.vgpus_used} of {g.vgpus_total} vGPUs")
        for h in g.holders:
            who = f"{h.host_id} on vfio-pci" if h.kind == "passthrough" else (
                f"VF {h.host_id}" if (h.host_id or "").count(":") == 2 else f"mdev {h.host_id}")
            L.append(f"        {h.workload:<{width}}  {h.profile:<10} {_human(h.memory):>7}  {who}")
        fits = [f"{x['fits']} x {x['profile']}" for x in g.left if x["fits"]]
        L.append("        left: " + (", or ".join(fits) if fits else "nothing"))
    if rep.refused:
        L.append("[5] refused")
        for r in rep.refused:
            L.append(f"    {r['workload']} asked for a {r['asked']} vGPU and stays Pending. Scheduler: {r['reason']}")
            L += [f"        {line}" for line in r["per_gpu"]]
    t = rep.teardown
    L.append(f"[6] teardown      {t['workloads']} workloads removed: the kubelet unprepared their claims over gRPC "
             f"({t['vgpus_removed']} vGPUs removed" + (f", {', '.join(t['gpus_returned'])} back from vfio-pci"
                                                      if t["gpus_returned"] else "") +
             "), then claims, pods and VMs were deleted; " +
             ("host clean" if not (t["vgpus_left"] or t["still_on_vfio"]) else "host NOT clean"))
    L.append("")
    L.append(("done" if rep.ok else "FAILED: " + "; ".join(rep.problems)) + f" in {rep.seconds:.1f} s")
    return "\n".join(L)


# --------------------------------------------------------------------------- picture


def svg(rep: DemoReport) -> str:
    """Each GPU's memory as a bar (scaled to the largest GPU), one segment per workload holding a
    share of it; the refused workload below."""
    left, bar_w, bar_h, row_h, top = 270, 600, 30, 74, 64
    biggest = max((g.memory_total or 0) for g in rep.gpus) or 1
    colors: dict[str, str] = {}
    for w in rep.workloads:
        colors.setdefault(w["name"], PALETTE[len(colors) % len(PALETTE)])
    height = top + row_h * len(rep.gpus) + 40 + 22 * sum(1 + len(r["per_gpu"]) for r in rep.refused)
    width = left + bar_w + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="16" y="26" font-size="16" font-weight="bold">GPU occupancy on {escape(rep.node)}</text>',
           f'<text x="16" y="46" fill="#555">bar length = framebuffer; segments = workloads holding a share '
           f'(vGPU) or all of it (passthrough)</text>']
    y = top
    for g in rep.gpus:
        total = g.memory_total or 0
        full = bar_w * total / biggest if total else bar_w
        out.append(f'<text x="16" y="{y + 14}" font-weight="bold">GPU {g.index}  {escape(g.address or "")}</text>')
        out.append(f'<text x="16" y="{y + 30}" fill="#555">{escape(g.model or "")} ({escape(g.framework)})</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{full:.1f}" height="{bar_h}" fill="#e8e8e8" stroke="#999"/>')
        x = float(left)
        for h in g.holders:
            mem = h.memory or 0
            seg = full * mem / total if total else 0
            color = colors.get(h.workload, "#888")
            label = f"{h.workload} · {h.profile}"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{seg:.1f}" height="{bar_h}" fill="{color}" stroke="#fff">'
                       f'<title>{escape(label)} · {escape(_human(h.memory))} · {escape(h.host_id or "")}</title></rect>')
            if seg > 7 * len(label) * 0.85:
                out.append(f'<text x="{x + 6:.1f}" y="{y + 19}" fill="#fff" font-size="11">{escape(label)}</text>')
            else:
                out.append(f'<text x="{x + 2:.1f}" y="{y + bar_h + 13}" font-size="10" fill="{color}">'
                           f'{escape(h.workload)}</text>')
            x += seg
        free = total - g.memory_used
        caption = f"{_human(g.memory_used)} of {_human(total)} used"
        fits = [f"{x_['fits']} x {x_['profile']}" for x_ in g.left if x_["fits"]]
        caption += "; fits " + ", or ".join(fits) if fits else "; full"
        if free > 0 and (left + full - x) > 60:
            out.append(f'<text x="{x + 6:.1f}" y="{y + 19}" fill="#666">free {escape(_human(free))}</text>')
        out.append(f'<text x="{left}" y="{y + bar_h + 28}" fill="#333" font-size="11">{escape(caption)}</text>')
        y += row_h
    y += 10
    for r in rep.refused:
        out.append(f'<text x="16" y="{y}" fill="#c0392b" font-weight="bold">refused: {escape(r["workload"])} '
                   f'({escape(r["asked"])}): stays Pending</text>')
        y += 22
        for line in r["per_gpu"]:
            out.append(f'<text x="32" y="{y}" fill="#c0392b">{escape(line)}</text>')
            y += 22
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_json(rep: DemoReport) -> str:
    def default(o: Any):
        if isinstance(o, Fraction):
            return float(o)
        raise TypeError(type(o).__name__)

    d = rep.to_dict()
    d["layout"] = {k: v for k, v in d["layout"].items() if k != "text"}
    return json.dumps(d, indent=2, default=default)


# --------------------------------------------------------------------------- command line


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="run the whole system on a simulated cluster (no cluster, no GPU, seconds)",
                       description="A simulated GPU node, the node manager, the DRA bridge publishing to an "
                                   "in-process API, VMs and a pod claiming vGPUs and whole GPUs, torn down again.")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--svg", metavar="FILE", help="also write a picture of each GPU's occupancy")
    d.add_argument("--server-version", default="1.35", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="Kubernetes version the in-process API serves (slice layout, compatibility groups)")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    import sys

    rep = run_demo(args.server_version,
                   progress=(lambda m: print(f"  ... {m}", file=sys.stderr, flush=True)) if args.verbose else None)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(rep))
    print(to_json(rep) if args.json else text(rep))
    if args.svg and not args.json:
        print(f"picture: {args.svg}")
    return 0 if rep.ok else 1
