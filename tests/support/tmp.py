"""Where the tests' temporary files go: tmpfs where the machine's /tmp is a disk.

A simulated host is thousands of small sysfs files, rewritten by ``os.replace`` at each kernel
write; on ext4 each replace of an existing file forces the new file's blocks out (auto_da_alloc),
which costs more CPU than the simulation itself (the largest preset's apply: 28 s on ext4, 13 s on
tmpfs). ``tests/conftest.py`` points ``TMPDIR`` (pytest's ``tmp_path`` and every ``tempfile``
user) at :func:`fast_root` when there is one.

Set ``TMPDIR`` yourself to choose (it is left alone), or ``VGPUCTL_TEST_TMPFS=0`` to keep /tmp.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: Free space /dev/shm must have to be used (the largest test host is ~200 MB; passed tests' dirs go).
MIN_FREE_FILES = 500_000
MIN_FREE = 1 << 30

#: A temporary root longer than this is not used for unix sockets (sun_path holds 107 bytes).
SHORT = 32


def _mounts() -> dict[str, str]:
    """Mount point -> file system type (the last mount of a point wins)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            return {fields[1]: fields[2] for fields in (line.split() for line in f) if len(fields) > 2}
    except OSError:
        return {}


def fast_root() -> Path | None:
    """A private directory on /dev/shm when /tmp is not a tmpfs and /dev/shm is one with room; else None."""
    if os.environ.get("VGPUCTL_TEST_TMPFS") == "0" or os.environ.get("TMPDIR"):
        return None
    mounts = _mounts()
    if mounts.get("/tmp") == "tmpfs" or mounts.get("/dev/shm") != "tmpfs":
        return None
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        # room in bytes and in files: a simulated host is some 13,000 files, and a tmpfs runs out of
        # inodes long before bytes
        if st.f_bavail * st.f_frsize < MIN_FREE or st.f_favail < MIN_FREE_FILES or not os.access(shm, os.W_OK):
            return None
        root = shm / f"vgpuctl-tests-{os.getuid()}"
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        info = root.lstat()  # /dev/shm is shared: only a directory of ours, not a link someone left
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
    except OSError:
        return None
    return root


def use(root: Path) -> None:
    """Make ``root`` the temporary directory of this process and of the processes it starts."""
    os.environ["TMPDIR"] = str(root)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def short_root() -> str:
    """The temporary directory if short enough for unix socket paths below it, else /tmp."""
    tmp = tempfile.gettempdir()
    return tmp if len(os.fsencode(tmp)) <= SHORT else "/tmp"
