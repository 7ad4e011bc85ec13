"""``vgpuctl serve``: the node agent (reconcile, publish ResourceSlices, serve the kubelet)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from vgpuctl.cli.common import kubelet_root, node_name, open_host


def add_arguments(sv: argparse.ArgumentParser) -> None:
    sv.add_argument("--node-name", help="node name (default $NODE_NAME)")
    sv.add_argument("--driver", default="vgpu.kubevirt.io", help="DRA driver name (default %(default)s)")
    sv.add_argument("-f", "--file", help="layout file to reconcile on every resync")
    sv.add_argument("--layout", default="default", help="named layout in the file (default %(default)s)")
    sv.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    sv.add_argument("--server-version", help="override the API server version, e.g. 1.35 (default: ask the server)")
    sv.add_argument("--resync", type=float, default=30.0, help="seconds between resyncs (default %(default)s)")
    sv.add_argument("--metrics-port", type=int, default=8080,
                    help="port of /metrics, /healthz, /readyz (default %(default)s)")
    sv.add_argument("--kubelet-root", default=None,
                    help="kubelet directory (default /var/lib/kubelet; with --simulate, <simulated host dir>/kubelet, "
                         "where apply, plan and restore --simulate read the prepared claims)")
    sv.add_argument("--cdi-root", default="/var/run/cdi", help="where CDI specs are written (default %(default)s)")
    sv.add_argument("--plain-logs", action="store_true", help="human-readable logs instead of JSON")
    sv.add_argument("--device-plugin", action="store_true",
                    help="also serve the classic device plugin (resources nvidia.com/<TYPE_NAME>) for non-DRA GPUs")
    sv.add_argument("--resource-prefix", default="nvidia.com/",
                    help="device plugin resource prefix (default %(default)s)")
    sv.add_argument("--layout-label", help="node label whose value names the layout (e.g. vgpu.kubevirt.io/config)")
    sv.add_argument("--state-label",
                    help="node label reporting pending|success|failed (e.g. vgpu.kubevirt.io/config.state)")
    sv.add_argument("--sizes-by-first-allocation", action="store_true",
                    help="servers keeping counters but neither compatibility groups nor binding conditions: offer "
                         "every vGPU size of an empty GPU and republish it with its first allocation's size (an "
                         "allocation of another size in between fails at prepare; default: one size per GPU)")


def run(args) -> int:
    from dra_bridge.agent.daemon import Daemon, ServeConfig
    from dra_bridge.agent.observe import setup_logging
    from dra_bridge.apiclient.client import connect
    from mdev_manager.config import load_document

    if args.file:
        # a file that is not YAML stops the start; a layout in it that is rejected is reported on
        # every resync (the state label reads failed) while the agent keeps serving
        load_document(args.file)
    version = _server_version(args.server_version)
    node = args.node_name or os.environ.get("NODE_NAME") or node_name(args)
    if not node:
        raise ValueError("node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) or pass --node-name")
    api = connect(args.kubeconfig)  # bad input stops the start before the host is touched
    setup_logging(logging.DEBUG if args.verbose else logging.INFO, json_logs=not args.plain_logs)
    env, io = open_host(args)
    cfg = ServeConfig(node_name=node, driver=args.driver, layout_file=args.file, layout=args.layout,
                      resync_seconds=args.resync, server_version=version, metrics_port=args.metrics_port,
                      kubelet_root=kubelet_root(args), cdi_root=Path(args.cdi_root),
                      device_plugin=args.device_plugin, resource_prefix=args.resource_prefix,
                      layout_label=args.layout_label, state_label=args.state_label,
                      sizes_by_first_allocation=args.sizes_by_first_allocation)
    daemon = Daemon(cfg, env, io, api).start()
    daemon.run()
    return 0


def _server_version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        major, minor = (int(x) for x in text.split(".")[:2])
    except ValueError:
        raise ValueError(f"--server-version {text!r}: expected MAJOR.MINOR, e.g. 1.35") from None
    return major, minor
