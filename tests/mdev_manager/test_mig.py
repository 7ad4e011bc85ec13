"""MIG on the node: the simulated NVML's rules, MIG-backed vGPUs in layouts, reboot and restore.

Profiles and placements are NVIDIA's (mdev_manager/catalog_mig.py, with its sources); the
simulated NVML enforces them as NVML does, so every layout here is checked against those rules
by running it, not by re-deriving them.
"""

from __future__ import annotations

import itertools

import pytest

from mdev_manager import persist
from mdev_manager.actions import SaveMigRecord
from mdev_manager.catalog_mig import mig_profiles
from mdev_manager.config import ConfigError, parse_config
from mdev_manager.host.nvml import (
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    Mig,
    NvmlError,
)
from mdev_manager.migplan import place, same_record
from mdev_manager.models import MigState, Usage
from mdev_manager.plan import make_plan
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore, unrestored
from tests.support.simnodes import layout, libvirt_node_xml, needs_libvirt

A100_MDEV, A100_VFIO, H100, L40S = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"


@pytest.fixture
def mig(make_sim):
    return make_sim("mig-node")


def placements(sim, addr):
    g = sim.discover().gpu(addr)
    return sorted((i.profile_id, i.placement.start, i.placement.size, bool(i.vgpu)) for i in g.mig.instances)


def types_on(sim, addr):
    return sorted(v.type_name.split()[-1] for v in sim.discover().gpu(addr).vgpus)


# --------------------------------------------------------------------------- simulated NVML


def test_nvml_reports_mig_only_for_mig_capable_boards(mig):
    inv = mig.discover()
    assert [g.mig is not None for g in inv.gpus] == [True, True, True, False]
    a100 = inv.gpu(A100_VFIO).mig
    assert not a100.enabled and a100.memory_slices == 8
    assert {p.name: p.id for p in a100.profiles} == {"1g.5gb": 19, "1g.5gb+me": 20, "1g.10gb": 15, "2g.10gb": 14,
                                                    "3g.20gb": 9, "4g.20gb": 5, "7g.40gb": 0}


def test_nvml_refuses_what_nvml_refuses(mig):
    m = Mig(mig.io.nvml())
    with pytest.raises(NvmlError) as e:
        m.create(A100_VFIO, 9, 0, 4)
    assert e.value.code == NVML_ERROR_NOT_SUPPORTED  # not in MIG mode
    with pytest.raises(NvmlError) as e:
        m.set_mode(L40S, True)
    assert e.value.code == NVML_ERROR_NOT_SUPPORTED
    m.set_mode(A100_VFIO, True)
    with pytest.raises(NvmlError) as e:
        m.create(A100_VFIO, 9, 2, 4)  # 3g.20gb starts at 0 or 4 only
    assert e.value.code == NVML_ERROR_INVALID_ARGUMENT
    first = m.create(A100_VFIO, 20, 6, 1)  # 1g.5gb+me
    with pytest.raises(NvmlError) as e:
        m.create(A100_VFIO, 20, 5, 1)  # one media extension on the GPU
    assert e.value.code == NVML_ERROR_INSUFFICIENT_RESOURCES
    m.create(A100_VFIO, 9, 0, 4)
    with pytest.raises(NvmlError) as e:
        m.create(A100_VFIO, 14, 2, 2)  # overlaps the 3g.20gb
    assert e.value.code == NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(NvmlError) as e:
        m.set_mode(A100_VFIO, False)  # instances exist
    assert e.value.code == NVML_ERROR_IN_USE
    m.destroy(A100_VFIO, first)
    assert [(i["profile_id"], i["placement"]["start"]) for i in m.state(A100_VFIO)["instances"]] == [(9, 0)]


