"""#37's memory bound: the pool and its slices for a large node are built at every full resync, so
their size is the agent's resident memory (and its high-water mark, which the allocator keeps).

A slot's devices differ by name only: they share their values (:func:`dra_bridge.pool.devices.renamed`),
and the slices one wire copy of them. Bytes counted with tracemalloc, no timings."""

from __future__ import annotations

import tracemalloc

from dra_bridge.pool.devices import PoolDevice, PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from tests.dra_bridge.test_slices import DRIVER, NODE, sixteen_l40s

#: bytes per device, traced; 16 x L40S at 1.37 (1,744 devices): 5.6 KB (pool) and 4.4 KB (slices) as one
#: model and one wire copy per device, 1.2 KB and 0.9 KB shared (Python 3.11)
POOL_BYTES_PER_DEVICE = 2000
SLICE_BYTES_PER_DEVICE = 1500


def _traced(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_large_nodes_pool_and_slices_hold_a_slots_common_values_once():
    inv = sixteen_l40s()
    pool, pool_bytes = _traced(lambda: build_pool(inv, PoolPolicy.default(), DRIVER, server_version=(1, 37)))
    n = len(pool.devices)
    assert n == 16 * 109
    slices, slice_bytes = _traced(lambda: build_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE,
                                                       generation=1, server_version=(1, 37)))
    assert sum(len(s["spec"].get("devices") or []) for s in slices) == n
    assert pool_bytes / n < POOL_BYTES_PER_DEVICE, f"{pool_bytes / n:.0f} bytes per pool device"
    assert slice_bytes / n < SLICE_BYTES_PER_DEVICE, f"{slice_bytes / n:.0f} bytes per published device"


def test_shared_devices_are_the_devices_validated_one_by_one_and_copies_stay_apart():
    pool = build_pool(sixteen_l40s(), PoolPolicy.default(), DRIVER, server_version=(1, 37))
    vgpus = [d for d in pool.devices if d.kind == "vgpu"]
    for d in vgpus:  # what validation makes of each device's own dump: equal, and the same fields set
        alone = PoolDevice.model_validate(d.model_dump(exclude_unset=True))
        assert alone == d and alone.model_fields_set == d.model_fields_set
    a, b = vgpus[0], vgpus[1]
    assert a.name != b.name and a.attributes is b.attributes  # one slot: shared
    tainted = a.model_copy(update={"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]})
    assert a.taints == [] and b.taints == [] and tainted.taints  # (as health and cordon copy a device)
    slices = build_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=1, server_version=(1, 37))
    wire = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    assert wire[a.name]["attributes"] == {k: dict(v) for k, v in a.attributes.items()}
    assert wire[a.name]["attributes"] is not a.attributes  # the wire form is a copy of the pool's
