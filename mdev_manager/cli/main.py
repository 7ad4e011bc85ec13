"""``vgpuctl``: the composition root. Nothing imports this package; it imports what a command needs.

Command modules are imported by name only for the command being run, so ``vgpuctl discover`` or
``vgpuctl plan`` load neither ``grpc`` nor ``kubernetes``. A module serves a command either with
``add_<command>(parser)`` (which sets ``func``) or with ``add_arguments(parser)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    description: str | None = None


COMMANDS: dict[str, Command] = {
    "discover": Command("mdev_manager.cli.node", "show GPUs, vGPU types and vGPUs"),
    "plan": Command("mdev_manager.cli.node", "print the steps apply would take"),
    "apply": Command("mdev_manager.cli.node", "make the node match a layout"),
    "restore": Command("mdev_manager.cli.node", "re-create saved vGPUs that are missing (after a reboot)"),
    "serve": Command("mdev_manager.cli.serve",
                     "run the node agent: reconcile, publish ResourceSlices, serve the kubelet"),
    "slices": Command("mdev_manager.cli.slices", "print the ResourceSlices this node would publish (writes nothing)"),
    "render": Command("mdev_manager.cli.render", "print KubeVirt and DRA objects (VMs, claims, DeviceClasses, ...)"),
    "demo": Command("mdev_manager.cli.demo", "run the whole system on a simulated cluster (no cluster, no GPU, seconds)",
                    "A simulated GPU node, the node manager, the DRA bridge publishing to an in-process API, VMs and "
                    "a pod claiming vGPUs and whole GPUs, torn down again."),
    "capacity": Command("mdev_manager.cli.capacity",
                        "how many more vGPUs of each profile (or whole GPUs) fit, per node and GPU",
                        "Reads ResourceSlices and ResourceClaims from a cluster (--kubeconfig), from a file of "
                        "objects (--from), or runs the simulated demo cluster with its workloads."),
    "conformance": Command("mdev_manager.cli.conformance",
                           "run the KAR-0003/KAR-0004 conformance checks (simulated cluster by default)",
                           "Five checks of GPU sharing through DRA; against the simulated cluster unless "
                           "--kubeconfig is given. Prints a table and writes JUnit XML."),
    "sim": Command("mdev_manager.cli.sim", "simulated hosts and the local Kubernetes API server"),
}

# global options that take a value: skipped when looking for the command name (``--simulate``
# takes the next word once :func:`_fix_simulate` has given a bare one its default)
_VALUED = {"--simulate", "--sim-dir", "--sys-root", "--dev-root", "--mdevctl-root", "--state-root", "--libvirt-uri"}


def _global_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--simulate", nargs="?", const="default", metavar="PRESET|HOST.yaml",
                   help="run against a simulated host (state kept between commands; preset default: default)")
    p.add_argument("--sim-dir", help="where the simulated host lives (default ~/.local/state/vgpuctl/sim/<name>, "
                                     "or $VGPUCTL_SIM_DIR/<name>)")
    p.add_argument("--sys-root", help="sysfs root (default /sys)")
    p.add_argument("--dev-root", help="/dev root (default /dev)")
    p.add_argument("--mdevctl-root", help="mdevctl definitions (default /etc/mdevctl.d)")
    p.add_argument("--state-root", help="vgpuctl state (default /var/lib/vgpuctl)")
    p.add_argument("--libvirt-uri", default=None, help="libvirt URI to check for devices in use (e.g. qemu:///system)")
    p.add_argument("-v", "--verbose", action="store_true", help="more detail (debug logs)")


def _command_of(argv: list[str]) -> str | None:
    """The first argument naming a command, skipping global options and their values."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in _VALUED:
            skip = True
        elif a in COMMANDS:
            return a
        elif not a.startswith("-"):
            return None  # a value where a command belongs: argparse says what is wrong
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only (every command is listed in ``-h``)."""
    p = argparse.ArgumentParser(prog="vgpuctl", description="vGPU and GPU passthrough manager for KubeVirt nodes")
    _global_options(p)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, c in COMMANDS.items():
        module = importlib.import_module(c.module) if name == command else None
        sp = sub.add_parser(name, help=c.help, description=c.description or c.help[:1].upper() + c.help[1:])
        if module is not None:
            adder = getattr(module, f"add_{name}", None)
            if adder is not None:
                adder(sp)
            else:
                module.add_arguments(sp)
                sp.set_defaults(func=module.run)
    return p


def _fix_simulate(argv: list[str]) -> list[str]:
    """``--simulate discover`` means the default preset, not a preset named discover."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--simulate" and (i + 1 == len(out) or out[i + 1] in COMMANDS or out[i + 1].startswith("-")):
            out[i] = "--simulate=default"
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _fix_simulate(sys.argv[1:] if argv is None else argv)  # before _command_of reads it
    args = build_parser(_command_of(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from mdev_manager.config import ConfigError

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
