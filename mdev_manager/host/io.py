"""File access to the host, behind a swappable transport (as httpx swaps transports).

Every read and write of a host file (sysfs, ``/dev``, ``/proc``, saved state) goes
through a ``HostIO``. Production uses :class:`RealIO`. The simulated host supplies a
transport whose writes to kernel attributes behave like the kernel; tests wrap a
transport to count or interrupt writes. Nothing above this layer knows which one it has.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mdev_manager.host.nvml import NvmlTransport

# A kept directory fd whose directory went away (removed, or removed and made again)
# fails with one of these; the open then walks the full path once more.
_STALE = (errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.ENODEV)


class HostIO(Protocol):
    def read(self, path: Path) -> str: ...
    def read_bytes(self, path: Path, size: int) -> bytes: ...
    def read_attrs(self, directory: Path, names: list[str]) -> dict[str, str | None]: ...
    def read_children(self, directory: Path, names: list[str]) -> dict[str, dict[str, str | None]]: ...
    def reusing_dirs(self) -> contextlib.AbstractContextManager: ...
    def write(self, path: Path, data: str) -> None: ...
    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None: ...
    def remove(self, path: Path) -> None: ...
    def rename(self, src: Path, dst: Path) -> None: ...
    def sync(self) -> None: ...
    def listdir(self, path: Path) -> list[str]: ...
    def readlink(self, path: Path) -> str: ...
    def exists(self, path: Path) -> bool: ...
    def is_dir(self, path: Path) -> bool: ...
    def realpath(self, path: Path) -> Path: ...
    def stat(self, path: Path) -> os.stat_result: ...
    def makedirs(self, path: Path) -> None: ...
    def rmdir(self, path: Path) -> None: ...
    def nvml(self) -> NvmlTransport: ...


def named(exc: OSError, path: Path | str) -> OSError:
    """``exc`` with the path it concerns (``write(2)`` on an fd reports none), so the one line a
    command prints names the file: ``/var/lib/vgpuctl/x: No space left on device``."""
    if exc.filename is not None:
        return exc
    out = type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno or 0), str(path))
    return out


class RealIO:
    """Plain file I/O. A sysfs attribute write is one ``write(2)``, as the kernel wants."""

    def __init__(self, nvml: NvmlTransport | None = None) -> None:
        self._local = threading.local()
        self._nvml = nvml  # None: NVIDIA's library through nvidia-ml-py, on first use
        self._dirty: set[str] = set()  # directories written without fsync since the last sync()
        self._dirty_lock = threading.Lock()

    def _dirtied(self, path: Path | str) -> None:
        if self.__dict__.get("_dirty_lock") is None:  # a subclass that skipped __init__
            self._dirty, self._dirty_lock = set(), threading.Lock()
        with self._dirty_lock:
            self._dirty.add(os.path.dirname(os.path.abspath(path)))

    def read(self, path: Path) -> str:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def read_bytes(self, path: Path, size: int) -> bytes:
        """The first ``size`` bytes of a binary file (a PCI function's ``config``: its header, raw)."""
        with open(path, "rb") as f:
            return f.read(size)

    def read_attrs(self, directory: Path, names: list[str]) -> dict[str, str | None]:
        """Several attributes of one directory, stripped; None for those missing or unreadable.

        Opens each relative to a directory fd: one lookup per file instead of one per path
        component (much cheaper on big sysfs trees and on FUSE).
        """
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return dict.fromkeys(names)
        try:
            return _read_at(dfd, names)
        finally:
            os.close(dfd)

    def read_children(self, directory: Path, names: list[str]) -> dict[str, dict[str, str | None]]:
        """``read_attrs`` of every subdirectory of ``directory`` (an mdev parent's types).

        Each subdirectory is opened relative to its parent's fd, so the path above them is walked
        once for all of them. One attribute a child (each type's ``available_instances``) is opened
        as ``child/name`` relative to the parent's fd instead: the same lookups, no descriptor for
        the child (an mdev parent's 23 types: 23 fewer open/close pairs); a child whose attribute
        does not open is checked to be a directory, as a file or one gone since the listing is
        left out either way. (Several attributes keep the child's fd: on FUSE every ``child/``
        prefix is one more lookup the daemon answers.)
        """
        out: dict[str, dict[str, str | None]] = {}
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return out
        try:
            for child in sorted(os.listdir(dfd)):
                if len(names) == 1:
                    got = _read_at(dfd, names, f"{child}/")
                    if got[names[0]] is None and not _is_dir_at(dfd, child):
                        continue
                    out[child] = got
                    continue
                try:
                    cfd = os.open(child, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
                except OSError:
                    continue  # a file, or gone since the listing
                try:
                    out[child] = _read_at(cfd, names)
                finally:
                    os.close(cfd)
        finally:
            os.close(dfd)
        return out

    @contextlib.contextmanager
    def reusing_dirs(self) -> Iterator[None]:
        """Within the block, this thread's writes keep each directory they write into open.

        An apply writes ``create`` 16 times into one type directory; opening it relative to
        a kept fd costs one lookup instead of one per path component. A directory that
        went away meanwhile is looked up afresh, so a kept fd never changes a result.
        """
        if self.__dict__.get("_local") is None:  # a subclass that skipped __init__
            self._local = threading.local()
        if getattr(self._local, "dirs", None) is not None:
            yield  # nested: the outer block owns the fds
            return
        self._local.dirs = {}
        try:
            yield
        finally:
            dirs, self._local.dirs = self._local.dirs, None
            for fd in dirs.values():
                os.close(fd)

    def _open_for_write(self, path: Path) -> int:
        dirs = getattr(self.__dict__.get("_local"), "dirs", None)
        if dirs is None:
            return os.open(path, os.O_WRONLY)
        parent, name = os.path.split(os.fspath(path))
        dfd = dirs.get(parent)
        if dfd is not None:
            try:
                return os.open(name, os.O_WRONLY, dir_fd=dfd)
            except OSError as e:
                if e.errno not in _STALE:
                    raise
                os.close(dirs.pop(parent))
        try:
            dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return os.open(path, os.O_WRONLY)  # fails with the error a plain open gives
        dirs[parent] = dfd
        return os.open(name, os.O_WRONLY, dir_fd=dfd)

    def write(self, path: Path, data: str) -> None:
        fd = self._open_for_write(path)
        try:
            raw = data.encode()
            n = os.write(fd, raw)
            if n != len(raw):
                raise OSError(errno.EIO, "short write", str(path))
        except OSError as exc:
            raise named(exc, path) from None
        finally:
            os.close(fd)

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        """Write a regular file so a crash leaves the old or the new content, never half.

        ``durable`` also fsyncs the file and its directory, so the new content survives a
        power loss; transient files (CDI specs under /var/run) skip that cost.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk: the old content stays, no temporary is left
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise named(exc, path) from None
        if not durable:
            self._dirtied(path)
            return
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def sync(self) -> None:
        """Flush what this transport wrote without fsync (one call after many non-durable writes):
        ``syncfs(2)`` of each filesystem it wrote to, not ``sync(2)`` of every filesystem of the host,
        whose VM disks may hold gigabytes of dirty pages that a stopping apply would wait for."""
        if self.__dict__.get("_dirty_lock") is None:
            return  # a subclass that skipped __init__ and never wrote through write_atomic
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        seen: set[int] = set()
        for d in sorted(dirty):
            while d != os.path.dirname(d) and not os.path.isdir(d):
                d = os.path.dirname(d)  # removed since: its filesystem is its parent's
            try:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                os.sync()
                return
            try:
                dev = os.fstat(fd).st_dev
                if dev not in seen:
                    seen.add(dev)
                    _syncfs(fd)
            finally:
                os.close(fd)

    def remove(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        self._dirtied(path)

    def rename(self, src: Path, dst: Path) -> None:
        """``rename(2)``: ``src`` becomes ``dst`` in one step (same filesystem; a file or a directory)."""
        os.rename(src, dst)
        self._dirtied(dst)

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def readlink(self, path: Path) -> str:
        return os.readlink(path)

    def exists(self, path: Path) -> bool:
        return os.path.lexists(path)

    def is_dir(self, path: Path) -> bool:
        return os.path.isdir(path)

    def realpath(self, path: Path) -> Path:
        return Path(os.path.realpath(path))

    def stat(self, path: Path) -> os.stat_result:
        """``stat(2)``, following links (a ``/proc/<pid>/fd/<n>`` gives the file it holds)."""
        return os.stat(path)

    def makedirs(self, path: Path) -> None:
        """A directory and its missing parents; no error when it exists."""
        os.makedirs(path, exist_ok=True)

    def rmdir(self, path: Path) -> None:
        """Remove an empty directory (OSError when it is not empty or absent)."""
        os.rmdir(path)

    def nvml(self) -> NvmlTransport:
        """NVIDIA's management library (MIG), through nvidia-ml-py; loaded on first call."""
        from mdev_manager.host.nvml import PynvmlTransport

        if self.__dict__.get("_nvml") is None:
            self._nvml = PynvmlTransport()
        return self._nvml  # type: ignore[return-value]


def _syncfs(fd: int) -> None:
    """``syncfs(2)`` of the filesystem holding ``fd``; ``sync(2)`` where the C library has none."""
    fn = getattr(_libc(), "syncfs", None)
    if fn is None or fn(fd) != 0:
        os.sync()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _read_at(dfd: int, names: list[str], prefix: str = "") -> dict[str, str | None]:
    out: dict[str, str | None] = dict.fromkeys(names)
    for name in names:
        try:
            fd = os.open(prefix + name, os.O_RDONLY, dir_fd=dfd)
        except OSError:
            continue
        try:
            out[name] = os.read(fd, 65536).decode("utf-8", "replace").strip()
        except OSError:
            pass
        finally:
            os.close(fd)
    return out


def _is_dir_at(dfd: int, name: str) -> bool:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
    except OSError:
        return False
    os.close(fd)
    return True


def read_attr(io: HostIO, path: Path, default: str | None = None) -> str | None:
    """Read a sysfs attribute without its trailing newline; ``default`` if absent."""
    try:
        return io.read(path).strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError, OSError):
        return default


def override_value(raw: str | None) -> str | None:
    """A ``driver_override`` as read, or None when unset (the kernel reads ``(null)``)."""
    return None if raw in (None, "", "(null)") else raw


def link_name(io: HostIO, path: Path) -> str | None:
    """Basename of a symlink's target (``driver``, ``iommu_group``, ``mdev_type``)."""
    try:
        return os.path.basename(io.readlink(path).rstrip("/"))
    except OSError:
        return None
