"""``vgpuctl slices``: the ResourceSlices this node's agent publishes, as a ``v1`` List. Writes nothing.

The slices come from the node agent's own code: the shape it chooses for the server
(:func:`~dra_bridge.pool.shape.choose_shape`, from what the server keeps) and the pool it builds
(:func:`~dra_bridge.pool.shape.node_pool`). What the server keeps is read off ``--server-version``
and ``--feature-gates`` (that version's defaults, as kube-apiserver has them), or, with
``--kubeconfig``, found by effect: a dry-run probe slice (nothing stored) shows which DRA fields
that server drops. A server that drops the counters gets the agent's safe shape, said on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from dra_bridge.api import compat
from dra_bridge.api.nodepaths import NodePaths
from vgpuctl.cli import options

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from dra_bridge.kubeletplugin.state import Checkpoint
    from dra_bridge.pool.shape import Shape
    from mdev_manager.config import GpuLayout
    from mdev_manager.host.env import HostEnv
    from mdev_manager.host.io import HostIO
    from mdev_manager.models import Inventory
    from vgpuctl.cli.host import Host


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.add_output(p, table=False, default=options.YAML)
    options.add_server_version(p, "the API server the slices are for")
    options.add_feature_gates(p)
    options.add_kubeconfig(p, "detect the server's version and the DRA fields it keeps from a cluster (a "
                              "dry-run probe, nothing stored) instead of --server-version / --feature-gates")
    p.add_argument("-f", "--file", metavar="LAYOUT",
                   help="layout file: the pool policy comes from its DRA entries, as the node agent's (default: "
                        "the layout the node was last made to match, by apply or serve; none recorded: every GPU)")
    p.add_argument("--layout", default="default", help="named layout in the file (default %(default)s)")
    options.add_node_name(p)
    options.add_driver(p)
    options.add_kubelet_root(p, "read only: an earlier release's GPU numbering")
    p.add_argument("--sizes-by-first-allocation", action="store_true",
                   help="as serve's option of that name: the shape it publishes where the server keeps counters "
                        "but neither compatibility groups nor binding conditions")


def node_slices(env: HostEnv, io: HostIO, node: str, *, paths: NodePaths, shape: Shape, prepared: Checkpoint | None,
                layouts: list[GpuLayout] | None = None, inv: Inventory | None = None) -> tuple[list[dict], list[str]]:
    """(slices, warnings): what this node's agent publishes in ``shape`` (the agent's own
    :func:`~dra_bridge.pool.shape.node_pool`) for the node as read, or as ``inv`` (a preview's);
    ``prepared``: the kubelet plugin's checkpoint (:func:`prepared_checkpoint`; None: it cannot be
    trusted). Shared with ``capacity``."""
    from dra_bridge.pool.policy import policy_from_layout, with_outside
    from dra_bridge.pool.shape import node_pool
    from dra_bridge.pool.slices import plan_slices
    from mdev_manager import numbering
    from mdev_manager.discovery import discover

    if inv is None:
        inv = discover(env, io, node=node, ids=numbering.load(env, io, paths.gpu_ids))  # read, never written here
    policy = policy_from_layout(inv, layouts)
    if prepared is not None:  # as the agent publishes: vGPUs no prepared claim holds keep their room
        policy = with_outside(policy, inv, {d.vgpu_id for c in prepared.claims.values() for d in c.devices
                                            if d.vgpu_id})
    pool = node_pool(inv, layouts, paths.driver, shape, policy=policy)
    plan = plan_slices(pool, driver=paths.driver, node_name=node, pool_name=node, generation=1,
                       server_version=shape.version)
    return plan.slices, [*pool.warnings, *plan.warnings]


def prepared_checkpoint(io: HostIO, paths: NodePaths) -> tuple[Checkpoint | None, str | None]:
    """(the kubelet plugin's checkpoint, read-only; None where it cannot be trusted, and why: the agent
    rebuilds it at its start). Read once by ``slices`` and ``capacity``."""
    from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore

    try:
        return CheckpointStore(paths.checkpoint, io).load(), None
    except CheckpointCorrupt as exc:
        return None, str(exc)


def _detected(args: argparse.Namespace) -> tuple[tuple[int, int], compat.KeptFields]:
    """The cluster's version, and what it keeps, by effect (a dry-run probe slice, nothing stored)."""
    # the kubernetes client (~0.9 s): only with --kubeconfig
    from dra_bridge.apiclient.kept import probe_kept
    from dra_bridge.apiclient.publisher import server_version

    api = options.connect(args)
    version = server_version(api)
    kept = probe_kept(api, version)
    print(f"detected: Kubernetes {compat.format_version(version)}; the API server keeps {kept.describe()}",
          file=sys.stderr)
    return version, kept


def shape_for(args: argparse.Namespace) -> Shape:
    """The shape ``serve`` would publish in: from the cluster (``--kubeconfig``), else from
    ``--server-version`` and ``--feature-gates`` (said on stderr when it is not every size at once)."""
    from dra_bridge.pool.shape import choose_shape

    if options.reads_cluster(args):
        version, kept = _detected(args)
        server = f"the API server (Kubernetes {compat.format_version(version)})"
    else:
        version = compat.version_tuple(args.server_version)
        kept = compat.kept_by_gates(version, compat.resolve(version, compat.parse_gates(args.feature_gates)))
        server = f"Kubernetes {compat.format_version(version)}"
    shape = choose_shape(version, kept, sizes_by_first_allocation=args.sizes_by_first_allocation)
    if not shape.counters:
        print(f"warning: {server} with {compat.PARTITIONABLE}=false drops sharedCounters and consumesCounters, so "
              "the node agent publishes without counters only what can never over-commit (per GPU the whole GPU or "
              f"one vGPU type); enable {compat.PARTITIONABLE} on the API server and the scheduler to offer more",
              file=sys.stderr)
    return shape


