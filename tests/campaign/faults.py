"""The campaign's transport: the simulated host's own, with a kill switch and kernel faults.

Tests swap transports instead of monkeypatching (docs/design.md): the daemon and the
kubelet plugin under test get a :class:`FaultIO` and see nothing else.

* ``kill_after(n)``: the process dies right before its write number ``n`` (0: the next one).
  Death is :class:`Killed`, a ``BaseException`` no handler in the code under test catches,
  and the transport stays dead: any write a ``finally`` block tries afterwards raises again,
  so nothing reaches the disk after the kill, as with ``kill -9``.
  (tests/mdev_manager/test_crash.py kills real child processes with ``os._exit``; this is the
  in-process equivalent the campaign can afford at every step.)
* ``fail_kernel(n, errno)``: the kernel refuses write number ``n`` to sysfs with ``errno``
  (EBUSY, EINVAL, ENOSPC, EEXIST, EIO), once; the caller must cope.
"""

from __future__ import annotations

import errno as errnos
import os
from pathlib import Path

from mdev_manager.sim import SimIO
from mdev_manager.sim.kernel import SimHost

KERNEL_ERRNOS = {name: getattr(errnos, name) for name in ("EBUSY", "EINVAL", "ENOSPC", "EEXIST", "EIO")}


class Killed(BaseException):
    """The process was killed (SIGKILL): nothing after this point runs in it."""


class FaultIO(SimIO):
    def __init__(self, host: SimHost):
        super().__init__(host)
        self.writes = 0
        self.kernel_writes = 0
        self._kill_at: int | None = None
        self._fail_at: tuple[int, int] | None = None
        self.dead = False
        self.failed: list[str] = []  # what the injected kernel faults hit

    # ------------------------------------------------------------ arming
    def kill_after(self, n: int) -> None:
        self._kill_at = self.writes + n

    def fail_kernel(self, n: int, errno: int) -> None:
        self._fail_at = (self.kernel_writes + n, errno)

    def disarm(self) -> None:
        self._kill_at = self._fail_at = None

    # ------------------------------------------------------------ the switch
    def _before_write(self) -> None:
        if self.dead:
            raise Killed("write after death")
        if self._kill_at is not None and self.writes >= self._kill_at:
            self.dead = True
            raise Killed(f"killed before write {self.writes}")
        self.writes += 1

    def _is_kernel(self, path: Path) -> bool:
        real = os.path.realpath(path)
        return real == self._sys or real.startswith(self._sys + os.sep)

    def write(self, path: Path, data: str) -> None:
        self._before_write()
        if self._is_kernel(path):
            n, self.kernel_writes = self.kernel_writes, self.kernel_writes + 1
            if self._fail_at is not None and n == self._fail_at[0]:
                code = self._fail_at[1]
                self._fail_at = None
                self.failed.append(f"{errnos.errorcode[code]} on {path}")
                raise OSError(code, os.strerror(code), str(path))
        super().write(path, data)

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        self._before_write()
        super().write_atomic(path, data, durable)

    def remove(self, path: Path) -> None:
        self._before_write()
        super().remove(path)

    def rename(self, src: Path, dst: Path) -> None:
        self._before_write()
        super().rename(src, dst)

    def makedirs(self, path: Path) -> None:
        if self.dead:
            raise Killed("makedirs after death")
        super().makedirs(path)

    def rmdir(self, path: Path) -> None:
        self._before_write()
        super().rmdir(path)
