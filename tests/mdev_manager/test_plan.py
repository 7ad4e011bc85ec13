"""The planner as a pure function: inventories from a simulated host, hand-made usage,
definitions and records; nothing here executes a plan.
"""

from __future__ import annotations

import itertools
import uuid as uuidlib

import pytest

from mdev_manager import catalog
from mdev_manager.actions import (
    BindDriver,
    CreateMdev,
    DisableVfs,
    EnableVfs,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SaveVendorRecord,
    SetVgpuType,
)
from mdev_manager.blocked import blocked_by_use
from mdev_manager.config import ConfigError
from mdev_manager.executor import Executor
from mdev_manager.models import Holder, MdevDefinition, Usage
from mdev_manager.plan import make_plan
from tests.support.simnodes import layout


def uuids():
    c = itertools.count(1)
    return lambda: f"00000000-0000-4000-8000-{next(c):012d}"


def tid(board_key: str, short: str, vendor: bool = False) -> str:
    b = catalog.board(board_key)
    t = next(t for t in b.types if t.short_name == short)
    return str(t.num) if vendor else t.mdev_id(b.driver)


def cap(board_key: str, short: str) -> int:
    return next(t for t in catalog.board(board_key).types if t.short_name == short).max_instances


def create(sim, parent: str, type_id: str, n: int = 1) -> list[str]:
    """Make n mdevs on the simulated host (as an earlier run would have); returns their UUIDs."""
    ex = Executor(sim.env, sim.io)
    out = []
    for _ in range(n):
        u = str(uuidlib.uuid4())
        ex.create_mdev(parent, type_id, u)
        out.append(u)
    return out


def defs_for(parent: str, type_id: str, ids: list[str]) -> list[MdevDefinition]:
    return [MdevDefinition(uuid=u, parent=parent, mdev_type=type_id) for u in ids]


def of(plan, cls):
    return [a for a in plan.actions if isinstance(a, cls)]


def index_of(plan, cls, **match) -> int:
    for i, a in enumerate(plan.actions):
        if isinstance(a, cls) and all(getattr(a, k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no {cls.__name__} {match} in {[a.describe() for a in plan.actions]}")


def touched(plan) -> set[str]:
    return {getattr(a, f) for a in plan.actions for f in ("uuid", "vf", "address") if hasattr(a, f)}


@pytest.fixture
def t4(sim):
    return sim.discover().gpus[0]


# --------------------------------------------------------------------------- ordering
def test_fresh_gpu_definition_saved_before_create(sim, t4):
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 4}}), new_uuid=uuids())
    creates = of(plan, CreateMdev)
    assert len(creates) == 4 and len(of(plan, SaveDefinition)) == 4
    assert len({c.uuid for c in creates}) == 4
    for c in creates:
        assert c.parent == t4.address and c.type_id == tid("T4", "T4-2Q") and c.gpu == t4.address
        save = index_of(plan, SaveDefinition, uuid=c.uuid, parent=c.parent, type_id=c.type_id)
        assert save < plan.actions.index(c)
    assert plan.skipped == [] and not plan.structural()


def test_device_removed_before_its_definition(sim, t4):
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 4)
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}),
                     definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
    removed = of(plan, RemoveMdev)
    assert len(removed) == 3 and of(plan, CreateMdev) == [] and of(plan, SaveDefinition) == []
    for r in removed:
        assert index_of(plan, RemoveMdev, uuid=r.uuid) < index_of(plan, RemoveDefinition, uuid=r.uuid)
    kept = set(ids) - {r.uuid for r in removed}
    assert len(kept) == 1


def test_replacing_a_type_removes_before_it_creates(sim, t4):
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 2)
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-4Q": 2}}),
                     definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
    last_removal = max(plan.actions.index(a) for a in of(plan, RemoveMdev) + of(plan, RemoveDefinition))
    first_create = min(plan.actions.index(a) for a in of(plan, SaveDefinition) + of(plan, CreateMdev))
    assert last_removal < first_create
    assert {a.type_id for a in of(plan, CreateMdev)} == {tid("T4", "T4-4Q")}


# --------------------------------------------------------------------------- layout changes
def test_layout_change_leaves_matching_devices_untouched(sim, t4):
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 4)
    defs = defs_for(t4.address, tid("T4", "T4-2Q"), ids)
    inv = sim.discover()
    grow = make_plan(inv, layout({"index": 0, "vgpus": {"T4-2Q": 6}}), definitions=defs, new_uuid=uuids())
    assert len(of(grow, CreateMdev)) == 2 and not (touched(grow) & set(ids))
    assert of(grow, RemoveMdev) == [] and of(grow, RemoveDefinition) == []
    # a change on another GPU does not touch this one
    other = make_plan(inv, layout({"index": 0, "vgpus": {"T4-2Q": 4}}, {"index": 1, "mode": "passthrough"}),
                      definitions=defs, new_uuid=uuids())
    assert all(a.gpu != t4.address for a in other.actions)
    assert other.actions  # GPU 1 does change
    # adding a same-size type of another series keeps the existing ones
    mix = make_plan(inv, layout({"index": 0, "vgpus": {"T4-2Q": 4, "T4-2B": 2}}), definitions=defs, new_uuid=uuids())
    assert not (touched(mix) & set(ids)) and len(of(mix, CreateMdev)) == 2
    # the same layout again: nothing to do
    same = make_plan(inv, layout({"index": 0, "vgpus": {"T4-2Q": 4}}), definitions=defs, new_uuid=uuids())
    assert same.actions == [] and same.skipped == []


