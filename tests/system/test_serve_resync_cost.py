"""The resync a prepare wakes costs the prepare's GPUs, not the node (#37.1): the host is listed once
per resync (its marks, read before any GPU; not a second fingerprint after), an unchanged pool is
neither rebuilt into slices nor written, and a change the prepare did not make is still seen and
published. Reads and writes are counted through the transports (the host's, the API server's)."""

from __future__ import annotations

from pathlib import Path

from dra_bridge.agent.daemon import Daemon
from mdev_manager.discovery import discover
from tests.support.dra import add_claim, make_node, resync_agent
from tests.support.readcount import CountingIO
from tests.system.test_serve import wait_until


def make_agent(node, srv, base: Path) -> Daemon:
    return resync_agent(node, srv, base, CountingIO(node.host))


def slice_writes(srv) -> list:
    return [w for w in srv.writes if w.resource == "resourceslices"]


def test_a_resync_after_a_prepare_lists_the_host_once(srv, base):
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    io: CountingIO = daemon.io  # type: ignore[assignment]
    dev = next(d for d in daemon._pool.devices if d.kind == "vgpu")
    ref = add_claim(srv, "one", [("vgpu", dev.name)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None
    io.listed.clear()
    daemon.resync(force=False)
    assert io.listed[str(node.env.pci_devices)] == 1, "the resync listed the host's functions more than once"
    # and what it recorded is the host as it is: the next periodic round finds nothing changed, reads nothing
    io.listed.clear()
    assert daemon.resync(force=False) == {"unchanged": True}
    assert io.listed[str(node.env.pci_devices)] == 1


def test_a_change_on_another_gpu_is_seen_by_the_resync_a_prepare_wakes_and_published(srv, base):
    """A prepare on one GPU, and meanwhile a vGPU made by hand on another (no event): the resync reads
    both (the GPUs that changed only) and publishes what the hand-made vGPU took."""
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    sriov = next(g for g in daemon.inventory.gpus if g.framework == "mdev-sriov")
    t4 = next(g for g in daemon.inventory.gpus if g.framework == "mdev")
    dev = next(d for d in daemon._pool.devices if d.kind == "vgpu" and d.gpu == sriov.address)
    ref = add_claim(srv, "one", [("vgpu", dev.name)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None
    daemon.resync(force=False)
    before = {d.name: d for d in daemon._pool.devices}
    srv.reset_counters()

    t = t4.type_by_ref("T4-1Q")  # no claim's: its room and the T4's other sizes are no longer offered
    daemon.io.write(node.env.pci(t4.address) / "mdev_supported_types" / t.id / "create",
                    "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c")
    other = next(d for d in daemon._pool.devices if d.kind == "vgpu" and d.gpu == sriov.address and d.name != dev.name
                 and d.type_id == dev.type_id)
    ref2 = add_claim(srv, "two", [("vgpu", other.name)], node=node.node)
    assert daemon.driver.prepare([ref2])[ref2.uid].error is None
    daemon.resync(force=False)

    assert daemon.gpu_states.reads == {"whole": 1, "vgpus": 3}
    assert daemon.inventory.gpu(t4.address) == discover(node.env, node.io, node=node.node).gpu(t4.address)
    after = {d.name: d for d in daemon._pool.devices}
    assert after != before, "the hand-made vGPU changed nothing in the pool: the test proves nothing"
    assert {before[n].gpu for n in before.keys() ^ after.keys()} | \
        {d.gpu for n, d in after.items() if n in before and before[n] != d} <= {t4.address}
    published = {d["name"] for s in srv.objects("resourceslices") for d in s["spec"].get("devices") or []}
    assert published == set(after)
    # the hand-made vGPU, no claim's, takes its room from the T4's counters (#36.2): the counter slice
    # and the T4's device slice change together, so the generation is bumped (keep.py writes one slice,
    # or whole GPUs, in place) and every slice is written once
    writes = slice_writes(srv)
    assert sorted(w.name for w in writes) == sorted(s["metadata"]["name"] for s in srv.objects("resourceslices"))


def test_an_unchanged_pool_after_a_prepare_writes_nothing_and_a_slice_changed_behind_its_back_is_restored(srv, base):
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    devs = [d for d in daemon._pool.devices if d.kind == "vgpu"]
    first = devs[0]
    same = [d for d in devs[1:] if d.gpu == first.gpu and d.type_id == first.type_id][:2]
    refs = [add_claim(srv, f"c{i}", [("vgpu", d.name)], node=node.node) for i, d in enumerate((first, *same))]
    assert daemon.driver.prepare([refs[0]])[refs[0].uid].error is None
    daemon.resync(force=False)  # the first vGPU may settle the GPU's size: republished
    srv.reset_counters()
    assert daemon.driver.prepare([refs[1]])[refs[1].uid].error is None
    daemon.resync(force=False)
    assert slice_writes(srv) == []
    # a slice deleted behind the agent's back (its watch sees it): the next resync writes it again
    victim = sorted(s["metadata"]["name"] for s in srv.objects("resourceslices"))[-1]
    srv.remove("resourceslices", victim)
    wait_until(lambda: victim not in daemon.publisher.known(), what="the watch to see the slice go")
    assert daemon.driver.prepare([refs[2]])[refs[2].uid].error is None
    daemon.resync(force=False)
    assert victim in {s["metadata"]["name"] for s in srv.objects("resourceslices")}
    assert [w.name for w in slice_writes(srv)] == [victim]


def test_a_resync_reads_each_gpus_health_once(srv, base):
    """The poll before the resync and the one after its read are the same reads when the GPUs and their
    drivers are unchanged: one NVML handle per NVIDIA GPU on its driver per resync, not two (counted through the
transport)."""
    node = make_node(base, "default")
    daemon = make_agent(node, srv, base)
    io: CountingIO = daemon.io  # type: ignore[assignment]
    nvidia = [g for g in daemon.inventory.gpus if g.vendor_id == "0x10de" and g.driver == "nvidia"]
    assert nvidia
    dev = next(d for d in daemon._pool.devices if d.kind == "vgpu" and d.gpu not in {g.address for g in nvidia[1:]})
    ref = add_claim(srv, "one", [("vgpu", dev.name)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None
    io.nvml_calls = 0
    daemon.resync(force=True)
    reads = io.nvml_calls
    io.nvml_calls = 0
    daemon.resync(force=True)  # nothing changed: the GPUs' own reads (their NVML view) are skipped too
    # one handle per GPU's health, one for the driver version the node is labelled with
    assert io.nvml_calls == len(nvidia) + 1, "a resync read a GPU's health twice"
    assert reads >= len(nvidia)


def test_the_first_vgpu_on_an_empty_gpu_narrows_its_slices_in_place(base):
    """1.36 defaults (binding conditions): the L40S, empty, offers every size under conditions in two device
    slices. Its first vGPU settles its size: the other sizes go, that size's slots lose their conditions.
    Before, that was a new generation and every slice of the node written again (33-34 PUTs on the
    largest preset; the whole pool hidden from the scheduler until the last one); now its own slices are
    written in place, one at a time, each state between a complete pool (#37)."""
    from dra_bridge.sim.apiserver import LocalApiServer

    with LocalApiServer(version="1.36") as srv:
        node = make_node(base, "default")
        daemon = make_agent(node, srv, base)
        assert daemon.shape().binding == "conditions"
        l40s = next(g for g in daemon.inventory.gpus if g.framework == "vendor-vfio")
        before = {s["metadata"]["name"]: s for s in srv.objects("resourceslices")}
        holding = {n for n, s in before.items() if any(d["name"].startswith(f"gpu-{l40s.index}-")
                                                     for d in s["spec"].get("devices") or [])}
        assert len(holding) == 2, "the L40S's devices fit one slice: the test proves nothing"
        dev = next(d for d in daemon._pool.devices if d.gpu == l40s.address and d.kind == "vgpu"
                   and d.binding_conditions and d.capacity["memory"] == "2Gi")
        ref = add_claim(srv, "one", [("vgpu", dev.name)], node=node.node)
        assert daemon.driver.prepare([ref])[ref.uid].error is None
        srv.reset_counters()
        daemon.resync(force=False)
        after = {s["metadata"]["name"]: s for s in srv.objects("resourceslices")}
        assert {w.name for w in slice_writes(srv)} == holding  # the L40S's two slices, nothing else
        assert {s["spec"]["pool"]["generation"] for s in after.values()} == \
            {s["spec"]["pool"]["generation"] for s in before.values()}
        mine = [d for n in holding for d in after[n]["spec"].get("devices") or []]
        assert mine and {d["capacity"]["memory"]["value"] for d in mine if "-vgpu-" in d["name"]} == {"2Gi"}
        assert not any(d.get("bindingConditions") for d in mine)