def test_mig_backed_types_follow_free_gpu_instances(mig):
    m = Mig(mig.io.nvml())
    mig.host.write(mig.env.pci(A100_VFIO) / "sriov_numvfs", "16")
    vf = mig.discover().gpu(A100_VFIO).vfs[0].address
    creatable = lambda: mig.host.sys.joinpath(  # noqa: E731
        "bus/pci/devices", vf, "nvidia/creatable_vgpu_types").read_text()
    assert "A100-4C" in creatable() and "A100-3-20C" not in creatable()  # time-sliced until MIG
    m.set_mode(A100_VFIO, True)
    assert "A100-4C" not in creatable() and "A100-3-20C" not in creatable()  # no instance yet
    gi = m.create(A100_VFIO, 9, 4, 4)
    assert "A100-3-20C" in creatable() and "A100-2-10C" not in creatable()
    mig.host.write(mig.env.pci(vf) / "nvidia/current_vgpu_type", "476")
    v = mig.discover().gpu(A100_VFIO).vgpus[0]
    assert (v.type_name, v.gpu_instance) == ("NVIDIA A100-3-20C", gi)
    with pytest.raises(NvmlError) as e:
        m.destroy(A100_VFIO, gi)  # a vGPU lives on it
    assert e.value.code == NVML_ERROR_IN_USE
    mig.host.reboot()  # instances are gone, the mode stays
    state = m.state(A100_VFIO)
    assert state["enabled"] and state["instances"] == []


# --------------------------------------------------------------------------- placement search


@pytest.mark.parametrize("board", ["A100-40GB", "H100-80GB", "A30"])
def test_placement_search_agrees_with_nvml_on_every_profile_multiset(board, make_sim, tmp_path):
    """For every multiset of up to 7 profiles: place() finds placements iff some order of NVML
    creations at NVML's possible placements succeeds (exhaustive search on the simulated NVML)."""
    profiles = list(mig_profiles(board))
    state = MigState(enabled=True, pending=True, memory_slices=max(p.start + p.size for q in profiles
                                                                    for p in q.placements), profiles=profiles)

    def nvml_accepts(chosen) -> bool:
        used, count = set(), {}
        def go(k):
            if k == len(chosen):
                return True
            p = chosen[k]
            if count.get(p.id, 0) >= p.instances:
                return False
            for pl in p.placements:
                if used & set(pl.slices):
                    continue
                used.update(pl.slices)
                count[p.id] = count.get(p.id, 0) + 1
                if go(k + 1):
                    return True
                used.difference_update(pl.slices)
                count[p.id] -= 1
            return False
        full = max(profiles, key=lambda p: (p.slices, p.memory_mib))
        engines = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")
        return go(0) and all(sum(getattr(p, e) for p in chosen) <= getattr(full, e) for e in engines)

    checked = 0
    for n in range(1, 8):
        for combo in itertools.combinations_with_replacement(profiles, n):
            got = place(state, [], list(combo))
            assert (got is not None) == nvml_accepts(list(combo)), [p.name for p in combo]
            checked += 1
            if got is not None:  # and the placements found really are creatable, in that order
                assert not any(set(a.slices) & set(b.slices) for a, b in itertools.combinations(got, 2))
    assert checked > 100


def test_placements_found_are_created_by_nvml(make_sim):
    sim = make_sim("h100-node")
    m = Mig(sim.io.nvml())
    addr = sim.discover().gpus[0].address
    m.set_mode(addr, True)
    state = sim.discover().gpus[0].mig
    want = [state.profile(n) for n in ("1g.10gb", "4g.40gb", "1g.20gb")]
    for prof, pl in zip(want, place(state, [], want), strict=False):
        m.create(addr, prof.id, pl.start, pl.size)  # raises if NVML disagrees
    assert len(m.state(addr)["instances"]) == 3


# --------------------------------------------------------------------------- layouts


MIXED = layout({"pciAddress": A100_MDEV, "vgpus": {"A100-3-20C": 1, "A100-2-10C": 1, "A100-1-5C": 2}},
               {"pciAddress": A100_VFIO, "vgpus": {"A100-4-20C": 1, "A100-1-5CME": 1, "A100-1-5C": 2}},
               {"pciAddress": H100, "vgpus": {"H100-3-40C": 2}},
               {"pciAddress": L40S, "vgpus": {"L40S-4Q": 2}})