def test_adopted_devices_get_a_definition_not_a_new_device(sim, t4):
    """vGPUs made by hand (or by an older run) that match the layout are kept and persisted."""
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 3)
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 3}}), new_uuid=uuids())
    assert of(plan, CreateMdev) == [] and of(plan, RemoveMdev) == []
    assert sorted(a.uuid for a in of(plan, SaveDefinition)) == sorted(ids)


# --------------------------------------------------------------------------- in-use protection
def test_in_use_extras_are_skipped_with_a_reason_and_the_rest_proceeds(sim, t4):
    ids = sorted(create(sim, t4.address, tid("T4", "T4-2Q"), 4))
    busy = ids[2:]  # two in use, layout keeps one
    usage = Usage(mdevs={busy[0]: ["libvirt domain vm1"], busy[1]: ["libvirt domain vm2"]})
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}, {"index": 1, "mode": "passthrough"}),
                     usage=usage, definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
    removed = {a.uuid for a in of(plan, RemoveMdev)}
    assert removed == set(ids[:2])  # the free ones go
    assert not removed & set(busy)
    assert len(plan.skipped) == 1
    skip = plan.skipped[0]
    assert skip.device in busy and "in use" in skip.reason
    assert ("vm1" if skip.device == busy[0] else "vm2") in skip.reason
    # the rest of the plan (GPU 1 to vfio-pci) still proceeds
    assert of(plan, BindDriver)


def test_in_use_device_is_preferred_when_keeping(sim, t4):
    ids = sorted(create(sim, t4.address, tid("T4", "T4-2Q"), 3))
    for busy in ids:
        usage = Usage(mdevs={busy: ["ResourceClaim ns/c1"]})
        plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}), usage=usage,
                         definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
        assert {a.uuid for a in of(plan, RemoveMdev)} == set(ids) - {busy}
        assert plan.skipped == []


def test_vfio_group_holder_counts_as_in_use(sim, t4):
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 2)
    inv = sim.discover()
    victim = inv.gpus[0].vgpus[0]
    usage = Usage(vfio_groups={victim.iommu_group: [Holder(pid=4242, comm="qemu-kvm")]}, vfio_dir="/dev/vfio")
    plan = make_plan(inv, layout({"index": 0, "vgpus": {"T4-2Q": 0}}), usage=usage,
                     definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids))
    assert [a.uuid for a in of(plan, RemoveMdev)] == [u for u in ids if u != victim.id]
    (skip,) = plan.skipped
    assert skip.device == victim.id and "pid 4242 (qemu-kvm)" in skip.reason
    assert f"/dev/vfio/{victim.iommu_group}" in skip.reason


def test_persisted_device_is_preferred_over_an_unknown_one(sim, t4):
    ids = sorted(create(sim, t4.address, tid("T4", "T4-2Q"), 3))
    for saved in ids:
        plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}),
                         definitions=defs_for(t4.address, tid("T4", "T4-2Q"), [saved]))
        assert {a.uuid for a in of(plan, RemoveMdev)} == set(ids) - {saved}


def test_equal_size_skip_when_an_in_use_device_of_another_size_stays(sim, t4):
    ids = sorted(create(sim, t4.address, tid("T4", "T4-2Q"), 2))
    usage = Usage(mdevs={ids[0]: ["libvirt domain vm1"]})
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-4Q": 2}}), usage=usage,
                     definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
    assert [a.uuid for a in of(plan, RemoveMdev)] == [ids[1]]  # the free one still goes
    assert of(plan, CreateMdev) == [] and of(plan, SaveDefinition) == []
    reasons = {s.device: s.reason for s in plan.skipped}
    assert "in use" in reasons[ids[0]]
    assert "equal-size" in reasons[t4.address] and "2048 MiB" in reasons[t4.address]
    assert "T4-4Q" in reasons[t4.address]


