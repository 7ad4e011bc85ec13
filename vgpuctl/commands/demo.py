"""``vgpuctl demo``: the whole system on a simulated cluster; the report as text, JSON or SVG."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from fractions import Fraction
from html import escape  # not xml.sax.saxutils: that loads urllib and email (-h stays light)
from typing import TYPE_CHECKING

from dra_bridge.api.compat import describe, parse_gates, version_tuple
from vgpuctl.cli import options
from vgpuctl.output.tables import fit_text, short_model

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from dra_bridge.sim.demo import DemoReport, GpuView, Holder


def add_arguments(d: argparse.ArgumentParser) -> None:
    options.add_output(d)
    d.add_argument("--svg", metavar="FILE", help="also write a picture of each GPU's occupancy")
    d.add_argument("--preset", choices=DEMO_PRESETS, default="default",
                   help="the simulated node: default (T4s, an A100 in MIG mode, an L40S in mixed-size mode), or "
                   "rtxpro-node (4 x RTX PRO 6000 Blackwell: time-sliced, mixed-size, MIG with a VM and a pod "
                   "sharing one GPU instance, whole) (default: default)")
    options.add_server_version(d, "the in-process API server (its DRA features and slice layout)")
    options.add_feature_gates(d)


#: dra_bridge.sim.demo.PRESETS' names (not imported here: -h stays light)
DEMO_PRESETS = ("default", "rtxpro-node")


def run(args: argparse.Namespace) -> int:
    import yaml

    from dra_bridge.sim.demo import run_demo
    from kubevirt_templates.render import render

    version_tuple(args.server_version)
    rep = run_demo(args.server_version, render=render, feature_gates=parse_gates(args.feature_gates), preset=args.preset,
                   progress=(lambda m: print(f"  ... {m}", file=sys.stderr, flush=True)) if args.verbose else None)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(rep))
    machine = args.output in ("json", "yaml")
    if args.output == "yaml":
        print(yaml.safe_dump(json.loads(to_json(rep)), sort_keys=False).rstrip())
    else:
        print(to_json(rep) if machine else text(rep))
    if args.svg and not machine:
        print(f"picture: {args.svg}")
    return 0 if rep.ok else 1


# --------------------------------------------------------------------------- text


def gates_line(rep: DemoReport) -> str:
    """The server's feature gates as the demo ran them: the version's defaults, and what differs."""
    version = version_tuple(rep.kubernetes)
    changed = describe(rep.feature_gates, version)
    on = sorted(g for g in SHOWN_GATES if rep.feature_gates.get(g))
    off = sorted(g for g in SHOWN_GATES if g in rep.feature_gates and not rep.feature_gates[g])
    return (f"feature gates: {version[0]}.{version[1]}'s defaults" + (f" with {changed}" if changed else "")
            + f"; on: {', '.join(on) or 'none'}" + (f"; off: {', '.join(off)}" if off else ""))


#: The gates that decide what the node agent publishes (schema.md, "shapes").
SHOWN_GATES = ("DRAPartitionableDevices", "DRADeviceBindingConditions", "DRADeviceCompatibilityGroups",
               "DRAExtendedResource", "DRAPrioritizedList")


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
    from dra_bridge.sim.demo import _human

    L: list[str] = []
    models: dict[str, int] = {}
    for g in rep.layout["gpus"]:
        models[short_model(g["model"])] = models.get(short_model(g["model"]), 0) + 1
    hw = ", ".join(f"{n} x {m}" if n > 1 else m for m, n in models.items())
    L.append(f"vgpuctl demo: simulated node {rep.node} ({hw}); in-process Kubernetes {rep.kubernetes} API")
    L.append("  " + gates_line(rep))
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
        head = f"    {w['name']:<{width}}  {w['what']:<18}"
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
        L.append(f"    GPU {g.index}  {g.address}  {short_model(g.model)}  ({g.framework})  "
                 f"{_bar(g.memory_used, g.memory_total)} "
                 f"{_human(g.memory_used)} of {_human(g.memory_total)}, "
                 + ("passed through whole" if any(h.kind == "passthrough" for h in g.holders)
                    else f"{g.slices_used} of {g.slices_total} memory slices (MIG)" if g.slices_total
                    else f"{len(g.holders)} vGPUs on {g.slots_total} slots of 1 GiB (mixed-size)" if g.slots_total
                    else f"{g.vgpus_used} of {g.vgpus_total} vGPUs"))
        for h in g.holders:
            who = f"{h.host_id} on vfio-pci" if h.kind == "passthrough" else (
                f"VF {h.host_id}" if (h.host_id or "").count(":") == 2 else f"mdev {h.host_id}")
            if h.classic:  # virt-launcher found it in MDEV_PCI_RESOURCE_<R> / PCI_RESOURCE_<R>, as from a device plugin
                who += " (by deviceName, through its resource variable)"
            if h.slots and h.kind != "passthrough":  # mixed-size: where it sits
                who += f", slots {h.slots[0]}-{h.slots[0] + h.slots[1] - 1}"
            if h.instance is not None and h.inside is not None:  # MIG time-slicing: where inside its instance
                who += f", GPU instance at slice {h.instance[0]}, placement {h.inside} inside it"
            L.append(f"        {h.owner:<3} {h.workload:<{width}}  {h.profile:<10} {_human(h.memory):>7}  {who}")
        for gi in (x for x in rep.shared_instances if x["gpu"] == g.index):
            held = " and ".join(f"{h['owner']} {h['workload']} at {h['placement']}" for h in gi["holders"])
            L.append(f"        one GPU instance ({gi['holders'][0]['profile']}, memory slices {gi['slices'][0]}-"
                     f"{sum(gi['slices']) - 1}) shared: {held}, each its own vGPU")
        shared = next((x for x in rep.shared if x["gpu"] == g.index), None)
        if shared:
            L.append(f"        one counter set ({shared['counter_set']}): VM {', '.join(shared['vms'])} and pod "
                     f"{', '.join(shared['pods'])} draw on the same {_human(shared['memory_total'])}")
        fits = [f"{x['fits']} x {x['profile']}" for x in g.left if x["fits"]]
        L.append("        left: " + (", or ".join(fits) if fits else "nothing"))
    if rep.refused:
        L.append("[5] refused")
        for r in rep.refused:
            asked = "a whole GPU" if r.get("whole") else f"a {r['asked']} vGPU"
            L.append(f"    {r.get('owner', '')} {r['workload']} asked for {asked} and stays Pending. "
                     f"Scheduler: {r['reason']}")
            L += [f"        {line}" for line in r["per_gpu"]]
    t = rep.teardown
    L.append(f"[6] teardown      {t['workloads']} workloads removed: the kubelet unprepared their claims over gRPC "
             f"({t['vgpus_removed']} vGPUs removed" + (f", {', '.join(t['gpus_returned'])} back from vfio-pci"
                                                      if t["gpus_returned"] else "") +
             "), then claims, pods and VMs were deleted; " +
             ("host clean" if not (t["vgpus_left"] or t["still_on_vfio"]) else "host NOT clean"))
    L.append("")
    L.append(("done" if rep.ok else "FAILED: " + "; ".join(rep.problems)) + f" in {rep.seconds:.1f} s")
    return fit_text("\n".join(L))  # 80 columns: a long line goes on indented below


# --------------------------------------------------------------------------- picture

VM_COLORS = ("#2f6fae", "#5d9bd6", "#1c4a7a", "#86b6e3")  # VMs: blues, solid
POD_COLORS = ("#d9661a", "#f09a4a", "#a94d0c")  # pods: oranges, hatched
FREE, REFUSED = "#e8e8e8", "#c0392b"
_CHAR = 6.4  # px per character at 11 px sans-serif, for fitting labels


def _colors(rep: DemoReport) -> dict[str, str]:
    """A colour per workload: a blue for each VM, an orange for each pod."""
    out: dict[str, str] = {}
    vms = pods = 0
    for w in rep.workloads:
        if w["kind"] == "VirtualMachine":
            out[w["name"]], vms = VM_COLORS[vms % len(VM_COLORS)], vms + 1
        else:
            out[w["name"]], pods = POD_COLORS[pods % len(POD_COLORS)], pods + 1
    return out


def _swatch(x: float, y: float, fill: str, *, hatch: bool = False, dashed: bool = False, w: float = 16,
            h: float = 14) -> list[str]:
    if dashed:
        return [f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" fill="#fdecea" stroke="{REFUSED}" '
                f'stroke-width="1.5" stroke-dasharray="4 3"/>']
    out = [f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" fill="{fill}" stroke="#fff"/>']
    if hatch:
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" fill="url(#pod-hatch)"/>')
    return out


def _legend(y: int) -> list[str]:
    entries = [(VM_COLORS[0], False, False, "VM: vGPU or whole GPU (virt-launcher pod's claim)"),
               (POD_COLORS[0], True, False, "pod: vGPU as a vfio device"),
               (FREE, False, False, "free framebuffer"),
               ("", False, True, "refused request (stays Pending)")]
    out = [f'<g class="legend"><text x="16" y="{y + 11}" font-weight="bold">Legend</text>']
    x = 76.0
    for fill, hatch, dashed, label in entries:
        out += _swatch(x, y, fill, hatch=hatch, dashed=dashed)
        out.append(f'<text x="{x + 22:.1f}" y="{y + 11}">{escape(label)}</text>')
        x += 22 + len(label) * _CHAR + 24
    out.append("</g>")
    return out


def _segment(out: list[str], h: Holder, x: float, y: float, seg: float, bar_h: int, color: str) -> None:
    """One workload's share of a GPU: colour by kind, hatched for pods, labelled with who it is."""
    from dra_bridge.sim.demo import _human

    pod = h.owner == "pod"
    title = f"{h.owner} {h.workload} · {h.profile} · {_human(h.memory)} · {h.host_id or ''}"
    if h.slots and h.kind != "passthrough":
        title += f" · slots {h.slots[0]}-{h.slots[0] + h.slots[1] - 1}"
    out.append(f'<rect class="holder {h.owner.lower()}" x="{x:.1f}" y="{y}" width="{seg:.1f}" height="{bar_h}" '
               f'fill="{color}" stroke="#fff"><title>{escape(title)}</title></rect>')
    if pod:
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{seg:.1f}" height="{bar_h}" fill="url(#pod-hatch)"/>')
    who, what = f"{h.owner} {h.workload}", h.profile if h.kind != "passthrough" else "whole GPU"
    ink = "#2b1300" if pod else "#fff"  # dark on the hatched orange, white on the solid blue
    if seg > max(len(who), len(what)) * _CHAR + 10:
        out.append(f'<text x="{x + 6:.1f}" y="{y + 15}" fill="{ink}" font-size="11" font-weight="bold">'
                   f'{escape(who)}</text>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + 29}" fill="{ink}" font-size="11">{escape(what)}</text>')
    else:
        out.append(f'<text x="{x + 2:.1f}" y="{y + bar_h + 13}" font-size="10" fill="{color}">{escape(who)}</text>')


def _ghosts(rep: DemoReport, g: GpuView) -> list[tuple[dict, int]]:
    """Refused requests to draw on this GPU: it publishes the profile asked for and its counters
    (not a passthrough) are what ran out; with the memory one instance needs."""
    out: list[tuple[dict, int]] = []
    if any(h.kind == "passthrough" for h in g.holders):
        return out
    for r in rep.refused:
        left = next((x for x in g.left if x["profile"] == r["asked"]), None)
        if left is not None and not left["fits"] and left.get("memory"):
            out.append((r, int(left["memory"])))
    return out


def slot_map(g: GpuView, left: float, y: float, full: float, bar_h: int) -> list[str]:
    """A GPU in mixed-size mode as its row of 1 GiB slots: a tick per slot, the first slot of each
    vGPU and the end under the bar, and the free runs named (which slots each vGPU holds)."""
    px = full / g.slots_total
    out = ['<g class="slot-map">', f'<text x="16" y="{y + 46}" fill="#555" font-size="11">mixed-size mode: '
           f'{g.slots_total} slots of 1 GiB</text>']
    out += [f'<line x1="{left + k * px:.1f}" y1="{y + bar_h - 5}" x2="{left + k * px:.1f}" y2="{y + bar_h}" '
            'stroke="#999" stroke-width="0.6"/>' for k in range(1, g.slots_total)]
    held = sorted(h.slots for h in g.holders if h.slots and h.kind != "passthrough")
    marks = sorted({0, g.slots_total, *(a for a, _ in held), *(a + n for a, n in held)})
    out += [f'<text x="{left + k * px:.1f}" y="{y + bar_h + 10}" font-size="9" fill="#555" text-anchor="middle">'
            f'{k}</text>' for k in marks]
    start = 0
    for a, n in [*held, (g.slots_total, 0)]:
        label = f"free slots {start}-{a - 1}"
        if a > start and (a - start) * px > len(label) * _CHAR + 10:  # a free run wide enough to name
            out.append(f'<text x="{left + start * px + 6:.1f}" y="{y + 22}" fill="#666" font-size="11">'
                       f'{label}</text>')
        start = max(start, a + n)
    out.append("</g>")
    return out


def svg(rep: DemoReport) -> str:
    """Each GPU's framebuffer (its counter set) as a bar scaled to the largest GPU, one segment per
    workload holding a share: VMs in blue, pods in hatched orange, each labelled; a refused request
    as a dashed red box past the end of the GPU it did not fit on; a legend on top."""
    from dra_bridge.sim.demo import _human

    left, bar_w, bar_h, row_h, top = 280, 620, 36, 86, 112
    biggest = max((g.memory_total or 0) for g in rep.gpus) or 1
    colors = _colors(rep)
    wrap = 150
    refusal_lines = sum(2 + len(textwrap.wrap(f"scheduler: {r['reason']}", wrap)) + len(r["per_gpu"])
                        for r in rep.refused)
    width = left + bar_w + 200
    height = top + row_h * len(rep.gpus) + 10 + 20 * refusal_lines
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           '<defs><pattern id="pod-hatch" patternUnits="userSpaceOnUse" width="8" height="8" '
           'patternTransform="rotate(45)"><rect width="3" height="8" fill="#ffffff" fill-opacity="0.45"/>'
           '</pattern></defs>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="16" y="26" font-size="16" font-weight="bold">GPU occupancy on {escape(rep.node)}: '
           f'VMs and pods, one accounting</text>',
           '<text x="16" y="46" fill="#555">one bar = one physical GPU = one counter set (its framebuffer, '
           'scaled to the largest GPU); every VM and pod holding a vGPU or the whole GPU draws on it</text>']
    out += _legend(62)
    y = top
    for g in rep.gpus:
        total = g.memory_total or 0
        full = bar_w * total / biggest if total else bar_w
        out.append(f'<text x="16" y="{y + 14}" font-weight="bold">GPU {g.index}  {escape(g.address or "")}</text>')
        out.append(f'<text x="16" y="{y + 30}" fill="#555">{escape(g.model or "")} ({escape(g.framework)})</text>')
        out.append(f'<rect class="gpu" x="{left}" y="{y}" width="{full:.1f}" height="{bar_h}" fill="{FREE}" '
                   f'stroke="#999"/>')
        x = float(left)
        for h in g.holders:
            if g.slots_total and h.slots:  # mixed-size: drawn where it sits, on the GPU's slot map
                x = left + full * h.slots[0] / g.slots_total
            seg = full * (h.memory or 0) / total if total else 0
            _segment(out, h, x, y, seg, bar_h, colors.get(h.workload, "#888"))
            x += seg
        free = total - g.memory_used
        if g.slots_total:
            out += slot_map(g, left, y, full, bar_h)
        elif free > 0 and (left + full - x) > 60:
            out.append(f'<text x="{x + 6:.1f}" y="{y + 22}" fill="#666">free {escape(_human(free))}</text>')
        gx = left + full + 6
        for r, mem in _ghosts(rep, g):
            gw = full * mem / total if total else 40
            out += _swatch(gx, y, "", dashed=True, w=round(gw, 1), h=bar_h)
            out.append(f'<text x="{gx + 5:.1f}" y="{y + 15}" fill="{REFUSED}" font-size="11" font-weight="bold">'
                       f'{escape(r.get("owner", ""))} {escape(r["workload"])}</text>')
            out.append(f'<text x="{gx + 5:.1f}" y="{y + 29}" fill="{REFUSED}" font-size="11">'
                       f'{escape(r["asked"])}: refused</text>')
            gx += gw + 6
        caption = f"{_human(g.memory_used)} of {_human(total)} used"
        fits = [f"{x_['fits']} x {x_['profile']}" for x_ in g.left if x_["fits"]]
        caption += ("; fits " + ", or ".join(fits)) if fits else "; full"
        shared = next((s_ for s_ in rep.shared if s_["gpu"] == g.index), None)
        if shared:
            caption += (f" · shared by VM {', '.join(shared['vms'])} and pod {', '.join(shared['pods'])}: "
                        "one counter set")
        weight = ' font-weight="bold"' if shared else ""
        out.append(f'<text x="{left}" y="{y + bar_h + 30}" fill="#333" font-size="11"{weight}>'
                   f'{escape(caption)}</text>')
        y += row_h
    y += 10
    for r in rep.refused:
        out.append(f'<text x="16" y="{y}" fill="{REFUSED}" font-weight="bold">refused: {escape(r.get("owner", ""))} '
                   f'{escape(r["workload"])} asked for {escape(r["asked"])} and stays Pending</text>')
        y += 20
        for line in textwrap.wrap(f"scheduler: {r['reason']}", wrap):
            out.append(f'<text x="32" y="{y}" fill="{REFUSED}">{escape(line)}</text>')
            y += 20
        for line in r["per_gpu"]:
            out.append(f'<text x="32" y="{y}" fill="{REFUSED}">{escape(line)}</text>')
            y += 20
        y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_json(rep: DemoReport) -> str:
    def default(o: object) -> float:
        if isinstance(o, Fraction):
            return float(o)
        raise TypeError(type(o).__name__)

    d = rep.to_dict()
    d["layout"] = {k: v for k, v in d["layout"].items() if k != "text"}
    return json.dumps(d, indent=2, default=default)
