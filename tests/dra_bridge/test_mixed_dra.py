"""Mixed-size vGPUs through DRA (#24 point 5): a GPU in NVIDIA's mixed-size mode publishes one
device per (size, placement ID) on the placement counters, which admit exactly the sets of devices
whose slot ranges are disjoint; prepare creates each vGPU at its device's placement (create, move,
read back), unprepare frees it, and a reboot re-creates prepared claims at their placements."""

from __future__ import annotations

import itertools
import random
import uuid

import pytest

from dra_bridge.api.k8sname import is_dns_label
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.kubeletplugin.effects import creation_order
from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
from dra_bridge.pool.devices import build_pool, co_allocatable
from dra_bridge.pool.policy import policy_from_layout
from dra_bridge.pool.safe import without_counters
from dra_bridge.pool.slices import build_slices
from dra_bridge.rpc.types import ClaimRef
from mdev_manager import catalog_placements
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim.io import SimIO
from tests.support.dra import DictClaims, claim_object, make_driver, make_node
from tests.support.k8sschema import kubernetes_problems

L40S, L4, H100, A100, A40 = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0", "0000:1c:00.0"
BOARDS = {L40S: "L40S", L4: "L4", H100: "H100-80GB", A100: "A100-40GB"}
#: every board of the mixed-node preset to DRA, the four with a placement table in mixed-size mode
LAYOUT = [GpuLayout(index=i, mode="dra", passthrough=True, mixed_size=i < 4) for i in range(5)]
VERSIONS = [(1, 34), (1, 35), (1, 36), (1, 37)]


@pytest.fixture
def node(tmp_path):
    n = make_node(tmp_path, "mixed-node", prepare_gpus=False)
    n.layouts = LAYOUT
    out = reconcile(n.env, n.io, LAYOUT, node=n.node)
    assert out.matches, out.rounds[-1].plan
    return n


def pool_of(node, version=(1, 35), **kw):
    inv = discover(node.env, node.io)
    return build_pool(inv, policy_from_layout(inv, LAYOUT), server_version=version, **kw)


def placed(pool, gpu):
    return [d for d in pool.devices if d.gpu == gpu and d.slots is not None]


def span(d) -> tuple[int, int]:
    return d.slots.start, d.slots.start + d.slots.size


def disjoint(a, b) -> bool:
    return a[1] <= b[0] or b[1] <= a[0]


# --------------------------------------------------------------------------- devices and counters


def test_one_device_per_size_and_placement_with_its_attributes(node):
    pool = pool_of(node)
    l40s = placed(pool, L40S)
    table = catalog_placements.placements("L40S")
    assert sorted((d.slots.size, d.slots.start) for d in l40s) == sorted((s, p) for s, ids in table.items() for p in ids)
    d = pool.device("gpu-0-vgpu-8gb-at-16")
    assert d.attributes["placementStart"] == {"int": 16} and d.attributes["placementSize"] == {"int": 8}
    assert d.attributes["vgpuTypes"] == {"string": " L40S-8Q L40S-8A "} and d.attributes["profile"] == {"string": "L40S-8Q"}
    assert d.capacity == {"memory": "8Gi"} and list(d.type_choices) == ["L40S-8Q", "L40S-8A"]
    assert d.type_choices["L40S-8Q"] == d.type_id
    assert all(is_dns_label(x.name) for x in pool.devices)
    # one counter set per GPU, from pool/placements.py: the L40S's 16 parts, no VF counter (32 VFs > 24 vGPUs)
    (cs,) = [c for c in pool.counter_sets if c.name.startswith("gpu-0-")]
    assert cs.name == "gpu-0-slots-a" and len(cs.counters) == 16 and sum(cs.counters.values()) == 48
    assert d.consumes[0].counters == {"slots-15-18": "2", "slots-18-20": "2", "slots-20-24": "4"}
    whole = pool.device("gpu-0-passthrough")
    assert whole.consumes[0].counters == {k: str(v) for k, v in cs.counters.items()}
    # the A40 has no table: it stays in equal-size mode with its fair-share counters
    assert pool.counter_set("gpu-4-counter-set") is not None and not placed(pool, A40)