def test_equal_size_skip_names_a_framebuffer_size_the_driver_does_not_tell(sim, t4):
    """Kept vGPUs of a known size and of a type whose framebuffer is unknown: the other size is
    skipped with a reason (sorting None among the sizes raised TypeError)."""
    ids = sorted(create(sim, t4.address, tid("T4", "T4-2Q"), 2))
    usage = Usage(mdevs={u: ["libvirt domain vm1"] for u in ids})
    inv = sim.discover()
    g = inv.gpus[0]
    unknown = next(t for t in g.types if t.short_name == "T4-1Q")
    g.types = [t.model_copy(update={"framebuffer_mib": None}) if t is unknown else t for t in g.types]
    next(v for v in inv.gpus[0].vgpus if v.id == ids[0]).type_id = unknown.id
    plan = make_plan(inv, layout({"index": 0, "vgpus": {"T4-4Q": 1}}), usage=usage,
                     definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids), new_uuid=uuids())
    assert of(plan, CreateMdev) == []
    reason = {s.device: s.reason for s in plan.skipped}[t4.address]
    assert "another framebuffer size (2048 MiB, unknown)" in reason


def test_passthrough_with_vgpus_in_use_waits_for_them(sim, t4):
    """Not an error: the node converges once the workload lets go (issue 12, truthful outcome);
    nothing on the GPU changes under it, and the block names the device, its user and the goal."""
    ids = create(sim, t4.address, tid("T4", "T4-2Q"), 2)
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "passthrough"})
    usage = Usage(mdevs={ids[1]: ["libvirt domain vm1"]})
    plan = make_plan(inv, layouts, usage=usage)
    assert [a for a in plan.actions if getattr(a, "gpu", None) == t4.address] == []
    reasons = {s.device: s.reason for s in plan.skipped}
    assert "libvirt domain vm1" in reasons[ids[1]] and "passed through once" in reasons[t4.address]
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert (b.device, b.gpu) == (ids[1], t4.address) and "libvirt domain vm1" in b.held_by[0]
    assert "passing GPU" in b.blocks and "through" in b.blocks
    # released: the GPU is cleared and passed through
    plan = make_plan(inv, layouts, definitions=defs_for(t4.address, tid("T4", "T4-2Q"), ids))
    assert sorted(a.uuid for a in of(plan, RemoveMdev)) == sorted(ids) and of(plan, BindDriver)


def test_a_claims_vgpu_is_never_adopted_by_the_layout(sim, t4):
    """A vGPU a DRA claim made (the GPU was in ``dra`` mode, the layout now says ``vgpu``) is the
    claim's: the layout neither counts it nor saves a definition for it (a device plugin would
    advertise it to a second VM), yet its framebuffer is taken, and it blocks the layout until
    the claim is released. Found by the fault campaign (tests/campaign)."""
    t2q = tid("T4", "T4-2Q")
    (claims_vgpu,) = create(sim, t4.address, t2q)
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}})
    usage = Usage(mdevs={claims_vgpu: ["ResourceClaim vms/vm1"]}, claimed={claims_vgpu: ["ResourceClaim vms/vm1"]})
    plan = make_plan(inv, layouts, usage=usage, new_uuid=uuids())
    saved = {a.uuid for a in of(plan, SaveDefinition)}
    assert claims_vgpu not in saved and of(plan, RemoveMdev) == []
    assert len(of(plan, CreateMdev)) == 7  # 8 fit the GPU; the claim's takes one place
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == claims_vgpu and "ResourceClaim vms/vm1" in b.held_by[0] and "DRA claim" in b.blocks
    # without the claim it is an ordinary vGPU of the wanted type: kept and saved
    plan = make_plan(inv, layouts, new_uuid=uuids())
    assert claims_vgpu in {a.uuid for a in of(plan, SaveDefinition)} and len(of(plan, CreateMdev)) == 7


def test_gpu_passed_through_to_a_workload_waits_before_becoming_vgpu(sim):
    inv = sim.discover()
    pt = inv.gpus[1]
    pt.driver = "vfio-pci"
    pt.iommu_group_drivers = {pt.address: "vfio-pci"}
    for usage, who in ((Usage(pci={pt.address: ["libvirt domain db"]}), "libvirt domain db"),
                       (Usage(vfio_groups={pt.iommu_group: [Holder(pid=7, comm="qemu")]}), "pid 7 (qemu)")):
        layouts = layout({"index": 1, "mode": "vgpu", "vgpus": {"T4-1Q": 1}})
        plan = make_plan(inv, layouts, usage=usage)
        assert plan.actions == []  # not rebound under the workload
        (b,) = blocked_by_use(inv, layouts, plan, usage)
        assert b.device == pt.address and who in b.held_by[0] and "return to nvidia" in b.blocks
        # dra mode: held by something that is not a DRA claim, it is left alone and reported blocked (the
        # node is not what the layout says until it is back on its driver; found by the fault campaign)
        layouts = layout({"index": 1, "mode": "dra"})
        plan = make_plan(inv, layouts, usage=usage)
        assert plan.actions == []
        assert [s.device for s in plan.skipped] == [pt.address] and who in plan.skipped[0].reason
        (b,) = blocked_by_use(inv, layouts, plan, usage)
        assert b.device == pt.address and who in b.held_by[0] and "for DRA claims" in b.blocks
    # dra mode, a DRA claim passes the whole GPU through: what dra mode asks for, not a block
    claim = "ResourceClaim vms/db"
    usage = Usage(pci={pt.address: [claim]}, claimed={pt.address: [claim]})
    layouts = layout({"index": 1, "mode": "dra"})
    plan = make_plan(inv, layouts, usage=usage)
    assert plan.actions == [] and claim in plan.skipped[0].reason
    assert blocked_by_use(inv, layouts, plan, usage) == []
    # unused: it goes back to its native driver first
    plan = make_plan(inv, layout({"index": 1, "vgpus": {"T4-1Q": 1}}))
    assert [(a.address, a.driver) for a in plan.actions] == [(pt.address, None)]
    assert plan.structural()


