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
from collections import Counter
from typing import TYPE_CHECKING

from dra_bridge.api.nodepaths import NodePaths
from vgpuctl.cli import options
from vgpuctl.cli.extras import require_sim
from vgpuctl.output.tables import fit, fit_lines, short_model

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from dra_bridge.kubeletplugin.state import Checkpoint
    from dra_bridge.scheduling.capacity import CapacityReport, GpuCapacity


def add_arguments(c: argparse.ArgumentParser) -> None:
    src = c.add_mutually_exclusive_group()
    options.add_kubeconfig(c, "read the cluster", group=src)
    src.add_argument("--from", dest="from_file", metavar="FILE",
                     help="objects in YAML/JSON, e.g. kubectl get resourceslices,resourceclaims -A -o yaml")
    c.add_argument("--empty", action="store_true", help="example cluster: without the demo workloads")
    options.add_server_version(c, "the example cluster or the --simulate node's API server")
    options.add_feature_gates(c)
    c.add_argument("--layout", default=None, choices=["demo", "all"],
                   help="example cluster: layout (default demo; all = every GPU offers every profile)")
    options.add_kubelet_root(c, "--simulate node: where its prepared claims are read")
    options.add_driver(c)
    c.add_argument("--node", action="append", help="only this node (repeatable)")
    c.add_argument("--fitting", action="store_true", help="list only profiles of which at least one more fits")
    options.add_output(c, wide=True)


EXAMPLE = ("simulated example cluster (the demo's node and made-up workloads), not yours: --kubeconfig reads "
           "a cluster, --from FILE its objects, --simulate a simulated node")


def run(args) -> int:
    import yaml

    from dra_bridge.scheduling.capacity import compute, from_file

    source = None  # said first when the answer is not about the admin's own cluster
    # $KUBECONFIG set: its cluster, as kubectl (and doctor, gpus, cordon) read it, unless told otherwise
    cluster = options.reads_cluster(args, env=not (args.from_file or args.simulate))
    if (args.from_file or cluster) and args.simulate:
        raise ValueError("capacity: --simulate reads a simulated node, --kubeconfig and --from a cluster; give one")
    if args.from_file:
        slices, claims = from_file(args.from_file)
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif cluster:
        from dra_bridge.apiclient.workloads import slices_and_claims

        slices, claims = slices_and_claims(options.connect(args))
        report = compute(slices, claims, driver=args.driver, nodes=args.node)
    elif args.simulate:
        report, source = simulated_node(args)
    else:
        require_sim("vgpuctl capacity's example cluster (give --kubeconfig or --from FILE for a real one)")
        from dra_bridge.sim.scenarios import simulated_capacity  # the [sim] extra
        from kubevirt_templates.render import render

        report = simulated_capacity(args.server_version, args.layout, workloads=not args.empty, render=render)
        if args.node:
            report.gpus = [g for g in report.gpus if g.node in args.node]
        source = EXAMPLE
    if args.output in ("json", "yaml"):
        if source:
            print(f"note: {source}", file=sys.stderr)
        data = report.to_dict()
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
    else:
        print((f"{fit_lines(source)}\n" if source else "") + table(report, only_fitting=args.fitting,
                                                                   wide=args.output == "wide"))
    return 0


def simulated_node(args) -> tuple[CapacityReport, str]:
    """The simulated node's own answer: the slices its agent publishes for the node's layout (the one it
    was last made to match; none recorded: every GPU offered), in the shape its server's gates give, as
    ``vgpuctl slices``, with the claims its kubelet plugin has prepared counted as allocated."""
    from dra_bridge.scheduling.capacity import compute
    from vgpuctl.cli.host import open_host
    from vgpuctl.commands.slices import node_layouts, node_slices, prepared_checkpoint, set_up, shape_for

    args.sizes_by_first_allocation, args.file = False, None
    shape = shape_for(args)
    host = open_host(args)
    layouts, what = node_layouts(args, host)
    inv = set_up(host, layouts, what, args.driver)
    paths = host.paths(args.driver)
    cp, untrusted = prepared_checkpoint(host.io, paths)
    slices, warnings = node_slices(host.env, host.io, host.node, paths=paths, shape=shape, prepared=cp,
                                   layouts=layouts, inv=inv)
    claims = prepared_claims(cp, untrusted, paths)
    others = _not_through_dra(host, layouts, inv)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    report = compute(slices, claims, driver=args.driver, nodes=args.node)
    source = (f"simulated node {host.node} ({args.simulate}, in {host.sim_root}), Kubernetes "
              f"{args.server_version}, {what}: the slices its agent publishes, {len(claims)} prepared claim(s)")
    report.notes += others
    return report, source


