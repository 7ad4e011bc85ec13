"""Several vGPUs in one GB20x GPU instance under DRA (MIG time-slicing, #38.1): the layout names
the sharing types (DC-1-6Q: 4 per 1g.24gb; DC-2-24Q: 2 per 2g.48gb); the pool publishes one device
per placement inside each instance on the grid of dra_bridge/pool/migshare.py; prepare creates the
instance or joins it and puts the vGPU at its placement inside; unprepare keeps the instance while
another vGPU lives on it; a crash or a reboot finds them again."""

from __future__ import annotations

import itertools
import uuid

import pytest

from dra_bridge.pool.devices import GpuPolicy, PoolPolicy, build_pool, co_allocatable
from dra_bridge.pool.slices import build_slices
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from tests.support.dra import DictClaims, claim_object, make_driver, make_node

GPU = "0000:10:00.0"
DRA = [GpuLayout(all=True, mode="dra", passthrough=True, migMode=True)]
SHARING = PoolPolicy(gpus={GPU: GpuPolicy(passthrough=True, vgpu_types=["DC-1-6Q", "DC-2-24Q"])})


@pytest.fixture
def node(tmp_path):
    n = make_node(tmp_path, "rtxpro-node", prepare_gpus=False)
    assert reconcile(n.env, n.io, DRA, node=n.node).matches
    return n


def pool_of(node, policy=SHARING, version=(1, 35)):
    return build_pool(discover(node.env, node.io), policy, server_version=version)


def test_each_instance_offers_a_device_per_placement_inside_it(node):
    pool = pool_of(node)
    assert pool.warnings == []
    names = [d.name for d in pool.devices if d.gpu == GPU and d.kind == "vgpu"]
    assert len(names) == 4 * 4 + 2 * 2  # 1g.24gb: 4 instances x 4 DC-1-6Q; 2g.48gb: 2 x 2 DC-2-24Q
    dev = pool.device("gpu-0-mig-1g24gb-14-1-at-12")
    assert (dev.placement.start, dev.inside.start, dev.inside.size, dev.capacity["memory"]) == (1, 12, 6, "6Gi")
    assert dev.attributes["vgpuPlacement"] == {"int": 12} and dev.attributes["vgpuType"] == {"string": "DC-1-6Q"}
    (cs,) = [c for c in pool.counter_sets if c.name == "gpu-0-counter-set"]
    assert len(cs.counters) == 32 and all(k.startswith("memory-slice-") for k in cs.counters)
    one = [f"gpu-0-mig-1g24gb-14-0-at-{p}" for p in (0, 6, 12, 18)]
    assert co_allocatable(pool, one)  # an instance's four vGPUs
    assert co_allocatable(pool, one + ["gpu-0-mig-1g24gb-14-1-at-0", "gpu-0-mig-2g48gb-5-2-at-0",
                                       "gpu-0-mig-2g48gb-5-2-at-24"])
    assert not co_allocatable(pool, ["gpu-0-mig-1g24gb-14-0-at-0", "gpu-0-mig-2g48gb-5-0-at-24"])  # slice 0 twice
    assert not co_allocatable(pool, ["gpu-0-mig-1g24gb-14-3-at-6", "gpu-0-passthrough"])
    for version in ((1, 34), (1, 35), (1, 37)):  # the API server's limits (build_slices checks them)
        assert build_slices(pool, driver="vgpu.kubevirt.io", node_name="n", pool_name="n", generation=1,
                            server_version=version)


def test_the_counters_admit_exactly_what_nvml_creates(node):
    """Every set of up to four devices: admitted exactly when their instances do not overlap and
    no two devices of one instance take the same placement inside it."""
    pool = pool_of(node)
    devs = [d for d in pool.devices if d.gpu == GPU and d.kind == "vgpu"]
    for n in range(1, 5):
        for chosen in itertools.combinations(devs, n):
            gis = {(d.gpu_instance_profile, d.placement.start, d.placement.size) for d in chosen}
            apart = all(not set(range(a[1], a[1] + a[2])) & set(range(b[1], b[1] + b[2]))
                        for a, b in itertools.combinations(gis, 2))
            distinct = len({(d.placement.start, d.gpu_instance_profile, d.inside.start) for d in chosen}) == n
            assert co_allocatable(pool, [d.name for d in chosen]) == (apart and distinct), [d.name for d in chosen]