def test_gpu_bound_to_another_driver_is_rejected(sim):
    inv = sim.discover()
    inv.gpus[0].driver = "nouveau"
    with pytest.raises(ConfigError) as e:
        make_plan(inv, layout({"index": 0, "vgpus": {"T4-1Q": 1}}))
    (p,) = e.value.problems
    assert p.startswith("gpus[0].mode:") and "nouveau" in p and "unmanaged" in p
    # unmanaged leaves it alone, passthrough may take it
    assert make_plan(inv, layout({"index": 0, "mode": "unmanaged"})).actions == []
    assert of(make_plan(inv, layout({"index": 0, "mode": "passthrough"})), BindDriver)


# --------------------------------------------------------------------------- dormant definitions
def test_dormant_definitions_are_reused_not_duplicated(sim, t4):
    dormant = [str(uuidlib.uuid4()) for _ in range(2)]
    stale = str(uuidlib.uuid4())
    defs = defs_for(t4.address, tid("T4", "T4-2Q"), dormant) + defs_for(t4.address, tid("T4", "T4-8Q"), [stale])
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 3}}), definitions=defs, new_uuid=uuids())
    creates = of(plan, CreateMdev)
    assert len(creates) == 3
    assert set(dormant) <= {c.uuid for c in creates}
    saves = of(plan, SaveDefinition)
    assert [s.uuid for s in saves] == [c.uuid for c in creates if c.uuid not in dormant]
    # a dormant definition of a type no longer wanted is forgotten, not started
    assert [(a.uuid, a.parent) for a in of(plan, RemoveDefinition)] == [(stale, t4.address)]
    assert stale not in {c.uuid for c in creates}


def test_dormant_definition_on_a_vf_keeps_its_parent(make_sim):
    sim = make_sim("a100-node")
    Executor(sim.env, sim.io).apply(EnableVfs(gpu=sim.discover().gpus[0].address, count=16))
    gpu = sim.discover().gpus[0]
    vf = gpu.vfs[5].address
    u = str(uuidlib.uuid4())
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"A100-4C": 2}}),
                     definitions=defs_for(vf, tid("A100-40GB", "A100-4C"), [u]), new_uuid=uuids())
    creates = of(plan, CreateMdev)
    assert len(creates) == 2 and len({c.parent for c in creates}) == 2  # one vGPU per VF
    assert any(c.uuid == u and c.parent == vf for c in creates)
    assert len(of(plan, SaveDefinition)) == 1


def test_definitions_of_other_gpus_are_left_alone(sim, t4):
    other = sim.discover().gpus[1].address
    d = defs_for(other, tid("T4", "T4-2Q"), [str(uuidlib.uuid4())])
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}), definitions=d, new_uuid=uuids())
    assert all(a.gpu == t4.address for a in plan.actions)


# --------------------------------------------------------------------------- vendor VFIO
@pytest.fixture
def l40s(sim):
    pf = next(g for g in sim.discover().gpus if g.device_id == catalog.board("L40S").device_id)
    Executor(sim.env, sim.io).apply(EnableVfs(gpu=pf.address, count=pf.sriov_total_vfs))
    return sim.discover().gpu(pf.address)


def test_vendor_vfio_record_saved_before_type_set_and_cleared_before_forgotten(sim, l40s):
    sel = {"pciAddress": l40s.address}
    q8 = tid("L40S", "L40S-8Q", vendor=True)
    plan = make_plan(sim.discover(), layout({**sel, "vgpus": {"L40S-8Q": 3}}))
    sets = of(plan, SetVgpuType)
    assert len(sets) == 3 and {s.type_id for s in sets} == {q8} and len({s.vf for s in sets}) == 3
    for s in sets:
        assert index_of(plan, SaveVendorRecord, vf=s.vf, type_id=q8) < plan.actions.index(s)
    # now with three set and recorded: shrink to one
    ex = Executor(sim.env, sim.io)
    ex.run(plan)
    records = {s.vf: q8 for s in sets}
    shrink = make_plan(sim.discover(), layout({**sel, "vgpus": {"L40S-8Q": 1}}), vendor_records=records)
    cleared = [a for a in of(shrink, SetVgpuType) if a.type_id == "0"]
    assert len(cleared) == 2
    for c in cleared:
        assert index_of(shrink, SetVgpuType, vf=c.vf, type_id="0") < index_of(shrink, SaveVendorRecord, vf=c.vf, type_id=None)
    assert of(shrink, SaveVendorRecord) and len(of(shrink, SaveVendorRecord)) == 2


