"""``vgpuctl``: the node manager's command line (and, later, the daemon and demo entry points)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import yaml

from mdev_manager.config import ConfigError, load_config
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO
from mdev_manager.cli.common import dump, node_name as _node, open_host, sim_dir_for
from mdev_manager.cli.output import inventory_table, plan_text, report_text
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore


def cmd_discover(args) -> int:
    env, io = open_host(args)
    inv = discover(env, io, node=_node(args, env))
    print(inventory_table(inv, types=args.types) if args.output == "table" else dump(inv, args.output))
    return 0


def cmd_apply(args, dry_run: bool = False) -> int:
    env, io = open_host(args)
    layouts = load_config(args.file, args.layout)
    out = reconcile(env, io, layouts, dry_run=dry_run or args.dry_run, node=_node(args, env),
                    final_inventory=args.output != "table")
    if args.output != "table":
        print(dump(out, args.output))
        return 0 if out.ok else 1
    for w in out.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for i, r in enumerate(out.rounds):
        title = "Plan" if r.report is None else f"Round {i + 1}"
        print(f"{title}:\n{plan_text(r.plan)}")
        if r.report is not None and r.report.results:
            print(report_text(r.report))
    if not (dry_run or args.dry_run):
        print(f"{out.changed} changes; " + ("node matches the layout" if out.ok else "some steps failed"))
    return 0 if out.ok else 1


def cmd_restore(args) -> int:
    env, io = open_host(args)
    before = len(discover(env, io).all_vgpus())
    reports = restore(env, io)
    for r in reports:
        print(report_text(r))
    # count vGPUs, not steps: enabling a GPU's VFs is a step but no device
    print(f"{len(discover(env, io).all_vgpus()) - before} devices restored")
    return 0 if all(not r.failed for r in reports) else 1


def cmd_sim(args) -> int:
    from mdev_manager.sim import SimHost, load_host, preset_names

    if args.sim_cmd == "presets":
        for name in preset_names():
            spec = load_host(name)
            print(f"{name:14} " + ", ".join(f"{g.count} x {g.board}" for g in spec.gpus))
        return 0
    if args.sim_cmd == "mount":
        from mdev_manager.sim.fuse import mount

        spec = load_host(args.host)
        root = Path(args.sim_dir) if args.sim_dir else sim_dir_for(args.host)
        host = SimHost.open_or_create(root, spec)
        print(f"mounting {root}/sys on {args.dir} (Ctrl-C to unmount)", file=sys.stderr)
        mount(host, Path(args.dir), foreground=True)
        return 0
    ref = args.simulate or "default"
    root = Path(args.sim_dir) if args.sim_dir else sim_dir_for(ref)
    if args.sim_cmd == "reset":
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        SimHost.create(root, load_host(ref))
        print(f"simulated host {ref} reset at {root}")
    elif args.sim_cmd == "reboot":
        SimHost.open_or_create(root, load_host(ref)).reboot()
        print(f"simulated host {ref} rebooted: VFs and vGPUs are gone, definitions stay")
    return 0


def cmd_serve(args) -> int:
    from dra_bridge.agent.observe import setup_logging
    from dra_bridge.agent.daemon import Daemon, ServeConfig

    setup_logging(logging.DEBUG if args.verbose else logging.INFO, json_logs=not args.plain_logs)
    env, io = open_host(args)
    node = args.node_name or os.environ.get("NODE_NAME") or _node(args, env)
    if not node:
        raise ValueError("node name: set NODE_NAME (the DaemonSet sets it from spec.nodeName) or pass --node-name")
    version = tuple(int(x) for x in args.server_version.split(".")[:2]) if args.server_version else None
    cfg = ServeConfig(node_name=node, driver=args.driver, layout_file=args.file, layout=args.layout,
                      resync_seconds=args.resync, server_version=version, metrics_port=args.metrics_port,
                      kubelet_root=Path(args.kubelet_root), cdi_root=Path(args.cdi_root),
                      device_plugin=args.device_plugin, resource_prefix=args.resource_prefix,
                      layout_label=args.layout_label, state_label=args.state_label)
    from dra_bridge.kube.client import api_client_from

    daemon = Daemon(cfg, env, io, api_client_from(args.kubeconfig)).start()
    daemon.run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vgpuctl", description="vGPU and GPU passthrough manager for KubeVirt nodes")
    p.add_argument("--simulate", nargs="?", const="default", metavar="PRESET|HOST.yaml",
                   help="run against a simulated host (state kept between commands)")
    p.add_argument("--sim-dir", help="where the simulated host lives (default ~/.local/state/vgpuctl/sim/<name>)")
    p.add_argument("--sys-root", help="sysfs root (default /sys)")
    p.add_argument("--dev-root", help="/dev root (default /dev)")
    p.add_argument("--mdevctl-root", help="mdevctl definitions (default /etc/mdevctl.d)")
    p.add_argument("--state-root", help="vgpuctl state (default /var/lib/vgpuctl)")
    p.add_argument("--libvirt-uri", default=None, help="libvirt URI to check for devices in use (e.g. qemu:///system)")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("discover", help="show GPUs, vGPU types and vGPUs")
    d.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    d.add_argument("--types", action="store_true", help="list every vGPU type of every GPU")
    d.set_defaults(func=cmd_discover)

    for name, help_ in (("apply", "make the node match a layout"), ("plan", "print the steps apply would take")):
        a = sub.add_parser(name, help=help_)
        a.add_argument("-f", "--file", required=True, help="layout file (vgpuctl/v1 or vgpu-device-manager v1)")
        a.add_argument("--layout", "--config-name", default="default", help="named layout / vgpu-config to apply")
        a.add_argument("--dry-run", action="store_true", help="print the steps without touching anything")
        a.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
        a.set_defaults(func=cmd_apply if name == "apply" else lambda args: cmd_apply(args, dry_run=True))

    r = sub.add_parser("restore", help="re-create saved vGPUs that are missing (after a reboot)")
    r.set_defaults(func=cmd_restore)

    sv = sub.add_parser("serve", help="run the node agent: reconcile, publish ResourceSlices, serve the kubelet")
    sv.add_argument("--node-name", help="node name (default $NODE_NAME)")
    sv.add_argument("--driver", default="vgpu.kubevirt.io", help="DRA driver name")
    sv.add_argument("-f", "--file", help="layout file to reconcile on every resync")
    sv.add_argument("--layout", default="default")
    sv.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    sv.add_argument("--server-version", help="override the API server version, e.g. 1.35")
    sv.add_argument("--resync", type=float, default=30.0, help="seconds between resyncs")
    sv.add_argument("--metrics-port", type=int, default=8080)
    sv.add_argument("--kubelet-root", default="/var/lib/kubelet")
    sv.add_argument("--cdi-root", default="/var/run/cdi")
    sv.add_argument("--plain-logs", action="store_true", help="human-readable logs instead of JSON")
    sv.add_argument("--device-plugin", action="store_true",
                    help="also serve the classic device plugin (resources nvidia.com/<TYPE_NAME>) for non-DRA GPUs")
    sv.add_argument("--resource-prefix", default="nvidia.com/", help="device plugin resource prefix")
    sv.add_argument("--layout-label", help="node label whose value names the layout (e.g. vgpu.kubevirt.io/config)")
    sv.add_argument("--state-label", help="node label reporting pending|success|failed (e.g. vgpu.kubevirt.io/config.state)")
    sv.set_defaults(func=cmd_serve)

    from mdev_manager.cli.render import add_render_parser

    add_render_parser(sub)

    from dra_bridge.scheduling import capacity

    from dra_bridge.conformance import checks as conformance

    from dra_bridge.sim import demo  # vgpuctl demo | capacity | conformance

    for module in (demo, capacity, conformance):
        module.add_parser(sub)

    s = sub.add_parser("sim", help="manage simulated hosts")
    ssub = s.add_subparsers(dest="sim_cmd", required=True)
    ssub.add_parser("presets", help="list the shipped host presets")
    m = ssub.add_parser("mount", help="mount a simulated host's sysfs with FUSE")
    m.add_argument("host", help="preset name or host YAML")
    m.add_argument("dir")
    ssub.add_parser("reset", help="rebuild the simulated host (with --simulate)")
    ssub.add_parser("reboot", help="simulate a reboot: VFs and vGPUs vanish")
    s.set_defaults(func=cmd_sim)
    return p


COMMANDS = {"discover", "apply", "plan", "restore", "sim", "serve", "render", "demo", "conformance", "capacity"}


def _fix_simulate(argv: list[str]) -> list[str]:
    """``--simulate discover`` means the default preset, not a preset named discover."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--simulate" and (i + 1 == len(out) or out[i + 1] in COMMANDS or out[i + 1].startswith("-")):
            out[i] = "--simulate=default"
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_fix_simulate(argv))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ConfigError as exc:
        print("error: the layout was rejected; nothing was changed:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
