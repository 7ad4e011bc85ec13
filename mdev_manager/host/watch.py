"""Watch the host for devices coming and going: inotify (ctypes on libc, no dependency) plus a poll.

The kernel sends no inotify events in sysfs for devices appearing or leaving, and some hosts
have no inotify at all, so :class:`HostWatcher` also compares directory listings every
``poll_interval`` seconds. Consumers (the classic device plugin's streams) wait on its
``version`` instead of polling the host themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Iterable
from pathlib import Path

from mdev_manager.host.env import HostEnv

log = logging.getLogger(__name__)

IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
WATCH_MASK = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_EVENT = struct.Struct("iIII")


class Inotify:
    """A minimal inotify instance through ctypes; OSError where the kernel or libc lacks it."""

    _libc: ctypes.CDLL | None = None

    @classmethod
    def _lib(cls) -> ctypes.CDLL:
        if cls._libc is None:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_init1.restype = ctypes.c_int
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.inotify_add_watch.restype = ctypes.c_int
            lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.inotify_rm_watch.restype = ctypes.c_int
            cls._libc = lib
        return cls._libc

    def __init__(self) -> None:
        try:
            lib = self._lib()
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"inotify unavailable: {exc}") from None
        fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd
        self._lib_ref = lib

    def add_watch(self, path: Path, mask: int = WATCH_MASK) -> int:
        wd = self._lib_ref.inotify_add_watch(self.fd, os.fsencode(str(path)), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch {path}: {os.strerror(e)}")
        return wd

    def rm_watch(self, wd: int) -> None:
        self._lib_ref.inotify_rm_watch(self.fd, wd)

    def read_events(self) -> list[tuple[int, int, str]]:
        """Pending events as (wd, mask, name); [] when none."""
        out: list[tuple[int, int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return out
            if not buf:
                return out
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                raw = buf[off + _EVENT.size: off + _EVENT.size + length]
                out.append((wd, mask, os.fsdecode(raw.rstrip(b"\0"))))
                off += _EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HostWatcher:
    """Wakes device plugin streams when ``/dev/vfio``, mdevs or PCI devices change.

    ``version`` grows on every change seen: an inotify event on one of ``paths``, or a
    change in their listings (checked every ``poll_interval`` seconds, which covers
    sysfs, where the kernel sends no inotify events for devices coming and going, and
    hosts without inotify). Watches on paths that do not exist yet are added once they do.
    """

    def __init__(self, paths: Iterable[Path], *, poll_interval: float = 2.0, use_inotify: bool = True) -> None:
        self.paths = [Path(p) for p in paths]
        self.poll_interval = poll_interval
        self.use_inotify = use_inotify
        self._cond = threading.Condition()
        self._version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inotify: Inotify | None = None
        self._wds: dict[int, Path] = {}
        self._pipe: tuple[int, int] | None = None
        self.inotify_error: str | None = None
        self.events = 0  # inotify events seen (observability, tests)

    @classmethod
    def for_env(cls, env: HostEnv, *, poll_interval: float = 2.0, use_inotify: bool = True) -> HostWatcher:
        return cls([env.vfio_dir, env.mdev_devices, env.pci_devices], poll_interval=poll_interval,
                   use_inotify=use_inotify)

    # ----------------------------------------------------------------- change signal
    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def bump(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def wait(self, seen: int | None, timeout: float) -> bool:
        """True as soon as ``version`` differs from ``seen`` (at once if ``seen`` is None)."""
        if seen is None:
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._version != seen, timeout)

    @property
    def watched(self) -> list[Path]:
        return sorted(self._wds.values())

    @property
    def inotify_active(self) -> bool:
        return self._inotify is not None and bool(self._wds)

    # ----------------------------------------------------------------- thread
    def start(self) -> HostWatcher:
        if self._thread is not None:
            raise RuntimeError("HostWatcher already started")
        self._stop.clear()
        if self.use_inotify:
            try:
                self._inotify = Inotify()
            except OSError as exc:
                self.inotify_error = str(exc)
                log.info("inotify unavailable (%s); polling %s every %ss", exc, self.paths, self.poll_interval)
        self._pipe = os.pipe()
        self._ensure_watches()
        self._last = self._fingerprint()
        self._thread = threading.Thread(target=self._run, name="vgpu-host-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._wds.clear()
        if self._pipe is not None:
            for fd in self._pipe:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._pipe = None

    def __enter__(self) -> HostWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ensure_watches(self) -> None:
        if self._inotify is None:
            return
        have = set(self._wds.values())
        for p in self.paths:
            if p in have or not p.is_dir():
                continue
            try:
                self._wds[self._inotify.add_watch(p)] = p
            except OSError as exc:
                self.inotify_error = str(exc)
                log.debug("cannot watch %s: %s (polled instead)", p, exc)

    def _fingerprint(self) -> tuple:
        out: list[tuple[str, ...] | None] = []
        for p in self.paths:
            try:
                out.append(tuple(sorted(os.listdir(p))))
            except OSError:
                out.append(None)
        return tuple(out)

    def _run(self) -> None:
        assert self._pipe is not None
        while not self._stop.is_set():
            fds = [self._pipe[0]] + ([self._inotify.fd] if self._inotify is not None else [])
            try:
                ready, _, _ = select.select(fds, [], [], self.poll_interval)
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                ready = []
            if self._stop.is_set():
                return
            changed = False
            if self._inotify is not None and self._inotify.fd in ready:
                try:
                    changed = self._handle_events(self._inotify.read_events())
                except OSError as exc:
                    log.warning("reading inotify events failed: %s", exc)
            try:
                self._ensure_watches()
                fp = self._fingerprint()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("host watcher poll failed")
                continue
            if fp != self._last:
                self._last = fp
                changed = True
            if changed:
                self.bump()

    def _handle_events(self, events: list[tuple[int, int, str]]) -> bool:
        changed = False
        for wd, mask, _name in events:
            self.events += 1
            changed = True
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                path = self._wds.pop(wd, None)
                if path is not None and mask & IN_MOVE_SELF and self._inotify is not None:
                    self._inotify.rm_watch(wd)  # the watch follows the moved inode; re-add by path
            if mask & IN_Q_OVERFLOW:
                log.info("inotify queue overflow; re-reading every device")
        return changed


__all__ = [
    "IN_ATTRIB", "IN_CREATE", "IN_DELETE", "IN_DELETE_SELF", "IN_IGNORED", "IN_MOVED_FROM", "IN_MOVED_TO",
    "IN_MOVE_SELF", "IN_ONLYDIR", "IN_Q_OVERFLOW", "WATCH_MASK", "HostWatcher", "Inotify",
]
