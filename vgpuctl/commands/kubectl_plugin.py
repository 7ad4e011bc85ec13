"""``kubectl vgpu`` (and ``vgpuctl gpus``): the cluster's GPUs per node, as an admin reads them.

pip installs the ``kubectl-vgpu`` executable (``vgpuctl.main:kubectl_plugin``), which kubectl runs
for ``kubectl vgpu ...`` with every argument after ``vgpu``. kubectl hands a plugin none of its own
flags (nor any environment beyond its own), so ``--kubeconfig``, ``--context`` and ``-n`` are parsed
here, with the same meaning (and ``$KUBECONFIG``). One row per GPU: what it publishes, whether it is
cordoned, who holds it and how many more of each profile fit (the scheduler model's answer,
:mod:`dra_bridge.scheduling.capacity`); then one row per vGPU held, with its placement, claim and
pod or VM. Device-plugin (classic) resources follow, one row per node and resource (host driver,
total, used, free, holders), and per VM holding one of their vGPUs the nodes it can live-migrate to
and why not the others (:mod:`dra_bridge.scheduling.classic`). ``--watch`` prints it again whenever
it changes (a terminal redraws it in place).
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import TYPE_CHECKING

from vgpuctl.cli import options
from vgpuctl.output.tables import fit_lines

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from dra_bridge.scheduling.classic import ClassicNode
    from dra_bridge.scheduling.gpuview import GpuView
    from vgpuctl.output.terminal import Terminal


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", metavar="NODE[/GPU]", help="only these nodes, or GPUs (index or PCI address)")
    p.add_argument("-n", "--namespace", help="only holders in this namespace (default: every namespace)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="holders in every namespace (the default)")
    options.add_kubeconfig(p)
    options.add_driver(p)
    options.add_output(p, wide=True)
    p.add_argument("-w", "--watch", action="store_true", help="print it again at every change (Ctrl-C ends)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="how often --watch reads the cluster")
    p.add_argument("--watch-count", type=int, default=None, metavar="N",
                   help="with --watch: end after printing N times (default: until Ctrl-C)")


def _wanted(views: list[GpuView], targets: list[str]) -> list[GpuView]:
    from vgpuctl.cli.gpus import pci

    if not targets:
        return views
    out = []
    for v in views:
        for t in targets:
            node, sep, gpu = t.partition("/")
            if v.node == node and (not sep or gpu in (str(v.index), v.address) or pci(gpu) == v.address):
                out.append(v)
                break
    return out


def render(views: list[GpuView], fmt: str, classic: list[ClassicNode] | None = None,
           nodes: list[str] | None = None) -> str:
    """The GPUs the driver publishes; then the device-plugin (classic) resources per node (``classic``;
    ``nodes``: only theirs) and, per VM holding one of their vGPUs, the nodes it can live-migrate to and
    why not the others."""
    import yaml

    from dra_bridge.scheduling.classic import migration_targets
    from vgpuctl.cli.gpus import classic_table, gpu_table, migration_lines, vgpu_rows

    targets = migration_targets(classic or [], only=nodes)
    classic = [c for c in classic or [] if c.resources and (not nodes or c.node in nodes)]
    if fmt in ("json", "yaml"):
        data: dict = {"apiVersion": "vgpu.kubevirt.io/v1", "kind": "GpuList", "items": [v.to_dict() for v in views]}
        if classic:
            data["devicePlugin"] = [c.to_dict() for c in classic]
            data["liveMigration"] = [t.to_dict() for t in targets]
        return json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False).rstrip()
    if not views and not classic:
        return "No GPUs published by this driver."
    wide = fmt == "wide"
    parts = []
    if views:
        out = gpu_table(views, wide=wide)
        if any(v.holders for v in views):
            out += "\n\n" + vgpu_rows(views, wide=wide)
        notes = [f"{v.name()}: cordoned ({v.cordon_how}): {v.reason}" for v in views if v.cordon and v.reason]
        parts.append(out + "".join("\n" + fit_lines(n) for n in notes))
    if classic:
        parts.append(classic_table(classic))
    if targets:
        parts.append("Live migration (device plugin):\n" + migration_lines(targets))
    return "\n\n".join(parts)


def run(args) -> int:
    from vgpuctl.cli.gpus import Session

    s = Session.open(args, write=False)  # plain JSON reads: no Kubernetes client to import
    nodes = sorted({t.partition("/")[0] for t in args.targets}) or None

    def text() -> str:
        views = _wanted(s.views(nodes), args.targets)
        # every node's classic side: a VM's migration targets are the other nodes
        return render(views, args.output, s.classic(), nodes)

    first = text()
    if not args.watch:
        print(first)
        return 0
    from vgpuctl.output.terminal import Terminal  # rich: only to redraw

    return _watch(Terminal(), text, first, args.interval, args.watch_count)


def _watch(term: Terminal, text, first: str, interval: float, count: int | None) -> int:
    """Print ``text()`` again whenever it changes: redrawn in place on a terminal; in a pipe each
    change is printed after a blank line (with -o json, one document per change, as ``kubectl get -w``)."""
    from rich.text import Text

    pause = threading.Event()
    shown, printed = first, 1
    if term.tty:
        from rich.live import Live

        with Live(Text(first), console=term.console, auto_refresh=False) as live:
            while count is None or printed < count:
                pause.wait(interval)
                now = text()
                if now != shown:
                    shown, printed = now, printed + 1
                    live.update(Text(now), refresh=True)
        return 0
    print(first, flush=True)
    while count is None or printed < count:
        pause.wait(interval)
        now = text()
        if now != shown:
            shown, printed = now, printed + 1
            print("\n" + now, flush=True)
    return 0
