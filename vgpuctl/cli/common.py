"""What every command shares: the host (real or simulated), the node name, machine output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO


def sim_dir_for(ref: str) -> Path:
    base = Path(os.environ.get("VGPUCTL_SIM_DIR") or Path.home() / ".local/state/vgpuctl/sim")
    return base / Path(ref).stem


def sim_root(args) -> Path | None:
    """Where the simulated host lives (None on a real host)."""
    if not args.simulate:
        return None
    return Path(args.sim_dir) if args.sim_dir else sim_dir_for(args.simulate)


DEFAULT_KUBELET_ROOT = Path("/var/lib/kubelet")
KUBELET_ROOT_HELP = ("kubelet directory; prepared DRA claims are read from <it>/plugins/<driver>/checkpoint.json "
                     "(default /var/lib/kubelet; with --simulate, <simulated host dir>/kubelet, where "
                     "vgpuctl --simulate serve keeps them)")


def kubelet_root(args) -> Path:
    """``--kubelet-root``, else the simulated host's own kubelet directory, else /var/lib/kubelet:
    ``serve --simulate`` and ``apply --simulate`` on one simulated node agree on it."""
    if getattr(args, "kubelet_root", None):
        return Path(args.kubelet_root)
    root = sim_root(args)
    return root / "kubelet" if root is not None else DEFAULT_KUBELET_ROOT


def open_host(args) -> tuple[HostEnv, HostIO]:
    """The real host, or a simulated one whose state persists between commands."""
    if args.simulate:
        from mdev_manager.sim.node import sim_node

        sim = sim_node(sim_root(args), args.simulate, reuse=True, libvirt_uri=args.libvirt_uri)
        return sim.env, sim.io
    env = HostEnv()
    changes = {k: Path(v) for k, v in (("sys_root", args.sys_root), ("dev_root", args.dev_root),
                                       ("mdevctl_root", args.mdevctl_root), ("state_root", args.state_root)) if v}
    env = env.with_(**changes, libvirt_uri=args.libvirt_uri)
    return env, RealIO()


def check_sys_root(args, env: HostEnv, io: HostIO) -> None:
    """A ``--sys-root`` that is no sysfs would read as a node without GPUs: say so instead."""
    from mdev_manager.discovery import read_failed

    if args.simulate or not args.sys_root:
        return
    try:
        io.stat(env.pci_devices)
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"--sys-root {env.sys_root}: no bus/pci/devices under it; give the root of a sysfs "
                         "tree (default /sys)") from None
    except OSError as exc:
        raise read_failed(exc, env) from None


def node_name(args, env: HostEnv | None = None) -> str:
    """The node's name: the simulated host's, else $NODE_NAME."""
    if args.simulate:
        from mdev_manager.sim import load_host

        return load_host(args.simulate).node
    return os.environ.get("NODE_NAME", "")


def dump(obj, fmt: str) -> str:
    data = obj.model_dump(mode="json", by_alias=True)
    return json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
