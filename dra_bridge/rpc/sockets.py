"""Unix socket files the kubelet plugins serve on (both the DRA plugin and the device plugin)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

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