def _not_through_dra(host, layouts, inv=None) -> list[str]:
    """One note per GPU the layout keeps out of DRA (vgpu, passthrough, unmanaged), with what it holds
    (``inv``: the node as the agent leaves it, else read)."""
    if layouts is None:
        return []
    from mdev_manager.discovery import discover
    from mdev_manager.plan import select_gpus

    inv = inv if inv is not None else discover(host.env, host.io)
    notes = []
    for addr, entry in sorted(select_gpus(inv, layouts).items()):
        if entry.mode == "dra":
            continue
        gpu = inv.gpu(addr)
        if gpu is None:
            continue
        held = ", ".join(f"{n} x {t}" for t, n in sorted(Counter(v.type_name for v in gpu.vgpus).items()))
        notes.append(f"GPU {gpu.index} {addr} is in {entry.mode} mode, not offered through DRA"
                     + (f" (it holds {held})" if held else ""))
    return notes


def prepared_claims(cp: Checkpoint | None, untrusted: str | None, paths: NodePaths) -> list[dict]:
    """The kubelet plugin's prepared claims (its checkpoint, :func:`~vgpuctl.commands.slices.prepared_checkpoint`;
    ``untrusted``: why it could not be read) as allocated ResourceClaims."""
    driver = paths.driver
    if cp is None:
        print(f"warning: the prepared-claims checkpoint {paths.checkpoint} cannot be read ({untrusted}); no claim "
              "counted", file=sys.stderr)
        return []
    return [{"kind": "ResourceClaim",
             "metadata": {"name": c.name, "namespace": c.namespace, "uid": c.uid},
             "status": {"allocation": {"devices": {"results": [
                 {"request": d.request, "driver": driver, "pool": d.pool, "device": d.device} for d in c.devices]}}}}
            for c in cp.claims.values() if c.devices]


def _human(q: str | None) -> str:
    from dra_bridge.api.quantity import format_quantity, parse_quantity

    if q is None:
        return "-"
    return format_quantity(parse_quantity(q), human=True)


def usage_text(g: GpuCapacity) -> str:
    """What is in use: memory (a mixed-size GPU counts 1 GiB slots, pool/placements.py, as ``demo``
    does), shares, vGPUs."""
    from dra_bridge.scheduling.capacity import WHOLE_GPU

    slots = sum(int(v) for k, v in g.totals.items() if k.startswith("slots-"))
    if slots:  # no memory or vgpus counter: the placement counters add up to the GPU's memory
        held = sum(int(v) for k, v in g.used.items() if k.startswith("slots-"))
        whole = any(h.get("profile") == WHOLE_GPU for h in g.holders)
        n = sum(1 for h in g.holders if h.get("profile") != WHOLE_GPU)
        return f"{_human(str(held * 2**30))} of {_human(str(slots * 2**30))}, " + (
            "passed through whole" if whole else f"{n} vGPU{'s' if n != 1 else ''}")
    if "memory" in g.totals:
        out = f"{_human(g.used.get('memory'))} of {_human(g.totals['memory'])}"
    elif "share" in g.totals:
        out = f"{g.used.get('share')} of {g.totals['share']} shares"
    else:
        out = "-"
    if any(h.get("profile") == WHOLE_GPU for h in g.holders):  # its counters all taken, by no vGPU
        out += ", passed through whole"
    elif "vgpus" in g.totals:
        out += f", {g.used.get('vgpus', 0)} of {g.totals['vgpus']} vGPUs"
    return out


def table(report: CapacityReport, *, only_fitting: bool = False, wide: bool = False) -> str:
    """80 columns: one table per node under its name, models shortened, what is in use folded;
    ``wide``: one table with a NODE column, PCI model names, one line per row."""
    head = ["GPU", "ADDRESS", "MODEL", "IN USE", "PROFILE", "SIZE", "FITS", "OF"]
    by_node: dict[str, list] = {}
    for g in report.gpus:
        first = True
        for p in g.profiles:
            if only_fitting and not p.fits:
                continue
            gpu = ("" if g.index is None else str(g.index), g.gpu or "?",
                   (g.product or "?") if wide else short_model(g.product), usage_text(g))
            row = (gpu if first else ("", "", "", "")) + (p.profile, _human(str(p.memory)) if p.memory else "-",
                                                          str(p.fits), str(p.published))
            by_node.setdefault(g.node or "*", []).append(row)
            first = False
    if wide:
        lines = [fit(["NODE", *head], [(n if i == 0 else "", *r) for n, rows in by_node.items()
                                       for i, r in enumerate(rows)], wide=True)]
    else:
        lines = [f"Node {n}:\n" + fit(head, rows, fold=("MODEL", "IN USE", "PROFILE")) for n, rows in by_node.items()]
    notes = list(report.notes)
    if report.incomplete_pools:
        notes.append("incomplete pools, not counted: " + ", ".join(report.incomplete_pools))
    if not report.gpus:
        notes.append("no GPU published by this driver")
    lines += [fit_lines(f"note: {n}") for n in notes]
    lines.append(fit_lines("FITS: more claims for one device of that profile the scheduler would allocate on that GPU "
                           "now (each profile alone); OF: devices of the profile published."))
    return "\n".join(lines)
