"""Publishing never drops a GPU that did not change (issue #36.6).

When a GPU leaves the bus (or comes back), the slices of the GPUs that stayed must stay visible to
the scheduler through every write of the sync: the pool as kube-scheduler reads it (upstream
``GatherPools``, modelled by :func:`dra_bridge.scheduling.pools.read_pools`: the newest generation,
usable only when complete and valid) holds, after each single write, every device of every other
GPU exactly as published before. A generation bump cannot do that (the new generation is incomplete
until its last slice is written, and the scheduler then allocates nothing from the pool; a reader
of the newest generation saw 255 devices fall to 179), so a GPU's slices are emptied and filled in
place, the slice count kept. The interleaving is taken deterministically: a snapshot of the server
after every write the publisher makes.
"""

from __future__ import annotations

import pytest

from dra_bridge.pool.devices import Pool
from dra_bridge.pool.slicecheck import check_pool_slices
from dra_bridge.scheduling.pools import read_pools
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from tests.dra_bridge.test_publisher import Recorder, publisher, small_node
from tests.support.dra import (
    VERSIONS,
    make_node,
    pool_slices,
    published_devices,
    schema_validate,
    strip_server_fields,
    version_tuple,
)


def without(pool: Pool, gpu: str) -> Pool:
    """The pool once ``gpu`` left the bus: its devices and its counter set gone, the rest unchanged."""
    out = pool.model_copy(deep=True)
    out.devices = [d for d in out.devices if d.gpu != gpu]
    out.counter_sets = [c for c in out.counter_sets if c.name in {x.counter_set for d in out.devices for x in d.consumes}]
    return out


def scheduler_view(slices: list[dict]) -> dict[str, dict] | None:
    """The devices the scheduler can allocate from (name -> the device as published), None when the pool
    is incomplete or invalid (it allocates nothing from it then)."""
    if not slices:
        return None
    ((_, pool),) = read_pools(slices).items()
    if not pool.complete or pool.invalid:
        return None
    by_name = {d["name"]: d for s in slices if s["spec"]["pool"]["generation"] == pool.generation
               for d in s["spec"].get("devices") or []}
    return {d.name: by_name[d.name] for d in pool.devices}


def devices_of(slices: list[dict], names: set[str]) -> dict[str, dict]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or [] if d["name"] in names}


def assert_kept_through_every_write(states: list[list[dict]], kept: dict[str, dict], what: str) -> None:
    for i, state in enumerate(states):
        seen = scheduler_view(state)
        assert seen is not None, f"{what}: after write {i + 1} of {len(states)} the scheduler sees no usable pool"
        lost = sorted(set(kept) - set(seen))
        assert not lost, f"{what}: after write {i + 1} of {len(states)} {len(lost)} devices of GPUs that did not " \
                         f"change are not allocatable: {lost[:5]}"
        changed = [n for n in kept if seen[n] != kept[n]]
        assert not changed, f"{what}: after write {i + 1} devices of unchanged GPUs differ: {changed[:5]}"


def mixed_node(root, version: str):
    """mixed-node's boards (the L4 in the middle), every GPU in dra mode, several slices per GPU."""
    return make_node(root, "mixed-node", version=version_tuple(version))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("maker, gone", [(small_node, "0000:13:00.0"), (mixed_node, "0000:13:00.0"),
                                         (mixed_node, "0000:10:00.0"), (mixed_node, "0000:1c:00.0")],
                         ids=["t4x8-second", "mixed-middle-l4", "mixed-first", "mixed-last"])
def test_a_gpu_leaving_and_coming_back_never_hides_the_others(tmp_path, version, maker, gone):
    node = maker(tmp_path, version)
    full = node.build_pool()
    assert any(d.gpu == gone for d in full.devices)
    left = without(full, gone)
    stay = {d.name for d in left.devices}
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)
        pub.sync(full)
        pub.api = rec = Recorder(pub.api, srv, node.node)
        for step, pool in enumerate((left, full, left, left, full)):
            kept = devices_of(pool_slices(srv), stay)
            assert set(kept) == stay
            rec.states.clear()
            pub.sync(pool)
            after = pool_slices(srv)
            assert_kept_through_every_write(rec.states, kept, f"step {step} ({'GPU gone' if pool is left else 'back'})")
            seen = scheduler_view(after)
            assert seen is not None and set(seen) == {d.name for d in pool.devices}, f"step {step}"
            for s in after:
                schema_validate(strip_server_fields(s), version)
            assert check_pool_slices([strip_server_fields(s) for s in after], version_tuple(version)) == []
        rec.states.clear()
        assert pub.sync(full).writes == 0 and rec.states == []  # as published, emptied slice and all: nothing to write


@pytest.mark.parametrize("version", ["1.35", "1.37"])
def test_nine_gpus_one_leaves_from_the_first_counter_slice(tmp_path, version):
    """More GPUs than one counters slice holds (8 sets each): the counter set of the GPU that leaves is
    taken out of its slice where it is; no other GPU's set moves to another slice meanwhile."""
    spec = HostSpec(name="t4-9", node="sim-t4", gpus=[GpuGroup(board="T4", count=9)])
    node = make_node(tmp_path, spec, version=version_tuple(version))
    full = node.build_pool()
    gone = sorted({d.gpu for d in full.devices})[1]
    left = without(full, gone)
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)
        pub.sync(full)
        kept = devices_of(pool_slices(srv), {d.name for d in left.devices})
        pub.api = rec = Recorder(pub.api, srv, node.node)
        pub.sync(left)
        assert_kept_through_every_write(rec.states, kept, "GPU gone")
        assert published_devices(pool_slices(srv)) == {d.name for d in left.devices}


def test_which_changes_are_written_slice_by_slice():
    """:func:`comes_or_goes`: whole members gained or lost, or devices lost and binding conditions dropped (a GPU
    narrowed to its first vGPU's size) are written slice by slice; any other change of a member (a condition
    added, a counter or a capacity changed) is one atomic generation."""
    from dra_bridge.apiclient.publisher import comes_or_goes
    from dra_bridge.pool.devices import PoolPolicy, build_pool
    from tests.dra_bridge.test_devices import inventory, t4

    inv = inventory(t4(0, "0000:3b:00.0"), t4(1, "0000:5e:00.0"))
    empty = build_pool(inv, PoolPolicy.default(), server_version=(1, 36), binding_conditions=True)
    narrowed = build_pool(inv, PoolPolicy.default().model_copy(update={"gpus": {
        "0000:3b:00.0": PoolPolicy.default().others.model_copy(update={"equal_size_fb_mib": 2048})}}),
        server_version=(1, 36), binding_conditions=True)
    assert {d.capacity["memory"] for d in narrowed.devices if d.gpu == "0000:3b:00.0" and d.kind == "vgpu"} == {"2Gi"}
    assert comes_or_goes(empty, narrowed)  # narrowed: in place
    assert not comes_or_goes(narrowed, empty)  # conditions added back: a generation
    assert not comes_or_goes(None, narrowed)
    assert not comes_or_goes(empty, empty)
    changed = narrowed.model_copy(deep=True)
    changed.counter_sets[0].counters["vgpus"] = 15
    assert not comes_or_goes(empty, changed)
    gone = without(empty, "0000:5e:00.0")
    assert comes_or_goes(empty, gone) and comes_or_goes(gone, empty)
