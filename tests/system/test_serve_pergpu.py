"""The agent keeps each GPU's state and reads again only what changed (#37.1): a prepare or
unprepare makes the next resync read the claim's GPUs, not the node; a change made by hand is
read where its fingerprint shows it; an unchanged slice is not written again. Claims on different
GPUs are prepared side by side (#37.2): one GPU's hung operation stalls no other GPU's prepare,
a hand-run apply is still kept out, and one device is never given to two claims."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.kubeletplugin.checkpoint import CheckpointStore
from mdev_manager.discovery import discover
from mdev_manager.host.lock import NodeLock, NodeLockBusy
from mdev_manager.sim import SimIO
from tests.support.dra import add_claim, make_node, resync_agent


def make_agent(node, srv, base: Path) -> Daemon:
    """The agent as ``start()`` wires it, without its sockets and threads: resyncs are called here."""
    return resync_agent(node, srv, base, SimIO(node.host))


def vgpu_devices(daemon: Daemon, framework: str) -> list:
    gpus = {g.address for g in daemon.inventory.gpus if g.framework == framework}
    return [d for d in daemon._pool.devices if d.kind == "vgpu" and d.gpu in gpus]


def test_a_prepare_and_an_unprepare_make_the_next_resync_read_their_gpu_only(srv, base):
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    assert daemon.gpu_states.reads == {"whole": 1}
    dev = vgpu_devices(daemon, "mdev-sriov")[0]
    ref = add_claim(srv, "one", [("vgpu", dev.name)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None

    daemon.resync(force=False)
    # its vGPUs and free instances only (its functions and drivers are as they were), as a whole read finds them
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}, "a prepare made the next resync read more than its GPU"
    made = daemon.driver.cp.claims[ref.uid].devices[0].vgpu_id
    assert [v.gpu for v in daemon.inventory.all_vgpus() if v.id == made] == [dev.gpu]
    assert daemon.inventory.gpu(dev.gpu) == discover(node.env, node.io, node=node.node).gpu(dev.gpu)

    assert daemon.driver.unprepare([ref])[ref.uid] is None
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 2}
    assert not daemon.inventory.all_vgpus(), "the unprepared vGPU is still in the agent's state"
    assert daemon.inventory.gpu(dev.gpu) == discover(node.env, node.io, node=node.node).gpu(dev.gpu)


def test_a_vgpu_made_by_hand_is_read_on_its_gpu_and_a_new_function_reads_the_node(srv, base):
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    t4 = next(g for g in daemon.inventory.gpus if g.framework == "mdev")
    t = t4.type_by_ref("T4-4Q")
    daemon.io.write(node.env.pci(t4.address) / "mdev_supported_types" / t.id / "create",
                    "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c")  # mdevctl start, by hand
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
    assert [v.gpu for v in daemon.inventory.all_vgpus()] == [t4.address]
    assert daemon.inventory.gpu(t4.address) == discover(node.env, node.io, node=node.node).gpu(t4.address)
    # nothing changed: the safety-net check reads nothing (no GPU of this preset is in MIG mode)
    daemon.resync(force=True)
    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 1}
    # a GPU that leaves the bus, and comes back (functions no known GPU owns): the whole node is read
    other = next(g for g in daemon.inventory.gpus if g.address != t4.address)
    node.host.unplug(other.address)
    daemon.resync(force=False)
    assert daemon.gpu_states.reads["whole"] == 2 and other.address not in {g.address for g in daemon.inventory.gpus}
    node.host.replug(other.address)
    daemon.resync(force=False)
    assert daemon.gpu_states.reads["whole"] == 3 and other.address in {g.address for g in daemon.inventory.gpus}

def test_a_prepare_that_changes_no_slice_writes_none(srv, base):
    """A second vGPU on a GPU whose size the first one settled changes no slice: nothing is written
    (the writes counted at the API server)."""
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    devs = vgpu_devices(daemon, "mdev-sriov")
    first = devs[0]
    same = next(d for d in devs[1:] if d.gpu == first.gpu and d.type_id == first.type_id)
    refs = [add_claim(srv, f"c{i}", [("vgpu", d.name)], node=node.node) for i, d in enumerate((first, same))]
    assert daemon.driver.prepare([refs[0]])[refs[0].uid].error is None
    daemon.resync(force=False)  # the first vGPU may settle the GPU's size: republished
    srv.reset_counters()
    assert daemon.driver.prepare([refs[1]])[refs[1].uid].error is None
    daemon.resync(force=False)
    assert daemon.gpu_states.reads["whole"] == 1
    assert [w for w in srv.writes if w.resource == "resourceslices"] == []


class GateIO(SimIO):
    """The simulated host's transport, holding the first vGPU creation on one GPU's functions until
    released: one GPU's slow operation."""

    def __init__(self, host):
        super().__init__(host)
        self.functions: set[str] = set()
        self.entered, self.release = threading.Event(), threading.Event()

    def write(self, path, data):
        if Path(path).name == "create" and any(f in str(path) for f in self.functions) and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60), "the gated write was never released"
        return super().write(path, data)