def test_a_mig_layout_applies_then_changes_nothing(mig):
    out = reconcile(mig.env, mig.io, MIXED)
    assert out.matches, out.rounds[-1].plan.skipped
    assert types_on(mig, A100_MDEV) == ["A100-1-5C", "A100-1-5C", "A100-2-10C", "A100-3-20C"]
    assert types_on(mig, A100_VFIO) == ["A100-1-5C", "A100-1-5C", "A100-1-5CME", "A100-4-20C"]
    assert types_on(mig, H100) == ["H100-3-40C", "H100-3-40C"]
    assert types_on(mig, L40S) == ["L40S-4Q", "L40S-4Q"]
    assert placements(mig, H100) == [(9, 0, 4, True), (9, 4, 4, True)]
    again = reconcile(mig.env, mig.io, MIXED)
    assert again.changed == 0 and again.matches
    saved = persist.load_mig(mig.env, mig.io)
    assert sorted(saved) == [A100_MDEV, A100_VFIO, H100]
    assert all(e["vgpu"] for entries in saved.values() for e in entries)


def test_which_equal_instance_holds_which_mdev_is_not_a_change(mig):
    """An mdev does not name its GPU instance: discovery pairs a profile's mdevs with its instances
    by a guess. A saved record pairing them the other way is the same record: no step to persist it
    again (the fault campaign found the agent saving it at every resync and reading it back as
    failed); a record that differs in placements or vGPUs is still saved."""
    one = layout({"pciAddress": A100_MDEV, "vgpus": {"A100-1-5C": 3}})
    assert reconcile(mig.env, mig.io, one).matches
    saved = persist.load_mig(mig.env, mig.io)[A100_MDEV]
    vgpus = [e["vgpu"] for e in saved]
    swapped = [{**e, "vgpu": v} for e, v in zip(saved, vgpus[1:] + vgpus[:1], strict=True)]
    assert swapped != saved and same_record(swapped, saved)
    persist.save_mig(mig.env, mig.io, {A100_MDEV: swapped})
    plan = make_plan(mig.discover(), one, mig_records=persist.load_mig(mig.env, mig.io))
    assert not [a for a in plan.actions if isinstance(a, SaveMigRecord)]
    moved = [{**saved[0], "start": saved[0]["start"] + 1}] + saved[1:]
    assert not same_record(moved, saved) and not same_record(saved[1:], saved)
    assert not same_record([{**saved[0], "vgpu": "0000:13:00.4"}] + saved[1:], saved)


def _true_instances(sim, addr) -> dict[str, int]:
    """vGPU -> the GPU instance the simulated driver made it in (its own record, not NVML's answer)."""
    gpu = next(g for g in sim.host.state["gpus"] if g["pf"] == addr)
    return {gi["vgpu"]: gi["id"] for gi in gpu["mig"]["gis"] if gi.get("vgpu")}


