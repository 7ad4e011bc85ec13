"""The simulated host's ``sys/`` tree as a FUSE filesystem.

Mounted somewhere (and bind-mounted over ``/sys`` in a private mount namespace), it lets
the production file-I/O path (``RealIO``) and tools nobody here wrote (mdevctl) run
against a :class:`~.kernel.SimHost`:

* Reads pass through to the backing tree under ``host.sys``. Symlinks stay symlinks (the
  simulated tree only holds relative links, so they resolve inside the mount).
* Attribute files look like sysfs: mode 0644 when the kernel acts on writes to them (0200 for
  the write-only ones, ``create``, ``remove``, ``bind``...: opening those for reading fails with
  EACCES), 0444 otherwise (opening those for writing fails with EACCES, as on sysfs), directories
  0755, and ``st_size`` 4096 whatever the content. Every attribute is opened with
  ``direct_io``, so reads ignore that size and return the real content, up to EOF.
* Each ``write()`` call is one kernel write: ``host.write(<backing path>, data)``, with the
  model's errno handed to the writer (EEXIST, EUSERS, EBUSY, EINVAL, ERANGE, ...).
  Nothing is buffered across calls; the offset is ignored, as sysfs ignores it.
* ``truncate`` and ``open(O_TRUNC)`` of an attribute are no-ops (``echo x > attr``).
  Reading or writing a file that was removed while open fails with ENODEV, as on sysfs;
  creating, removing or renaming anything fails (EACCES / EPERM).
* As kernfs does, an attribute's content is taken when it is read at offset 0 and later
  reads of the same open file continue from that copy; the copy is taken under a shared
  lock on the simulator's lock file, so a read never sees half of a concurrent whole-host
  write. One GPU's writes (an mdev's create or remove) hold that lock shared too, beside
  their GPU's own, as the kernel orders them per parent: a read may see such a device
  being made, as on sysfs, and its attributes are replaced whole, never seen half-written.
* The kernel caches neither attributes, entries nor negative lookups (timeouts 0): the
  tree changes underneath (``available_instances``, new mdev directories).

Use :func:`mounted` in tests and tools: it runs the FUSE loop in a child process
(``python -m mdev_manager.sim.fuse ROOT MOUNTPOINT``), so the caller's own file I/O can
never deadlock against the FUSE loop; it waits for the mount and unmounts on exit.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import mfusepy

from mdev_manager.sim.child import child_env, reap, wait_started
from mdev_manager.sim.kernel import SimHost

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Attribute names the simulated kernel acts on (SimHost._dispatch); everything else is read-only.
WRITABLE_ATTRS = frozenset({
    "create", "remove", "sriov_numvfs", "driver_override", "bind", "unbind", "new_id", "remove_id",
    "drivers_probe", "current_vgpu_type", "vgpu_params", "warm_update", "placement_id", "gpu_instance_id",
})
ATTR_SIZE = 4096  # what sysfs reports for every attribute
MOUNT_TIMEOUT = 10.0
FUSERMOUNT = "fusermount3"


# Of those, the ones the kernel declares write-only (``MDEV_TYPE_ATTR_WO(create)``, ``DEVICE_ATTR_WO(remove)``,
# the PCI core's ``bind``/``unbind``/``new_id``/``remove_id``/``drivers_probe``): mode 0200, opening one
# for reading fails with EACCES (kernfs: no show method), root or not.
WRITE_ONLY_ATTRS = frozenset({"create", "remove", "bind", "unbind", "new_id", "remove_id", "drivers_probe"})


def attr_mode(name: str) -> int:
    """Permission bits of an attribute file (sysfs-like)."""
    if name in WRITE_ONLY_ATTRS:
        return 0o200
    return 0o644 if name in WRITABLE_ATTRS else 0o444


def _counted(fn: Callable[..., _T], name: str, counts: collections.Counter[str]) -> Callable[..., _T]:
    def call(*args: object, **kw: object) -> _T:
        counts[name] += 1
        return fn(*args, **kw)
    return call


class SimFS(mfusepy.Operations):
    """Pass-through of ``host.sys`` whose writes are kernel writes (see the module doc)."""

    use_ns = True  # timestamps in nanoseconds (mfusepy >= 3)

    def __init__(self, host: SimHost, counts: collections.Counter[str] | None = None) -> None:
        self.host = host
        self.base = os.path.realpath(host.sys)
        self._lockfile = host.root / ".sim/lock"
        self._files: dict[int, dict] = {}  # fh -> {"path": backing path, "data": bytes | None}
        self._fh = itertools.count(1)
        self._mutex = threading.Lock()
        if counts is not None:  # requests per operation, for the benchmarks (``--stats``)
            for name in [n for n, v in vars(type(self)).items() if callable(v) and not n.startswith("_")]:
                setattr(self, name, _counted(getattr(self, name), name, counts))

    # ------------------------------------------------------------------ helpers
    def _backing(self, path: str) -> str:
        rel = os.path.normpath(path.lstrip("/")) if path not in ("", "/") else ""
        if rel.startswith(".."):
            raise mfusepy.FuseOSError(errno.ENOENT)
        return os.path.join(self.base, rel) if rel else self.base

    @contextlib.contextmanager
    def _shared(self) -> Iterator[None]:
        """Hold the simulator's lock shared: SimHost writers hold it exclusively."""
        try:
            lf = open(self._lockfile, "a")
        except OSError:  # no lock file (a bare tree): nothing to synchronise with
            yield
            return
        try:
            fcntl.flock(lf, fcntl.LOCK_SH)
            yield
        finally:
            fcntl.flock(lf, fcntl.LOCK_UN)
            lf.close()

    @staticmethod
    def _oserror(e: OSError) -> mfusepy.FuseOSError:
        return mfusepy.FuseOSError(e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO)

    # ------------------------------------------------------------------ metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        try:
            st = os.lstat(self._backing(path))
        except OSError as e:
            raise self._oserror(e) from None
        attrs = {
            "st_uid": 0, "st_gid": 0, "st_nlink": st.st_nlink,
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns,
            "st_blksize": ATTR_SIZE,
        }
        if stat.S_ISDIR(st.st_mode):
            attrs.update(st_mode=stat.S_IFDIR | 0o755, st_size=0)
        elif stat.S_ISLNK(st.st_mode):
            attrs.update(st_mode=stat.S_IFLNK | 0o777, st_size=st.st_size)
        else:
            attrs.update(st_mode=stat.S_IFREG | attr_mode(os.path.basename(path)), st_size=ATTR_SIZE)
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        try:
            names = os.listdir(self._backing(path))
        except OSError as e:
            raise self._oserror(e) from None
        return [".", "..", *sorted(names)]

    def readlink(self, path: str) -> str:
        try:
            return os.readlink(self._backing(path))
        except OSError as e:
            raise self._oserror(e) from None

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": ATTR_SIZE, "f_frsize": ATTR_SIZE, "f_namemax": 255}

    # ------------------------------------------------------------------ files
    def open(self, path: str, fi: mfusepy.fuse_file_info) -> int:
        """``fi`` is the raw fuse_file_info (``raw_fi=True``): set ``direct_io`` and ``fh``."""
        backing = self._backing(path)
        if not os.path.isfile(backing):
            raise mfusepy.FuseOSError(errno.EISDIR if os.path.isdir(backing) else errno.ENOENT)
        accmode = fi.flags & os.O_ACCMODE
        if accmode != os.O_RDONLY and os.path.basename(path) not in WRITABLE_ATTRS:
            raise mfusepy.FuseOSError(errno.EACCES)  # sysfs: no store method, no write open
        if accmode != os.O_WRONLY and os.path.basename(path) in WRITE_ONLY_ATTRS:
            raise mfusepy.FuseOSError(errno.EACCES)  # sysfs: no show method, no read open
        with self._mutex:
            fh = next(self._fh)
            self._files[fh] = {"path": backing, "data": None}
        fi.fh = fh
        fi.direct_io = 1   # no page cache: every read reaches read() below, st_size is ignored
        fi.keep_cache = 0
        return 0

    def read(self, path: str, size: int, offset: int, fi: mfusepy.fuse_file_info) -> bytes:
        f = self._files.get(fi.fh)
        if f is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        if offset == 0 or f["data"] is None:
            try:
                with self._shared():
                    with open(f["path"], "rb") as src:
                        f["data"] = src.read()
            except FileNotFoundError:  # removed while open: sysfs says ENODEV
                raise mfusepy.FuseOSError(errno.ENODEV) from None
            except OSError as e:
                raise self._oserror(e) from None
        return f["data"][offset:offset + size]

    def write(self, path: str, data: bytes, offset: int, fi: mfusepy.fuse_file_info) -> int:
        if not data:
            return 0  # sysfs stores nothing for an empty write
        f = self._files.get(fi.fh)
        backing = f["path"] if f else self._backing(path)
        if not os.path.lexists(backing):  # removed while open (an mdev's `remove`): sysfs says ENODEV
            raise mfusepy.FuseOSError(errno.ENODEV)
        try:
            self.host.write(Path(backing), bytes(data).decode())
        except UnicodeDecodeError:
            raise mfusepy.FuseOSError(errno.EINVAL) from None
        except OSError as e:
            raise self._oserror(e) from None
        except Exception:  # a bug in the model: say so in the daemon's log, fail the write
            log.exception("simulated kernel failed on a write to %s", backing)
            raise mfusepy.FuseOSError(errno.EIO) from None
        if f is not None:
            f["data"] = None  # a later read shows the attribute as it is now
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        backing = self._backing(path)
        if os.path.isdir(backing):
            raise mfusepy.FuseOSError(errno.EISDIR)
        if not os.path.lexists(backing):
            raise mfusepy.FuseOSError(errno.ENOENT)
        return 0  # sysfs ignores truncation; `echo x > attr` truncates before writing

    # No ``flush``: sysfs does nothing on close. Left out, libfuse answers the first FLUSH
    # with ENOSYS and the kernel sends no more, which saves a round trip per close.

    def release(self, path: str, fi: mfusepy.fuse_file_info) -> int:
        with self._mutex:
            self._files.pop(fi.fh, None)
        return 0

    # ------------------------------------------------------------------ refused, as sysfs refuses them
    def create(self, path: str, mode: int, fi: mfusepy.fuse_file_info | None = None) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EACCES)

    def mkdir(self, path: str, mode: int) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)

    def unlink(self, path: str) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)

    def rmdir(self, path: str) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)

    def rename(self, old: str, new: str) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)

    def symlink(self, target: str, source: str) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)

    def link(self, target: str, source: str) -> NoReturn:
        raise mfusepy.FuseOSError(errno.EPERM)


