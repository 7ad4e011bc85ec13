"""NVIDIA's mixed-size mode in layouts: switched through NVML, each vGPU placed exactly, restored.

A layout entry with ``mixedSize: true`` switches an empty GPU to mixed-size mode (NVML), places
its vGPUs by an exact search over the board's placements (created, then moved, one at a time,
each read back), records the mode and the placements, and ``restore`` brings both back after a
reboot. Nothing in use is moved or removed; a board without a known table, a mix no placement
holds and a mix of sizes without the declaration are refused before any write. The simulated
host's own rules (NVML, first fit, placement_id) are pinned in test_sim_placements.py.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from mdev_manager import persist
from mdev_manager.catalog_placements import placements as table
from mdev_manager.config import ConfigError, load_config
from mdev_manager.discovery import infer_mixed_size
from mdev_manager.models import TypePlacements, Vgpu, VgpuPlacements, VgpuType
from mdev_manager.placeplan import place
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim import HostSpec, SimIO
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import REPO, layout

EXAMPLE = REPO / "examples" / "mixed-size-layout.yaml"
# mixed-node's GPUs; a host built from spec(...) has its first GPU at L40S's address too
L40S, L4, H100, A100, A40 = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0", "0000:1c:00.0"


def spec(*boards: str, mixed: bool = False, vfs: bool = False) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=b, mixed_size=mixed, vfs_enabled=vfs) for b in boards])


def slots_of(sim, addr: str) -> dict[str, tuple[str, int]]:
    """vGPU id -> (short type, placement id) on one GPU."""
    return {v.id: (v.type_name.split()[-1], v.placement_id) for v in sim.discover().gpu(addr).vgpus}


def assert_exact(sim, addr: str) -> None:
    """Every vGPU sits at a placement of its type, no two overlap, and the record says where."""
    g = sim.discover().gpu(addr)
    taken: set[int] = set()
    for v in g.vgpus:
        tp = g.placements.types[v.type_id]
        assert v.placement_id in tp.ids, v
        r = set(range(v.placement_id, v.placement_id + tp.size))
        assert not taken & r, f"{v.id} overlaps"
        taken |= r
    rec = persist.load_placements(sim.env, sim.io)[addr]
    assert rec["mixed"] and rec["vgpus"] == {v.id: v.placement_id for v in g.vgpus}


def apply(sim, *entries, usage_sim=None):
    s = usage_sim or sim
    return reconcile(s.env, s.io, layout(*entries))


# --------------------------------------------------------------------------- the mode
@pytest.mark.parametrize("board, one, mixed", [("L40S", "L40S-2Q", False), ("L40S", "L40S-2Q", True),
                                               ("T4", "T4-1Q", False), ("A16", "A16-1Q", False)])
def test_nvml_tells_the_mode_and_sysfs_tells_it_where_nvml_is_silent(make_sim, board, one, mixed):
    sim = make_sim(spec(board, mixed=mixed, vfs=True))
    known = table(board) is not None
    assert sim.discover().gpus[0].mixed_size is (mixed if known else None)  # NVML answers at once
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {one: 1}})).ok
    assert sim.discover().gpus[0].mixed_size is mixed  # without NVML: in equal-size mode the other sizes read 0


def test_intel_and_full_gpus_say_nothing():
    t = lambda tid, fb, mx, avail: VgpuType(id=tid, name=tid, short_name=tid, framework="mdev",  # noqa: E731
                                             available_instances=avail, max_instances=mx, framebuffer_mib=fb)
    full = [t("a", 1024, 16, 0), t("b", 4096, 4, 0)]
    held = [Vgpu(id="u", framework="mdev", type_id="a", type_name="a", parent="p", gpu="g")]
    assert infer_mixed_size("0x10de", full, held * 16) is None  # full: equal or mixed read the same
    assert infer_mixed_size("0x8086", [t("a", 1024, 16, 3), t("b", 4096, 4, 0)], held) is None
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("c", 16384, 1, 0)], held) is None
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("b", 4096, 4, 0)], held) is False
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("b", 4096, 4, 3)], held) is True


def test_mixing_sizes_needs_the_declaration_even_on_a_gpu_switched_by_hand(make_sim):
    sim = make_sim(spec("L40S", mixed=True))  # switched by the admin: a reboot would clear it
    mix = {"L40S-8Q": 2, "L40S-4Q": 2}
    with pytest.raises(ConfigError) as exc:
        apply(sim, {"index": 0, "vgpus": mix})
    assert "gpus[0].vgpus" in str(exc.value) and "mixedSize: true" in str(exc.value)
    assert sim.discover().all_vgpus() == [] and sim.discover().gpus[0].sriov_num_vfs == 0  # refused before any write
    out = apply(sim, {"index": 0, "mixedSize": True, "vgpus": mix})
    assert out.ok and Counter(t for t, _ in slots_of(sim, L40S).values()) == {"L40S-8Q": 2, "L40S-4Q": 2}
    assert_exact(sim, L40S)
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": mix}).changed == 0


def test_a_declared_gpu_is_switched_then_placed_as_planned(make_sim):
    sim = make_sim("mixed-node")
    entries = load_config(EXAMPLE)
    dry = reconcile(sim.env, sim.io, entries, dry_run=True)
    assert "GPU 0 (0000:10:00.0): once in mixed-size mode, places L40S-24Q at slot 0, L40S-8Q at slot 24, " \
           "L40S-4Q at slot 32, L40S-4Q at slot 36, L40S-8Q at slot 40 (48 slots of 1 GiB)" in dry.rounds[0].plan.notes
    out = reconcile(sim.env, sim.io, entries)
    assert out.ok and out.matches
    assert sorted(slots_of(sim, L40S).values()) == [("L40S-24Q", 0), ("L40S-4Q", 32), ("L40S-4Q", 36),
                                                    ("L40S-8Q", 24), ("L40S-8Q", 40)]
    assert sorted(slots_of(sim, L4).values()) == [("L4-12C", 0), ("L4-6C", 12), ("L4-6C", 18)]
    for addr in (L40S, L4, H100, A100):
        assert sim.discover().gpu(addr).mixed_size is True
        assert_exact(sim, addr)
    assert sim.discover().gpu(A40).placements is None  # no known table: equal-size mode, untouched
    assert all(d.start == "manual" for d in sim.definitions())  # mdevctl must not start them before the mode
    assert reconcile(sim.env, sim.io, entries).changed == 0


def test_switching_clears_unused_vgpus_and_waits_for_used_ones(make_sim):
    sim = make_sim(spec("L40S"))
    assert apply(sim, {"index": 0, "vgpus": {"L40S-8Q": 2}}).ok
    vfs = sorted(slots_of(sim, L40S))
    group = sim.discover().gpu(L40S).vfs[0].iommu_group
    pid = sim.host.spawn_holder([sim.env.vfio_group(group)])
    out = apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-24Q": 1, "L40S-8Q": 1}})
    assert out.ok and not out.matches and [b.device for b in out.blocked] == [vfs[0]]
    assert sorted(slots_of(sim, L40S)) == vfs and sim.discover().gpu(L40S).mixed_size is False  # nothing changed
    assert any("mixed-size mode set once its 1 vGPU(s) in use are released" in s.reason
               for s in out.rounds[-1].plan.skipped)
    sim.host.kill(pid)
    out = apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-24Q": 1, "L40S-8Q": 1}})
    assert out.matches and sim.discover().gpu(L40S).mixed_size is True
    assert sorted(slots_of(sim, L40S).values()) == [("L40S-24Q", 0), ("L40S-8Q", 24)]


@pytest.mark.parametrize("preset, index, board", [("mixed-node", 4, "A40"), ("default", 0, "T4")])
def test_a_board_without_a_known_table_is_refused_by_name(make_sim, preset, index, board):
    sim = make_sim(preset)
    with pytest.raises(ConfigError) as exc:
        apply(sim, {"index": index, "mixedSize": True, "vgpus": {}})
    msg = str(exc.value)
    assert f"gpus[0].mixedSize: GPU {index}" in msg and f"board {board} has no known mixed-size placement table" in msg
    assert sim.discover().all_vgpus() == []


def test_mixing_sizes_on_a_board_without_a_table_suggests_one_size_not_the_declaration(make_sim):
    """newcomer finding 5: on a T4 (no known placement table) the fix offered for a mixed layout
    is one size per GPU, not "add mixedSize: true", which the next run refuses."""
    sim = make_sim("default")
    with pytest.raises(ConfigError) as exc:
        apply(sim, {"index": 0, "vgpus": {"T4-2Q": 4, "T4-4Q": 2}})
    msg = str(exc.value)
    assert "mixedSize" not in msg, msg
    assert "board T4 has no known mixed-size placement table, so no mixed-size mode: give the GPU vGPUs of one size" in msg


@pytest.mark.parametrize("vgpus, words", [
    ({"L40S-16Q": 3}, "3 x L40S-16Q do not fit"),  # 3 in equal-size mode, 2 placements in mixed-size mode
    ({"L40S-4Q": 9}, "9 x L40S-4Q do not fit"),
    ({"L40S-16Q": 2, "L40S-12Q": 1}, "do not fit"),  # 44 of 48 GiB, but no 12 GiB placement is left free
    ({"L40S-1Q": 1}, "no mixed-size placement for NVIDIA L40S-1Q (1 GiB types are never placed"),
])
def test_mixes_no_placement_holds_are_refused(make_sim, vgpus, words):
    sim = make_sim(spec("L40S"))
    with pytest.raises(ConfigError) as exc:
        apply(sim, {"index": 0, "mixedSize": True, "vgpus": vgpus})
    assert words in str(exc.value) and str(exc.value).startswith("gpus[0].vgpus")
    assert sim.discover().gpu(L40S).sriov_num_vfs == 0


def test_kept_vgpus_stay_where_they_are_and_new_ones_fill_around(make_sim):
    sim = make_sim(spec("L40S"))
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": 4}}).ok
    before = slots_of(sim, L40S)
    assert sorted(p for _, p in before.values()) == [0, 16, 24, 40]
    out = apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": 4, "L40S-4Q": 2}})
    after = slots_of(sim, L40S)
    assert out.matches and {k: after[k] for k in before} == before
    assert sorted(p for t, p in after.values() if t == "L40S-4Q") == [8, 12]
    assert_exact(sim, L40S)


def test_an_in_use_vgpu_is_never_moved_and_what_needs_its_slots_waits(make_sim):
    sim = make_sim(spec("L40S"))
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": 4}}).ok
    at16 = next(k for k, (_, p) in slots_of(sim, L40S).items() if p == 16)
    group = next(vf.iommu_group for vf in sim.discover().gpu(L40S).vfs if vf.address == at16)
    pid = sim.host.spawn_holder([sim.env.vfio_group(group)])
    out = apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-24Q": 2}})
    assert slots_of(sim, L40S) == {at16: ("L40S-8Q", 16)}  # the unused ones went; the used one stayed put
    assert [b.device for b in out.blocked] == [at16]
    assert any("no placement left beside the vGPUs kept" in s.reason for s in out.rounds[-1].plan.skipped)
    sim.host.kill(pid)
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-24Q": 2}}).matches
    assert sorted(slots_of(sim, L40S).values()) == [("L40S-24Q", 0), ("L40S-24Q", 24)]


class DroppingPlacements(SimIO):
    """A driver that takes placement_id writes without moving anything."""

    def write(self, path, data):
        if str(path).endswith("nvidia/placement_id"):
            return
        super().write(path, data)


def test_a_placement_that_reads_back_wrong_fails_the_step(make_sim):
    sim = make_sim(spec("L40S"))
    io = DroppingPlacements(sim.host)
    out = reconcile(sim.env, io, layout({"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": 1, "L40S-24Q": 1}}))
    failed = [r for r in out.rounds[-1].report.failed if not r.skipped]
    assert not out.ok and [r.error for r in failed] == ["EIO", "EIO"]
    assert "reads 0 after writing 24" in failed[0].message  # the 8Q took slot 0 first; the search put it at 24
    assert "reads 24 after writing 0" in failed[1].message  # so the 24Q found 0 taken and took 24
    assert sorted(slots_of(sim, L40S).values()) == [("L40S-24Q", 24), ("L40S-8Q", 0)]  # shown as they are


# --------------------------------------------------------------------------- reboot, VFs, restore
def test_restore_sets_the_mode_again_and_re_creates_each_vgpu_at_its_placement(make_sim):
    sim = make_sim("mixed-node")
    assert reconcile(sim.env, sim.io, load_config(EXAMPLE)).ok
    before = {a: slots_of(sim, a) for a in (L40S, L4, H100, A100, A40)}
    sim.host.reboot()
    assert not sim.discover().all_vgpus() and not any(g.mixed_size for g in sim.discover().gpus)
    reports = restore(sim.env, sim.io)
    assert all(not r.failed for r in reports)
    assert {a: slots_of(sim, a) for a in before} == before
    for addr in (L40S, L4, H100, A100):
        assert_exact(sim, addr)
    assert reconcile(sim.env, sim.io, load_config(EXAMPLE)).changed == 0


def test_restore_leaves_a_recorded_gpu_it_cannot_switch(make_sim):
    sim = make_sim(spec("L4", "A100-40GB"))
    entries = [{"index": 0, "mixedSize": True, "vgpus": {"L4-12C": 1, "L4-6C": 2}},
               {"index": 1, "mixedSize": True, "vgpus": {"A100-20C": 1, "A100-10C": 1}}]
    assert apply(sim, *entries).ok
    a100 = slots_of(sim, "0000:13:00.0")
    sim.host.reboot()
    sim.io.write(sim.env.pci(L40S) / "sriov_numvfs", "24\n")  # the admin's own vGPU, in equal-size mode
    sim.io.write(sim.env.pci(L40S.replace("00.0", "00.4")) / "nvidia/current_vgpu_type",
                 str(9100 + 7) + "\n")  # L4-24Q (made-up id in the catalog)
    reports = restore(sim.env, sim.io)
    assert all(not r.failed for r in reports)
    assert [v.type_name for v in sim.discover().gpu(L40S).vgpus] == ["NVIDIA L4-24Q"]  # none of its recorded ones
    assert slots_of(sim, "0000:13:00.0") == a100


def test_vfs_enabled_again_clear_the_mode_and_apply_sets_it_and_the_placements_back(make_sim):
    sim = make_sim(spec("L4"))
    mix = {"index": 0, "mixedSize": True, "vgpus": {"L4-8C": 1, "L4-4C": 2}}
    assert apply(sim, mix).ok
    before = slots_of(sim, L40S)
    sim.io.write(sim.env.pci(L40S) / "sriov_numvfs", "0\n")  # sriov-manage -d: vGPUs and the mode go
    assert sim.discover().gpu(L40S).mixed_size is False
    out = apply(sim, mix)
    assert out.matches and slots_of(sim, L40S) == before  # the same VFs at their recorded placements
    assert_exact(sim, L40S)


def test_dra_gpus_are_switched_and_recorded_for_restore(make_sim):
    sim = make_sim("mixed-node")
    assert reconcile(sim.env, sim.io, load_config(EXAMPLE, "dra")).ok
    assert [g.mixed_size for g in sim.discover().gpus] == [True, True, True, True, None]
    rec = persist.load_placements(sim.env, sim.io)
    assert rec == {a: {"mixed": True, "vgpus": {}} for a in (L40S, L4, H100, A100)}
    sim.host.reboot()
    restore(sim.env, sim.io)  # VFs (the layout's records name none), so only the mode is not back yet
    assert reconcile(sim.env, sim.io, load_config(EXAMPLE, "dra")).ok
    assert [g.mixed_size for g in sim.discover().gpus] == [True, True, True, True, None]


def test_dropping_the_declaration_forgets_the_record_and_leaves_the_mode(make_sim):
    sim = make_sim(spec("A100-40GB"))
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"A100-10C": 2}}).ok
    assert all(d.start == "manual" for d in sim.definitions())
    out = apply(sim, {"index": 0, "vgpus": {"A100-10C": 2}})
    assert out.ok and persist.load_placements(sim.env, sim.io) == {}
    assert sim.discover().gpus[0].mixed_size is True  # never switched back under the layout
    assert all(d.start == "auto" for d in sim.definitions())  # mdevctl may start them again


def test_mixed_size_is_only_for_vgpu_modes():
    with pytest.raises(ConfigError, match="mixedSize"):
        layout({"all": True, "mode": "passthrough", "mixedSize": True})


# --------------------------------------------------------------------------- the search
def _brute(smap: VgpuPlacements, need: list[str]) -> bool:
    choices = [smap.types[t].ids for t in need]
    for combo in itertools.product(*choices):
        used: set[int] = set()
        ok = True
        for t, p in zip(need, combo, strict=True):
            r = set(range(p, p + smap.types[t].size))
            if used & r:
                ok = False
                break
            used |= r
        if ok:
            return True
    return False


def _smap(board: str) -> VgpuPlacements:
    t = table(board)
    return VgpuPlacements(enabled=True, slots=max(p + s for s, ids in t.items() for p in ids),
                          types={str(s): TypePlacements(size=s, ids=list(ids)) for s, ids in t.items()})


def test_the_search_is_exact_against_brute_force():
    smap = _smap("L4")
    sizes = sorted(smap.types)
    for n in range(1, 5):
        for need in itertools.combinations_with_replacement(sizes, n):
            got = place(smap, (), list(need))
            assert (got is not None) == _brute(smap, list(need)), need
            if got is not None:
                used: set[int] = set()
                for t, p in zip(need, got, strict=True):
                    r = set(range(p, p + int(t)))
                    assert p in smap.types[t].ids and not used & r
                    used |= r


def test_the_search_answers_large_hopeless_mixes_quickly():
    smap = _smap("H100-NVL")
    assert place(smap, (), ["4"] * 17) is None  # 16 placements of 4 GiB
    assert place(smap, (), ["4"] * 16) is not None
    assert place(smap, (), ["6"] * 8 + ["4"] * 8 + ["11"] * 1) is None
    assert place(smap, set(range(0, 47)), ["47"]) == [47]


def test_a_dormant_vgpu_a_domain_names_keeps_its_record_and_vf_in_mixed_size_mode(make_sim):
    """A saved VF record without its vGPU (its type cleared: a reboot whose restore failed) that a
    libvirt domain names is not forgotten when the layout changes, nor its VF given another type;
    the node is blocked on it, naming the domain."""
    from mdev_manager.blocked import blocked_by_use
    from mdev_manager.executor import Executor
    from mdev_manager.models import Usage
    from mdev_manager.plan import make_plan

    sim = make_sim(spec("L40S"))
    assert apply(sim, {"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": 4}}).ok
    vf = sorted(slots_of(sim, L40S))[0]
    Executor(sim.env, sim.io).set_vgpu_type(vf, "0")
    usage = Usage(pci={vf: ["libvirt domain vm1 (not running)"]})
    inv, layouts = sim.discover(), layout({"index": 0, "mixedSize": True, "vgpus": {"L40S-4Q": 2}})
    plan = make_plan(inv, layouts, usage=usage, vendor_records=persist.load_vendor_vfio(sim.env, sim.io),
                     placement_records=persist.load_placements(sim.env, sim.io))
    assert vf not in {getattr(a, "vf", None) for a in plan.actions}
    (b,) = blocked_by_use(inv, layouts, plan, usage)
    assert b.device == vf and "libvirt domain vm1" in b.held_by[0]