def test_vendor_vfio_dormant_record_is_reused(sim, l40s):
    q8 = tid("L40S", "L40S-8Q", vendor=True)
    vf = l40s.vfs[7].address
    plan = make_plan(sim.discover(), layout({"pciAddress": l40s.address, "vgpus": {"L40S-8Q": 2}}),
                     vendor_records={vf: q8})
    sets = of(plan, SetVgpuType)
    assert vf in {s.vf for s in sets}
    assert [r.vf for r in of(plan, SaveVendorRecord)] == [s.vf for s in sets if s.vf != vf]


def test_vendor_vfio_in_use_extra_is_skipped(sim, l40s):
    q8 = tid("L40S", "L40S-8Q", vendor=True)
    ex = Executor(sim.env, sim.io)
    for vf in l40s.vfs[:3]:
        ex.set_vgpu_type(vf.address, q8)
    busy = l40s.vfs[1:3]  # two in use, the layout keeps one
    usage = Usage(pci={vf.address: [f"libvirt domain vm{i}"] for i, vf in enumerate(busy)})
    plan = make_plan(sim.discover(), layout({"pciAddress": l40s.address, "vgpus": {"L40S-8Q": 1}}), usage=usage,
                     vendor_records={vf.address: q8 for vf in l40s.vfs[:3]})
    cleared = [a.vf for a in of(plan, SetVgpuType) if a.type_id == "0"]
    assert cleared == [l40s.vfs[0].address]  # the free one goes
    assert [a.vf for a in of(plan, SaveVendorRecord)] == cleared
    (skip,) = plan.skipped
    assert skip.device in {vf.address for vf in busy} and "in use" in skip.reason and "libvirt domain vm" in skip.reason


# --------------------------------------------------------------------------- structural steps
def test_sriov_gpu_gets_vfs_first_and_nothing_else(sim):
    inv = sim.discover()
    a100 = next(g for g in inv.gpus if g.device_id == catalog.board("A100-40GB").device_id)
    plan = make_plan(inv, layout({"pciAddress": a100.address, "vgpus": {"A100-4C": 4}}))
    assert [(type(a), a.gpu) for a in plan.actions] == [(EnableVfs, a100.address)]
    assert plan.actions[0].count == catalog.board("A100-40GB").sriov_total_vfs
    assert plan.structural()
    # dra mode prepares the GPU too, and creates nothing itself
    dra = make_plan(inv, layout({"pciAddress": a100.address, "mode": "dra"}))
    assert [type(a) for a in dra.actions] == [EnableVfs]


def test_passthrough_binds_every_group_function_and_clears_everything(make_sim):
    sim = make_sim("workstation")
    inv = sim.discover()
    t4 = inv.gpus[1]
    ids = create(sim, t4.address, tid("T4", "T4-4Q"), 2)
    plan = make_plan(sim.discover(), layout({"index": 1, "mode": "passthrough"}),
                     definitions=defs_for(t4.address, tid("T4", "T4-4Q"), ids))
    binds = of(plan, BindDriver)
    assert sorted(b.address for b in binds) == sorted(t4.iommu_group_members) and len(binds) == 2
    assert all(b.driver == "vfio-pci" for b in binds)
    first_bind = min(plan.actions.index(b) for b in binds)
    for u in ids:
        assert index_of(plan, RemoveMdev, uuid=u) < index_of(plan, RemoveDefinition, uuid=u) < first_bind


def test_passthrough_of_an_sriov_gpu_disables_vfs_and_forgets_records(sim, l40s):
    q8 = tid("L40S", "L40S-8Q", vendor=True)
    Executor(sim.env, sim.io).set_vgpu_type(l40s.vfs[0].address, q8)
    plan = make_plan(sim.discover(), layout({"pciAddress": l40s.address, "mode": "passthrough"}),
                     vendor_records={l40s.vfs[0].address: q8, l40s.vfs[1].address: q8})
    kinds = [type(a) for a in plan.actions]
    assert kinds.index(SetVgpuType) < kinds.index(DisableVfs) < kinds.index(BindDriver)
    assert {a.vf for a in of(plan, SaveVendorRecord)} == {l40s.vfs[0].address, l40s.vfs[1].address}
    assert all(a.type_id is None for a in of(plan, SaveVendorRecord))