def mount(host: SimHost, mountpoint: Path, foreground: bool = True, allow_other: bool = False, *,
          threads: bool = False, stats: Path | None = None) -> None:
    """Serve ``host.sys`` at ``mountpoint``; in the foreground this returns once unmounted.

    Single-threaded by default: every request runs Python under the GIL anyway, and
    libfuse's worker threads only fight over it (discovery through the mount is 2-4x
    slower with ``threads=True``). Both are safe: SimHost orders writers with its locks
    (whole-host writes one at a time, one GPU's writes per GPU), readers take the node's
    shared, and no handler ever calls back into the mount.
    Attribute, entry and negative lookups are never cached by the kernel (timeouts 0),
    since the tree changes underneath.
    """
    counts: collections.Counter[str] | None = collections.Counter() if stats is not None else None
    mfusepy.FUSE(
        SimFS(host, counts), str(mountpoint), raw_fi=True, foreground=foreground, nothreads=not threads,
        allow_other=allow_other, fsname="simsys:" + str(host.root).replace(",", "_"), subtype="vgpuctl-sim",
        attr_timeout=0, entry_timeout=0, negative_timeout=0,
    )
    if stats is not None and counts is not None:  # unmounted: every request served is counted
        Path(stats).write_text(json.dumps(dict(counts)))


