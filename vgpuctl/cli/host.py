"""The node a command works on: the real host, or the simulated one ``--simulate`` opened.

``main`` decides once, before the command runs: with ``--simulate`` it opens the simulated host
(:mod:`vgpuctl.cli.simhost`, the only CLI module that imports a simulator) and hands it over in
``args.simulated``; commands call :func:`open_host` and never import a simulator themselves, so
``vgpuctl serve`` on a real node loads none (an import contract holds it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from dra_bridge.api.nodepaths import DEFAULT_KUBELET_ROOT, NodePaths
from mdev_manager.discovery import read_failed
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO


@dataclass(frozen=True)
class Host:
    """A node to read or change: its paths and file transport, its name, where its kubelet keeps its
    files, and (simulated only) the preset and directory it lives in."""

    env: HostEnv
    io: HostIO
    node: str
    kubelet_root: Path = DEFAULT_KUBELET_ROOT
    preset: str | None = None
    sim_root: Path | None = None

    @property
    def simulated(self) -> bool:
        return self.preset is not None

    def paths(self, driver: str, cdi_root: Path | None = None) -> NodePaths:
        """The kubelet and DRA paths of this node for ``driver`` (``--kubelet-root`` applied)."""
        return NodePaths(driver=driver, kubelet_root=self.kubelet_root).with_(cdi_root=cdi_root)


def open_host(args) -> Host:
    """The real host (``--sys-root`` and friends applied), or the simulated one ``main`` opened."""
    if getattr(args, "simulated", None) is not None:
        host: Host = args.simulated(args)
        return host
    env = HostEnv()
    changes = {k: Path(v) for k, v in (("sys_root", args.sys_root), ("dev_root", args.dev_root),
                                       ("mdevctl_root", args.mdevctl_root), ("state_root", args.state_root)) if v}
    env = env.with_(**changes, libvirt_uri=args.libvirt_uri)
    kubelet = getattr(args, "kubelet_root", None)
    host = Host(env=env, io=RealIO(), node=os.environ.get("NODE_NAME", ""),
                kubelet_root=Path(kubelet) if kubelet else DEFAULT_KUBELET_ROOT)
    _check_sys_root(args, host)
    return host


def _check_sys_root(args, host: Host) -> None:
    """A ``--sys-root`` that is no sysfs would read as a node without GPUs: say so instead."""
    if not args.sys_root:
        return
    try:
        host.io.stat(host.env.pci_devices)
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"--sys-root {host.env.sys_root}: no bus/pci/devices under it; give the root of a sysfs "
                         "tree (default /sys)") from None
    except OSError as exc:
        raise read_failed(exc, host.env) from None


def sim_dir_for(ref: str) -> Path:
    """Where a simulated host named ``ref`` (a preset, or a host YAML file's stem) keeps its state."""
    base = Path(os.environ.get("VGPUCTL_SIM_DIR") or Path.home() / ".local/state/vgpuctl/sim")
    return base / Path(ref).stem


def dump(obj, fmt: str) -> str:
    data = obj.model_dump(mode="json", by_alias=True)
    return json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