def in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    t.start()
    return t, box


def gated_agent(srv, base: Path):
    node = make_node(base, "default")
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                      resync_seconds=3600, health_poll_seconds=3600, full_resync_seconds=3600)
    io = GateIO(node.host)
    daemon = Daemon(cfg, node.env, io, srv.api_client())
    daemon._wrap_prepare()  # as start() wires it: under the node lock, shared
    daemon.resync()
    return node, daemon, io


def test_a_gpu_whose_vgpu_creation_hangs_does_not_stall_a_prepare_on_another_gpu(srv, base):
    node, daemon, io = gated_agent(srv, base)
    devs = [d for d in daemon._pool.devices if d.kind == "vgpu"]
    a = devs[0]
    b = next(d for d in devs if d.gpu != a.gpu)
    gpu_a = daemon.inventory.gpu(a.gpu)
    io.functions = {gpu_a.address, *(vf.address for vf in gpu_a.vfs)}
    ref_a = add_claim(srv, "on-a", [("vgpu", a.name)], node=node.node)
    ref_b = add_claim(srv, "on-b", [("vgpu", b.name)], node=node.node)

    ta, out_a = in_thread(lambda: daemon.driver.prepare([ref_a]))
    assert io.entered.wait(30), "the prepare on GPU A never reached its vGPU's creation"
    tb, out_b = in_thread(lambda: daemon.driver.prepare([ref_b]))
    tb.join(60)
    assert not tb.is_alive(), "the prepare on GPU B waited for GPU A's hung creation"
    assert out_b["out"][ref_b.uid].error is None
    assert ta.is_alive() and not io.release.is_set()
    # a hand-run vgpuctl apply is still kept out while A's prepare is in flight
    with pytest.raises(NodeLockBusy):
        with NodeLock(node.env, "vgpuctl apply").hold(wait=False):
            pass
    io.release.set()
    ta.join(60)
    assert out_a["out"][ref_a.uid].error is None
    on_disk = CheckpointStore(daemon.paths.checkpoint, daemon.io).load()
    assert {u: r.state for u, r in on_disk.claims.items()} == {ref_a.uid: "prepared", ref_b.uid: "prepared"}
    vgpus = [d.vgpu_id for r in on_disk.claims.values() for d in r.devices]
    assert len(set(vgpus)) == 2 and all(vgpus)


def test_two_claims_given_one_device_at_once_prepare_one(srv, base):
    """The scheduler can allocate one device twice: the second prepare waits for the first on the GPU's
    lock, then finds the device held and is refused, nothing made."""
    node, daemon, io = gated_agent(srv, base)
    dev = next(d for d in daemon._pool.devices if d.kind == "vgpu")
    gpu = daemon.inventory.gpu(dev.gpu)
    io.functions = {gpu.address, *(vf.address for vf in gpu.vfs)}
    first = add_claim(srv, "first", [("vgpu", dev.name)], node=node.node)
    second = add_claim(srv, "second", [("vgpu", dev.name)], node=node.node)
    t1, out1 = in_thread(lambda: daemon.driver.prepare([first]))
    assert io.entered.wait(30)
    t2, out2 = in_thread(lambda: daemon.driver.prepare([second]))
    io.release.set()
    t1.join(60)
    t2.join(60)
    assert out1["out"][first.uid].error is None
    assert "refused, nothing prepared" in (out2["out"][second.uid].error or "")
    assert list(daemon.driver.cp.claims) == [first.uid]
    assert len([v for v in node.inventory().all_vgpus() if v.gpu == dev.gpu]) == 1


def test_a_gpu_whose_function_changed_driver_is_read_whole_not_only_its_vgpus(srv, base):
    """The light read takes the GPU's functions from the last read: a VF unbound by hand (a mark other
    than an mdev's changed) makes the GPU read whole."""
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    gpu = next(g for g in daemon.inventory.gpus if g.framework == "mdev-sriov")
    vf = gpu.vfs[-1]
    daemon.io.write(node.env.pci_drivers / vf.driver / "unbind", vf.address)
    daemon.gpu_states.touched({gpu.address})
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}
    assert daemon.inventory.gpu(gpu.address) == discover(node.env, node.io, node=node.node).gpu(gpu.address)
