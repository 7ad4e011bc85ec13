"""``vgpuctl capacity``: how many more of each profile fit, per node and GPU, as a table or JSON.

Three sources, said in the first line when it is not the admin's cluster: a cluster
(``--kubeconfig``), a file of objects (``--from``), a simulated node (``--simulate``: the slices
its agent would publish and the claims its kubelet plugin prepared), else the simulated example
cluster of ``vgpuctl demo`` with its made-up workloads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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
    c.add_argument("--empty", action="store_true", help="example cluster: without the demo workloads")
    c.add_argument("--server-version", default="1.35", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="example cluster or --simulate node: Kubernetes version the slices are for (default "
                        "%(default)s; 1.37 publishes every profile, with compatibility groups)")
    c.add_argument("--layout", default=None, choices=["demo", "all"],
                   help="example cluster: layout (default demo; all = every GPU offers every profile)")
    c.add_argument("--kubelet-root", default=None,
                   help="--simulate node: kubelet directory whose DRA plugin checkpoint holds the prepared claims "
                        "(default: <simulated host dir>/kubelet, where vgpuctl --simulate serve keeps them)")
    c.add_argument("--driver", default=DEFAULT_DRIVER, help="DRA driver name (default %(default)s)")
    c.add_argument("--node", action="append", help="only this node (repeatable)")
    c.add_argument("--fitting", action="store_true", help="list only profiles of which at least one more fits")
    c.add_argument("--json", action="store_true", help="print the report as JSON")


EXAMPLE = ("simulated example cluster (the demo's node and made-up workloads), not yours: --kubeconfig reads "
           "a cluster, --from FILE its objects, --simulate a simulated node")


def run(args) -> int:
    source = None  # said first when the answer is not about the admin's own cluster
    if (args.from_file or args.kubeconfig is not None) and args.simulate:
        raise ValueError("capacity: --simulate reads a simulated node, --kubeconfig and --from a cluster; give one")
    if args.from_file:
        slices, claims = from_file(args.from_file)
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif args.kubeconfig is not None:
        from dra_bridge.apiclient.client import connect
        from dra_bridge.apiclient.workloads import slices_and_claims

        slices, claims = slices_and_claims(connect(args.kubeconfig or None))
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif args.simulate:
        report, source = simulated_node(args)
    else:
        report = simulated_capacity(args.server_version, args.layout, workloads=not args.empty)
        if args.node:
            report.gpus = [g for g in report.gpus if g.node in args.node]
        source = EXAMPLE
    if args.json:
        if source:
            print(f"note: {source}", file=sys.stderr)
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print((f"{source}\n" if source else "") + table(report, only_fitting=args.fitting))
    return 0


def simulated_node(args) -> tuple[CapacityReport, str]:
    """The simulated node's own answer: the slices its agent would publish (every GPU offered, as
    ``vgpuctl slices``) with the claims its kubelet plugin has prepared counted as allocated."""
    from dra_bridge.sim.apiserver import featuregates
    from vgpuctl.cli.common import kubelet_root, node_name, open_host, sim_root
    from vgpuctl.commands.slices import node_slices

    env, io = open_host(args)
    node = node_name(args, env)
    root = kubelet_root(args)
    version = featuregates.version_tuple(args.server_version)
    slices, warnings = node_slices(env, io, node, driver=args.driver, kubelet_root=root, version=version,
                                   gates=featuregates.resolve(version, {}))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    claims = prepared_claims(io, root, args.driver)
    report = compute(slices, claims, driver=args.driver, nodes=args.node)
    source = (f"simulated node {node} ({args.simulate}, in {sim_root(args)}), Kubernetes {args.server_version}: "
              f"the slices it would publish, {len(claims)} prepared claim(s)")
    return report, source


def prepared_claims(io, root: Path, driver: str) -> list[dict]:
    """The kubelet plugin's prepared claims (its checkpoint, read-only) as allocated ResourceClaims."""
    from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore
    from dra_bridge.kubeletplugin.paths import PluginPaths

    path = PluginPaths(driver=driver, kubelet_root=root).checkpoint
    try:
        cp = CheckpointStore(path, io).load()
    except CheckpointCorrupt as exc:
        print(f"warning: the prepared-claims checkpoint {path} cannot be read ({exc}); no claim counted",
              file=sys.stderr)
        return []
    return [{"kind": "ResourceClaim",
             "metadata": {"name": c.name, "namespace": c.namespace, "uid": c.uid},
             "status": {"allocation": {"devices": {"results": [
                 {"request": d.request, "driver": driver, "pool": d.pool, "device": d.device} for d in c.devices]}}}}
            for c in cp.claims.values() if c.devices]


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
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    notes = list(report.notes)
    if report.incomplete_pools:
        notes.append("incomplete pools, not counted: " + ", ".join(report.incomplete_pools))
    if not report.gpus:
        notes.append("no GPU published by this driver")
    lines += [f"note: {n}" for n in notes]
    lines.append("FITS: more claims for one device of that profile the scheduler would allocate on that GPU now "
                 "(each profile alone); OF: devices of the profile published.")
    return "\n".join(lines)
