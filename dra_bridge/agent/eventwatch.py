"""The agent's uevent watch (moved out of :mod:`.daemon`, whose :class:`~.daemon.Daemon` it is a part
of): which event source runs, and what an event does. An event only marks the GPUs it names
(:func:`~.hotplug.event_gpus`) to be read again and wakes the resync loop; it writes nothing, so a
lost, duplicated or reordered event costs a read at most (the periodic fingerprint check stays the
safety net)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from dra_bridge.agent.config import ServeConfig
from dra_bridge.agent.events import one_line
from dra_bridge.agent.gpustate import GpuStates
from dra_bridge.agent.hotplug import EventSource, Lost, SocketSource, UdevSource, Uevent, event_gpus
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO

log = logging.getLogger(__name__)


class EventWatch:
    """The event half of the agent (a part of :class:`~.daemon.Daemon`, which holds the state)."""

    cfg: ServeConfig
    env: HostEnv
    io: HostIO
    gpu_states: GpuStates
    event_source: EventSource | None  # given, then only one that started (``_shutdown`` stops it)
    _wake: threading.Event

    def _watch_events(self) -> None:
        """Take uevents from the event source; without one the periodic resync covers changes."""
        source = self.event_source
        if source is None and self.env.uevent_socket is not None:
            source = SocketSource(self.env.uevent_socket)
        elif source is None and self.env.sys_root == Path("/sys"):
            source = UdevSource()
        if source is None:
            return
        self.event_source = None  # kept only once started: a source that failed is never stopped
        try:
            source.start(self.on_event)
            self.event_source = source
        except Exception as exc:  # noqa: BLE001 - no udev (no netlink in this namespace): the periodic resync
            log.info("uevents unavailable (%s); resyncing every %ss", one_line(exc), self.cfg.resync_seconds)

    def on_event(self, event: Uevent | Lost) -> None:
        """A uevent: the GPUs it names are read again at the next resync (the whole node where it names
        no function a GPU accounts for, or events were lost), and the loop is woken for it. Writes nothing."""
        if isinstance(event, Lost):
            log.info("%s: reading the whole node again", event.reason)
            gpus = None
        else:
            gpus = event_gpus(event, self.gpu_states.owners(), self.env, self.io)
        if gpus is None:
            self.gpu_states.invalidate()
        elif gpus:
            self.gpu_states.touched(gpus)
        else:
            return
        self._wake.set()
