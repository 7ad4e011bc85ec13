"""The agent keeps each GPU's state and reads again only what changed (#37.1): a prepare or
unprepare makes the next resync read the claim's GPUs, not the node; a change made by hand is
read where its fingerprint shows it; an unchanged slice is not written again."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim import SimIO
from tests.support.dra import add_claim, make_node, short_tmp


@pytest.fixture
def base():
    with short_tmp("vp") as d:
        yield d


@pytest.fixture
def srv():
    with LocalApiServer(version="1.35") as s:
        yield s


def make_agent(node, srv, base: Path) -> Daemon:
    """The agent as ``start()`` wires it, without its sockets and threads: resyncs are called here."""
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                      resync_seconds=3600, health_poll_seconds=3600, full_resync_seconds=3600)
    daemon = Daemon(cfg, node.env, SimIO(node.host), srv.api_client())
    daemon._wrap_prepare()
    daemon.resync()
    return daemon


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
    assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}, "a prepare made the next resync read more than its GPU"
    made = daemon.driver.cp.claims[ref.uid].devices[0].vgpu_id
    assert [v.gpu for v in daemon.inventory.all_vgpus() if v.id == made] == [dev.gpu]

    assert daemon.driver.unprepare([ref])[ref.uid] is None
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "gpu": 2}
    assert not daemon.inventory.all_vgpus(), "the unprepared vGPU is still in the agent's state"


def test_a_vgpu_made_by_hand_is_read_on_its_gpu_and_a_new_function_reads_the_node(srv, base):
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    t4 = next(g for g in daemon.inventory.gpus if g.framework == "mdev")
    t = t4.type_by_ref("T4-4Q")
    daemon.io.write(node.env.pci(t4.address) / "mdev_supported_types" / t.id / "create",
                    "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c")  # mdevctl start, by hand
    daemon.resync(force=False)
    assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}
    assert [v.gpu for v in daemon.inventory.all_vgpus()] == [t4.address]
    # nothing changed: the safety-net check reads nothing (no GPU of this preset is in MIG mode)
    daemon.resync(force=True)
    assert daemon.gpu_states.reads == {"whole": 1, "gpu": 1}
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
