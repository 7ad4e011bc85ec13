"""Hotplug: the kernel's uevents name the GPUs the agent reads again (#37.1).

A PCI function coming, going or changing driver, and an mdev made or removed, each makes the
kernel send a uevent naming the device by its sysfs path (``DEVPATH``). The agent keeps each
GPU's state (:mod:`.gpustate`), so an event should make it read that GPU again, not the node.
Deciding which GPU an event names is pure (:func:`gpus_named`): a PCI function is its own GPU
or one of a GPU's VFs (``physfn``) or IOMMU group's members; an mdev's parent is the directory
above it. An event that names no function the agent knows (a new GPU, a VF of an unknown PF)
means "read everything", and so does a lost event (:data:`LOST`: the netlink socket overflowed,
or a message could not be read): the agent cannot know what it missed.

Events are a shortcut, never the truth: the periodic check (fingerprints, then the safety net's
whole read) stays, so a lost, late, duplicated or reordered event costs a read, never a wrong
state. Sources (:class:`EventSource`) only deliver; :class:`UdevSource` is libudev's netlink
monitor (``/sys`` only), :class:`SocketSource` a unix datagram socket a relay sends the kernel's
messages to (``HostEnv.uevent_socket``), and tests give the agent their own.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import re
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Final, Protocol

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.host.unixaddr import unix_address

log = logging.getLogger(__name__)

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
MDEV_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SUBSYSTEMS: Final = ("pci", "mdev")


@dataclass(frozen=True)
class Uevent:
    """One kernel uevent: ``action`` (add, remove, bind, unbind, change, move), ``subsystem`` and
    ``devpath`` (``/devices/pci0000:0f/0000:0f:01.0/0000:10:00.4``, below the sysfs root), and the
    other ``KEY=VALUE`` pairs the kernel sent (``DRIVER``, ``MDEV_TYPE``, ``SEQNUM``...)."""

    action: str
    subsystem: str
    devpath: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The device's own name: a PCI address, an mdev's UUID."""
        return posixpath.basename(self.devpath.rstrip("/"))


@dataclass(frozen=True)
class Lost:
    """Events may have been lost (the socket overflowed, a message was unreadable): read everything."""

    reason: str


LOST: Final = Lost("events lost")

Deliver = Callable[[Uevent | Lost], None]


class EventSource(Protocol):
    """Where uevents come from: :meth:`start` calls ``deliver`` from its own thread for each one,
    :data:`LOST` where it may have missed some; :meth:`stop` ends it."""

    def start(self, deliver: Deliver) -> None: ...

    def stop(self) -> None: ...


