"""The agent under uevent faults (#37.1, #37.5): an event makes the next resync read the GPU it names,
not the node; events lost, duplicated, reordered or in a storm cost reads, never a wrong state: the
agent's state and its published slices converge to the node's (the next event, or the periodic
check's fingerprints), and handling events writes nothing to the host.

The events come from a source the test drives (the agent takes any :class:`EventSource`), shaped
as the kernel sends them for what the test did to the simulated host (its sysfs paths)."""

from __future__ import annotations

import os
import random
import threading
import uuid
from pathlib import Path

from dra_bridge.agent.daemon import Daemon
from dra_bridge.agent.hotplug import LOST, Deliver, Lost, Uevent
from mdev_manager.discovery import discover
from mdev_manager.sim import SimIO
from tests.support.dra import assert_consistent_pool, make_node, pool_slices, published_devices, resync_agent


class ScriptedSource:
    """An event source the test drives: what it emits reaches the agent as udev's would."""

    def __init__(self) -> None:
        self.deliver: Deliver | None = None
        self.stopped = False

    def start(self, deliver: Deliver) -> None:
        self.deliver = deliver

    def stop(self) -> None:
        self.stopped = True

    def emit(self, *events: Uevent | Lost) -> None:
        assert self.deliver is not None, "the agent did not start its event source"
        for event in events:
            self.deliver(event)


class WatchedIO(SimIO):
    """The simulated host's transport, keeping the kernel writes made through it (sysfs) and telling
    when a GPU's vGPU types are listed (a resync reading that GPU)."""

    def __init__(self, host, watch: str | None = None):
        super().__init__(host)
        self.kernel_writes: list[str] = []
        self.watch, self.read_watched = watch, threading.Event()

    def write(self, path: Path, data: str) -> None:
        if os.path.realpath(path).startswith(self._sys + os.sep):
            self.kernel_writes.append(str(path))
        super().write(path, data)

    def read_children(self, directory, names):
        if self.watch is not None and directory.name == "mdev_supported_types" and directory.parent.name == self.watch:
            self.read_watched.set()
        return super().read_children(directory, names)


def make_agent(node, srv, base: Path, watch: str | None = None) -> tuple[Daemon, ScriptedSource]:
    """The agent as ``start()`` wires it, without its sockets; resyncs are called here (a period of an
    hour: only events and the test make it read)."""
    source = ScriptedSource()
    return resync_agent(node, srv, base, WatchedIO(node.host, watch), events=source), source


def devpath(node, address: str) -> str:
    """A PCI function's DEVPATH (its directory below the sysfs root), as the kernel names it."""
    return "/" + os.path.relpath(os.path.realpath(node.env.pci(address)), node.env.sys_root)


def make_mdev(node, parent: str) -> tuple[str, Uevent]:
    """``mdevctl start`` by hand on ``parent``: the mdev and the uevent the kernel sends for it."""
    types = node.env.pci(parent) / "mdev_supported_types"
    free = next(t for t in sorted(os.listdir(types)) if int((types / t / "available_instances").read_text()) > 0)
    uid = str(uuid.uuid4())
    node.io.write(types / free / "create", uid)
    return uid, Uevent("add", "mdev", f"{devpath(node, parent)}/{uid}", {"MDEV_TYPE": free})


def remove_mdev(node, parent: str, uid: str) -> Uevent:
    node.io.write(node.env.mdev_devices / uid / "remove", "1")
    return Uevent("remove", "mdev", f"{devpath(node, parent)}/{uid}")


def t4s(daemon: Daemon) -> list[str]:
    return [g.address for g in daemon.inventory.gpus if g.framework == "mdev"]