def test_device_names_say_size_and_placement():
    from dra_bridge.api.names import mixed_device_name

    assert mixed_device_name(0, 8192, 16) == "gpu-0-vgpu-8gb-at-16"
    assert mixed_device_name(12, 512, 3) == "gpu-12-vgpu-512mb-at-3"
    assert is_dns_label(mixed_device_name(10**9, 2**40, 10**6))


def test_no_groups_and_no_binding_conditions_on_any_server(node):
    for v in VERSIONS:
        pool = pool_of(node, v, binding_conditions=True)
        for d in pool.devices:
            if d.gpu in BOARDS:
                assert not d.binding_conditions and all(not c.compatibility_groups for c in d.consumes)
        # every size of the GPU at once, on every version
        assert {d.slots.size for d in placed(pool, H100)} == {4, 5, 8, 10, 16, 20, 40, 80}


@pytest.mark.parametrize("gpu", list(BOARDS), ids=list(BOARDS.values()))
def test_counters_admit_exactly_the_disjoint_sets(node, gpu):
    """The argument of pool/placements.py on the pool as published, for every size the board's
    types have (the catalog's tables include the 2 and 3 GiB Q/B/A sizes): (1) every counter's value
    is at least what any disjoint family of devices consumes of it (so every disjoint family is
    admitted), (2) every overlapping pair is refused (so every family holding one is), the whole GPU
    beside anything included. Random maximal disjoint families are admitted too."""
    pool = pool_of(node)
    devs = placed(pool, gpu)
    whole = pool.device(f"gpu-{discover(node.env, node.io).gpu(gpu).index}-passthrough")
    sets = {c.name: c for c in pool.counter_sets if c.name.startswith(whole.name.rsplit("-", 1)[0])}
    slots = max(span(d)[1] for d in devs)
    for cs in sets.values():
        for counter, value in cs.counters.items():
            use = {span(d): sum(parse_quantity(c.counters.get(counter, "0")) for c in d.consumes if c.counter_set == cs.name)
                   for d in devs}
            best = [0] * (slots + 1)  # most of it that disjoint ranges within [x, slots) consume
            for x in range(slots - 1, -1, -1):
                best[x] = max([best[x + 1]] + [q + best[r[1]] for r, q in use.items() if r[0] == x])
            assert best[0] <= parse_quantity(str(value)), (cs.name, counter)
    for a, b in itertools.combinations(devs, 2):
        assert co_allocatable(pool, [a.name, b.name]) == disjoint(span(a), span(b)), (a.name, b.name)
    assert co_allocatable(pool, [whole.name]) and not any(co_allocatable(pool, [whole.name, d.name]) for d in devs)
    rng = random.Random(gpu)
    for _ in range(50):
        chosen: list = []
        for d in rng.sample(devs, len(devs)):
            if all(disjoint(span(d), span(c)) for c in chosen):
                chosen.append(d)
        assert co_allocatable(pool, [d.name for d in chosen])


def test_slices_on_every_version_are_valid(node):
    for v in VERSIONS:
        pool = pool_of(node, v)
        slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name=node.node, pool_name=node.node,
                              generation=1, server_version=v)
        published = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
        assert {d.name for d in pool.devices} == published
        for s in slices:
            assert kubernetes_problems(s, (f"{v[0]}.{v[1]}",)) == []


# --------------------------------------------------------------------------- the safe shape


@pytest.mark.parametrize("board", catalog_placements.KNOWN)
def test_each_sizes_placements_are_pairwise_disjoint(board):
    """What the safe shape relies on: any subset of one size's placements is creatable."""
    for size, ids in catalog_placements.placements(board).items():
        for a, b in itertools.combinations(ids, 2):
            assert disjoint((a, a + size), (b, b + size)), (board, size, a, b)


