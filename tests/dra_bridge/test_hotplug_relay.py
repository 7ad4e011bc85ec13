"""The simulated kernel announces its device changes as uevents in the kernel's format, relayed to the
socket the agent's ``HostEnv.uevent_socket`` names (#37.1): the agent takes them through the same
event source abstraction as udev's, and reads only the GPUs they name. The agent does not know the
host is simulated: it listens where its environment says."""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.agent.hotplug import Deliver, Lost, SocketSource, Uevent, parse_uevent
from mdev_manager.discovery import discover
from mdev_manager.sim import SimIO
from mdev_manager.sim.uevents import RELAY, message, send
from tests.support.dra import make_node, pool_slices, published_devices


class Heard:
    """The agent's event source wrapped: it tells the test what reached the agent."""

    def __init__(self, inner: SocketSource):
        self.inner, self.events = inner, []
        self._cond = threading.Condition()

    def start(self, deliver: Deliver) -> None:
        def heard(event: Uevent | Lost) -> None:
            deliver(event)
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

        self.inner.start(heard)

    def stop(self) -> None:
        self.inner.stop()

    def wait_for(self, seen: Callable[[Uevent | Lost], bool]) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: any(seen(e) for e in self.events), 60), "the event never arrived"


def relayed_agent(node, srv, base: Path, heard: bool = True) -> tuple[Daemon, Heard | None]:
    env = node.env.with_(uevent_socket=node.root / RELAY)
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                      resync_seconds=3600, health_poll_seconds=3600, full_resync_seconds=3600)
    source = Heard(SocketSource(env.uevent_socket)) if heard else None
    daemon = Daemon(cfg, env, SimIO(node.host), srv.api_client(), events=source)
    daemon._wrap_prepare()
    daemon.resync()
    daemon._watch_events()
    return daemon, source


def assert_converged(daemon: Daemon, node, srv) -> None:
    inv = discover(node.env, node.io, node=node.node)
    assert daemon.inventory is not None and daemon.inventory.gpus == inv.gpus
    assert published_devices(pool_slices(srv, node=node.node)) == {d.name for d in daemon._pool.devices}


def test_the_message_is_the_kernels_format():
    raw = message("add", "mdev", "/devices/pci0000:0f/0000:0f:01.0/0000:10:00.0/x", MDEV_TYPE="nvidia-222")
    assert raw.startswith(b"add@/devices/pci0000:0f/0000:0f:01.0/0000:10:00.0/x\0ACTION=add\0") and raw.endswith(b"\0")
    event = parse_uevent(raw)
    assert event is not None and (event.action, event.subsystem, event.env["MDEV_TYPE"]) == ("add", "mdev", "nvidia-222")


def test_the_agent_listens_where_its_environment_says(srv, base):
    node = make_node(base, "default")
    daemon, _ = relayed_agent(node, srv, base, heard=False)
    try:
        assert isinstance(daemon.event_source, SocketSource)
        assert (node.root / RELAY).is_socket()
    finally:
        daemon.event_source.stop()
    assert not (node.root / RELAY).exists(), "the socket outlived the agent"


def test_an_mdev_made_by_hand_reaches_the_agent_and_its_gpu_alone_is_read(srv, base):
    node = make_node(base, "default")
    daemon, heard = relayed_agent(node, srv, base)
    try:
        t4 = next(g.address for g in daemon.inventory.gpus if g.framework == "mdev")
        types = node.env.pci(t4) / "mdev_supported_types"
        free = next(t for t in sorted(os.listdir(types)) if int((types / t / "available_instances").read_text()) > 0)
        uid = str(uuid.uuid4())
        node.io.write(types / free / "create", uid)  # mdevctl start, by hand
        heard.wait_for(lambda e: isinstance(e, Uevent) and e.name == uid)
        (event,) = [e for e in heard.events if isinstance(e, Uevent) and e.name == uid]
        assert (event.action, event.subsystem, event.env["MDEV_TYPE"]) == ("add", "mdev", free)
        assert os.path.realpath(node.env.sys_root / event.devpath.lstrip("/")) == os.path.realpath(
            node.env.mdev_devices / uid)
        assert daemon.gpu_states.pending()
        daemon.resync(force=False)
        assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
        assert_converged(daemon, node, srv)
    finally:
        daemon.event_source.stop()


def test_vfs_enabled_by_hand_are_read_on_their_gpu_not_the_node(srv, base):
    node = make_node(base, "default", prepare_gpus=False)
    daemon, heard = relayed_agent(node, srv, base)
    try:
        g = next(g.address for g in daemon.inventory.gpus if (node.env.pci(g.address) / "sriov_totalvfs").exists())
        total = (node.env.pci(g) / "sriov_totalvfs").read_text().strip()
        node.io.write(node.env.pci(g) / "sriov_numvfs", total)
        vfs = [os.path.basename(os.readlink(node.env.pci(g) / v))
               for v in os.listdir(node.env.pci(g)) if v.startswith("virtfn")]
        assert len(vfs) == int(total)
        for vf in vfs:  # each VF added, then bound to its driver
            heard.wait_for(lambda e, vf=vf: isinstance(e, Uevent) and e.name == vf and e.action == "bind")
        daemon.resync(force=False)
        assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}, "the VFs' events made more than their GPU read"
        assert_converged(daemon, node, srv)
    finally:
        daemon.event_source.stop()


def test_a_relay_socket_past_the_address_limit_is_bound_and_reached(base):
    """A simulated host's directory deep enough that ``<root>/run/uevents.sock`` is longer than a unix socket
    address (108 bytes) still relays: both ends reach the file through its directory."""
    root = base / ("d" * 60) / ("e" * 60)
    path = root / RELAY
    assert len(os.fsencode(path)) > 108
    got: queue.Queue[Uevent | Lost] = queue.Queue()
    source = SocketSource(path)
    source.start(got.put)
    try:
        assert path.is_socket()
        send(root, "remove", "pci", "/devices/pci0000:0f/0000:0f:01.0/0000:10:00.0")
        event = got.get(timeout=60)
        assert isinstance(event, Uevent) and (event.action, event.name) == ("remove", "0000:10:00.0")
    finally:
        source.stop()
    assert not path.exists()