# --------------------------------------------------------------------------- rejected layouts
@pytest.mark.parametrize("entries,field,words", [
    ([{"index": 0, "vgpus": {"T4-99Q": 1}}], "gpus[0].vgpus.T4-99Q", ["offers no vGPU type", "T4-1Q"]),
    ([{"index": 0, "vgpus": {"A100-4C": 1}}], "gpus[0].vgpus.A100-4C", ["offers no vGPU type"]),
    ([{"index": 0, "vgpus": {"T4-2Q": cap("T4", "T4-2Q") + 1}}], "gpus[0].vgpus.T4-2Q",
     [f"{cap('T4', 'T4-2Q') + 1} is more than the {cap('T4', 'T4-2Q')}"]),
    ([{"index": 0, "vgpus": {"T4-2Q": 4, "T4-2B": 5}}], "gpus[0].vgpus", ["more than"]),
    ([{"index": 0, "vgpus": {"T4-1Q": 2, "T4-2Q": 2}}], "gpus[0].vgpus",
     ["equal-size", "1024 MiB", "2048 MiB", "0000:10:00.0"]),
    ([{"index": 0, "vgpus": {"T4-2Q": 1, "GRID T4-2Q": 1}}], "gpus[0].vgpus.GRID T4-2Q", ["same type"]),
    ([{"index": 0}, {"pciAddress": "0000:10:00.0"}], "gpus[1]", ["already selected", "once"]),
    ([{"all": True, "mode": "unmanaged"}, {"index": 3}], "gpus[1]", ["already selected"]),
    ([{"pciAddress": "0000:99:00.0"}], "gpus[0] (pciAddress 0000:99:00.0).pciAddress", ["no GPU at"]),
    ([{"index": 9}], "gpus[0] (index 9).index", ["the node has 4 GPUs"]),
    ([{"model": "H100"}], "gpus[0] (model 'H100').model", ["no GPU matches"]),
])
def test_bad_layouts_are_rejected_before_any_step(sim, entries, field, words):
    with pytest.raises(ConfigError) as e:
        make_plan(sim.discover(), layout(*entries))
    (p,) = e.value.problems
    assert p.startswith(field), p
    for w in words:
        assert w in p, p


def test_type_refs_by_id_full_and_short_name(sim, t4):
    for ref in (tid("T4", "T4-2Q"), "GRID T4-2Q", "T4-2Q", "t4-2q"):
        plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {ref: 2}}), new_uuid=uuids())
        assert [c.type_id for c in of(plan, CreateMdev)] == [tid("T4", "T4-2Q")] * 2


def test_mig_backed_types_need_a_gpu_with_mig(make_sim):
    """A100 types on a GPU whose NVML reports no MIG (the driver is not loaded, or no NVML)."""
    sim = make_sim("a100-node")
    inv = sim.discover()
    inv.gpus[0].mig = None
    with pytest.raises(ConfigError) as e:
        make_plan(inv, layout({"index": 0, "vgpus": {"A100-1-5C": 1}}))
    assert "no MIG" in e.value.problems[0] and e.value.problems[0].startswith("gpus[0].vgpus")


def test_all_problems_reported_together(sim):
    with pytest.raises(ConfigError) as e:
        make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-99Q": 1}}, {"index": 1, "vgpus": {"T4-2Q": 99}}))
    assert [p.split(":")[0] for p in e.value.problems] == ["gpus[0].vgpus.T4-99Q", "gpus[1].vgpus.T4-2Q"]
    with pytest.raises(ConfigError) as e:
        make_plan(sim.discover(), layout({"index": 7}, {"pciAddress": "0000:99:00.0"}))
    assert len(e.value.problems) == 2


def test_nvidia_only_indices_skip_other_vendors(make_sim):
    sim = make_sim("workstation")
    inv = sim.discover()
    entry = layout({"index": 0, "vgpus": {"T4-4Q": 1}})[0].model_copy(update={"nvidia_only": True})
    plan = make_plan(inv, [entry], new_uuid=uuids())
    assert {a.gpu for a in plan.actions} == {inv.gpus[1].address}


def test_passthrough_waits_while_a_vf_or_group_mate_is_held(sim, l40s):
    """A held VF (or a function of the GPU's IOMMU group; usage credits both to the GPU) would be
    taken away by disabling SR-IOV or rebinding: nothing is tried under it, the GPU is blocked."""
    inv = sim.discover()
    gpu = inv.gpu(l40s.address)
    assert gpu.sriov_num_vfs and not gpu.vgpus
    who = f"pid 7 (qemu-kvm) holds /dev/vfio/devices/vfio3 of its VF {gpu.vfs[0].address}"
    usage = Usage(pci={gpu.address: [who]})
    layouts = layout({"pciAddress": gpu.address, "mode": "passthrough"})
    plan = make_plan(inv, layouts, usage=usage)
    assert [a for a in plan.actions if getattr(a, "gpu", None) == gpu.address] == []
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == gpu.address and who in b.held_by[0] and "passing it through" in b.blocks
    assert of(make_plan(inv, layouts), DisableVfs)  # released: VFs off, then vfio-pci