def test_without_counters_one_size_and_nothing_over_a_held_vgpu(node, paths):
    safe = without_counters(pool_of(node), discover(node.env, node.io))
    for gpu in BOARDS:
        devs = [d for d in safe.devices if d.gpu == gpu]
        assert devs and {d.kind for d in devs} == {"vgpu"} and len({d.slots.size for d in devs}) == 1
        assert all(disjoint(span(a), span(b)) for a, b in itertools.combinations(devs, 2))
        assert not any(d.consumes for d in devs)
    assert any("only 2Gi vGPUs are offered" in w for w in safe.warnings)
    # a 12 GiB vGPU at 0 and an 8 GiB one at 16: the safe shape keeps 12 GiB devices clear of the 8 GiB one
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    refs = [claims.add(claim_object(n, [("gpu", dev)], node=node.node), str(uuid.uuid4()))
            for n, dev in (("a", "gpu-0-vgpu-12gb-at-0"), ("b", "gpu-0-vgpu-8gb-at-16"))]
    assert all(r.error is None for r in drv.prepare(refs).values())
    safe = without_counters(pool_of(node), discover(node.env, node.io))
    kept = [d.name for d in safe.devices if d.gpu == L40S]
    assert kept in (["gpu-0-vgpu-8gb-at-16", "gpu-0-vgpu-8gb-at-24", "gpu-0-vgpu-8gb-at-40"],
                    ["gpu-0-vgpu-12gb-at-0", "gpu-0-vgpu-12gb-at-24", "gpu-0-vgpu-12gb-at-36"])


# --------------------------------------------------------------------------- prepare and unprepare


def slots_on_host(node, gpu) -> dict[str, tuple[str, int]]:
    return {v.id: (v.type_name.split()[-1], v.placement_id) for v in discover(node.env, node.io).gpu(gpu).vgpus}


