"""``vgpuctl sim presets | mount | reset | reboot | apiserver``: simulated hosts and the local API server."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vgpuctl.cli import options

#: libfuse's fuse_main() status when its loop ended on SIGINT, SIGTERM or SIGHUP (helper.c), and the others
FUSE_STOPPED_BY_SIGNAL = 8
FUSE_ERRORS = {1: "invalid option arguments", 2: "no mount point", 3: "FUSE setup failed",
               4: "mounting failed (is the directory there, empty and not mounted already? is /dev/fuse usable?)",
               5: "could not detach", 6: "could not set up signal handlers", 7: "an error while serving"}


def add_arguments(s: argparse.ArgumentParser) -> None:
    ssub = s.add_subparsers(dest="sim_cmd", required=True, metavar="{presets,mount,reset,reboot,unplug,replug,health,apiserver}")
    pr = ssub.add_parser("presets", help="list the shipped host presets")
    options.add_output(pr)
    m = ssub.add_parser("mount", help="mount a simulated host's sysfs with FUSE")
    m.add_argument("host", help="preset name or host YAML")
    m.add_argument("dir", help="mount point")
    reset = ssub.add_parser("reset", help="rebuild the simulated host (with --simulate; default preset: default)")
    reboot = ssub.add_parser("reboot", help="simulate a reboot: VFs and vGPUs vanish, definitions stay")
    unplug = ssub.add_parser("unplug", help="a GPU leaves the bus (hot-unplug, fallen off the bus)")
    unplug.add_argument("address", help="the GPU's PCI address, e.g. 0000:13:00.0")
    replug = ssub.add_parser("replug", help="a GPU that left the bus comes back (a PCI rescan), cold")
    replug.add_argument("address", help="the GPU's PCI address")
    health = ssub.add_parser("health", help="raise or clear a GPU health fault NVML or the kernel reports "
                                            "(Xid, ECC, lost, hang; AER, link, fell off, reset)",
                             description="What the node agent's health watch sees through NVML: a critical Xid "
                                         "event, ECC page retirement pending a reset, the GPU lost, a GPU that "
                                         "stops answering; and, for a GPU on vfio-pci, in the kernel's sysfs: an "
                                         "uncorrectable AER error counted (aer-fatal, aer-nonfatal), the PCIe link "
                                         "narrower (link), config space reading all ones (fell-off), no reset "
                                         "method left (reset-failed). The agent taints the GPU's devices at once "
                                         "and lifts the taint after its quiet period without a fault.")
    health.add_argument("address", help="the GPU's PCI address")
    health.add_argument("fault", choices=("xid", "ecc", "lost", "hang", "aer-fatal", "aer-nonfatal", "link", "fell-off",
                                          "reset-failed"), help="the fault")
    health.add_argument("--xid", type=int, default=79,
                        help="the Xid number of an xid fault to raise (default %(default)s; --clear clears every "
                             "queued Xid)")
    health.add_argument("--clear", action="store_true",
                        help="clear the fault instead of raising it (an AER count: set back to 0)")
    for sp in (pr, m, reset, reboot, unplug, replug, health):
        options.add_host_options(sp, suppress=True)
    a = ssub.add_parser("apiserver", help="run a local Kubernetes API server in the foreground until SIGTERM",
                        description="A local Kubernetes API server (the DRA resources and the objects vgpuctl uses) "
                                    "that keeps and drops fields as kube-apiserver does for its version and "
                                    "feature gates. Writes a kubeconfig for it once it answers.")
    from vgpuctl.commands import apiserver

    apiserver.add_arguments(a)
    options.add_host_options(a, suppress=True)


def run(args) -> int:
    import yaml

    from vgpuctl.cli.host import sim_dir_for

    if args.sim_cmd == "apiserver":
        from vgpuctl.commands import apiserver

        return apiserver.run(args)

    from mdev_manager.sim import load_host, preset_names
    from mdev_manager.sim.node import sim_node
    from vgpuctl.cli.simhost import whole_sim_node

    if args.sim_cmd == "presets":
        presets = {name: load_host(name) for name in preset_names()}
        if args.output in ("json", "yaml"):
            data = [{"name": name, "node": spec.node, "gpus": [{"board": g.board, "count": g.count} for g in spec.gpus]}
                    for name, spec in presets.items()]
            print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
            return 0
        for name, spec in presets.items():
            print(f"{name:14} " + ", ".join(f"{g.count} x {g.board}" for g in spec.gpus))
        return 0
    if args.sim_cmd == "mount":
        if not Path(args.dir).is_dir():  # libfuse would say only "invalid option arguments"
            raise ValueError(f"sim mount: the mount point {args.dir} is not a directory; name an empty one"
                             if Path(args.dir).exists() else
                             f"sim mount: the mount point {args.dir} does not exist; create it first "
                             f"(mkdir -p {args.dir})")
        from mdev_manager.sim.fuse import mount

        root = Path(args.sim_dir) if args.sim_dir else sim_dir_for(args.host)
        sim = whole_sim_node(root, args.host, args.sim_dir)
        print(f"mounting {root}/sys on {args.dir} (Ctrl-C to unmount)", file=sys.stderr)
        try:
            mount(sim.host, Path(args.dir), foreground=True)
        except RuntimeError as exc:  # libfuse's fuse_main status, as mfusepy raises it
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code != FUSE_STOPPED_BY_SIGNAL:
                print(f"error: mounting {root}/sys on {args.dir} failed: {FUSE_ERRORS.get(code or 0, exc)}",
                      file=sys.stderr)
                return 1
        print(f"unmounted {args.dir}", file=sys.stderr)  # Ctrl-C (or SIGTERM, fusermount3 -u): the way to stop
        return 0
    ref = args.simulate or "default"
    root = Path(args.sim_dir) if args.sim_dir else sim_dir_for(ref)
    if args.sim_cmd == "reset":
        return _reset(args, ref, root)
    elif args.sim_cmd == "reboot":
        whole_sim_node(root, ref, args.sim_dir).host.reboot()
        print(f"simulated host {ref} rebooted: VFs and vGPUs are gone, definitions stay")
    elif args.sim_cmd in ("unplug", "replug"):
        node = whole_sim_node(root, ref, args.sim_dir)
        host = node.host
        if args.sim_cmd == "unplug":  # as the node's agent would have: number the GPUs first, so the one
            from mdev_manager import numbering  # that leaves is reported gone (GPU N), not forgotten
            from mdev_manager.discovery import gpu_ids

            numbering.record(node.env, node.io, gpu_ids(node.env, node.io))
        try:
            (host.unplug if args.sim_cmd == "unplug" else host.replug)(args.address)
        except OSError as exc:  # no such GPU (or not unplugged): the address is bad input
            raise ValueError(f"sim {args.sim_cmd} {args.address}: {exc.strerror}") from None
    elif args.sim_cmd == "health":
        node = sim_node(root, ref, reuse=True)
        try:
            node.host.health(args.address, args.fault, xid=args.xid, clear=args.clear)
        except OSError as exc:
            raise ValueError(f"sim health {args.address}: {exc.strerror}") from None
        if args.fault == "xid" and args.clear:  # clearing drops every queued Xid, whichever --xid says
            what = "every queued Xid cleared"
        elif args.fault.startswith("aer-") and args.clear:  # a counter, not a state: what clearing did to it
            what = (f"{args.fault} count set back to 0 (as after a reboot or hot-plug; the kernel never lowers it "
                    "otherwise); a taint the agent raised for it lifts after its quiet period")
        else:
            what = f"{f'Xid {args.xid}' if args.fault == 'xid' else args.fault} {'cleared' if args.clear else 'raised'}"
            if not args.clear:
                what += _unseen(args.address, args.fault, _bound_driver(node.env.pci(args.address)))
        print(f"GPU {args.address} of simulated host {ref}: {what}")
    if args.sim_cmd == "unplug":
        print(f"GPU {args.address} left the bus of simulated host {ref}: its functions, VFs and vGPUs are gone")
    elif args.sim_cmd == "replug":
        print(f"GPU {args.address} is back on the bus of simulated host {ref}, cold (no VFs, no vGPUs)")
    return 0



#: the faults NVML reports (the agent reads them for a GPU on NVIDIA's driver); the rest the kernel's sysfs
#: shows (read for a GPU on vfio-pci)
NVML_FAULTS = ("xid", "ecc", "lost", "hang")


def _bound_driver(function: Path) -> str | None:
    link = function / "driver"
    return Path(os.readlink(link)).name if os.path.islink(link) else None


def _unseen(address: str, fault: str, driver: str | None) -> str:
    """A note when the agent's health watch does not read what ``fault`` changed on a GPU bound to
    ``driver`` (it reads NVML on NVIDIA's driver, sysfs on vfio-pci): "raised" alone would promise a taint."""
    if driver == "nvidia" and fault not in NVML_FAULTS:
        return f"; note: GPU {address} is on nvidia: the agent watches it through NVML, not its AER, link or config files"
    if driver == "vfio-pci" and fault in NVML_FAULTS:
        return (f"; note: GPU {address} is on vfio-pci: the agent watches it through the kernel's AER, link and "
                "config files, not NVML")
    if driver not in ("nvidia", "vfio-pci"):
        return (f"; note: GPU {address} is on {driver or 'no driver'}: the agent's health watch reads only GPUs on "
                "nvidia (NVML) or vfio-pci (sysfs)")
    return ""


class _Stopped(BaseException):
    """SIGINT or SIGTERM arrived during ``sim reset``: raised at the next GPU (past any ``except Exception``)."""


def _reset(args, ref: str, root: Path) -> int:
    """Rebuild the simulated host. SIGINT and SIGTERM are taken as apply takes them (vgpuctl.cli.signals):
    remembered by a handler that cannot be lost wherever the signal lands, acted on between two GPUs,
    said in one line, exit 128 + the signal's number."""
    from mdev_manager import catalog
    from mdev_manager.sim import load_host
    from mdev_manager.sim.kernel import SimHost
    from mdev_manager.sim.node import sim_node
    from vgpuctl.cli.signals import StopSignals
    from vgpuctl.output.terminal import Terminal

    spec = load_host(ref)
    gpus = sum(g.count * catalog.board(g.board).gpus_per_board for g in spec.gpus)
    where = f" --sim-dir {args.sim_dir}" if args.sim_dir else ""
    incomplete = (f"interrupted: simulated host {ref} at {root} is incomplete; run vgpuctl --simulate {ref}{where} "
                  "sim reset again")
    with StopSignals() as signals:

        def stop_here() -> None:
            if signals.signum:
                raise _Stopped

        try:
            SimHost.remove(root)
            stop_here()
            with Terminal().progress(f"building simulated host {ref}", gpus) as on_gpu:  # a terminal only

                def built_one() -> None:
                    on_gpu(None)
                    stop_here()

                sim_node(root, spec, on_gpu=built_one)
        except KeyboardInterrupt:  # marked incomplete until its last write: no command uses it half-built
            print(incomplete, file=sys.stderr)
            raise
        except _Stopped:
            print(f"{signals.pending()}: {incomplete}", file=sys.stderr)
            return 128 + signals.signum
    if signals.signum:  # after the last GPU: the host is whole
        print(f"{signals.pending()}: it came after the last write; simulated host {ref} is whole, reset at {root}",
              file=sys.stderr)
        return 128 + signals.signum
    print(f"simulated host {ref} reset at {root}")
    return 0
