"""Prepare reads only what the claim needs (issue #15): the allocated type's directory on each VF,
not every type of every VF; a whole GPU's answer reads the GPU's function, not its VFs."""

from __future__ import annotations

from tests.support.dra import add_claim, devices_of, make_driver
from tests.support.readcount import CountingIO


def test_a_vgpu_prepare_reads_only_its_type_on_each_vf(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:16:00.0"  # A100: mdev on 16 VFs, 13 types each
    dev_name = devices_of(pool, gpu, "vgpu")[0]
    type_id = pool.device(dev_name).type_id
    ref = add_claim(srv, "vm-a", [("vgpu", dev_name)], node=node.node)
    io = CountingIO(node.host)
    out = make_driver(node, paths, srv.api_client(), pool, io=io).prepare([ref])
    assert out[ref.uid].error is None, out[ref.uid].error
    vfs = len(node.gpu(gpu).vfs)
    assert set(io.type_dirs) == {type_id}
    assert len(io.type_dirs) == vfs  # one type directory per VF, not 13
    (v,) = node.gpu(gpu).vgpus
    assert v.type_id == type_id
