"""Unix socket files the kubelet plugins serve on (both the DRA plugin and the device plugin),
and :class:`SocketKeeper`, which notices when one is removed behind the server's back."""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from mdev_manager.host.watch import HostWatcher

log = logging.getLogger(__name__)

# sun_path is 108 bytes including the terminating NUL.
UNIX_PATH_MAX = 107


def check_socket_path(path: Path) -> None:
    """Raise ValueError if ``path`` cannot be a unix socket address."""
    if len(os.fsencode(str(path))) > UNIX_PATH_MAX:
        raise ValueError(f"unix socket path longer than {UNIX_PATH_MAX} bytes: {path}")


def remove_socket(path: Path) -> None:
    """Remove a (stale) socket file; refuse to delete anything that is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path} is a directory, not a socket")
    if not stat.S_ISSOCK(st.st_mode):
        log.warning("removing non-socket file %s in the way of a socket", path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def prepare_socket(path: Path) -> str:
    """Create the parent directory, remove a stale socket, return the gRPC address."""
    path = Path(os.path.abspath(path))
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_socket(path)
    return f"unix:{path}"


def socket_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime) of the unix socket at ``path``: a socket removed and made again,
    even on a reused inode, differs. None where there is none (or another kind of file)."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


class SocketKeeper:
    """Notices when sockets a server bound are gone from their paths and asks for them again.

    The kubelet finds a plugin only by its socket files: one removed (the kubelet reinstalled, its
    state directory cleaned, an admin's ``rm``) leaves a server that nobody can reach, until the
    socket is bound again. ``sockets`` maps a name to (socket path, directory that must exist
    first): a directory the kubelet owns is never made here (a remover still at work would find it
    back; the kubelet makes its own directories when it starts), so such a socket waits for it.
    ``rebind(names)`` binds those sockets again and calls :meth:`mark` for each, once the
    directories have been quiet for ``settle`` seconds.

    Woken at once by inotify (the project's :class:`~mdev_manager.host.watch.HostWatcher`, on the
    sockets' directories and their parents, so a removed and re-created directory is seen too),
    and every ``poll_interval`` seconds anyway: a host without inotify, a socket replaced under the
    same name, all come down to comparing :func:`socket_identity` with what was bound (two
    ``stat`` calls).
    """

    def __init__(self, sockets: dict[str, tuple[Path, Path]], rebind: Callable[[list[str]], None], *,
                 poll_interval: float = 1.0, settle: float = 0.3, use_inotify: bool = True) -> None:
        self.sockets = {name: (Path(p), Path(gate)) for name, (p, gate) in sockets.items()}
        self.rebind = rebind
        self.poll_interval = poll_interval
        self.settle = settle
        dirs = {d for p, gate in self.sockets.values() for d in (p.parent, gate, gate.parent)}
        self._watcher = HostWatcher(sorted(dirs), poll_interval=poll_interval, use_inotify=use_inotify)
        self._bound: dict[str, tuple[int, int, int] | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self.rebinds = 0  # sockets bound again (observability, tests)

    def mark(self, name: str) -> None:
        """Record the socket ``name`` as it is now: the one the server just bound."""
        self._bound[name] = socket_identity(self.sockets[name][0])

    def gone(self) -> list[str]:
        """Names whose socket is no longer the one bound and whose directory is there to bind it in."""
        return [name for name, (path, gate) in self.sockets.items()
                if socket_identity(path) != self._bound.get(name) and gate.is_dir()]

    def _settled(self) -> bool:
        """Wait until the watched directories have been quiet for ``settle`` seconds (at most ten
        rounds): a remover at work (``rm -rf``) is let finish, instead of finding a new socket in
        the directory it is about to remove. False when stopped meanwhile."""
        for _ in range(10):
            if self._stop.is_set():
                return False
            if not self._watcher.wait(self._watcher.version, self.settle):
                break
        return not self._stop.is_set()

    def check_once(self) -> list[str]:
        """Bind again what is gone (after the directories settle); the names it asked for."""
        if not self.gone() or not self._settled():
            return []
        names = self.gone()
        if not names:
            return []
        try:
            self.rebind(names)
        except Exception as exc:  # noqa: BLE001 - retried at the next wake; logged once per distinct error
            if str(exc) != self._last_error:
                log.warning("cannot serve %s again (retrying every %ss): %s", ", ".join(names), self.poll_interval,
                            exc)
            self._last_error = str(exc)
            return []
        self._last_error = ""
        self.rebinds += len(names)
        return names

    def start(self) -> SocketKeeper:
        self._stop.clear()
        self._watcher.start()
        if self._watcher.inotify_error:
            log.info("sockets polled every %ss (inotify: %s)", self.poll_interval, self._watcher.inotify_error)
        self._thread = threading.Thread(target=self._run, name="socket-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching; waits for a rebind under way to finish (the caller stops the servers next)."""
        self._stop.set()
        self._watcher.bump()  # wakes the thread
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._watcher.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            seen = self._watcher.version
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - the keeper must outlive anything
                log.exception("socket keeper check failed")
            if not self._stop.is_set():
                self._watcher.wait(seen, self.poll_interval)
