"""A vGPU prepare plans on the agent's GPU state in memory (#37): it reads neither its GPU's type
directories nor NVML, and asks the host about each parent before choosing it, so a state older than
the host (a vGPU made by hand, one freed since) never gives a taken VF and never refuses a free one."""

from __future__ import annotations

import uuid

from tests.support.dra import add_claim, devices_of, make_driver
from tests.support.readcount import CountingIO

GPU = "0000:16:00.0"  # A100: mdev on 16 VFs, MIG off


def _prepare(srv, node, paths, kept, io, name="vm-a", index=0):
    pool = node.build_pool()
    dev_name = devices_of(pool, GPU, "vgpu")[index]
    ref = add_claim(srv, name, [("vgpu", dev_name)], node=node.node)
    driver = make_driver(node, paths, srv.api_client(), pool, io=io)
    driver.gpu_state = lambda address: kept if address == GPU else None
    out = driver.prepare([ref])
    assert out[ref.uid].error is None, out[ref.uid].error
    return driver, pool.device(dev_name).type_id


def test_a_vgpu_prepare_on_the_kept_state_reads_no_type_directory_and_no_nvml(srv, node, paths):
    kept = node.gpu(GPU)
    io = CountingIO(node.host)
    driver, type_id = _prepare(srv, node, paths, kept, io)
    assert io.type_dirs == [] and io.nvml_calls == 0
    (v,) = node.gpu(GPU).vgpus
    assert io.asked == [v.parent] == [kept.parents[0].address]  # one attribute, of the parent chosen
    assert driver.writes == 2  # the intent, then the prepared claim


def test_a_vf_taken_by_hand_since_the_state_was_read_is_not_chosen(srv, node, paths):
    kept = node.gpu(GPU)
    first = kept.parents[0].address
    type_id = node.build_pool().device(devices_of(node.build_pool(), GPU, "vgpu")[0]).type_id
    hand = str(uuid.uuid4())
    node.io.write(node.env.pci(first) / "mdev_supported_types" / type_id / "create", hand)
    io = CountingIO(node.host)
    _prepare(srv, node, paths, kept, io)
    vgpus = {v.id: v.parent for v in node.gpu(GPU).vgpus}
    assert len(vgpus) == 2 and vgpus[hand] == first
    assert [p for i, p in vgpus.items() if i != hand] != [first]  # another VF, not the hand-made vGPU's
    assert io.asked[0] == first and len(io.asked) == 2


def test_a_state_showing_every_vf_full_does_not_refuse_a_free_one(srv, node, paths):
    gpu = node.gpu(GPU)
    kept = gpu.model_copy(update={"parents": [  # as read before an unprepare freed them (types are frozen)
        p.model_copy(update={"types": [t.model_copy(update={"available_instances": 0}) for t in p.types]})
        for p in gpu.parents]})
    io = CountingIO(node.host)
    _prepare(srv, node, paths, kept, io)
    assert len(node.gpu(GPU).vgpus) == 1
    assert io.type_dirs == []  # the host asked per parent, not the GPU read again


def test_a_prepare_of_a_type_the_host_no_longer_offers_reads_the_gpu_and_says_why(srv, node, paths):
    """Every parent asked says 0 (a vGPU of another size made by hand settled the GPU since the state
    was read): the GPU is read as it is now and the claim refused with the reason, as without a state."""
    kept = node.gpu(GPU)
    pool = node.build_pool()
    type_id = pool.device(devices_of(pool, GPU, "vgpu")[0]).type_id
    size = next(t.framebuffer_mib for t in kept.types if t.id == type_id)
    other = next(t for t in kept.types if not t.mig_backed and t.framebuffer_mib != size)
    node.io.write(node.env.pci(kept.parents[-1].address) / "mdev_supported_types" / other.id / "create",
                  str(uuid.uuid4()))
    io = CountingIO(node.host)
    ref = add_claim(srv, "vm-a", [("vgpu", devices_of(pool, GPU, "vgpu")[0])], node=node.node)
    driver = make_driver(node, paths, srv.api_client(), pool, io=io)
    driver.gpu_state = lambda address: kept
    err = driver.prepare([ref])[ref.uid].error
    assert err and "cannot create" in err and other.name in err, err
    assert [v.type_id for v in node.gpu(GPU).vgpus] == [other.id]
    assert io.type_dirs  # read again once the state misled
