"""``vgpuctl serve``: the node agent (reconcile, publish ResourceSlices, serve the kubelet)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
from pathlib import Path

from dra_bridge.api.nodepaths import DEFAULT_CDI_ROOT
from vgpuctl.cli import options


def add_arguments(sv: argparse.ArgumentParser) -> None:
    options.add_node_name(sv)
    options.add_driver(sv)
    sv.add_argument("-f", "--file", help="layout file to reconcile on every resync")
    sv.add_argument("--layout", default="default", help="named layout in the file (default %(default)s)")
    options.add_kubeconfig(sv, "the cluster to publish to")
    options.add_server_version(sv, "the API server (an override)", from_cluster=True)
    sv.add_argument("--resync", type=float, default=30.0, help="seconds between resyncs (default %(default)s)")
    sv.add_argument("--metrics-port", type=int, default=8080,
                    help="port of /metrics, /healthz, /readyz (default %(default)s)")
    options.add_kubelet_root(sv)
    sv.add_argument("--cdi-root", default=str(DEFAULT_CDI_ROOT), help="where CDI specs are written (default %(default)s)")
    sv.add_argument("--plain-logs", action="store_true", help="human-readable logs instead of JSON")
    sv.add_argument("--device-plugin", action="store_true",
                    help="also serve the classic device plugin (resources nvidia.com/<TYPE_NAME>) for non-DRA GPUs")
    sv.add_argument("--resource-prefix", default="nvidia.com/",
                    help="device plugin resource prefix (default %(default)s)")
    sv.add_argument("--layout-label", help="node label whose value names the layout (e.g. vgpu.kubevirt.io/config)")
    sv.add_argument("--state-label",
                    help="node label reporting pending|success|failed (e.g. vgpu.kubevirt.io/config.state)")
    sv.add_argument("--health-quiet-seconds", type=float, default=300.0, metavar="SECONDS",
                    help="an unhealthy GPU (critical Xid, ECC pages pending, lost, not answering) is tainted at "
                         "once and untainted after this long without a problem (default %(default)s)")
    sv.add_argument("--gpu-lost-effect", choices=("NoSchedule", "NoExecute"), default="NoSchedule",
                    help="the effect of a lost GPU's taint (vgpu.kubevirt.io/gpu-lost): NoExecute (opt-in, device "
                         "taints on the server) has kube-controller-manager evict the pods whose claims hold the "
                         "GPU; other health taints stay NoSchedule (default %(default)s)")
    sv.add_argument("--sizes-by-first-allocation", action="store_true",
                    help="servers keeping counters but neither compatibility groups nor binding conditions: offer "
                         "every vGPU size of an empty GPU and republish it with its first allocation's size (an "
                         "allocation of another size in between fails at prepare; default: one size per GPU)")


def run(args) -> int:
    # the agent's modules are imported here, not at the top: `vgpuctl serve -h` stays fast
    from dra_bridge.agent.daemon import Daemon, ServeConfig
    from dra_bridge.agent.observe import setup_logging
    from mdev_manager.config import load_document
    from vgpuctl.cli.host import open_host

    if args.file:
        # a file that is not YAML stops the start; a layout in it that is rejected is reported on
        # every resync (the state label reads failed) while the agent keeps serving
        load_document(args.file)
    version = _server_version(args.server_version)
    api = options.connect(args)  # bad input stops the start before the host is opened
    host = open_host(args)
    node = args.node_name or os.environ.get("NODE_NAME") or host.node
    if not node:
        raise ValueError("node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) or pass --node-name")
    setup_logging(logging.DEBUG if args.verbose else logging.INFO, json_logs=not args.plain_logs)
    cfg = ServeConfig(node_name=node, driver=args.driver, layout_file=args.file, layout=args.layout,
                      resync_seconds=args.resync, server_version=version, metrics_port=args.metrics_port,
                      kubelet_root=host.kubelet_root, cdi_root=Path(args.cdi_root),
                      device_plugin=args.device_plugin, resource_prefix=args.resource_prefix,
                      layout_label=args.layout_label, state_label=args.state_label,
                      sizes_by_first_allocation=args.sizes_by_first_allocation,
                      health_quiet_seconds=args.health_quiet_seconds, gpu_lost_effect=args.gpu_lost_effect)
    daemon = Daemon(cfg, host.env, host.io, api).start()
    # what the start built (the imports, the first inventory and pool) lives as long as the process: collected
    # once, then frozen, so a full collection during a boot storm scans only what was made since (#37: 117 ms
    # at most -> 40 ms, 0.51 -> 0.12 s of CPU over the storm benchmark)
    gc.collect()
    gc.freeze()
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
