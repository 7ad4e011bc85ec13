"""``migMode: auto``: a MIG-capable GPU publishes its MIG placements and its time-sliced slots on
one counter set, kept apart by compatibility groups where the server keeps them; the first claim
prepared on the empty GPU switches its MIG mode; servers without groups get the current mode only.
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from dra_bridge.pool.devices import build_pool, co_allocatable
from dra_bridge.pool.dualmode import MIG_GROUP, SLICED_MEMORY
from dra_bridge.pool.policy import policy_from_layout
from dra_bridge.pool.slices import build_slices
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from tests.support.dra import DictClaims, claim_object, make_driver, make_node

AUTO = [GpuLayout(all=True, mode="dra", passthrough=True, migMode="auto")]
A100_MDEV, A100_VFIO, H100, L40S = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"


@pytest.fixture
def node(tmp_path):
    n = make_node(tmp_path, "mig-node", prepare_gpus=False)
    out = reconcile(n.env, n.io, AUTO, node=n.node)
    assert out.matches, out.rounds[-1].plan
    return n


def pool_of(node, version=(1, 37)):
    inv = discover(node.env, node.io)
    return build_pool(inv, policy_from_layout(inv, AUTO), server_version=version)


def test_auto_leaves_the_mode_alone_and_publishes_both_kinds_on_one_counter_set(node):
    inv = discover(node.env, node.io)
    assert [g.mig.enabled if g.mig else None for g in inv.gpus] == [False, False, False, None]
    pool = pool_of(node)
    a100 = [d for d in pool.devices if d.gpu == A100_MDEV]
    mig = [d for d in a100 if d.placement is not None]
    sliced = [d for d in a100 if d.kind == "vgpu" and d.placement is None]
    assert len(mig) == 21 and len(sliced) > 10  # every placement (as in MIG mode), every size slot
    (cs,) = [c for c in pool.counter_sets if c.name == "gpu-0-counter-set"]
    assert {"multiprocessors", "memory", "memory-slice-7", SLICED_MEMORY, "vgpus"} <= set(cs.counters)
    assert all(c.compatibility_groups == [MIG_GROUP] for d in mig for c in d.consumes)
    assert all(c.compatibility_groups and c.compatibility_groups[0].startswith("fb-") for d in sliced for c in d.consumes)
    assert all(set(d.consumes[0].counters) == {SLICED_MEMORY, "vgpus"} for d in sliced)
    whole = pool.device("gpu-0-passthrough")
    assert whole.consumes[0].counters.keys() == cs.counters.keys()
    # the L40S has no MIG: time-sliced only, as before
    assert all(d.placement is None for d in pool.devices if d.gpu == L40S)


def test_the_counters_and_groups_never_mix_the_modes(node):
    pool = pool_of(node)
    a100 = [d for d in pool.devices if d.gpu == A100_MDEV]
    mig = [d for d in a100 if d.placement is not None]
    sliced = [d for d in a100 if d.kind == "vgpu" and d.placement is None]
    for m, s in itertools.product(mig, sliced):
        assert not co_allocatable(pool, [m.name, s.name])
    # within a mode, as before: placements by their slices, slots by size
    assert co_allocatable(pool, ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"])
    assert not co_allocatable(pool, ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-4g20gb-5-0"])
    by_size = {}
    for d in sliced:
        by_size.setdefault(d.consumes[0].compatibility_groups[0], []).append(d.name)
    two = next(v for v in by_size.values() if len(v) >= 2)
    assert co_allocatable(pool, two[:2])
    a, b = (v[0] for v in list(by_size.values())[:2])
    assert not co_allocatable(pool, [a, b])  # two sizes of one equal-size GPU
    for d in a100:
        if d.kind != "passthrough":
            assert not co_allocatable(pool, ["gpu-0-passthrough", d.name])


def test_servers_without_groups_get_the_current_mode_only(node):
    pool = pool_of(node, version=(1, 36))
    assert not any(d.placement is not None for d in pool.devices)  # the A100s and the H100 are not in MIG mode
    slices = build_slices(pool_of(node), driver="vgpu.kubevirt.io", node_name=node.node, pool_name=node.node,
                          generation=1, server_version=(1, 37))
    groups = {g for s in slices for d in s["spec"].get("devices") or [] for c in d.get("consumesCounters") or []
              for g in c.get("compatibilityGroups") or []}
    assert MIG_GROUP in groups and "fb-5120" in groups


def test_the_first_claim_prepared_sets_the_mode_and_the_other_mode_waits(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    mig = claims.add(claim_object("vm-mig", [("gpu", "gpu-0-mig-3g20gb-9-4")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([mig])[mig.uid].error is None
    gpu = discover(node.env, node.io).gpu(A100_MDEV)
    assert gpu.mig.enabled and [(g.profile_id, g.placement.start) for g in gpu.mig.instances] == [(9, 4)]
    assert gpu.vgpus[0].type_name.endswith("A100-3-20C")
    # a time-sliced claim the scheduler would never allocate beside it: refused, nothing touched
    sliced = next(d.name for d in pool_of(node).devices if d.gpu == A100_MDEV and d.kind == "vgpu" and d.placement is None)
    ts = claims.add(claim_object("vm-ts", [("gpu", sliced)], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([ts])[ts.uid].error
    assert "must leave MIG mode" in err and "holds" in err
    assert discover(node.env, node.io).gpu(A100_MDEV).mig.enabled
    # once the MIG claim is gone, the time-sliced one switches the empty GPU back and runs
    assert drv.unprepare([mig]) == {mig.uid: None}
    assert drv.prepare([ts])[ts.uid].error is None
    gpu = discover(node.env, node.io).gpu(A100_MDEV)
    assert not gpu.mig.enabled and len(gpu.vgpus) == 1 and not gpu.vgpus[0].gpu_instance
    assert gpu.vgpus[0].type_name == "NVIDIA A100-4C"  # the slot's default type: time-sliced
    assert drv.unprepare([ts]) == {ts.uid: None}
    # the layout left the mode alone throughout, and still does
    assert reconcile(node.env, node.io, AUTO, node=node.node).changed == 0


def test_a_layout_with_both_kinds_of_type_validates_under_auto(node):
    layout = [GpuLayout(model="A100", mode="dra", migMode="auto", vgpus={"A100-3-20C": 0, "A100-5C": 0})]
    assert reconcile(node.env, node.io, layout, node=node.node).ok
    inv = discover(node.env, node.io)
    pool = build_pool(inv, policy_from_layout(inv, layout), server_version=(1, 37))
    a100 = [d for d in pool.devices if d.gpu == A100_MDEV and d.kind == "vgpu"]
    assert {d.attributes["profile"]["string"] for d in a100} == {"3g.20gb", "A100-5C"}
