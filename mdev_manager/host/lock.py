"""One node-wide lock that serialises every writer of the host's GPU state.

``vgpuctl apply`` and ``restore``, the agent's reconcile and its kubelet plugin's prepare /
unprepare all change the same sysfs attributes, mdevctl definitions and vendor records; two
of them at once leave definitions without devices and records that disagree with the VFs.
Each takes this lock (an ``fcntl.flock`` on ``<state_root>/node.lock``) around its writes.

The holder writes its pid and command into the file, so a second writer can say whom it
waits for (or, not waiting, whom it lost to); on a full disk it holds the lock without that note.
flock locks die with their process: a holder killed with SIGKILL leaves a file with stale text
but no lock.

The lock goes straight to the file system, not through :class:`~mdev_manager.host.io.HostIO`:
HostIO has no way to hold an open descriptor (its calls open and close per call), and the
state root is a plain directory on real and simulated hosts alike (a simulated host keeps it
below its root), so ``flock`` means the same on both.

Within one process (the agent runs reconcile and the kubelet plugin side by side) the lock is
re-entrant per thread and the file is locked once, however many of the process's writers hold it.
A writer that changes only some GPUs, each under its own lock (the kubelet plugin's prepare and
unprepare: :mod:`dra_bridge.kubeletplugin.gpulocks`), holds it ``shared``: several of them run at
once, and the file stays locked while any of them runs, so a hand-run ``vgpuctl apply`` still waits
for all of them, and they for it. An exclusive holder (reconcile, restore) waits for every shared
one of the process and they for it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mdev_manager.host.env import HostEnv

LOCK_NAME = "node.lock"


class NodeLockBusy(RuntimeError):
    """Another writer holds the node lock and the caller chose not to wait."""

    def __init__(self, path: Path, holder: str):
        self.path, self.holder = path, holder
        super().__init__(f"the node lock {path} is held by {holder}; nothing was changed "
                         "(run again without --no-wait to wait for it)")


def _note_holder(fd: int, command: str) -> None:
    """Write ``pid command`` into the lock file. The note is for a waiting writer's message; the flock
    is the lock: on a full disk (or quota) the lock is held without it, and the apply goes on to name
    the state file it cannot write, instead of failing on the lock."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


def lock_path(env: HostEnv) -> Path:
    return env.state_root / LOCK_NAME


def _holder_text(fd: int) -> str:
    """``pid N (command)`` as the holder wrote it; what is there when the text is being rewritten."""
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        raw = ""
    pid, _, command = raw.partition(" ")
    if not pid.isdigit():
        return "another process (pid not recorded yet)"
    return f"pid {pid}" + (f" ({command})" if command else "")


class NodeLock:
    """The node lock of one host (``env.state_root``); :meth:`hold` takes it."""

    def __init__(self, env: HostEnv, command: str = ""):
        self.path = lock_path(env)
        self.command = command or "vgpuctl"
        self._thread_lock = threading.RLock()  # an exclusive holder's, for all its hold; a shared one's to enter
        self._depth = 0
        self._shared = 0  # shared holds of this process
        self._mine = threading.local()  # this thread's shared holds
        self._state = threading.Condition(threading.Lock())  # guards the counts and the descriptor
        self._fd: int | None = None

    @contextmanager
    def hold(self, *, wait: bool = True, on_wait: Callable[[str], None] | None = None,
             command: str | None = None, shared: bool = False) -> Iterator[None]:
        """Hold the lock for the block (``shared``: beside the process's other shared holders). Not
        waiting, a held lock raises :class:`NodeLockBusy`; waiting, ``on_wait`` is told once whom the
        caller waits for."""
        mine: int = getattr(self._mine, "n", 0)
        if not shared and mine:
            raise RuntimeError("this thread holds the node lock shared: taking it exclusively would wait for itself")
        nested = shared and mine > 0  # never queued behind a waiting exclusive holder
        if not nested and not self._thread_lock.acquire(blocking=wait):
            raise NodeLockBusy(self.path, f"another thread of this process (pid {os.getpid()})")
        if nested or (shared and self._depth == 0):  # (inside this thread's exclusive hold it is one more re-entry)
            if nested:
                with self._state:
                    self._shared += 1
            else:
                try:
                    self._take_file(wait, on_wait, command)
                    with self._state:
                        self._shared += 1
                finally:
                    self._thread_lock.release()  # entered: the next shared holder may enter beside it
            self._mine.n = getattr(self._mine, "n", 0) + 1
            try:
                yield
            finally:
                self._mine.n -= 1
                with self._state:
                    self._shared -= 1
                    self._release_if_idle()
                    self._state.notify_all()
            return
        try:
            if self._depth == 0:
                self._wait_shared(wait)
                self._take_file(wait, on_wait, command)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    with self._state:
                        self._release_if_idle()
        finally:
            self._thread_lock.release()

    def _wait_shared(self, wait: bool) -> None:
        """An exclusive holder (holding the thread lock: no new shared one enters) waits for the shared
        ones in flight to leave."""
        with self._state:
            while self._shared:
                if not wait:
                    raise NodeLockBusy(self.path, f"another thread of this process (pid {os.getpid()})")
                self._state.wait()

    def _take_file(self, wait: bool, on_wait: Callable[[str], None] | None, command: str | None) -> None:
        with self._state:
            if self._fd is None:
                self._fd = self._take(wait, on_wait, command or self.command)

    def _release_if_idle(self) -> None:
        if self._shared == 0 and self._depth == 0:
            self._release()

    def _take(self, wait: bool, on_wait: Callable[[str], None] | None, command: str) -> int:
        os.makedirs(self.path.parent, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                holder = _holder_text(fd)
                if not wait:
                    raise NodeLockBusy(self.path, holder) from None
                if on_wait is not None:
                    on_wait(f"waiting for the node lock held by {holder}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            _note_holder(fd, command)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no stale holder text for the next reader
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the last descriptor drops the flock
