"""The campaign's transport: the simulated host's own, with a kill switch, kernel and disk faults,
the page cache's un-synced writes, and a scheduling point at every call.

Tests swap transports instead of monkeypatching (docs/design.md): the agent, its kubelet plugin
and a hand-run ``vgpuctl`` get a :class:`FaultIO` and see nothing else.

* ``kill_after(n, torn=..., match=...)``: the process dies right before its write number ``n``
  (0: the next one; with ``match``, counting only writes to paths containing it, e.g. the
  checkpoint). Death is :class:`Killed`, a ``BaseException`` no handler in the code under test
  catches, and the transport stays dead: any call a ``finally`` block makes afterwards raises
  again, so nothing reaches the disk after the kill, as with ``kill -9``. ``torn``: the write
  in flight is half done (an atomic write leaves its temporary file half written, never renamed);
  a sysfs write, one write(2), is taken by the kernel whole and the process dies before it reads
  the answer (a vGPU made that the caller's records may not know of: its next try meets EEXIST).
* ``fail_kernel(n, errno)``: the kernel refuses write number ``n`` to sysfs with ``errno``
  (EBUSY, EINVAL, ENOSPC, EEXIST, EIO), once; the caller must cope.
* ``fail_file(n, errno, match)``: the disk refuses file write number ``n`` (to a path containing
  ``match``) with ENOSPC or EIO, once; nothing is written.
* :class:`Disk`: what the page cache holds that no fsync made durable (atomic writes without
  ``durable``, removes, renames), shared by every transport of one node; :meth:`Disk.power_loss`
  undoes a seeded part of it, as a power cut before the next ``sync``.
* every call is a scheduling point of the node's :class:`~tests.campaign.sched.Scheduler`.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import random
from pathlib import Path

from mdev_manager.sim import SimIO
from mdev_manager.sim.kernel import SimHost
from tests.campaign.sched import flock_free

KERNEL_ERRNOS = {name: getattr(errnos, name) for name in ("EBUSY", "EINVAL", "ENOSPC", "EEXIST", "EIO")}
DISK_ERRNOS = {name: getattr(errnos, name) for name in ("ENOSPC", "EIO")}


class Killed(BaseException):
    """The process was killed (SIGKILL): nothing after this point runs in it."""


_ABSENT = object()


class Disk:
    """Writes the page cache holds for one node: path -> its content before them (bytes, or
    ``_ABSENT``). A ``sync`` (any process) makes them durable; a durable atomic write makes its path so."""

    def __init__(self) -> None:
        self.pending: dict[str, object] = {}

    def before(self, path: Path | str) -> None:
        p = str(path)
        if p in self.pending:
            return
        try:
            with open(p, "rb") as f:
                self.pending[p] = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.pending[p] = _ABSENT

    def synced(self, path: Path | str | None = None) -> None:
        if path is None:
            self.pending.clear()
        else:
            self.pending.pop(str(path), None)

    def power_loss(self, rng: random.Random) -> list[str]:
        """Each un-synced change survives or is lost (the old content back), by ``rng``; what was lost."""
        lost = []
        for p, old in sorted(self.pending.items()):
            if rng.random() < 0.5:
                continue
            lost.append(p)
            if old is _ABSENT:
                try:
                    os.unlink(p)
                except (FileNotFoundError, IsADirectoryError):
                    pass
            else:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(old)  # type: ignore[arg-type]
        self.pending.clear()
        return lost


class FaultIO(SimIO):
    def __init__(self, host: SimHost, *, sched=None, disk: Disk | None = None, lock_file: Path | None = None,
                 unlocked: list[str] | None = None):
        super().__init__(host)
        self.sched = sched
        self.disk = disk
        # the node lock every writer of the node takes around its writes: a write to the kernel's device
        # files while nobody holds it is recorded in ``unlocked`` (an invariant: one writer at a time)
        self.lock_file = lock_file
        self.unlocked = unlocked if unlocked is not None else []
        self.writes = 0
        self.kernel_writes = 0
        self.file_writes = 0
        self._kill_at: int | None = None
        self._kill_match: str | None = None
        self._kill_torn = False
        self._matched = 0
        self._fail_at: tuple[int, int] | None = None
        self._file_fail: tuple[int, int, str | None] | None = None
        self.dead = False
        self.failed: list[str] = []  # what the injected kernel and disk faults hit
        self.killed_at: str | None = None

    # ------------------------------------------------------------ arming
    def kill_after(self, n: int, *, torn: bool = False, match: str | None = None) -> None:
        self._kill_match, self._kill_torn = match, torn
        self._kill_at = (self._matched if match else self.writes) + n

    def fail_kernel(self, n: int, errno: int) -> None:
        self._fail_at = (self.kernel_writes + n, errno)

    def fail_file(self, n: int, errno: int, match: str | None = None) -> None:
        self._file_fail = (n, errno, match)

    def disarm(self) -> None:
        self._kill_at = self._fail_at = self._file_fail = None

    # ------------------------------------------------------------ the switches
    def _gate(self) -> None:
        """Every call: dead stays dead; a scheduling point."""
        if self.dead:
            raise Killed("call after death")
        if self.sched is not None:
            self.sched.point()
            if self.dead:  # killed while another actor ran
                raise Killed("call after death")

    def _before_write(self, path: Path | str) -> bool:
        """Count the write; True when it is the one the kill lands on (the caller tears it or not)."""
        self._gate()
        hit = False
        if self._kill_at is not None:
            if self._kill_match is None:
                hit = self.writes >= self._kill_at
            elif self._kill_match in str(path):
                hit = self._matched >= self._kill_at
                self._matched += 1
        if hit:
            self.dead = True
            self.killed_at = str(path)
            if not self._kill_torn:
                raise Killed(f"killed before write {self.writes} ({path})")
            return True
        self.writes += 1
        return False

    def _is_kernel(self, path: Path) -> bool:
        real = os.path.realpath(path)
        return real == self._sys or real.startswith(self._sys + os.sep)

    def _file_fault(self, path: Path) -> None:
        if self._file_fail is None:
            return
        n, code, match = self._file_fail
        if match is not None and match not in str(path):
            return
        if n > 0:
            self._file_fail = (n - 1, code, match)
            return
        self._file_fail = None
        self.failed.append(f"{errnos.errorcode[code]} on {path}")
        raise OSError(code, os.strerror(code), str(path))

    # ------------------------------------------------------------ writes
    def write(self, path: Path, data: str) -> None:
        torn = self._before_write(path)
        if self._is_kernel(path):
            if torn:  # a sysfs write is one write(2): the kernel took it (torn), then the process died
                with contextlib.suppress(OSError):  # before it read the answer
                    super().write(path, data)
                raise Killed(f"killed right after the kernel took {path}")
            if self.lock_file is not None and flock_free(self.lock_file):
                self.unlocked.append(f"{path} written while nobody held the node lock")
            n, self.kernel_writes = self.kernel_writes, self.kernel_writes + 1
            if self._fail_at is not None and n == self._fail_at[0]:
                code = self._fail_at[1]
                self._fail_at = None
                self.failed.append(f"{errnos.errorcode[code]} on {path}")
                raise OSError(code, os.strerror(code), str(path))
            super().write(path, data)
            return
        self._file_fault(path)
        if self.disk is not None:
            self.disk.before(path)
        if torn:
            with open(path, "w", encoding="utf-8") as f:
                f.write(data[: len(data) // 2])
            raise Killed(f"killed half-way through writing {path}")
        super().write(path, data)

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        torn = self._before_write(path)
        self._file_fault(path)
        path = Path(path)
        if torn:  # the temporary file half written, the rename never made
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            if self.disk is not None:
                self.disk.before(tmp)
            tmp.write_text(data[: len(data) // 2])
            raise Killed(f"killed half-way through writing {path}")
        if self.disk is not None:
            if durable:
                self.disk.synced(path)
            else:
                self.disk.before(path)
        super().write_atomic(path, data, durable)

    def remove(self, path: Path) -> None:
        self._before_write(path)
        if self.disk is not None and not self._is_kernel(path):
            self.disk.before(path)
        super().remove(path)

    def rename(self, src: Path, dst: Path) -> None:
        self._before_write(dst)
        if self.disk is not None:
            self.disk.before(src)
            self.disk.before(dst)
        super().rename(src, dst)

    def makedirs(self, path: Path) -> None:
        self._gate()
        super().makedirs(path)

    def rmdir(self, path: Path) -> None:
        self._before_write(path)
        super().rmdir(path)

    def sync(self) -> None:
        self._gate()
        super().sync()
        if self.disk is not None:
            self.disk.synced()

    # ------------------------------------------------------------ reads: scheduling points only
    def read(self, path):
        self._gate()
        return super().read(path)

    def read_attrs(self, directory, names):
        self._gate()
        return super().read_attrs(directory, names)

    def read_children(self, directory, names):
        self._gate()
        return super().read_children(directory, names)

    def listdir(self, path):
        self._gate()
        return super().listdir(path)

    def readlink(self, path):
        self._gate()
        return super().readlink(path)

    def exists(self, path):
        self._gate()
        return super().exists(path)

    def is_dir(self, path):
        self._gate()
        return super().is_dir(path)

    def realpath(self, path):
        self._gate()
        return super().realpath(path)

    def stat(self, path):
        self._gate()
        return super().stat(path)