def test_without_a_sharing_type_named_each_instance_is_offered_whole(node):
    pool = pool_of(node, PoolPolicy.default())
    assert not any(d.inside for d in pool.devices)
    assert "memory-slice-0" in pool.counter_sets[0].counters


def test_a_grid_beyond_one_counter_set_falls_back_to_whole_instances(node):
    """DC-1-6Q (4 per instance) x DC-2-24Q (2) x DC-4-32Q (3): 96 counters per GPU, more than 32."""
    pol = PoolPolicy(gpus={GPU: GpuPolicy(vgpu_types=["DC-1-6Q", "DC-2-24Q", "DC-4-32Q"])})
    pool = pool_of(node, pol)
    assert not any(d.inside for d in pool.devices)
    assert any("96 counters" in w and "one per GPU instance" in w for w in pool.warnings), pool.warnings


def prepare(drv, claims, node, name, device):
    ref = claims.add(claim_object(name, [("gpu", device)], node=node.node), str(uuid.uuid4()))
    res = drv.prepare([ref])[ref.uid]
    return ref, res.error


def instances(node):
    g = discover(node.env, node.io).gpu(GPU)
    return {(gi.profile_id, gi.placement.start): sorted((v.placement_id, v.type_name.split()[-1]) for v in g.vgpus
                                                        if v.gpu_instance == gi.id) for gi in g.mig.instances}