def _run(cmd: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def in_mount_table(mountpoint: Path | str) -> bool:
    """Listed in /proc/self/mounts (unlike ``os.path.ismount``, also true for a dead FUSE
    mount, whose stat fails with ENOTCONN)."""
    target = os.path.abspath(mountpoint)
    target = os.path.join(os.path.realpath(os.path.dirname(target)), os.path.basename(target))
    esc = target.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split(" ")[1] == esc for line in f if line.count(" ") >= 2)
    except OSError:
        return os.path.ismount(target)


def unmount(mountpoint: Path | str, lazy: bool = False) -> bool:
    """``fusermount3 -u`` (``-uz`` when lazy); True when it is no longer mounted."""
    try:
        _run([FUSERMOUNT, "-uz" if lazy else "-u", str(mountpoint)])
    except (OSError, subprocess.TimeoutExpired):
        pass
    return not in_mount_table(mountpoint)


@contextlib.contextmanager
def mounted(host: SimHost | Path | str, mountpoint: Path | str, timeout: float = MOUNT_TIMEOUT,
            allow_other: bool = False, max_seconds: float | None = None, threads: bool = False,
            stats: Path | None = None) -> Iterator[Path]:
    """Mount the host's ``sys/`` at ``mountpoint`` in a child process; unmount on exit.

    Yields the mountpoint once ``os.path.ismount`` says it is mounted; raises
    ``RuntimeError`` (with the child's output) if that takes longer than ``timeout``.
    ``max_seconds`` bounds the mount's life: past it the daemon is killed, so a hung
    request fails with ENOTCONN instead of blocking its caller forever (tests).
    ``threads`` runs libfuse's multithreaded loop (see :func:`mount`). ``stats``: a file the
    daemon writes its requests per operation to (JSON) once unmounted.
    """
    root = Path(host.root if isinstance(host, SimHost) else host)
    mp = Path(mountpoint)
    mp.mkdir(parents=True, exist_ok=True)
    if in_mount_table(mp):
        raise RuntimeError(f"{mp} is already a mount point")
    if shutil.which(FUSERMOUNT) is None:
        raise RuntimeError(f"{FUSERMOUNT} not found")
    cmd = [sys.executable, "-m", "mdev_manager.sim.fuse", str(root), str(mp)]
    if allow_other:
        cmd.append("--allow-other")
    if threads:
        cmd.append("--threads")
    if stats is not None:
        cmd += ["--stats", str(stats)]
    log_file = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                            env=child_env())

    def daemon_log() -> str:
        log_file.seek(0)
        return log_file.read()[-4000:]

    watchdog = None
    if max_seconds is not None:
        watchdog = threading.Timer(max_seconds, proc.kill)
        watchdog.daemon = True
        watchdog.start()
    try:
        wait_started(proc, lambda: os.path.ismount(mp), timeout, "the FUSE daemon", f"mount {mp}", daemon_log)
        yield mp
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if in_mount_table(mp) and not unmount(mp):
            unmount(mp, lazy=True)  # something still holds it open: detach now, free later
        reap(proc, timeout)
        if in_mount_table(mp):  # the daemon died without unmounting: ENOTCONN until detached
            unmount(mp, lazy=True)
        log_file.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdev_manager.sim.fuse",
                                 description="Serve a simulated host's sys/ tree over FUSE (foreground).")
    ap.add_argument("root", type=Path, help="simulated host root (holds sys/ and .sim/)")
    ap.add_argument("mountpoint", type=Path)
    ap.add_argument("--allow-other", action="store_true", help="let other users see the mount")
    ap.add_argument("--threads", action="store_true", help="libfuse's multithreaded loop (default: one thread)")
    ap.add_argument("--debug", action="store_true", help="log every FUSE error")
    ap.add_argument("--stats", type=Path, help="write the requests served per operation (JSON) here when unmounted")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not (args.root / ".sim/state.json").exists():
        ap.error(f"{args.root} holds no simulated host (no .sim/state.json)")
    mount(SimHost(args.root), args.mountpoint, foreground=True, allow_other=args.allow_other, threads=args.threads,
          stats=args.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
