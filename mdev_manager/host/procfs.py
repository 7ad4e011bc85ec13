"""Which processes hold a ``/dev/vfio/<group>`` open: a scan of ``/proc/*/fd``, through HostIO.

The facts only (pid, comm, group); what they mean for a vGPU is :mod:`mdev_manager.usage`'s
business. Everything is read through a ``HostIO`` under ``env.proc_root``, so the same scan
runs on the real ``/proc`` and on a simulated host's processes (``<root>/proc/<pid>/fd/<n>``
symlinks, see :mod:`mdev_manager.sim.procs`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO

_DELETED = " (deleted)"


def _identity(st: os.stat_result) -> tuple:
    """Device nodes compare by device number (a container's /dev has its own inodes for
    the same node); anything else (test files) by inode."""
    if stat.S_ISCHR(st.st_mode):
        return ("chr", st.st_rdev)
    return ("ino", st.st_dev, st.st_ino)


class _GroupNodes:
    """Identities of the ``<dev_root>/vfio/<N>`` nodes, read once and only if needed
    (most hosts have no fd that needs them)."""

    def __init__(self, env: HostEnv, io: HostIO):
        self.env, self.io = env, io
        self._by_identity: dict[tuple, int] | None = None

    def group_of(self, fd: Path) -> int | None:
        if self._by_identity is None:
            self._by_identity = {}
            try:
                names = self.io.listdir(self.env.vfio_dir)
            except OSError:
                names = []
            for name in filter(str.isdigit, names):
                try:
                    self._by_identity[_identity(self.io.stat(self.env.vfio_dir / name))] = int(name)
                except OSError:
                    pass
        try:
            return self._by_identity.get(_identity(self.io.stat(fd)))
        except OSError:
            return None


class Proc(NamedTuple):
    """A process with a group open (the host layer's fact; usage makes it a ``Holder``)."""

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


def _held_groups(io: HostIO, fd_dir: Path, vfio_dirs: set[str], nodes: _GroupNodes) -> set[int]:
    """Groups one process holds; OSError when its fds cannot be listed."""
    groups: set[int] = set()
    for fd in io.listdir(fd_dir):
        path = fd_dir / fd
        try:
            target = io.readlink(path).removesuffix(_DELETED)
        except OSError:
            continue
        head, _, name = target.rpartition("/")
        if not name.isdigit() or not head.endswith("vfio"):
            continue
        if head in vfio_dirs:
            groups.add(int(name))
        elif (g := nodes.group_of(path)) is not None:
            groups.add(g)
    return groups


def vfio_holders(env: HostEnv, io: HostIO) -> dict[int, list[Proc]]:
    """Map VFIO group number -> processes with ``<dev_root>/vfio/<group>`` open, by pid.

    An fd matches when its link target is that path (resolved), or, for processes in
    another mount namespace whose target reads ``.../vfio/<N>``, when it is the same
    device node or file. Processes that vanish or deny access are skipped.
    """
    vfio_dirs = {str(env.vfio_dir), str(io.realpath(env.vfio_dir))}
    nodes = _GroupNodes(env, io)
    held: dict[int, list[Proc]] = {}
    try:
        pids = [p for p in io.listdir(env.proc_root) if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        proc_dir = env.proc_root / pid
        try:
            groups = _held_groups(io, proc_dir / "fd", vfio_dirs, nodes)
        except OSError:  # exited, or not ours to look at
            continue
        if not groups:
            continue
        comm = read_comm(io, proc_dir)
        if comm is None:
            continue
        for g in groups:
            held.setdefault(g, []).append(Proc(int(pid), comm))
    for procs in held.values():
        procs.sort()
    return held