def assert_converged(daemon: Daemon, node, srv) -> None:
    """The agent's state is the node's, and what it published is its pool (one generation)."""
    inv = discover(node.env, node.io, node=node.node)
    assert daemon.inventory is not None
    assert [g.address for g in daemon.inventory.gpus] == [g.address for g in inv.gpus]
    for g in inv.gpus:
        assert daemon.inventory.gpu(g.address) == g, f"the agent's state of {g.address} is not the node's"
    slices = pool_slices(srv, node=node.node)
    assert_consistent_pool(slices)
    assert published_devices(slices) == {d.name for d in daemon._pool.devices}


def test_an_event_makes_the_next_resync_read_its_gpu_only(srv, base):
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    gpu = t4s(daemon)[0]
    _uid, event = make_mdev(node, gpu)
    source.emit(event)
    assert daemon.gpu_states.pending() and daemon._wake.is_set(), "the event did not mark its GPU and wake the loop"
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
    assert_converged(daemon, node, srv)
    assert daemon.io.kernel_writes == []


def test_a_duplicated_or_late_event_costs_one_light_read_and_no_write(srv, base):
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    _uid, event = make_mdev(node, t4s(daemon)[0])
    source.emit(*[event] * 50)  # duplicated before the resync: one read
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
    srv.reset_counters()
    source.emit(event)  # late, after the change was read: read again, nothing to republish
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 2}
    assert [w for w in srv.writes if w.resource == "resourceslices"] == []
    assert_converged(daemon, node, srv)
    daemon.resync(force=False)  # no event, nothing changed: nothing read
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 2}
    assert daemon.io.kernel_writes == []


def test_a_lost_event_is_caught_by_the_periodic_check(srv, base):
    """No event reaches the agent: the periodic resync's fingerprint sees the GPU changed and reads it."""
    node = make_node(base, "default")
    daemon, _source = make_agent(node, srv, base)
    make_mdev(node, t4s(daemon)[0])  # its event lost
    assert not daemon.gpu_states.pending()
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
    assert_converged(daemon, node, srv)


def test_an_overflow_reads_the_node_once(srv, base):
    """The socket overflowed (events lost, unknown which): the whole node is read, once for many."""
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    for gpu in t4s(daemon):
        make_mdev(node, gpu)
    source.emit(LOST, Lost("udev socket overflowed"), LOST)
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 2}
    assert_converged(daemon, node, srv)


def test_reordered_events_converge_to_the_node(srv, base):
    """An mdev made then removed on one GPU, another made on a second: the removal's event first. The
    events name GPUs; what the GPUs hold is read from the host, so the order cannot make the state wrong."""
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    one, two = t4s(daemon)[:2]
    uid, added = make_mdev(node, one)
    removed = remove_mdev(node, one, uid)
    kept, added_two = make_mdev(node, two)
    source.emit(removed, added_two, added)
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 2}
    assert {v.id for v in daemon.inventory.all_vgpus()} == {kept}
    assert_converged(daemon, node, srv)


def test_new_vfs_named_by_their_events_read_their_gpu_not_the_node(srv, base):
    """VFs enabled by hand: their add events name their GPU through the ``physfn`` link, so that GPU is
    read and the node is not; the same change with its events lost costs a whole read, and converges."""
    node = make_node(base, "default", prepare_gpus=False)
    daemon, source = make_agent(node, srv, base)
    sriov = [g for g in daemon.inventory.gpus if not g.vfs and (node.env.pci(g.address) / "sriov_totalvfs").exists()]
    assert len(sriov) >= 2, "the default preset has two GPUs with SR-IOV"
    for i, g in enumerate(sriov[:2]):
        total = (node.env.pci(g.address) / "sriov_totalvfs").read_text().strip()
        node.io.write(node.env.pci(g.address) / "sriov_numvfs", total)
        vfs = sorted(os.path.basename(p) for p in os.listdir(node.env.pci(g.address)) if p.startswith("virtfn"))
        assert vfs, "no VFs were enabled"
        if i == 0:  # the first GPU's events arrive; the second's are lost
            paths = [devpath(node, os.path.basename(os.readlink(node.env.pci(g.address) / v))) for v in vfs]
            source.emit(*(Uevent(action, "pci", p) for p in paths for action in ("add", "bind")))
            daemon.resync(force=False)
            assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}, "the VFs' events made more than their GPU read"
            assert daemon.inventory.gpu(g.address).vfs
        else:
            daemon.resync(force=False)
            assert daemon.gpu_states.reads["whole"] == 2
    assert_converged(daemon, node, srv)
    assert daemon.io.kernel_writes == []


