"""The node a command works on: the real host, or the simulated one ``--simulate`` opened.

``main`` decides once, before the command runs: with ``--simulate`` it opens the simulated host
(:mod:`vgpuctl.cli.simhost`, the only CLI module that imports a simulator) and hands it over in
``args.simulated``; commands call :func:`open_host` and never import a simulator themselves, so
``vgpuctl serve`` on a real node loads none (an import contract holds it).
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from dra_bridge.api.nodepaths import DEFAULT_KUBELET_ROOT, NodePaths
from mdev_manager import numbering
from mdev_manager.discovery import discover, gpu_ids, read_failed
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO
from mdev_manager.models import Usage
from mdev_manager.numbering import Numbered


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


class NotSetUp(Exception):
    """The node does not match the layout yet, so what a command would show is not what the agent
    will do once it applied it (exit 3, as a converging apply)."""

    exit_code = 3


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


def prepared_usage(host: Host, driver: str) -> Usage:
    """Devices the kubelet plugin's prepared claims hold (its checkpoint, read-only): what a hand-run
    ``apply``, ``restore`` or ``slices`` must count as in use, as ``serve`` does."""
    path = host.paths(driver).checkpoint
    try:
        host.io.stat(path)
    except FileNotFoundError:  # no checkpoint, no claims (the store's own answer), without loading its models
        return Usage()
    except OSError:
        pass  # the store says what is wrong with it
    from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore

    try:
        cp = CheckpointStore(path, host.io).load()
    except CheckpointCorrupt as exc:
        return _cannot_tell(host.env, host.io, f"the prepared-claims checkpoint {path} cannot be read ({exc}): which devices "
                                     "DRA claims hold cannot be told, so no existing vGPU or passed-through GPU is "
                                     "removed or changed; the agent (vgpuctl serve) rebuilds it at its next start")
    return cp.usage()


def _cannot_tell(env: HostEnv, io: HostIO, warning: str) -> Usage:
    """Every device a plan could remove or change counts as in use."""
    inv = discover(env, io)
    who = ["an unreadable prepared-claims checkpoint (may be a DRA claim)"]
    mdevs = {v.id: who for v in inv.all_vgpus() if v.framework == "mdev"}
    pci = {v.id: who for v in inv.all_vgpus() if v.framework != "mdev"}
    pci |= {g.address: who for g in inv.gpus if g.driver == "vfio-pci"}
    return Usage(mdevs=mdevs, pci=pci, warnings=[warning])


def numbering_of(host: Host, driver: str) -> dict[str, Numbered]:
    """The node's GPU numbering, read only (an earlier release's, the DRA driver's, where the node has none)."""
    return numbering.load(host.env, host.io, host.paths(driver).gpu_ids)


def number_gpus(host: Host, driver: str, *, writes: bool) -> None:
    """Number the GPUs on the bus that the node's numbering lacks, and save it: whichever command sees
    a GPU first numbers it, so an ``index:`` of a layout names the same GPU for every command even
    after one leaves the bus. A command that changes nothing else (``discover``, ``plan``) goes on
    without it where the state cannot be written (not root, a read-only or full disk: a read-only
    command must still read), saying why unless it is a permission; ``apply`` and ``restore`` fail."""
    gpus = gpu_ids(host.env, host.io)  # first: a host that cannot be read says so, naming sysfs
    try:
        numbering.adopt(host.env, host.io, host.paths(driver).gpu_ids)
        numbering.record(host.env, host.io, gpus)
    except OSError as exc:
        if writes:
            raise
        if not (isinstance(exc, PermissionError) or exc.errno == errno.EROFS):
            print(f"warning: the GPU numbering was not saved ({exc.strerror or exc}: "
                  f"{exc.filename or host.env.gpu_ids}); a new GPU's index is kept once a command saves it", file=sys.stderr)


def sim_dir_for(ref: str) -> Path:
    """Where a simulated host named ``ref`` (a preset, or a host YAML file's stem) keeps its state."""
    base = Path(os.environ.get("VGPUCTL_SIM_DIR") or Path.home() / ".local/state/vgpuctl/sim")
    return base / Path(ref).stem


def dump(obj, fmt: str) -> str:
    if fmt == "json":  # pydantic's own encoder: json.dumps with an indent falls back to pure Python (4 s for 7 MB)
        return obj.model_dump_json(indent=2, by_alias=True)
    import yaml

    return yaml.safe_dump(obj.model_dump(mode="json", by_alias=True), sort_keys=False)