def node_layouts(args: argparse.Namespace, host: Host) -> tuple[list[GpuLayout] | None, str]:
    """The layout the agent works to: ``-f``/``--layout``, else the node's record of the layout it was
    last made to match, else None (every GPU offered); and how to name it."""
    from mdev_manager import applied
    from mdev_manager.config import load_config

    if args.file:
        return load_config(args.file, args.layout), f"layout {args.layout} of {args.file}"
    rec = applied.load(host.env, host.io)
    if rec is None:
        return None, "no layout (every GPU offered)"
    return rec.layouts(), rec.describe()

def set_up(host: Host, layouts: list[GpuLayout] | None, what: str, driver: str, node: str = "") -> Inventory | None:
    """The node as the agent leaves it before it publishes: None where it matches ``layouts`` (or there
    is none: the node is read as it is); else its inventory once the agent's rounds took their steps,
    in memory (:func:`mdev_manager.preview.preview`: the same planner, the kernel's steps applied to the
    inventory read once; the node is never written). The same on a real host as on a simulated one."""
    from mdev_manager.discovery import discover
    from mdev_manager.preview import preview
    from vgpuctl.cli.host import NotSetUp, numbering_of, prepared_usage

    if layouts is None:
        return None
    ids = numbering_of(host, driver)
    inv = discover(host.env, host.io, node=node or host.node, ids=ids)
    pv = preview(host.env, host.io, layouts, usage_extra=prepared_usage(host, driver), node=node or host.node,
                 ids=ids, inventory=inv)
    if not pv.plans:
        return inv
    if not pv.ok:
        why = "; ".join(pv.failed) if pv.failed else "its rounds did not end"
        raise NotSetUp(f"the node does not match {what} yet and the agent's steps could not be previewed ({why}); "
                       "apply it first (vgpuctl apply -f FILE --layout NAME, or let vgpuctl serve run), then run "
                       "this again")
    print(f"note: the node does not match {what} yet: this is what the agent publishes once it has applied it "
          f"({pv.steps} steps, taken in memory; the node is unchanged)", file=sys.stderr)
    for assumed in pv.assumptions:
        print(f"note: assumed until the kernel answers: {assumed}", file=sys.stderr)
    return pv.inventory


def why_empty(host: Host, layouts: list[GpuLayout] | None, what: str, inv: Inventory | None = None) -> str:
    """Why a node publishes no device (``inv``: the node as the agent leaves it, else read), and what
    layout would make it publish some."""
    from mdev_manager.discovery import discover
    from mdev_manager.plan import select_gpus

    inv = inv if inv is not None else discover(host.env, host.io, node=host.node)
    if not inv.gpus:
        return "no device to publish: the node has no GPU"
    if layouts is None:
        return "no device to publish: no GPU offers one (see vgpuctl discover)"
    modes: dict[str, int] = {}
    try:
        selected = select_gpus(inv, layouts)
    except ValueError:  # a layout problem: the slices' own warnings say it
        return "no device to publish (see the warnings)"
    for entry in selected.values():
        modes[entry.mode] = modes.get(entry.mode, 0) + 1
    if modes.get("dra"):
        return (f"no device to publish: the {modes['dra']} GPU(s) {what} hands to DRA offer none (cordoned, or "
                "their types do not fit; see vgpuctl discover --types)")
    left = len(inv.gpus) - sum(modes.values())
    held = ", ".join(f"{n} in {mode} mode" for mode, n in sorted(modes.items()))
    held += f"{', ' if held else ''}{left} not selected" if left else ""
    return (f"no device to publish: no GPU is handed to DRA by {what} ({len(inv.gpus)} GPU(s): {held}; the node manager "
            "serves those itself, through KubeVirt's permittedHostDevices); a layout entry with mode: dra would "
            "publish its GPU, e.g. '- all: true' with 'mode: dra' (layout dra in examples/layout.yaml: "
            "slices -f examples/layout.yaml --layout dra)")


def run(args: argparse.Namespace) -> int:
    import yaml

    from vgpuctl.cli.host import open_host

    node = args.node_name or os.environ.get("NODE_NAME")
    if not node and not args.simulate:
        raise ValueError("node name: set NODE_NAME or pass --node-name (or use --simulate)")
    shape = shape_for(args)
    host = open_host(args)
    node = node or host.node
    layouts, what = node_layouts(args, host)
    inv = set_up(host, layouts, what, args.driver, node)
    paths = host.paths(args.driver)
    slices, warnings = node_slices(host.env, host.io, node, paths=paths, shape=shape,
                                   prepared=prepared_checkpoint(host.io, paths)[0], layouts=layouts, inv=inv)
    if not any(s.get("spec", {}).get("devices") for s in slices):
        print(f"note: {why_empty(host, layouts, what, inv)}", file=sys.stderr)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    doc = {"apiVersion": "v1", "kind": "List", "items": slices}
    # libyaml's emitter where PyYAML has it: the same text, 4x faster on a MIG node's 300 kB of slices
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    print(json.dumps(doc, indent=2) if args.output == "json" else yaml.dump(doc, Dumper=dumper, sort_keys=False),
          end="")
    if args.output == "json":
        print()
    return 0