def storm(node, daemon: Daemon, rng: random.Random) -> list[Uevent]:
    """Every function of every GPU added, bound, unbound and changed, and an mdev event on each, many
    times over, shuffled: a node's boot or a driver reload."""
    events = []
    for g in daemon.inventory.gpus:
        for function in [g.address, *(vf.address for vf in g.vfs)]:
            path = devpath(node, function)
            events += [Uevent(a, "pci", path) for a in ("add", "bind", "unbind", "change")]
            events.append(Uevent("add", "mdev", f"{path}/{uuid.UUID(int=rng.getrandbits(128))}"))
    events = events * 20
    rng.shuffle(events)
    return events


def test_a_storm_reads_each_named_gpu_at_most_once_and_writes_nothing(srv, base):
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    gpus = len(daemon.inventory.gpus)
    made = [make_mdev(node, gpu)[0] for gpu in t4s(daemon)]
    events = storm(node, daemon, random.Random(37))
    assert len(events) > 1000
    source.emit(*events)
    daemon.resync(force=False)
    reads = daemon.gpu_states.reads
    assert reads["whole"] == 1 and reads["gpu"] + reads["vgpus"] <= gpus, reads
    assert {v.id for v in daemon.inventory.all_vgpus()} == set(made)
    assert_converged(daemon, node, srv)
    # a storm with an overflow in it: one whole read, not one per event
    source.emit(*events[:500], LOST, *events[500:])
    daemon.resync(force=False)
    assert daemon.gpu_states.reads["whole"] == 2
    assert_converged(daemon, node, srv)
    assert daemon.io.kernel_writes == []


def test_a_storm_beside_resyncs_and_a_change_converges(srv, base):
    """A storm delivered from udev's thread while the agent resyncs, with a vGPU made by hand in the
    middle: events marked during a read are kept for the next, so the next resync ends on the node's state."""
    node = make_node(base, "default")
    daemon, source = make_agent(node, srv, base)
    events = storm(node, daemon, random.Random(5))
    half = len(events) // 2
    gpu = t4s(daemon)[1]
    made: list[str] = []

    def udev() -> None:
        source.emit(*events[:half])
        uid, event = make_mdev(node, gpu)
        made.append(uid)
        source.emit(*events[half:], event)

    thread = threading.Thread(target=udev)
    thread.start()
    while thread.is_alive():
        daemon.resync(force=False)
    thread.join()
    daemon.resync(force=False)
    assert [v.id for v in daemon.inventory.all_vgpus()] == made
    assert_converged(daemon, node, srv)
    assert daemon.io.kernel_writes == []


def test_the_loop_wakes_on_an_event_and_reads_its_gpu(srv, base):
    """The agent's own loop, period an hour: an event wakes it and its resync reads the named GPU."""
    node = make_node(base, "default")
    t4 = next(g.address for g in discover(node.env, node.io).gpus if g.framework == "mdev")
    daemon, source = make_agent(node, srv, base, watch=t4)
    daemon.io.read_watched.clear()
    loop = threading.Thread(target=daemon.run)
    loop.start()
    try:
        uid, event = make_mdev(node, t4)
        source.emit(event)
        assert daemon.io.read_watched.wait(60), "the event did not make the loop read its GPU"
    finally:
        daemon.stop()
        loop.join(60)
    assert not loop.is_alive()
    assert source.stopped, "the agent did not stop its event source"
    assert daemon.gpu_states.reads["whole"] == 1 and [v.id for v in daemon.inventory.all_vgpus()] == [uid]
    assert_converged(daemon, node, srv)