def test_prepare_creates_or_joins_the_instance_and_unprepare_keeps_it_while_shared(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    a, err = prepare(drv, claims, node, "vm-a", "gpu-0-mig-1g24gb-14-2-at-12")
    assert err is None, err
    assert instances(node) == {(14, 2): [(12, "DC-1-6Q")]}  # made, and the vGPU moved to 12 inside it
    b, err = prepare(drv, claims, node, "pod-b", "gpu-0-mig-1g24gb-14-2-at-0")
    assert err is None, err
    assert instances(node) == {(14, 2): [(0, "DC-1-6Q"), (12, "DC-1-6Q")]}  # joined
    # the same placement inside it again (allocated twice): refused, nothing made
    c, err = prepare(drv, claims, node, "vm-c", "gpu-0-mig-1g24gb-14-2-at-12")
    assert "is already prepared for claim default/vm-a" in err, err
    # an instance overlapping it: refused
    d, err = prepare(drv, claims, node, "vm-d", "gpu-0-mig-2g48gb-5-2-at-0")
    assert "memory slices 2-3" in err, err
    assert instances(node) == {(14, 2): [(0, "DC-1-6Q"), (12, "DC-1-6Q")]}
    assert drv.unprepare([a]) == {a.uid: None}
    assert instances(node) == {(14, 2): [(0, "DC-1-6Q")]}  # kept for pod-b
    assert drv.unprepare([b]) == {b.uid: None}
    assert instances(node) == {}  # the last one out removes it


def test_one_claim_of_two_vgpus_in_one_new_instance(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    ref = claims.add(claim_object("vm", [("a", "gpu-0-mig-2g48gb-5-0-at-24"), ("b", "gpu-0-mig-2g48gb-5-0-at-0")],
                                  node=node.node), str(uuid.uuid4()))
    assert drv.prepare([ref])[ref.uid].error is None
    assert instances(node) == {(5, 0): [(0, "DC-2-24Q"), (24, "DC-2-24Q")]}
    assert drv.unprepare([ref]) == {ref.uid: None}
    assert instances(node) == {}


def test_a_crash_half_way_undoes_only_the_claim_it_left(node, paths, monkeypatch):
    """The second claim's vGPU is made, then the plugin dies before its record says prepared:
    recover() removes that vGPU and keeps the instance the first claim's vGPU lives on."""
    from dra_bridge.kubeletplugin import driver as driver_mod

    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    a, err = prepare(drv, claims, node, "vm-a", "gpu-0-mig-1g24gb-14-0-at-6")
    assert err is None, err

    class Crash(BaseException):
        pass

    def die(*_a, **_k):
        raise Crash

    monkeypatch.setattr(driver_mod.Driver, "_write_files", die)
    with pytest.raises(Crash):
        prepare(drv, claims, node, "pod-b", "gpu-0-mig-1g24gb-14-0-at-18")
    monkeypatch.undo()
    assert instances(node) == {(14, 0): [(6, "DC-1-6Q"), (18, "DC-1-6Q")]}
    drv = make_driver(node, paths, claims, lambda: pool_of(node))  # the plugin starts again
    assert len(drv.recover()) == 1
    assert instances(node) == {(14, 0): [(6, "DC-1-6Q")]}
    assert drv.prepare([a])[a.uid].error is None  # still prepared, answered from the checkpoint


def test_after_a_reboot_the_sharing_claims_find_their_instance_and_placements_again(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    refs = [prepare(drv, claims, node, f"c{i}", dev)[0] for i, dev in enumerate(
        ("gpu-0-mig-1g24gb-14-3-at-18", "gpu-0-mig-1g24gb-14-3-at-6", "gpu-0-mig-2g48gb-5-0-at-24"))]
    before = instances(node)
    assert before == {(14, 3): [(6, "DC-1-6Q"), (18, "DC-1-6Q")], (5, 0): [(24, "DC-2-24Q")]}
    node.host.reboot()
    assert reconcile(node.env, node.io, DRA, node=node.node).ok  # MIG mode and VFs back, no instance
    assert instances(node) == {}
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    for ref in refs:  # the kubelet asks one claim at a time, in its own order
        assert drv.prepare([ref])[ref.uid].error is None
    assert instances(node) == before
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert instances(node) == {}


def test_overlap_lets_claims_share_an_instance_only_at_disjoint_placements_of_one_type(node):
    """The refusal prepare runs first, from the records (a claim of an earlier boot holds its
    placement too): one instance, one type, placements apart; anything else on its slices clashes."""
    from dra_bridge.kubeletplugin.overlap import overlap
    from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
    from dra_bridge.rpc.types import ClaimRef

    U1 = str(uuid.uuid4())
    pool = pool_of(node)
    six = pool.device("gpu-0-mig-1g24gb-14-0-at-6").type_id

    def held(name, type_id, gi_profile, gi_start, gi_size, at, size):
        return {U1: ClaimRecord(uid=U1, namespace="default", name="a", devices=[PreparedDeviceRecord(
            request="gpu", pool="p", device=name, kind="vgpu", gpu=GPU, type_id=type_id, gi_profile=gi_profile,
            gi_start=gi_start, gi_size=gi_size, placement=at, placement_size=size)])}

    def asks(device):
        return overlap(ClaimRef(uid=str(uuid.uuid4()), namespace="default", name="b"), [{"pool": "p", "device": device}], "p",
                       pool, claims)

    claims = held("gpu-0-mig-1g24gb-14-0-at-6", six, 14, 0, 1, 6, 6)
    assert asks("gpu-0-mig-1g24gb-14-0-at-12") is None  # same instance and type, placements apart
    assert asks("gpu-0-mig-1g24gb-14-1-at-6") is None  # another instance
    assert "overlap 0-0" in asks("gpu-0-mig-2g48gb-5-0-at-0")  # an instance over it
    claims = held("gpu-0-mig-1g24gb-14-0-at-12", "1558", 14, 0, 1, 12, 12)  # a DC-1-12Q there (an earlier pool)
    why = asks("gpu-0-mig-1g24gb-14-0-at-18")
    assert "placement 18 inside the GPU instance at memory slices 0-0 of GPU 0000:10:00.0, which overlaps type 1558 at "\
        "placement 12 inside it of gpu-0-mig-1g24gb-14-0-at-12 prepared for claim default/a" in why, why
    claims = held("gpu-0-mig-1g24gb-14-0-at-0", six, 14, 0, 1, 0, 12)  # overlapping placements inside
    assert "placement 6 inside the GPU instance at memory slices 0-0 of GPU 0000:10:00.0, which overlaps placement 0 "\
        "inside it" in asks("gpu-0-mig-1g24gb-14-0-at-6")


def test_a_rebuilt_record_of_unknown_size_holds_its_instance_whole_but_for_those_that_shared_it(node):
    """A record rebuilt at the daemon's start (its vGPU's type, so its size, unknown: a placement id,
    no size) holds the whole instance against anyone, except a claim that held a device in that
    instance before, asking a published placement apart from the held device's published one."""
    from dra_bridge.kubeletplugin.overlap import overlap
    from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
    from dra_bridge.rpc.types import ClaimRef

    U1 = str(uuid.uuid4())
    pool = pool_of(node)

    def rec(name, at, size=None, gi_start=0):
        return PreparedDeviceRecord(request="gpu", pool="p", device=name, kind="vgpu", gpu=GPU, gi_profile=14,
                                    gi_start=gi_start, gi_size=1, placement=at, placement_size=size)

    claims = {U1: ClaimRecord(uid=U1, namespace="default", name="a", devices=[rec("gpu-0-mig-1g24gb-14-0-at-12", 12)])}

    def asks(device, before=None, in_pool=pool):
        return overlap(ClaimRef(uid=str(uuid.uuid4()), namespace="default", name="b"), [{"pool": "p", "device": device}],
                       "p", in_pool, claims, before=before)

    why = asks("gpu-0-mig-1g24gb-14-0-at-6")  # a free placement: not while the instance is held whole
    assert "takes the GPU instance at memory slices 0-0 of GPU 0000:10:00.0, held whole (the size of its vGPU at " \
        "placement 12 is not known since a rebuild) until its claim prepares again of gpu-0-mig-1g24gb-14-0-at-12 " \
        "prepared for claim default/a" in why, why
    cotenant = {"gpu-0-mig-1g24gb-14-0-at-0": rec("gpu-0-mig-1g24gb-14-0-at-0", 0)}
    assert asks("gpu-0-mig-1g24gb-14-0-at-0", cotenant) is None  # it shared the instance: beside it again
    assert asks("gpu-0-mig-1g24gb-14-0-at-6", cotenant) is not None  # not the device it held there
    elsewhere = {"gpu-0-mig-1g24gb-14-0-at-0": rec("gpu-0-mig-1g24gb-14-0-at-0", 0, gi_start=1)}
    assert asks("gpu-0-mig-1g24gb-14-0-at-0", elsewhere) is not None  # its record was of another instance
    eights = pool_of(node, PoolPolicy(gpus={GPU: GpuPolicy(vgpu_types=["DC-1-8Q"])}))  # at 0, 8, 16: no at 12
    assert asks("gpu-0-mig-1g24gb-14-0-at-0", cotenant, eights) is not None  # the held device's size unknown still
    assert "overlap 0-0" in asks("gpu-0-mig-2g48gb-5-0-at-0", cotenant)  # an instance over it

def test_an_instance_holds_one_type_so_one_sharing_type_per_profile_is_offered(node):
    pool = pool_of(node, PoolPolicy(gpus={GPU: GpuPolicy(vgpu_types=["DC-1-6Q", "DC-1-12Q"])}))
    assert {d.attributes["vgpuType"]["string"] for d in pool.devices if d.gpu == GPU and d.kind == "vgpu"} == {"DC-1-6Q"}
    assert any("DC-1-12Q not offered: DC-1-6Q is offered on 1g.24gb" in w for w in pool.warnings), pool.warnings


def test_a_dual_mode_gpu_offers_each_instance_whole(node):
    """migMode: auto keeps both modes' counters on one set: no room for the grid, so instances whole."""
    pol = PoolPolicy(gpus={GPU: GpuPolicy(vgpu_types=["DC-1-6Q", "DC-24Q"], mig_auto=True)})
    pool = pool_of(node, pol, version=(1, 37))
    mig = [d for d in pool.devices if d.gpu == GPU and d.placement is not None]
    assert mig and not any(d.inside for d in mig)
    assert any("migMode: auto keeps both modes' counters" in w for w in pool.warnings), pool.warnings
