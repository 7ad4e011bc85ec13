"""A unix socket's address for a path of any length.

An ``AF_UNIX`` address holds 108 bytes, NUL ended (``sun_path``, unix(7)); a socket under a deep
directory (a simulated host under a long ``--sim-dir``) has a longer path. The same file is reached
through an open descriptor of its directory, ``/proc/self/fd/N/<name>``, a short name. The agent binds
its uevent socket that way and the simulated kernel sends to it that way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

SUN_PATH_MAX: Final = 107  # a unix socket's address: 108 bytes, NUL ended


@contextmanager
def unix_address(path: str) -> Iterator[str]:
    """``path`` where it fits an address, else the same file through its directory's descriptor, held
    open while the caller binds or sends to it. ``OSError`` where that directory cannot be opened."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)