def test_a_gpu_turned_dra_sheds_what_the_layout_saved_on_it(sim, t4):
    """In dra mode a GPU's vGPUs are its claims': the layout's saved vGPUs go (unused ones with
    their definitions, dormant definitions too), one a VM uses stays blocked, a claim's is never
    touched. A dormant definition left behind would take a claim's device back at the next restore
    (found by the fault campaign)."""
    t2q = tid("T4", "T4-2Q")
    free, used, claimed = create(sim, t4.address, t2q, 3)
    dormant = str(uuidlib.uuid4())
    defs = defs_for(t4.address, t2q, [free, used, dormant])
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "dra"})
    usage = Usage(mdevs={used: ["libvirt domain vm1"], claimed: ["ResourceClaim vms/c"]},
                  claimed={claimed: ["ResourceClaim vms/c"]})
    plan = make_plan(inv, layouts, usage=usage, definitions=defs)
    assert [a.uuid for a in of(plan, RemoveMdev)] == [free]
    assert sorted(a.uuid for a in of(plan, RemoveDefinition)) == sorted([free, dormant])
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == used and "libvirt domain vm1" in b.held_by[0]


def test_a_vf_a_claim_holds_is_not_the_layouts(sim, l40s):
    """A dormant layout record naming a VF a claim holds (its vGPU gone with a reboot, to be made
    again) is forgotten, and the layout fills other VFs: after a reboot the layout took the claim's
    VF back and the claim could not be re-created (found by the fault campaign)."""
    inv = sim.discover()
    gpu = inv.gpu(l40s.address)
    vf = gpu.vfs[0].address
    t = next(t for t in gpu.types if t.short_name == "L40S-8Q")
    records = {vf: t.id}
    usage = Usage(pci={vf: ["ResourceClaim vms/c"]}, claimed={vf: ["ResourceClaim vms/c"]})
    plan = make_plan(inv, layout({"pciAddress": gpu.address, "vgpus": {"L40S-8Q": 2}}), usage=usage,
                     vendor_records=records)
    assert SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None) in plan.actions
    made = [a.vf for a in of(plan, SetVgpuType)]
    assert len(made) == 2 and vf not in made
    # in dra mode the same record goes too
    plan = make_plan(inv, layout({"pciAddress": gpu.address, "mode": "dra"}), usage=usage, vendor_records=records)
    assert of(plan, SaveVendorRecord) == [SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None)]


# --------------------------------------------------------------------------- saved vGPUs a domain names
def test_a_dormant_definition_a_domain_names_is_recreated_as_saved_not_forgotten(sim, t4):
    """A saved definition whose mdev is gone (a reboot whose restore failed) that a libvirt domain
    names, running or merely defined, is the domain's: the next plan re-creates it as saved (its
    UUID, parent and type) and counts it, even when the layout now wants another type. Forgetting it
    left the domain naming an mdev that would never come back."""
    t2q, named, unnamed = tid("T4", "T4-2Q"), str(uuidlib.uuid4()), str(uuidlib.uuid4())
    defs = defs_for(t4.address, t2q, [named, unnamed])
    usage = Usage(mdevs={named: ["libvirt domain vm1 (not running)"]})
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-4Q": 2}}), usage=usage, definitions=defs,
                     new_uuid=uuids())
    assert CreateMdev(gpu=t4.address, parent=t4.address, uuid=named, type_id=t2q) in plan.actions
    assert [a.uuid for a in of(plan, RemoveDefinition)] == [unnamed]  # nobody names this one: forgotten
    assert not of(plan, SaveDefinition)
    # not the layout's type: the node is not told it matches, it is blocked on the domain's vGPU
    (b,) = blocked_by_use(sim.discover(), layout({"index": 0, "vgpus": {"T4-4Q": 2}}), plan, usage)
    assert b.device == named and "libvirt domain vm1" in b.held_by[0] and "no room for this T4-2Q" in b.blocks
    # the layout wants its type: it counts towards the layout, nothing is made twice
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {"T4-2Q": 1}}), usage=usage, definitions=defs,
                     new_uuid=uuids())
    assert [c.uuid for c in of(plan, CreateMdev)] == [named] and not plan.skipped


def test_a_dormant_definition_a_domain_names_that_cannot_be_recreated_is_kept_and_blocks(sim, t4):
    """Where the saved vGPU cannot come back now (here: an in-use vGPU of another size on an
    equal-size GPU), its definition stays and the node is blocked on it, naming the domain."""
    t2q = tid("T4", "T4-2Q")
    (used,) = create(sim, t4.address, tid("T4", "T4-4Q"))
    named = str(uuidlib.uuid4())
    inv = sim.discover()
    layouts = layout({"index": 0, "vgpus": {"T4-4Q": 1}})
    usage = Usage(mdevs={named: ["libvirt domain vm1 (not running)"], used: ["libvirt domain vm2"]})
    plan = make_plan(inv, layouts, usage=usage, definitions=defs_for(t4.address, t2q, [named]), new_uuid=uuids())
    assert named not in touched(plan)
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == named and b.gpu == t4.address and "libvirt domain vm1" in b.held_by[0]
    assert "another framebuffer size" in b.blocks


