"""The pool for a server that drops the shared counters (#14): per GPU the whole GPU or one vGPU
type's slots, never both and never two types, so no allocation the scheduler can make without
counters is impossible on the node."""

from __future__ import annotations

from collections import defaultdict

from dra_bridge.pool.safe import without_counters
from tests.support.dra import add_claim, devices_of, make_driver


def _per_gpu(pool) -> dict[str, list]:
    out = defaultdict(list)
    for d in pool.devices:
        out[d.gpu].append(d)
    return out


def test_each_gpu_offers_the_whole_gpu_or_one_type(tmp_path):
    from tests.support.dra import make_node

    node = make_node(tmp_path, "default", version=(1, 35))
    full = node.build_pool()
    inv = node.inventory()
    safe = without_counters(full, inv)
    assert not any(d.consumes for d in safe.devices)
    for gpu, devs in _per_gpu(safe).items():
        kinds = {d.kind for d in devs}
        assert len(kinds) == 1, f"{gpu}: {kinds}"
        if kinds == {"vgpu"}:
            (type_id,) = {d.type_id for d in devs}
            t = inv.gpu(gpu).type_by_ref(type_id)
            assert len(devs) <= t.max_instances  # any subset of the slots is creatable
        else:
            assert len(devs) == 1
    # every GPU the full pool offered vGPUs on still offers vGPUs (one type), none lost entirely
    assert {d.gpu for d in full.devices} == {d.gpu for d in safe.devices}
    assert any("DRAPartitionableDevices" in w for w in safe.warnings)


def test_a_gpu_holding_vgpus_keeps_their_type(tmp_path, srv, paths):
    from tests.support.dra import make_node

    node = make_node(tmp_path, "default", version=(1, 37))
    pool = node.build_pool()  # every size's slots
    gpu = "0000:10:00.0"  # T4, mdev on the PF
    types = list(dict.fromkeys(d.type_id for d in pool.devices if d.gpu == gpu and d.kind == "vgpu"))
    assert len(types) > 1
    held = types[-1]
    dev = devices_of(pool, gpu, "vgpu", held)[0]
    ref = add_claim(srv, "vm", [("vgpu", dev)], node=node.node)
    assert make_driver(node, paths, srv.api_client(), pool).prepare([ref])[ref.uid].error is None
    safe = without_counters(node.build_pool(), node.inventory())
    assert {d.type_id for d in safe.devices if d.gpu == gpu} == {held}