def test_each_mig_backed_mdev_is_in_the_gpu_instance_nvml_names(mig):
    """An mdev names no GPU instance in sysfs; NVML does (nvmlVgpuInstanceGetGpuInstanceId). Pairing a
    profile's mdevs with its instances in id order went wrong once the first-made vGPU was removed, and
    an apply keeping a held vGPU then destroyed the instance it sat in (refused by the driver, IN_USE:
    the campaign's seed 1 with the reboot steps re-weighted, step 100)."""
    three = layout({"pciAddress": A100_MDEV, "vgpus": {"A100-1-5C": 3}})
    assert reconcile(mig.env, mig.io, three).matches
    truth = _true_instances(mig, A100_MDEV)
    first = min(truth, key=truth.get)
    mig.host.write(f"bus/mdev/devices/{first}/remove", "1")
    g = mig.discover().gpu(A100_MDEV)
    assert {v.id: v.gpu_instance for v in g.vgpus} == _true_instances(mig, A100_MDEV)
    assert {i.id: i.vgpu for i in g.mig.instances if i.vgpu} == {n: v for v, n in _true_instances(mig, A100_MDEV).items()}
    # a held vGPU and a layout of one: the other vGPU and the free instances go, the held one's stays
    held = max(g.vgpus, key=lambda v: truth[v.id])
    pid = mig.host.spawn_holder([mig.env.vfio_group(held.iommu_group)])
    out = reconcile(mig.env, mig.io, layout({"pciAddress": A100_MDEV, "vgpus": {"A100-1-5C": 1}}))
    assert out.ok and out.matches, [r.report.failed for r in out.rounds if r.report]
    assert [v.id for v in mig.discover().gpu(A100_MDEV).vgpus] == [held.id]
    mig.host.kill(pid)


def test_a_reboot_is_restored_at_the_same_placements(mig):
    reconcile(mig.env, mig.io, MIXED)
    before = {a: (placements(mig, a), types_on(mig, a)) for a in (A100_MDEV, A100_VFIO, H100)}
    mig.host.reboot()
    assert all(not mig.discover().gpu(a).vgpus for a in before)
    reports = restore(mig.env, mig.io)
    assert all(r.ok for rep in reports for r in rep.results), [r for rep in reports for r in rep.results if not r.ok]
    assert {a: (placements(mig, a), types_on(mig, a)) for a in before} == before
    assert reconcile(mig.env, mig.io, MIXED).changed == 0


@pytest.mark.libvirt
@needs_libvirt
def test_a_vgpu_a_libvirt_domain_names_keeps_its_gpu_instance_across_a_reboot(mig, tmp_path):
    """A layout that no longer wants a MIG-backed vGPU a defined libvirt domain names keeps the vGPU
    (in use) and its definition, and so its GPU instance's record: after a reboot restore re-creates
    the instance and the vGPU, and the layout does not take its placement. Found by the fault
    campaign (issue 29, seed 11 at step 149): the apply forgot the record, so after a power cut the
    vGPU was not restored and the next resync replaced its definition with a 7-40C the domain never
    named."""
    small = layout({"pciAddress": A100_MDEV, "vgpus": {"A100-2-10C": 1}})
    assert reconcile(mig.env, mig.io, small).matches
    (held,) = mig.discover().gpu(A100_MDEV).vgpus
    node = tmp_path / "libvirt.xml"
    node.write_text(libvirt_node_xml({"vm1": ([held.id], [])}))
    lv = mig.with_env(libvirt_uri=f"test://{node}")
    whole = layout({"pciAddress": A100_MDEV, "vgpus": {"A100-7-40C": 1}})

    out = reconcile(lv.env, lv.io, whole)
    assert not out.matches and any(b.device == held.id for b in out.blocked)
    assert [v.id for v in lv.discover().gpu(A100_MDEV).vgpus] == [held.id]
    assert [e["vgpu"] for e in persist.load_mig(lv.env, lv.io)[A100_MDEV]] == [held.id]  # was forgotten

    lv.host.reboot()  # the domain stays defined; the vGPU and its GPU instance are gone until restored
    assert not lv.discover().gpu(A100_MDEV).vgpus
    restore(lv.env, lv.io)
    assert [(v.id, v.type_name.split()[-1]) for v in lv.discover().gpu(A100_MDEV).vgpus] == [(held.id, "A100-2-10C")]
    out = reconcile(lv.env, lv.io, whole)
    assert not out.matches and any(b.device == held.id for b in out.blocked)
    assert [v.id for v in lv.discover().gpu(A100_MDEV).vgpus] == [held.id]
    assert held.id in {d.uuid for d in persist.load_definitions(lv.env, lv.io)[0]}

    node.write_text(libvirt_node_xml({}))  # undefined: the layout takes the GPU
    assert reconcile(lv.env, lv.io, whole).matches
    assert types_on(lv, A100_MDEV) == ["A100-7-40C"]