def parse_uevent(data: bytes) -> Uevent | None:
    """A message in the kernel's netlink format (``ACTION@DEVPATH`` then ``KEY=VALUE``, each NUL
    ended); None where it is not one (libudev's own ``libudev`` messages, garbage)."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    head, *pairs = text.rstrip("\0").split("\0")
    if "@" not in head:
        return None
    env = dict(p.split("=", 1) for p in pairs if "=" in p)
    action, devpath = env.get("ACTION"), env.get("DEVPATH")
    if action is None or devpath is None or head != f"{action}@{devpath}" or "SUBSYSTEM" not in env:
        return None
    return Uevent(action, env["SUBSYSTEM"], devpath, env)


def function_of(event: Uevent) -> str | None:
    """The PCI function an event is about: the device itself (pci), the parent above it (mdev); None: no
    PCI address there."""
    if event.subsystem == "pci":
        name = event.name
    elif event.subsystem == "mdev":
        name = posixpath.basename(posixpath.dirname(event.devpath.rstrip("/")))
    else:
        return None
    return name if PCI_ADDRESS.match(name) else None


def gpus_named(event: Uevent, owners: Mapping[str, str], physfn: str | None = None) -> frozenset[str] | None:
    """The GPUs an event names, to read again; an empty set: none of ours (another subsystem); None:
    read everything (a function no GPU accounts for). ``owners`` maps each function a GPU accounts for
    to the GPU (:func:`~dra_bridge.agent.gpustate.owners`); ``physfn``: the PF of a function ``owners``
    does not know, where its ``physfn`` link could be read (a VF just added)."""
    if event.subsystem not in SUBSYSTEMS:
        return frozenset()
    function = function_of(event)
    if function is None:
        return None
    for known in (function, physfn):
        if known is not None and known in owners:
            return frozenset({owners[known]})
    return None


def event_gpus(event: Uevent, owners: Mapping[str, str], env: HostEnv, io: HostIO) -> frozenset[str] | None:
    """:func:`gpus_named`, reading a new function's ``physfn`` link where ``owners`` does not know it
    (a VF just added, or bound to its driver: its PF is a GPU's). The only host read an event costs."""
    gpus = gpus_named(event, owners)
    if gpus is None and event.subsystem == "pci" and event.action != "remove":
        try:
            physfn = io.readlink(env.sys_root / event.devpath.lstrip("/") / "physfn")
        except OSError:  # no link (not a VF), or gone again: unknown, read everything
            return None
        gpus = gpus_named(event, owners, physfn=PurePosixPath(physfn).name)
    return gpus


class UdevSource:
    """PCI and mdev uevents from libudev's netlink monitor (pyudev): the host's ``/sys`` only. An
    overflow of the socket's buffer (ENOBUFS) is delivered as :data:`LOST`."""

    def __init__(self, buffer_bytes: int = 4 << 20):
        self.buffer_bytes = buffer_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, deliver: Deliver) -> None:
        import pyudev  # only where there is udev: the agent's import set stays small

        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
        for subsystem in SUBSYSTEMS:
            monitor.filter_by(subsystem)
        try:
            monitor.set_receive_buffer_size(self.buffer_bytes)
        except Exception as exc:  # noqa: BLE001 - no CAP_NET_ADMIN: the default buffer (overflows say so)
            log.debug("udev receive buffer left as it is: %s", exc)
        monitor.start()
        self._thread = threading.Thread(target=self._loop, args=(monitor, deliver), name="udev", daemon=True)
        self._thread.start()

    def _loop(self, monitor: Any, deliver: Deliver) -> None:
        while not self._stop.is_set():
            try:
                device = monitor.poll(timeout=1.0)
            except OSError as exc:  # ENOBUFS: the kernel dropped events; anything else: unreadable
                deliver(Lost("udev socket overflowed" if exc.errno == errno.ENOBUFS else f"udev: {exc}"))
                continue
            if device is not None:
                deliver(Uevent(device.action or "change", device.subsystem or "", device.device_path,
                               dict(device.properties)))

    def stop(self) -> None:
        self._stop.set()


class SocketSource:
    """Uevents relayed to a unix datagram socket at ``path``, one kernel-format message a datagram
    (:func:`parse_uevent`); a datagram that is none is delivered as :data:`LOST`. The socket is
    made at :meth:`start` (a stale one replaced) and removed at :meth:`stop`."""

    def __init__(self, path: os.PathLike[str] | str, buffer_bytes: int = 4 << 20):
        self.path, self.buffer_bytes = os.fspath(path), buffer_bytes
        self._sock: socket.socket | None = None
        self._stop = threading.Event()

    def start(self, deliver: Deliver) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if os.path.lexists(self.path):
                os.unlink(self.path)
            with unix_address(self.path) as address:  # a path past the address limit: through its directory
                sock.bind(address)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffer_bytes)
        except OSError:
            sock.close()
            raise
        sock.settimeout(1.0)  # to see stop(): a blocked recv is not woken by another thread's close
        self._sock = sock
        threading.Thread(target=self._loop, args=(sock, deliver), name="uevents", daemon=True).start()

    def _loop(self, sock: socket.socket, deliver: Deliver) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError as exc:
                    if not self._stop.is_set():
                        deliver(Lost(f"uevent socket {self.path}: {exc}"))
                    return
                event = parse_uevent(data)
                deliver(event if event is not None else Lost(f"unreadable uevent on {self.path}"))
        finally:
            sock.close()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
