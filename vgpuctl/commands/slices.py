"""``vgpuctl slices``: the ResourceSlices this node would publish, as a ``v1`` List. Writes nothing.

The slices come from the node agent's own code (discover -> pool policy -> ``build_pool`` ->
``plan_slices``), for an API server of ``--server-version`` with ``--feature-gates`` (over that
version's defaults, as kube-apiserver has them). What the builder can express it is asked for
(no compatibility groups when ``DRADeviceCompatibilityGroups`` is off: the equal-size choice of
servers without them); what it cannot (no counters when ``DRAPartitionableDevices`` is off) is
removed afterwards with the API server's own drop rules, and said so on stderr. With
``--kubeconfig`` the version and what the server keeps are not given but found, by effect: a
dry-run probe slice (nothing stored) shows which DRA fields that server drops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import yaml

from vgpuctl.cli.common import node_name, open_host

VERSIONS = ("1.34", "1.35", "1.36", "1.37")
GROUPS_GATE = "DRADeviceCompatibilityGroups"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dra_bridge.api.names import DEFAULT_DRIVER

    p.add_argument("-o", "--output", choices=("json", "yaml"), default="yaml",
                   help="output format (default %(default)s)")
    p.add_argument("--server-version", choices=VERSIONS, default=VERSIONS[-1],
                   help="Kubernetes version of the API server the slices are for (default %(default)s)")
    p.add_argument("--feature-gates", default="", metavar="NAME=true|false,...",
                   help="the API server's feature gates over that version's defaults, e.g. "
                        "DRADeviceCompatibilityGroups=true (default: none, the version's defaults)")
    p.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE",
                   help="detect the server's version and the DRA fields it keeps from a cluster (a dry-run probe, "
                        "nothing stored) instead of --server-version / --feature-gates")
    p.add_argument("-f", "--file", metavar="LAYOUT",
                   help="layout file: the pool policy comes from its DRA entries, as the node agent's "
                        "(default: none, every GPU offered)")
    p.add_argument("--layout", default="default", help="named layout in the file (default %(default)s)")
    p.add_argument("--node-name", default=None,
                   help="node name (default: $NODE_NAME, or the simulated host's node)")
    p.add_argument("--driver", default=DEFAULT_DRIVER, help="DRA driver name (default %(default)s)")
    p.add_argument("--kubelet-root", default="/var/lib/kubelet",
                   help="kubelet directory, where the node agent keeps its GPU numbering (read only; "
                        "default %(default)s)")


def builder_version(version: tuple[int, int], gates: dict[str, bool]) -> tuple[int, int]:
    """The server version to build for: with compatibility groups off, the newest one without them.

    Used only when that older version's limits are the same but for the groups, so the slices
    are what ``version`` accepts; otherwise the groups are left to the drop rules.
    """
    from dra_bridge.pool.devices import COMPATIBILITY_GROUPS_SINCE
    from dra_bridge.pool.slicecheck import limits_for

    if version < COMPATIBILITY_GROUPS_SINCE or gates.get(GROUPS_GATE, True):
        return version
    older = (COMPATIBILITY_GROUPS_SINCE[0], COMPATIBILITY_GROUPS_SINCE[1] - 1)
    if dataclasses.replace(limits_for(version), compatibility_groups=0) == limits_for(older):
        return older
    return version


class _ReadOnly:
    """The host IO for the GPU numbering: reads go through, writes are discarded (nothing written)."""

    def __init__(self, io):
        self._io = io

    def read(self, path: Path) -> str:
        return self._io.read(path)

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        pass


def _report_dropped(dropped, version: str, gates: dict[str, bool]) -> None:
    by_field = Counter(d.path.rsplit(".", 1)[-1] for d in dropped)
    off = sorted({d.gate for d in dropped})
    fields = ", ".join(f"{name} ({n})" for name, n in sorted(by_field.items()))
    print(f"note: Kubernetes {version} with {', '.join(f'{g}=false' for g in off)} drops these fields on "
          f"write; the slice builder cannot leave them out, so they are removed here as kube-apiserver "
          f"would: {fields}", file=sys.stderr)
    if by_field.keys() & {"sharedCounters", "consumesCounters"}:
        print("warning: without counters the scheduler can allocate a GPU's vGPUs and the whole GPU "
              "together; enable DRAPartitionableDevices on the API server and the scheduler",
              file=sys.stderr)


def node_slices(env, io, node: str, *, driver: str, kubelet_root: Path, version: tuple[int, int],
                gates: dict[str, bool], layouts=None) -> tuple[list[dict], list[str]]:
    """(slices, warnings): what this node's agent would publish for an API server of ``version`` with
    ``gates`` (fields that server drops are left in; ``run`` removes them). Shared with ``capacity``."""
    from dra_bridge.kubeletplugin.gpuids import StableGpuIds
    from dra_bridge.kubeletplugin.paths import PluginPaths
    from dra_bridge.pool.devices import build_pool
    from dra_bridge.pool.policy import policy_from_layout
    from dra_bridge.pool.slices import plan_slices
    from mdev_manager.discovery import discover

    inv = discover(env, io, node=node)
    policy = policy_from_layout(inv, layouts)
    ids = StableGpuIds(PluginPaths(driver=driver, kubelet_root=kubelet_root).data_dir / "gpu-ids.json", _ReadOnly(io))
    build_for = builder_version(version, gates)
    # as the agent (Daemon._binding_mode): counters and binding conditions kept, no groups
    binding = bool(gates.get("DRAPartitionableDevices") and gates.get("DRADeviceBindingConditions")
                   and gates.get("DRAResourceClaimDeviceStatus", True)) and build_for < (1, 37)
    pool = build_pool(ids.apply(inv), policy, driver, server_version=build_for, binding_conditions=binding,
                      pcie_roots={g.address: g.pcie_root for g in inv.gpus if g.pcie_root})
    plan = plan_slices(pool, driver=driver, node_name=node, pool_name=node, generation=1, server_version=build_for)
    return plan.slices, [*pool.warnings, *plan.warnings]


def _detected(args) -> tuple[tuple[int, int], dict[str, bool]]:
    """The cluster's version, and gates as its effect shows them (only the DRA gates the slices use)."""
    from dra_bridge.apiclient.client import connect
    from dra_bridge.apiclient.kept import probe_kept
    from dra_bridge.apiclient.publisher import server_version
    from dra_bridge.sim.apiserver import featuregates

    api = connect(args.kubeconfig or None)
    version = server_version(api)
    kept = probe_kept(api, version)
    print(f"detected: Kubernetes {version[0]}.{version[1]}; the API server keeps {kept.describe()}", file=sys.stderr)
    overrides = {"DRAPartitionableDevices": kept.counters is not False,
                 "DRADeviceBindingConditions": kept.binding_conditions is not False}
    if version >= (1, 37):
        overrides[GROUPS_GATE] = kept.compatibility_groups is not False
    known = featuregates.resolve(version, {})
    return version, featuregates.resolve(version, {k: v for k, v in overrides.items() if k in known})


def run(args) -> int:
    from dra_bridge.sim.apiserver import featuregates
    from mdev_manager.config import load_config

    if args.kubeconfig is not None:
        version, gates = _detected(args)
        args.server_version = f"{version[0]}.{version[1]}"
    else:
        version = featuregates.version_tuple(args.server_version)
        gates = featuregates.resolve(version, featuregates.parse_gates(args.feature_gates))
    env, io = open_host(args)
    node = args.node_name or node_name(args, env)
    if not node:
        raise ValueError("node name: set NODE_NAME or pass --node-name (or use --simulate)")
    layouts = load_config(args.file, args.layout) if args.file else None

    slices, warnings = node_slices(env, io, node, driver=args.driver, kubelet_root=Path(args.kubelet_root),
                                   version=version, gates=gates, layouts=layouts)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    dropped = [d for s in slices for d in featuregates.drop_disabled(s, None, gates)]
    if dropped:
        _report_dropped(dropped, args.server_version, gates)

    doc = {"apiVersion": "v1", "kind": "List", "items": slices}
    print(json.dumps(doc, indent=2) if args.output == "json" else yaml.safe_dump(doc, sort_keys=False), end="")
    if args.output == "json":
        print()
    return 0