def test_switching_modes_only_when_the_gpu_is_free(mig):
    reconcile(mig.env, mig.io, MIXED)
    busy = mig.discover().gpu(H100).vgpus[0]
    pid = mig.host.spawn_holder([mig.env.vfio_group(busy.iommu_group)])
    timesliced = MIXED[:2] + layout({"pciAddress": H100, "vgpus": {"H100-10C": 4}}) + MIXED[3:]
    out = reconcile(mig.env, mig.io, timesliced)
    assert not out.matches and any(b.device == busy.id for b in out.blocked)
    assert mig.discover().gpu(H100).mig.enabled and len(mig.discover().gpu(H100).vgpus) == 2  # nothing removed
    mig.host.kill(pid)
    out = reconcile(mig.env, mig.io, timesliced)
    assert out.matches
    g = mig.discover().gpu(H100)
    assert not g.mig.enabled and types_on(mig, H100) == ["H100-10C"] * 4
    assert H100 not in persist.load_mig(mig.env, mig.io)


def test_a_gpu_instance_in_use_is_never_destroyed(mig):
    reconcile(mig.env, mig.io, MIXED)
    held = next(v for v in mig.discover().gpu(A100_VFIO).vgpus if v.type_name.endswith("A100-4-20C"))
    pid = mig.host.spawn_holder([mig.env.vfio_group(held.iommu_group)])
    smaller = layout({"pciAddress": A100_VFIO, "vgpus": {"A100-1-5C": 7}})
    out = reconcile(mig.env, mig.io, smaller)
    assert not out.matches
    g = mig.discover().gpu(A100_VFIO)
    assert any(i.vgpu == held.id and i.profile_id == 5 for i in g.mig.instances)
    assert types_on(mig, A100_VFIO).count("A100-4-20C") == 1
    mig.host.kill(pid)
    assert reconcile(mig.env, mig.io, smaller).matches
    assert types_on(mig, A100_VFIO) == ["A100-1-5C"] * 7


def test_a_passed_through_gpu_gets_mig_backed_vgpus_back(mig):
    """Passed through (vfio-pci) NVML does not see the A100: a MIG layout for it is not bad input; the
    plan returns it to its driver, then sets MIG mode and creates the vGPUs. Found by the fault campaign
    (the layout was refused as 'has no MIG', for good)."""
    assert reconcile(mig.env, mig.io, layout({"pciAddress": A100_VFIO, "mode": "passthrough"})).matches
    assert mig.discover().gpu(A100_VFIO).driver == "vfio-pci" and mig.discover().gpu(A100_VFIO).mig is None
    back = layout({"pciAddress": A100_VFIO, "vgpus": {"A100-3-20C": 2}})
    plan = make_plan(mig.discover(), back)  # no ConfigError: the MIG check waits for the driver
    assert plan.actions and plan.structural()
    out = reconcile(mig.env, mig.io, back)
    assert out.matches, out.rounds[-1].plan.skipped
    assert types_on(mig, A100_VFIO) == ["A100-3-20C", "A100-3-20C"] and mig.discover().gpu(A100_VFIO).mig.enabled
    # rounds that run out with work left never read as done: the rest is read back as unapplied
    assert reconcile(mig.env, mig.io, layout({"pciAddress": A100_VFIO, "mode": "passthrough"})).matches
    short = reconcile(mig.env, mig.io, back, max_rounds=2)
    assert not short.ok and not short.matches and short.unapplied
    assert reconcile(mig.env, mig.io, back).matches
    # a layout that cannot fit is still refused once NVML sees the GPU, before any MIG step
    assert reconcile(mig.env, mig.io, layout({"pciAddress": A100_VFIO, "mode": "passthrough"})).matches
    with pytest.raises(ConfigError) as e:
        reconcile(mig.env, mig.io, layout({"pciAddress": A100_VFIO, "vgpus": {"A100-4-20C": 1, "A100-3-20C": 1,
                                                                              "A100-1-5C": 1}}))
    assert "do not fit" in e.value.problems[0]
    assert mig.discover().gpu(A100_VFIO).vgpus == []  # nothing made


