"""Which processes hold a ``/dev/vfio/<group>`` or an iommufd user's per-device cdev
(``/dev/vfio/devices/vfioN``) open: a scan of ``/proc/*/fd``, through HostIO.

The facts only (pid, comm, group or cdev, the device a cdev belongs to, the functions a held
one shares its IOMMU group with, a VF's PF); what they mean for a vGPU or a GPU is
:mod:`mdev_manager.usage`'s business. Everything is read through a ``HostIO`` under ``env.proc_root``, so the same scan
runs on the real ``/proc`` and on a simulated host's processes (``<root>/proc/<pid>/fd/<n>``
symlinks, see :mod:`mdev_manager.sim.procs`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, link_name

_DELETED = " (deleted)"
K = TypeVar("K")


def _identity(st: os.stat_result) -> tuple:
    """Device nodes compare by device number (a container's /dev has its own inodes for
    the same node); anything else (test files) by inode."""
    if stat.S_ISCHR(st.st_mode):
        return ("chr", st.st_rdev)
    return ("ino", st.st_dev, st.st_ino)


class _Nodes(Generic[K]):
    """Identities of the device nodes in one directory, read once and only if needed
    (most hosts have no fd that needs them); ``key`` names a node (None: not one of ours)."""

    def __init__(self, io: HostIO, directory: Path, key: Callable[[str], K | None]):
        self.io, self.dir, self.key = io, directory, key
        self._by_identity: dict[tuple, K] | None = None

    def of(self, fd: Path) -> K | None:
        if self._by_identity is None:
            self._by_identity = {}
            try:
                names = self.io.listdir(self.dir)
            except OSError:
                names = []
            for name in names:
                if (k := self.key(name)) is None:
                    continue
                try:
                    self._by_identity[_identity(self.io.stat(self.dir / name))] = k
                except OSError:
                    pass
        try:
            return self._by_identity.get(_identity(self.io.stat(fd)))
        except OSError:
            return None


def _group_key(name: str) -> int | None:
    return int(name) if name.isdigit() else None


def _cdev_key(name: str) -> str | None:
    return name if name.startswith("vfio") and name[4:].isdigit() else None


class Proc(NamedTuple):
    """A process with a group or cdev open (the host layer's fact; usage makes it a ``Holder``)."""

    pid: int
    comm: str


def read_comm(io: HostIO, proc_dir: Path) -> str | None:
    """A process's command name; None once it has exited, ``?`` when it cannot be read."""
    try:
        return io.read(proc_dir / "comm").strip()
    except (FileNotFoundError, ProcessLookupError):
        return None  # exited meanwhile: it holds nothing any more
    except OSError:
        return "?"


class Held(NamedTuple):
    """What the scan found: group number -> processes, and cdev name (``vfioN``) -> processes."""

    groups: dict[int, list[Proc]]
    cdevs: dict[str, list[Proc]]


class _Matcher:
    """Tells which ``/dev/vfio/<group>`` or ``/dev/vfio/devices/vfioN`` an fd is, if any.

    An fd matches when its link target is that path (resolved), or, for processes in
    another mount namespace whose target reads ``.../vfio/<N>`` or ``.../vfio/devices/vfioN``,
    when it is the same device node (or file) as ours.
    """

    def __init__(self, env: HostEnv, io: HostIO):
        self.io = io
        self.group_dirs = {str(env.vfio_dir), str(io.realpath(env.vfio_dir))}
        self.cdev_dirs = {str(env.vfio_cdev_dir), str(io.realpath(env.vfio_cdev_dir))}
        self.groups = _Nodes(io, env.vfio_dir, _group_key)
        self.cdevs = _Nodes(io, env.vfio_cdev_dir, _cdev_key)

    def held(self, fd_dir: Path) -> tuple[set[int], set[str]]:
        """(groups, cdevs) one process holds; OSError when its fds cannot be listed."""
        groups: set[int] = set()
        cdevs: set[str] = set()
        for fd in self.io.listdir(fd_dir):
            path = fd_dir / fd
            try:
                target = self.io.readlink(path).removesuffix(_DELETED)
            except OSError:
                continue
            head, _, name = target.rpartition("/")
            if name.isdigit() and head.endswith("vfio"):
                if head in self.group_dirs:
                    groups.add(int(name))
                elif (g := self.groups.of(path)) is not None:
                    groups.add(g)
            elif _cdev_key(name) and head.endswith("vfio/devices"):
                if head in self.cdev_dirs:
                    cdevs.add(name)
                elif (c := self.cdevs.of(path)) is not None:
                    cdevs.add(c)
        return groups, cdevs


def scan(env: HostEnv, io: HostIO) -> Held:
    """Processes holding a vfio group or a vfio device cdev open, by pid.

    Processes that vanish or deny access are skipped.
    """
    match = _Matcher(env, io)
    held = Held({}, {})
    try:
        pids = [p for p in io.listdir(env.proc_root) if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        proc_dir = env.proc_root / pid
        try:
            groups, cdevs = match.held(proc_dir / "fd")
        except OSError:  # exited, or not ours to look at
            continue
        if not groups and not cdevs:
            continue
        comm = read_comm(io, proc_dir)
        if comm is None:
            continue
        for g in groups:
            held.groups.setdefault(g, []).append(Proc(int(pid), comm))
        for c in cdevs:
            held.cdevs.setdefault(c, []).append(Proc(int(pid), comm))
    for procs in (*held.groups.values(), *held.cdevs.values()):
        procs.sort()
    return held


def vfio_holders(env: HostEnv, io: HostIO) -> dict[int, list[Proc]]:
    """Map VFIO group number -> processes with ``<dev_root>/vfio/<group>`` open (see :func:`scan`)."""
    return scan(env, io).groups


def cdev_device(env: HostEnv, io: HostIO, cdev: str) -> str | None:
    """The device a vfio cdev (``vfioN``) belongs to: an mdev UUID or a PCI address; None when unknown.

    vfio registers each device's cdev as ``/sys/class/vfio-dev/vfioN`` (drivers/vfio/vfio_main.c,
    ``class_create("vfio-dev")``), a child of the device it drives, so its ``device`` link
    points at that device's directory: the mdev's ``<parent>/<uuid>``, or the PCI function (a VF
    holding a vendor-VFIO vGPU, or a function on vfio-pci). Documentation/driver-api/vfio.rst
    ("VFIO device cdev"): ``/dev/vfio/devices/vfioX`` <-> ``<device>/vfio-dev/vfioX``.
    """
    link = env.vfio_dev_class / cdev / "device"
    try:
        io.readlink(link)  # a link, or this is not a cdev's device
        name = io.realpath(link).name.lower()
    except OSError:
        return None
    return name or None


class Related(NamedTuple):
    """The PCI functions a held function answers for: its IOMMU group's other functions, and the
    PF when it is a VF (facts from sysfs; :mod:`mdev_manager.usage` decides what they mean)."""

    group: int | None
    group_mates: list[str]
    physfn: str | None


def related_functions(env: HostEnv, io: HostIO, address: str) -> Related:
    """``<bdf>/iommu_group`` (a link to ``/sys/kernel/iommu_groups/<N>``, whose ``devices/`` lists
    every member) and ``<bdf>/physfn`` (a VF's link to its PF; Documentation/PCI/pci-iov-howto.rst).
    Unreadable parts are left empty: an mdev, or a function gone meanwhile, has neither."""
    fdir = env.pci(address)
    group = link_name(io, fdir / "iommu_group")
    number = int(group) if group and group.isdigit() else None
    mates: list[str] = []
    if group is not None and number is not None:
        try:
            mates = sorted(n.lower() for n in io.listdir(env.iommu_groups / group / "devices") if n != address)
        except OSError:
            pass
    return Related(number, mates, physfn(env, io, address))


def physfn(env: HostEnv, io: HostIO, address: str) -> str | None:
    """A VF's PF (``<bdf>/physfn``, Documentation/PCI/pci-iov-howto.rst); None for anything else."""
    return link_name(io, env.pci(address) / "physfn")


def group_members(env: HostEnv, io: HostIO, group: int) -> list[str]:
    """The functions (or mdev) of an IOMMU group, from ``/sys/kernel/iommu_groups/<N>/devices``."""
    try:
        return sorted(n.lower() for n in io.listdir(env.iommu_groups / str(group) / "devices"))
    except OSError:
        return []
