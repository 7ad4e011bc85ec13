"""The simulated kernel's uevents: each device added, removed, bound or unbound is announced as the
kernel announces it (``ACTION@DEVPATH`` then ``KEY=VALUE`` pairs, NUL ended), one datagram to the
host's relay socket ``<root>/run/uevents.sock`` (an agent listens there where its ``HostEnv`` names
it as ``uevent_socket``). Nobody listening, or a listener whose buffer is full after a second, loses
the event, as a netlink socket nobody reads does: the agent's periodic check covers what it missed.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from mdev_manager.host.unixaddr import unix_address

RELAY = "run/uevents.sock"


def message(action: str, subsystem: str, devpath: str, **env: str) -> bytes:
    """One uevent in the kernel's netlink format."""
    pairs = {"ACTION": action, "DEVPATH": devpath, "SUBSYSTEM": subsystem, **env}
    return f"{action}@{devpath}\0".encode() + b"".join(f"{k}={v}\0".encode() for k, v in pairs.items())


def send(root: Path, action: str, subsystem: str, devpath: str, **env: str) -> None:
    """Announce one device change of the host under ``root`` (lost where nobody listens)."""
    path = os.path.join(root, RELAY)
    if not os.path.exists(path):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        try:
            with unix_address(path) as address:  # a path past the address limit: through its directory
                sock.sendto(message(action, subsystem, devpath, **env), address)
        except OSError:  # no listener any more (a stale socket), its buffer stayed full, or its directory went: lost
            pass