@pytest.mark.parametrize("addr", [A100_MDEV, A100_VFIO])
def test_passing_a_mig_gpu_through_forgets_its_gpu_instances(mig, addr):
    """A layout passing the GPU through forgets its vGPUs, and with them the record of their GPU
    instances: on vfio-pci NVML does not see the GPU, so restore could never re-create them and said
    "3 saved GPU instance(s), but NVML reports no MIG for it", exit 3, on a node where nothing was
    missing (campaign seed 24, step 54: layout c's MIG vGPUs, then the agent applying layout b's
    passthrough). A record an older apply left behind is forgotten by the next passthrough apply."""
    assert reconcile(mig.env, mig.io, layout({"pciAddress": addr, "vgpus": {"A100-1-5C": 3}})).matches
    saved = persist.load_mig(mig.env, mig.io)[addr]
    assert len(saved) == 3
    passed = layout({"pciAddress": addr, "mode": "passthrough"})
    assert reconcile(mig.env, mig.io, passed).matches
    assert mig.discover().gpu(addr).driver == "vfio-pci"
    assert addr not in persist.load_mig(mig.env, mig.io)
    assert unrestored(mig.env, mig.io) == []
    mig.host.reboot()
    restore(mig.env, mig.io)
    assert mig.discover().gpu(addr).driver == "vfio-pci" and unrestored(mig.env, mig.io) == []

    persist.save_mig(mig.env, mig.io, {addr: saved})  # left by an apply before this fix
    assert any("NVML reports no MIG" in n for n in unrestored(mig.env, mig.io))
    out = reconcile(mig.env, mig.io, passed)
    assert out.matches and out.changed == 1 and persist.load_mig(mig.env, mig.io) == {}
    assert unrestored(mig.env, mig.io) == []


@pytest.mark.parametrize("entry, expect", [
    ({"pciAddress": A100_VFIO, "vgpus": {"A100-3-20C": 1, "A100-10C": 1}}, "never both"),
    ({"pciAddress": A100_VFIO, "vgpus": {"A100-4-20C": 1, "A100-3-20C": 1, "A100-1-5C": 1}}, "do not fit"),
    ({"pciAddress": A100_VFIO, "mode": "dra", "vgpus": {"A100-3-20C": 1}}, "add migMode: true"),
    ({"pciAddress": A100_VFIO, "mode": "dra", "migMode": True, "vgpus": {"A100-10C": 1}}, "MIG-backed types only"),
])
def test_impossible_mig_layouts_are_refused_before_any_step(mig, entry, expect):
    with pytest.raises(ConfigError) as e:
        make_plan(mig.discover(), layout(entry))
    assert expect in e.value.problems[0] and e.value.problems[0].startswith("gpus[0].vgpus"), e.value.problems


def test_vgpu_device_manager_configs_naming_mig_backed_types_apply_as_they_are(make_sim):
    sim = make_sim("h100-node")
    doc = {"version": "v1", "vgpu-configs": {"h100-mixed": [
        {"devices": [0, 1], "vgpu-devices": {"H100-2-20C": 3, "H100-1-10C": 1}},
        {"devices": [2], "device-filter": ["0x233110DE"], "vgpu-devices": {"H100-7-80C": 1}}]}}
    layouts = parse_config(doc, "h100-mixed")
    out = reconcile(sim.env, sim.io, layouts)
    assert out.matches
    inv = sim.discover()
    assert sorted(v.type_name.split()[-1] for v in inv.gpus[0].vgpus) == ["H100-1-10C"] + ["H100-2-20C"] * 3
    assert [v.type_name.split()[-1] for v in inv.gpus[2].vgpus] == ["H100-7-80C"]
    assert not inv.gpus[3].vgpus and not inv.gpus[3].mig.enabled


