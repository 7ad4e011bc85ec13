"""Processes of a simulated host, so tests and demos can put a VM on a vGPU without a real process.

A process is ``<root>/proc/<pid>/`` laid out as the real ``/proc`` is: ``comm``,
``cmdline`` (NUL-separated) and ``fd/<n>`` symlinks to the files it holds open (0-2 on
``/dev/null``). The node manager's holder scan (:mod:`mdev_manager.host.procfs`) reads
them through HostIO exactly as it reads the real ``/proc``, and the simulated kernel asks
:meth:`SimProcs.holding` whether a vfio group or device cdev is busy (EBUSY on remove,
unbind, VF disable). A held file is linked by its resolved absolute path, as the kernel shows it.

A process appears and disappears whole (built aside, renamed into place; renamed aside,
removed), so a concurrent scan sees it with all its fds or not at all.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

FIRST_PID = 1000  # clear of the small pids a reader might take for real system processes
_STD_FDS = ("/dev/null",) * 3


class SimProcs:
    """The process table of the simulated host rooted at ``root``."""

    def __init__(self, root: Path):
        self.dir = Path(root) / "proc"
        self._last = Path(root) / ".sim/last_pid"  # pids are not handed out again, as on a fresh kernel

    def _next_pid(self) -> int:
        try:
            last = int(self._last.read_text())
        except (FileNotFoundError, ValueError):
            last = FIRST_PID - 1
        return max([last, *self.pids()]) + 1

    def pids(self) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self.dir) if n.isdigit())
        except FileNotFoundError:
            return []

    def spawn(self, paths: Iterable[Path | str], comm: str = "qemu-kvm", cmdline: list[str] | None = None) -> int:
        """Start a process holding ``paths`` open (fds 3, 4, ...); returns its pid.

        FileNotFoundError for a path that does not exist: a process can only open what is there.
        """
        targets = [os.path.realpath(p) for p in paths]
        for t in targets:
            if not os.path.lexists(t):
                raise FileNotFoundError(errno.ENOENT, "no such file to hold open", t)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".new-{os.getpid()}-{time.monotonic_ns()}"
        (tmp / "fd").mkdir(parents=True)
        (tmp / "comm").write_text(comm[:15] + "\n")  # TASK_COMM_LEN: the kernel keeps 15 characters
        (tmp / "cmdline").write_text("".join(f"{a}\0" for a in (cmdline or [comm])))
        for n, target in enumerate([*_STD_FDS, *targets]):
            os.symlink(target, tmp / "fd" / str(n))
        pid = self._next_pid()
        while True:
            try:
                os.rename(tmp, self.dir / str(pid))  # fails on an existing (never empty) process dir
                self._last.parent.mkdir(parents=True, exist_ok=True)
                self._last.write_text(str(pid))
                return pid
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                pid += 1

    def kill(self, pid: int) -> None:
        """End a process: its fds close with it. ProcessLookupError when there is none."""
        gone = self.dir / f".dead-{pid}-{time.monotonic_ns()}"
        try:
            os.rename(self.dir / str(int(pid)), gone)
        except FileNotFoundError:
            raise ProcessLookupError(errno.ESRCH, f"no simulated process {pid}") from None
        shutil.rmtree(gone)

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                self.kill(pid)
            except ProcessLookupError:
                pass  # ended meanwhile

    def holding(self, paths: set[str]) -> list[int]:
        """Simulated pids with any of ``paths`` open."""
        return holding(self.dir, paths)


def holding(proc_dir: Path | str, paths: set[str]) -> list[int]:
    """Pids under ``proc_dir`` (a real or simulated ``/proc``) with any of ``paths`` open.

    The kernel's own view, for the simulated kernel's EBUSY; paths compare resolved.
    """
    wanted = set(paths) | {os.path.realpath(p) for p in paths}
    out: list[int] = []
    try:
        pids = sorted(int(n) for n in os.listdir(proc_dir) if n.isdigit())
    except FileNotFoundError:
        return out
    for pid in pids:
        fd_dir = os.path.join(proc_dir, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # ended meanwhile, or not ours to look at
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    out.append(pid)
                    break
            except OSError:
                continue
    return out