def test_a_dormant_vendor_record_a_domain_names_keeps_its_vf_and_type(sim, l40s):
    """A saved VF record whose type is gone that a domain names: the VF gets its saved type again,
    never another type of the layout's, and the record is not forgotten; where that type cannot come
    back now the record stays, the VF stays empty and the node is blocked on it."""
    q8, vf = tid("L40S", "L40S-8Q", vendor=True), l40s.vfs[0].address
    usage = Usage(pci={vf: ["libvirt domain vm1 (not running)"]})
    sel = {"pciAddress": l40s.address}
    plan = make_plan(sim.discover(), layout({**sel, "vgpus": {"L40S-8Q": 2}}), usage=usage, vendor_records={vf: q8})
    assert SetVgpuType(gpu=l40s.address, vf=vf, type_id=q8) in plan.actions and len(of(plan, SetVgpuType)) == 2
    assert [r.vf for r in of(plan, SaveVendorRecord)] != [] and vf not in {r.vf for r in of(plan, SaveVendorRecord)}
    # the layout wants another size: the domain's VF keeps its type, nothing else goes on it
    plan = make_plan(sim.discover(), layout({**sel, "vgpus": {"L40S-4Q": 2}}), usage=usage, vendor_records={vf: q8})
    assert [a for a in plan.actions if getattr(a, "vf", None) == vf] == [SetVgpuType(gpu=l40s.address, vf=vf, type_id=q8)]
    # another size in use on the GPU: the domain's VF cannot take 8Q now; kept saved, blocked
    q4 = tid("L40S", "L40S-4Q", vendor=True)
    Executor(sim.env, sim.io).set_vgpu_type(l40s.vfs[1].address, q4)
    inv = sim.discover()
    usage.pci[l40s.vfs[1].address] = ["libvirt domain vm2"]
    layouts = layout({**sel, "vgpus": {"L40S-4Q": 1}})
    plan = make_plan(inv, layouts, usage=usage, vendor_records={vf: q8, l40s.vfs[1].address: q4})
    assert vf not in touched(plan)
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == vf and "libvirt domain vm1" in b.held_by[0]


def test_a_gpu_turned_dra_keeps_the_saved_vgpu_a_domain_names(sim, t4):
    """Turned ``dra``, a GPU sheds the layout's saved vGPUs, but not a dormant one a domain names:
    its definition stays and the node is blocked on it, naming the domain."""
    named = str(uuidlib.uuid4())
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "dra"})
    usage = Usage(mdevs={named: ["libvirt domain vm1 (not running)"]})
    plan = make_plan(inv, layouts, usage=usage, definitions=defs_for(t4.address, tid("T4", "T4-2Q"), [named]))
    assert named not in touched(plan)
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == named and "libvirt domain vm1" in b.held_by[0]


def test_passthrough_keeps_the_saved_vgpus_a_domain_names_and_waits(sim, t4, l40s):
    """A GPU the layout passes through, with a saved vGPU without a device (a reboot whose restore
    failed) that a libvirt domain names: nothing of the GPU is removed or rebound (its definition or
    record stays, no VF disable, no vfio-pci), and the node is blocked on it naming the domain. Before,
    the planner forgot it and bound the GPU to vfio-pci under the domain (issue 36, point 1)."""
    named, unnamed = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    defs = defs_for(t4.address, tid("T4", "T4-2Q"), [named, unnamed])
    q8, vf = tid("L40S", "L40S-8Q", vendor=True), l40s.vfs[0].address
    records = {vf: q8, l40s.vfs[1].address: q8}
    usage = Usage(mdevs={named: ["libvirt domain vm1 (not running)"]}, pci={vf: ["libvirt domain vm2 (not running)"]})
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "passthrough"}, {"pciAddress": l40s.address, "mode": "passthrough"})
    plan = make_plan(inv, layouts, usage=usage, definitions=defs, vendor_records=records)
    assert [a for a in plan.actions if getattr(a, "gpu", None) in (t4.address, l40s.address)] == []
    blocked = {b.device: b for b in blocked_by_use(inv, layouts, plan, usage)}
    assert sorted(blocked) == sorted([named, vf])
    assert blocked[named].gpu == t4.address and "libvirt domain vm1" in blocked[named].held_by[0]
    assert blocked[vf].gpu == l40s.address and "libvirt domain vm2" in blocked[vf].held_by[0]
    assert all("through" in b.blocks for b in blocked.values())
    reasons = {s.device: s.reason for s in plan.skipped}
    assert "passed through once" in reasons[t4.address] and "passed through once" in reasons[l40s.address]
    # no domain names them: forgotten, and the GPUs passed through
    plan = make_plan(inv, layouts, definitions=defs, vendor_records=records)
    assert sorted(a.uuid for a in of(plan, RemoveDefinition)) == sorted([named, unnamed])
    assert {a.vf for a in of(plan, SaveVendorRecord)} == set(records) and of(plan, DisableVfs) and of(plan, BindDriver)
