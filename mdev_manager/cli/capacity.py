"""``vgpuctl capacity``: how many more of each profile fit, per node and GPU, as a table or JSON."""

from __future__ import annotations

import argparse
import json

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.quantity import format_quantity, parse_quantity
from dra_bridge.scheduling.capacity import CapacityReport, GpuCapacity, compute, from_file
from dra_bridge.sim.scenarios import simulated_capacity


def add_arguments(c: argparse.ArgumentParser) -> None:
    src = c.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE",
                     help="read the cluster (FILE, or $KUBECONFIG / ~/.kube/config / in-cluster when omitted)")
    src.add_argument("--from", dest="from_file", metavar="FILE",
                     help="objects in YAML/JSON, e.g. kubectl get resourceslices,resourceclaims -A -o yaml")
    c.add_argument("--empty", action="store_true", help="simulated cluster: without the demo workloads")
    c.add_argument("--server-version", default="1.35", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="simulated cluster: Kubernetes version (default %(default)s; 1.37 publishes every profile, with compatibility groups)")
    c.add_argument("--layout", default=None, choices=["demo", "all"],
                   help="simulated cluster: layout (default demo; all = every GPU offers every profile)")
    c.add_argument("--driver", default=DEFAULT_DRIVER, help="DRA driver name (default %(default)s)")
    c.add_argument("--node", action="append", help="only this node (repeatable)")
    c.add_argument("--fitting", action="store_true", help="list only profiles of which at least one more fits")
    c.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    if args.from_file:
        slices, claims = from_file(args.from_file)
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif args.kubeconfig is not None:
        from dra_bridge.kube.client import connect
        from dra_bridge.kube.workloads import slices_and_claims

        slices, claims = slices_and_claims(connect(args.kubeconfig or None))
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    else:
        report = simulated_capacity(args.server_version, args.layout, workloads=not args.empty)
        if args.node:
            report.gpus = [g for g in report.gpus if g.node in args.node]
    print(json.dumps(report.to_dict(), indent=2) if args.json else table(report, only_fitting=args.fitting))
    return 0


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