def test_three_sizes_prepared_each_at_its_placement_and_freed(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    wanted = {"vm-24": "gpu-0-vgpu-24gb-at-24", "vm-8": "gpu-0-vgpu-8gb-at-16", "pod-4": "gpu-0-vgpu-4gb-at-8"}
    refs = {n: claims.add(claim_object(n, [("gpu", d)], node=node.node), str(uuid.uuid4())) for n, d in wanted.items()}
    res = drv.prepare(list(refs.values()))
    assert all(r.error is None for r in res.values()), {k: r.error for k, r in res.items()}
    assert sorted(slots_on_host(node, L40S).values()) == [("L40S-24Q", 24), ("L40S-4Q", 8), ("L40S-8Q", 16)]
    rec = drv.cp.claims[refs["vm-8"].uid].devices[0]
    assert (rec.placement, rec.placement_size) == (16, 8)
    # unprepare frees the slots: another claim takes them
    assert drv.unprepare([refs["vm-24"]]) == {refs["vm-24"].uid: None}
    assert sorted(p for _, p in slots_on_host(node, L40S).values()) == [8, 16]
    other = claims.add(claim_object("vm-12", [("gpu", "gpu-0-vgpu-12gb-at-36")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([other])[other.uid].error is None
    assert sorted(slots_on_host(node, L40S).values()) == [("L40S-12Q", 36), ("L40S-4Q", 8), ("L40S-8Q", 16)]
    drv.unprepare([refs["vm-8"], refs["pod-4"], other])
    assert slots_on_host(node, L40S) == {}


def test_the_claims_config_picks_the_series_and_mdev_boards_are_placed_too(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    obj = claim_object("vm", [("gpu", "gpu-0-vgpu-8gb-at-40")], node=node.node)
    params = {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": "L40S-8A"}
    obj["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "vgpu.kubevirt.io", "parameters": params}}]
    ref = claims.add(obj, str(uuid.uuid4()))
    a100 = claims.add(claim_object("vm-a", [("gpu", "gpu-3-vgpu-10gb-at-30")], node=node.node), str(uuid.uuid4()))
    res = drv.prepare([ref, a100])
    assert all(r.error is None for r in res.values()), {k: r.error for k, r in res.items()}
    assert list(slots_on_host(node, L40S).values()) == [("L40S-8A", 40)]
    assert list(slots_on_host(node, A100).values()) == [("A100-10C", 30)]  # an mdev on a VF of the A100


class DroppingPlacements(SimIO):
    """A driver that takes placement_id writes without moving anything."""

    def write(self, path, data):
        if str(path).endswith("nvidia/placement_id"):
            return
        super().write(path, data)


def test_a_placement_that_reads_back_wrong_fails_the_prepare_and_leaves_nothing(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node), io=DroppingPlacements(node.host))
    ref = claims.add(claim_object("vm", [("gpu", "gpu-0-vgpu-8gb-at-24")], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([ref])[ref.uid].error
    assert "not placed at slots 24-31" in err and "reads 0 after writing 24" in err
    assert slots_on_host(node, L40S) == {} and drv.cp.claims == {}


def test_slots_held_or_a_gpu_out_of_the_mode_refuse_before_anything_is_made(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    first = claims.add(claim_object("a", [("gpu", "gpu-0-vgpu-16gb-at-32")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([first])[first.uid].error is None
    clash = claims.add(claim_object("b", [("gpu", "gpu-0-vgpu-12gb-at-36")], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([clash])[clash.uid].error
    assert "gpu-0-vgpu-12gb-at-36 takes slots 36-47 of GPU 0000:10:00.0, which overlap 32-47 of " \
           "gpu-0-vgpu-16gb-at-32 prepared for claim default/a" in err, err
    assert len(slots_on_host(node, L40S)) == 1
    published = pool_of(node)  # as published while the L4 was in the mode
    node.host.reboot()
    assert reconcile(node.env, node.io, [GpuLayout(index=1, mode="dra")], node=node.node).ok  # VFs, no mode
    drv = make_driver(node, paths, claims, lambda: published)
    ref = claims.add(claim_object("c", [("gpu", "gpu-1-vgpu-6gb-at-6")], node=node.node), str(uuid.uuid4()))
    assert "GPU 0000:13:00.0 is not in mixed-size mode" in drv.prepare([ref])[ref.uid].error
    assert discover(node.env, node.io).gpu(L4).vgpus == []


# --------------------------------------------------------------------------- reboot


class FirstFitLog(SimIO):
    """Where each new vGPU sat before its move: the driver's first-fit spot."""

    def __init__(self, host):
        super().__init__(host)
        self.spots: list[int] = []

    def write(self, path, data):
        super().write(path, data)
        if str(path).endswith("nvidia/current_vgpu_type") and data.strip() != "0":
            self.spots.append(int((path.parent / "placement_id").read_text()))


def test_a_reboot_re_creates_prepared_claims_at_their_placements(node, paths):
    """Prepared in one order; after the reboot the kubelet asks in another. Re-created lowest placement
    first, no first-fit spot is another claim's placement, and each vGPU is back at its own."""
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    wanted = [("c24", "gpu-0-vgpu-24gb-at-24"), ("c8", "gpu-0-vgpu-8gb-at-16"), ("c4", "gpu-0-vgpu-4gb-at-0"),
              ("c6", "gpu-0-vgpu-6gb-at-6")]
    refs = [claims.add(claim_object(n, [("gpu", d)], node=node.node), str(uuid.uuid4())) for n, d in wanted]
    assert all(r.error is None for r in drv.prepare(refs).values())
    before = sorted(slots_on_host(node, L40S).values())
    node.host.reboot()
    assert slots_on_host(node, L40S) == {}
    # the agent's start: restore, then the layout (VFs back, then mixed-size mode: enabling VFs clears it)
    assert all(not r.failed for r in restore(node.env, node.io, drv.usage()))
    assert reconcile(node.env, node.io, LAYOUT, node=node.node, usage_extra=drv.usage()).matches
    io = FirstFitLog(node.host)
    drv = make_driver(node, paths, claims, lambda: pool_of(node), io=io)
    res = drv.prepare(list(reversed(refs)))
    assert all(r.error is None for r in res.values()), {k: r.error for k, r in res.items()}
    assert sorted(slots_on_host(node, L40S).values()) == before
    targets = {p: s for _, p, s in ((0, 0, 4), (0, 6, 6), (0, 16, 8), (0, 24, 24))}
    assert len(io.spots) == 4
    for k, spot in enumerate(io.spots):  # made in order 0, 6, 16, 24: a spot overlaps no later target
        later = sorted(targets)[k + 1:]
        assert all(spot + targets[sorted(targets)[k]] <= p for p in later), (k, spot)


def test_creation_order_puts_recorded_placements_first_lowest_first():
    def ref(n):
        return ClaimRef(namespace="default", name=f"c{n}", uid=str(uuid.UUID(int=n)))

    def rec(n, *placements):
        devices = [PreparedDeviceRecord(request="gpu", pool="p", device=f"d{n}{k}", kind="vgpu", gpu="g",
                                        placement=p) for k, p in enumerate(placements)]
        return ClaimRecord(uid=ref(n).uid, namespace="default", name=f"c{n}", devices=devices)

    refs = [ref(n) for n in range(1, 6)]
    records = {r.uid: r for r in (rec(1, 24), rec(2, None), rec(4, 40, 0), rec(5, 8))}
    assert [r.uid for r in creation_order(refs, records)] == [ref(n).uid for n in (4, 5, 1, 2, 3)]


# --------------------------------------------------------------------------- odd cases and readers


def test_a_board_with_fewer_vfs_than_its_slots_hold_gets_a_vf_counter(node):
    """No published board needs it (their VFs outnumber the vGPUs their slots hold); a board that did
    would get a ``vgpus`` counter beside its slots, each vGPU consuming one."""
    inv = discover(node.env, node.io)
    l40s = inv.gpu(L40S)
    l40s.sriov_total_vfs = 4
    pool = build_pool(inv, policy_from_layout(inv, LAYOUT), server_version=(1, 35))
    cs = pool.counter_set("gpu-0-slots-a")
    assert cs.counters["vgpus"] == 4 and pool.device("gpu-0-passthrough").consumes[0].counters["vgpus"] == "4"
    small = [f"gpu-0-vgpu-2gb-at-{p}" for p in (0, 4, 6, 10, 12)]
    assert co_allocatable(pool, small[:4]) and not co_allocatable(pool, small)
    assert pool_of(node).counter_set("gpu-0-slots-a").counters.get("vgpus") is None  # 32 VFs: not needed


def test_the_scheduler_says_which_slots_are_held(node):
    from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
    from dra_bridge.scheduling.selectors import default_selectors

    pool = pool_of(node, (1, 37))
    slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name=node.node, pool_name=node.node, generation=1,
                          server_version=(1, 37))
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "v"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.kubevirt.io"'}}]}}
    alloc = Allocator(slices, [cls], default_selectors())

    def ask(name, expr):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "d"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "v", "selectors": [
                    {"cel": {"expression": expr}}]}}]}}}

    # has(): the passthrough device has no placementSize, and the scheduler fails the attempt on a
    # selector that errors (the model does too)
    on_l40s = ('device.attributes["vgpu.kubevirt.io"].gpuIndex == 0 && '
               'has(device.attributes["vgpu.kubevirt.io"].placementSize)')
    _, (got,) = alloc.allocate([ask("big", on_l40s + ' && device.attributes["vgpu.kubevirt.io"].placementSize == 48')])
    assert got["devices"]["results"][0]["device"] == "gpu-0-vgpu-48gb-at-0"
    with pytest.raises(Unsatisfiable, match=r"gpu-0 has 0 of its slots 0-1 free; needs 2"):
        alloc.allocate([ask("small", on_l40s + ' && device.attributes["vgpu.kubevirt.io"].placementSize == 2')])


def test_a_placement_name_tells_its_gpu_and_type_without_the_pool(node):
    """What the checkpoint rebuild reads back from a device name at the daemon's start."""
    from dra_bridge.kubeletplugin import recovery

    obs = recovery.Observed(inventory=discover(node.env, node.io))
    a100_10c = obs.inventory.gpu(A100).type_by_ref("A100-10C").id
    assert recovery._published("gpu-3-vgpu-10gb-at-30", None, obs) == ("vgpu", A100, a100_10c)
    kind, gpu, _ = recovery._published("gpu-0-vgpu-8gb-at-16", None, obs)  # 8Q and 8A: the claim chose
    assert (kind, gpu) == ("vgpu", L40S)


@pytest.mark.parametrize("order", ["overlapping claim first", "prepared claim first"])
def test_after_a_reboot_a_prepared_claim_keeps_its_placement_whoever_the_kubelet_retries_first(node, paths, order):
    """Issue #29.3: P (H100, 8 GiB at 72) prepared, X (5 GiB at 70, overlapping) refused. After a
    reboot the kubelet may retry X first: X is refused again (P's record holds slots 72-79 though its
    vGPU is not made again yet), and P gets its slots and its own VF back."""
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    p = claims.add(claim_object("p", [("gpu", "gpu-2-vgpu-8gb-at-72")], node=node.node), str(uuid.uuid4()))
    x = claims.add(claim_object("x", [("gpu", "gpu-2-vgpu-5gb-at-70")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([p])[p.uid].error is None
    assert "slots 70-74" in drv.prepare([x])[x.uid].error
    vf = drv.cp.claims[p.uid].devices[0].parent
    node.host.reboot()
    assert all(not r.failed for r in restore(node.env, node.io, drv.usage()))
    assert reconcile(node.env, node.io, LAYOUT, node=node.node, usage_extra=drv.usage()).matches
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    if order == "overlapping claim first":
        err = drv.prepare([x])[x.uid].error
        assert err and "slots 70-74 of GPU 0000:16:00.0, which overlap 72-79 of gpu-2-vgpu-8gb-at-72" in err
        assert f"prepared for claim default/p (uid {p.uid})" in err
        assert slots_on_host(node, H100) == {}
    assert drv.prepare([p])[p.uid].error is None
    assert [s for _, s in slots_on_host(node, H100).values()] == [72]
    assert drv.cp.claims[p.uid].devices[0].parent == vf
    assert drv.prepare([x])[x.uid].error  # still refused: P holds the slots


def test_after_a_reboot_a_new_claim_takes_no_vf_another_claims_record_names(node, paths):
    """A claim on other slots retried first after a reboot leaves the VF of the claim not yet re-created."""
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    p = claims.add(claim_object("p", [("gpu", "gpu-2-vgpu-8gb-at-0")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([p])[p.uid].error is None
    vf = drv.cp.claims[p.uid].devices[0].parent
    node.host.reboot()
    assert all(not r.failed for r in restore(node.env, node.io, drv.usage()))
    assert reconcile(node.env, node.io, LAYOUT, node=node.node, usage_extra=drv.usage()).matches
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    y = claims.add(claim_object("y", [("gpu", "gpu-2-vgpu-8gb-at-40")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([y])[y.uid].error is None
    assert drv.cp.claims[y.uid].devices[0].parent != vf
    assert drv.prepare([p])[p.uid].error is None
    assert drv.cp.claims[p.uid].devices[0].parent == vf


def test_a_vgpu_no_claim_holds_keeps_its_slots_from_the_claims(node, paths):
    """#36.2 in mixed-size mode: a vGPU no prepared claim holds (here one a claim made, then taken as
    made by hand) keeps its slots: no device overlapping them is published, nor the whole GPU; the
    other placements stay offered. Named by a claim's record, every device is back (the allocation
    the scheduler counts keeps its slots)."""
    from dra_bridge.pool.policy import with_outside

    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    ref = claims.add(claim_object("a", [("gpu", "gpu-0-vgpu-12gb-at-0")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([ref])[ref.uid].error is None
    inv = discover(node.env, node.io)
    (v,) = inv.gpu(L40S).vgpus
    everything = [d.name for d in pool_of(node).devices if d.gpu == L40S]
    pool = build_pool(inv, with_outside(policy_from_layout(inv, LAYOUT), inv, set()), server_version=(1, 35))
    left = [d for d in pool.devices if d.gpu == L40S]
    assert left and all(d.kind == "vgpu" and disjoint(span(d), (0, 12)) for d in left)
    assert {d.name for d in left} == {n for n in everything if (d := pool_of(node).device(n)).slots is not None
                                      and disjoint(span(d), (0, 12))}
    assert any(f"GPU {L40S}: 1 vGPU(s) no claim holds" in w for w in pool.warnings)
    back = build_pool(inv, with_outside(policy_from_layout(inv, LAYOUT), inv, {v.id}), server_version=(1, 35))
    assert [d.name for d in back.devices if d.gpu == L40S] == everything
