"""``vgpuctl demo``: the whole system on a simulated cluster; the report as text, JSON or SVG."""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any
from xml.sax.saxutils import escape

from dra_bridge.sim.demo import PALETTE, DemoReport, _human, run_demo


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--svg", metavar="FILE", help="also write a picture of each GPU's occupancy")
    d.add_argument("--server-version", default="1.35", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="Kubernetes version the in-process API serves (slice layout, compatibility groups; "
                        "default %(default)s)")


def run(args) -> int:
    rep = run_demo(args.server_version,
                   progress=(lambda m: print(f"  ... {m}", file=sys.stderr, flush=True)) if args.verbose else None)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(rep))
    print(to_json(rep) if args.json else text(rep))
    if args.svg and not args.json:
        print(f"picture: {args.svg}")
    return 0 if rep.ok else 1


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
