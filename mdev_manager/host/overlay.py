"""A copy-on-write view of the host: reads fall through, writes stay in memory (previews).

``vgpuctl slices -f`` and ``capacity`` show what the node agent does once the node matches a
layout without changing the node (:mod:`mdev_manager.preview`). The steps that only record state
run through the agent's executor over an :class:`OverlayIO`: a file the agent writes (a saved
definition, a record) is kept in memory and read back from there; a file it removes is hidden;
the host is never written.

What a write to the kernel does (``sriov_numvfs`` making VFs, ``create`` making an mdev, an NVML
call making a GPU instance) is the kernel's to say, and a preview cannot ask it. Those writes go to
``kernel``, a model of the kernel's reaction supplied by whoever knows one; without one they are
refused with :class:`CannotPreview` and the overlay remembers it (:attr:`OverlayIO.refused`), so a
caller tells "the preview needs the kernel" apart from "the step failed".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mdev_manager.host.io import HostIO
    from mdev_manager.host.nvml import NvmlTransport

#: NVML calls that change the device (everything else reads)
_NVML_CHANGES = ("set_", "create_", "destroy_", "reset")


class CannotPreview(OSError):
    """A write whose effect only the kernel knows, in a preview that has no model of it."""

    def __init__(self, what: str):
        super().__init__(errno.EPERM, f"a preview cannot ask the kernel: {what}")


class OverlayIO:
    """A :class:`~mdev_manager.host.io.HostIO` over ``base`` that never writes to it.

    ``kernel_roots``: trees whose writes are the kernel's (sysfs, ``/dev``); a write there, and an
    NVML call that changes a device, goes to ``kernel(overlay, path, data)`` (NVML: path is the
    call's name, data its arguments) or, without it, is refused (:class:`CannotPreview`).
    """

    def __init__(self, base: HostIO, *, kernel_roots: Iterable[Path] = (),
                 kernel: Callable[[OverlayIO, str, Any], None] | None = None) -> None:
        self._base = base
        self._kernel = kernel
        self._roots = tuple(os.path.join(os.path.realpath(r), "") for r in kernel_roots)
        self._files: dict[str, str] = {}  # written here: path -> content
        self._dirs: set[str] = set()  # made here
        self._gone: set[str] = set()  # removed here: hides the base's path and all below it
        self._opaque: set[str] = set()  # removed, then made again: the base's children stay hidden
        self.refused: list[str] = []  # kernel writes refused for want of a model

    # ---- where things are
    def _key(self, path: Path | str) -> str:
        head, name = os.path.split(os.path.abspath(os.fspath(path)))
        return os.path.join(os.path.realpath(head), name) if name else head

    def _kernels(self, key: str) -> bool:
        return any(key.startswith(r) for r in self._roots)

    def _mine(self, key: str) -> bool:
        return key in self._files or key in self._dirs

    def _base_visible(self, key: str) -> bool:
        """The base's ``key`` shows through: neither it nor a directory above it was removed here."""
        a = key
        while True:
            if a in self._gone or (a != key and a in self._opaque):
                return False
            parent = os.path.dirname(a)
            if parent == a:
                return True
            a = parent

    def _touched_below(self, key: str) -> bool:
        prefix = os.path.join(key, "")
        return any(p == key or p.startswith(prefix) for s in (self._files, self._dirs, self._gone) for p in s)

    def _exists(self, key: str) -> bool:
        return self._mine(key) or (self._base_visible(key) and self._base.exists(Path(key)))

    def _isdir(self, key: str) -> bool:
        if key in self._dirs:
            return True
        if key in self._files:
            return False
        return self._base_visible(key) and self._base.is_dir(Path(key))

    def _missing(self, key: str) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), key)

    def _add_dirs(self, key: str) -> None:
        """``key`` and the directories above it that do not exist, made here."""
        missing = []
        a = key
        while not self._isdir(a):
            missing.append(a)
            a = os.path.dirname(a)
        for d in missing:
            if d in self._gone:
                self._gone.discard(d)
                self._opaque.add(d)
            self._files.pop(d, None)
            self._dirs.add(d)

    # ---- reads
    def read(self, path: Path) -> str:
        key = self._key(path)
        if key in self._files:
            return self._files[key]
        if key in self._dirs:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), key)
        if not self._base_visible(key):
            raise self._missing(key)
        return self._base.read(path)

    def read_bytes(self, path: Path, size: int) -> bytes:
        """Binary files (a PCI function's ``config``) are the kernel's: never written here, read through."""
        key = self._key(path)
        if key in self._files:
            return self._files[key].encode()[:size]
        if key in self._dirs:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), key)
        if not self._base_visible(key):
            raise self._missing(key)
        return self._base.read_bytes(path, size)

    def read_attrs(self, directory: Path, names: list[str]) -> dict[str, str | None]:
        key = self._key(directory)
        if not self._touched_below(key) and self._base_visible(key):
            return self._base.read_attrs(directory, names)
        out: dict[str, str | None] = dict.fromkeys(names)
        for name in names:
            with contextlib.suppress(OSError):
                out[name] = self.read(Path(key) / name).strip()
        return out

    def read_children(self, directory: Path, names: list[str]) -> dict[str, dict[str, str | None]]:
        key = self._key(directory)
        if not self._touched_below(key) and self._base_visible(key):
            return self._base.read_children(directory, names)
        return {c: self.read_attrs(Path(key) / c, names) for c in self.listdir(Path(key))
                if self._isdir(os.path.join(key, c))}

    def reusing_dirs(self) -> contextlib.AbstractContextManager:
        return self._base.reusing_dirs()

    def listdir(self, path: Path) -> list[str]:
        key = self._key(path)
        names = set(self._base.listdir(path)) if self._base_visible(key) and key not in self._opaque else set()
        names = {n for n in names if os.path.join(key, n) not in self._gone}
        for p in (*self._files, *self._dirs):
            if os.path.dirname(p) == key:
                names.add(os.path.basename(p))
        return sorted(names)

    def readlink(self, path: Path) -> str:
        key = self._key(path)
        if self._mine(key):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), key)
        if not self._base_visible(key):
            raise self._missing(key)
        return self._base.readlink(path)

    def exists(self, path: Path) -> bool:
        return self._exists(self._key(path))

    def is_dir(self, path: Path) -> bool:
        return self._isdir(self._key(path))

    def realpath(self, path: Path) -> Path:
        return self._base.realpath(path)

    def stat(self, path: Path) -> os.stat_result:
        key = self._key(path)
        if key in self._files:
            return os.stat_result((stat_mod.S_IFREG | 0o644, 0, 0, 1, 0, 0, len(self._files[key].encode()), 0, 0, 0))
        if key in self._dirs:
            return os.stat_result((stat_mod.S_IFDIR | 0o755, 0, 0, 2, 0, 0, 0, 0, 0, 0))
        if not self._base_visible(key):
            raise self._missing(key)
        return self._base.stat(path)

    def nvml(self) -> NvmlTransport:
        return _OverlayNvml(self)

    # ---- writes: kept here, the kernel's to its model
    def _to_kernel(self, what: str, data: Any) -> None:
        if self._kernel is None:
            self.refused.append(what)
            raise CannotPreview(what)
        self._kernel(self, what, data)

    def write(self, path: Path, data: str) -> None:
        key = self._key(path)
        if self._kernels(key):
            self._to_kernel(key, data)
            return
        if not self._exists(key) or self._isdir(key):  # as write(2) on a path that is no file
            raise self._missing(key)
        self._files[key] = data

    def set_file(self, path: Path | str, data: str) -> None:
        """A file made or changed here, as the kernel's model makes them (its parents made too)."""
        key = self._key(path)
        self._add_dirs(os.path.dirname(key))
        self._gone.discard(key)
        self._dirs.discard(key)
        self._files[key] = data

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        self.set_file(path, data)

    def remove(self, path: Path) -> None:
        key = self._key(path)
        if not self._exists(key):
            return
        self._files.pop(key, None)
        self._gone.add(key)

    def rename(self, src: Path, dst: Path) -> None:
        skey, dkey = self._key(src), self._key(dst)
        if not self._exists(skey):
            raise self._missing(skey)
        if self._isdir(skey):
            self._copy_tree(skey, dkey)
        else:
            self.set_file(dkey, self.read(Path(skey)))
        self._drop(skey)

    def _copy_tree(self, src: str, dst: str) -> None:
        self._add_dirs(dst)
        for name in self.listdir(Path(src)):
            s, d = os.path.join(src, name), os.path.join(dst, name)
            if self._isdir(s):
                self._copy_tree(s, d)
            else:
                self.set_file(d, self.read(Path(s)))

    def _drop(self, key: str) -> None:
        prefix = os.path.join(key, "")
        for s in (self._files, self._dirs, self._opaque):
            for p in [p for p in s if p == key or p.startswith(prefix)]:
                s.pop(p) if isinstance(s, dict) else s.discard(p)
        self._gone.add(key)

    def sync(self) -> None:
        pass

    def makedirs(self, path: Path) -> None:
        key = self._key(path)
        if self._exists(key) and not self._isdir(key):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), key)
        self._add_dirs(key)

    def rmdir(self, path: Path) -> None:
        key = self._key(path)
        if not self._isdir(key):
            raise self._missing(key) if not self._exists(key) else NotADirectoryError(
                errno.ENOTDIR, os.strerror(errno.ENOTDIR), key)
        if self.listdir(Path(key)):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), key)
        self._drop(key)


class _OverlayNvml:
    """The base's NVML for reading; a call that changes a device goes to the overlay's kernel model."""

    def __init__(self, overlay: OverlayIO) -> None:
        self._overlay = overlay
        self._t = overlay._base.nvml()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith(_NVML_CHANGES):
            return getattr(self._t, name)

        def change(*args: Any) -> Any:
            return self._overlay._to_kernel(f"nvml.{name}{args}", (name, args))
        return change