def test_the_mig_record_survives_corruption_by_being_ignored(mig):
    mig.env.mig_state.parent.mkdir(parents=True, exist_ok=True)
    mig.env.mig_state.write_text("{not json")
    assert persist.load_mig(mig.env, mig.io) == {}
    out = reconcile(mig.env, mig.io, MIXED)
    assert out.matches and len(persist.load_mig(mig.env, mig.io)) == 3


def test_handing_a_mig_gpu_to_dra_frees_its_placements_and_its_record(mig):
    reconcile(mig.env, mig.io, MIXED)
    dra = layout({"all": True, "mode": "dra", "migMode": True})
    out = reconcile(mig.env, mig.io, dra)
    assert out.matches
    inv = mig.discover()
    assert all(g.mig.enabled and not g.mig.instances and not g.vgpus for g in inv.gpus if g.mig)
    assert persist.load_mig(mig.env, mig.io) == {}
    assert reconcile(mig.env, mig.io, dra).changed == 0


def test_the_discover_command_shows_mig_mode_and_gpu_instances(mig):
    from vgpuctl.output.text import inventory_table

    reconcile(mig.env, mig.io, MIXED)
    text = inventory_table(mig.discover())
    assert "GPU 2: MIG mode on" in text and "GPU 3:" not in text.split("MIG mode")[-1].split("\n")[0]
    assert any(line.split()[:4] == ["2", "1", "3g.40gb", "0:4"] for line in text.splitlines())


def test_a_dormant_mig_backed_vgpu_a_domain_names_keeps_its_vf_and_its_placement(mig):
    """After a reboot whose restore did not run, apply with a layout of other MIG-backed types: the VF
    of a saved vGPU a libvirt domain names (defined, not running) takes no new vGPU, the placement of
    its GPU instance takes no new instance, its vendor record and GPU-instance record stay, and the
    node is blocked on it naming the domain; a later restore brings it back as it was. Before, the new
    1-5C went onto the domain's VF and its record was overwritten (issue 36, point 1)."""
    both = layout({"pciAddress": A100_VFIO, "vgpus": {"A100-2-10C": 1, "A100-1-5C": 1}})
    assert reconcile(mig.env, mig.io, both).matches
    (held,) = [v for v in mig.discover().gpu(A100_VFIO).vgpus if v.type_name.endswith("A100-2-10C")]
    (entry,) = [e for e in persist.load_mig(mig.env, mig.io)[A100_VFIO] if e["vgpu"] == held.id]
    usage = Usage(pci={held.id: ["libvirt domain vm1 (not running)"]})
    mig.host.reboot()
    assert not mig.discover().gpu(A100_VFIO).vgpus

    out = reconcile(mig.env, mig.io, layout({"pciAddress": A100_VFIO, "vgpus": {"A100-1-5C": 2}}), usage_extra=usage)
    g = mig.discover().gpu(A100_VFIO)
    assert held.id not in {v.id for v in g.vgpus} and types_on(mig, A100_VFIO) == ["A100-1-5C"] * 2
    taken = {s for i in g.mig.instances for s in i.placement.slices}
    assert not taken & set(range(entry["start"], entry["start"] + entry["size"]))
    assert persist.load_vendor_vfio(mig.env, mig.io)[held.id] == held.type_id
    assert entry in persist.load_mig(mig.env, mig.io)[A100_VFIO]
    (b,) = out.blocked
    assert b.device == held.id and b.gpu == A100_VFIO and "libvirt domain vm1" in b.held_by[0] and not out.matches

    mig.host.reboot()
    restore(mig.env, mig.io)
    back = {v.id: v for v in mig.discover().gpu(A100_VFIO).vgpus}
    assert back[held.id].type_id == held.type_id and len(back) == 3
