"""File access to the host, behind a swappable transport (as httpx swaps transports).

Production uses :class:`RealIO`. The simulated host supplies a transport whose
writes to kernel attributes behave like the kernel; tests wrap a transport to count
or interrupt writes. Nothing above this layer knows which one it has.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol


class HostIO(Protocol):
    def read(self, path: Path) -> str: ...
    def read_attrs(self, directory: Path, names: list[str]) -> dict[str, str | None]: ...
    def write(self, path: Path, data: str) -> None: ...
    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None: ...
    def remove(self, path: Path) -> None: ...
    def sync(self) -> None: ...
    def listdir(self, path: Path) -> list[str]: ...
    def readlink(self, path: Path) -> str: ...
    def exists(self, path: Path) -> bool: ...
    def is_dir(self, path: Path) -> bool: ...
    def realpath(self, path: Path) -> Path: ...


class RealIO:
    """Plain file I/O. A sysfs attribute write is one ``write(2)``, as the kernel wants."""

    def read(self, path: Path) -> str:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read()

    def read_attrs(self, directory: Path, names: list[str]) -> dict[str, str | None]:
        """Several attributes of one directory, stripped; None for those missing or unreadable.

        Opens each relative to a directory fd: one lookup per file instead of one per path
        component (much cheaper on big sysfs trees and on FUSE).
        """
        out: dict[str, str | None] = dict.fromkeys(names)
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return out
        try:
            for name in names:
                try:
                    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    out[name] = os.read(fd, 65536).decode("utf-8", "replace").strip()
                except OSError:
                    pass
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)
        return out

    def write(self, path: Path, data: str) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            raw = data.encode()
            n = os.write(fd, raw)
            if n != len(raw):
                raise OSError(errno.EIO, f"short write to {path}")
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
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if not durable:
            return
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def sync(self) -> None:
        """Flush every written file to disk (one call after many non-durable writes)."""
        os.sync()

    def remove(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

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


def read_attr(io: HostIO, path: Path, default: str | None = None) -> str | None:
    """Read a sysfs attribute without its trailing newline; ``default`` if absent."""
    try:
        return io.read(path).strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError, OSError):
        return default


def link_name(io: HostIO, path: Path) -> str | None:
    """Basename of a symlink's target (``driver``, ``iommu_group``, ``mdev_type``)."""
    try:
        return os.path.basename(io.readlink(path).rstrip("/"))
    except OSError:
        return None
