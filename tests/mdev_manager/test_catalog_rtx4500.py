"""The RTX PRO 4500 Blackwell Server Edition in the catalog (#38 points 3 and 4).

Facts in docs/blackwell.md's "RTX PRO 4500" section: the driver's MIG-backed type ids for device
0x2C3A10DE (``vgpuSmcTypeIdMappings``), counts from vgpu-device-manager v0.5.0 and NVIDIA AI
Enterprise's tables; its time-sliced ids, like the B200/B300/GB200 full-GPU ids, are published
nowhere: placeholders, marked inferred.
"""

from __future__ import annotations

import json
import re

import pytest

from mdev_manager import catalog
from mdev_manager.catalog_blackwell import PLACEHOLDER_IDS
from mdev_manager.catalog_mig import MIG_INFERRED, mig_profiles
from mdev_manager.catalog_placements import instance_placements, placements, slots
from mdev_manager.plan import make_plan
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import layout
from vgpuctl.output.text import inventory_table

RTX4500, RTX6000 = catalog.board("RTX-PRO-4500-BSE"), catalog.board("RTX-PRO-6000-BSE")


def by_short(board: catalog.BoardSpec) -> dict[str, catalog.TypeSpec]:
    return {t.short_name: t for t in board.types}


def host(*boards: str) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=b, vfs_enabled=True) for b in boards])


def test_the_board_is_recognised_by_its_pci_ids():
    assert catalog.match_board("0x10de", "0x2c3a", "0x21f4") is RTX4500
    assert catalog.match_board("0x10de", "0x2c3a", "0x9999") is RTX4500  # another subsystem: still the board
    assert RTX4500.framebuffer_mib == 32 * 1024 and RTX4500.mig_timeslicing  # GB203: MIG time-slicing


@pytest.mark.parametrize("short, num, profile", [
    ("DC-1-2Q", 2229, "1g.16gb"), ("DC-1-3B", 2233, "1g.16gb"), ("DC-1-16C", 2243, "1g.16gb"),
    ("DC-2-8Q", 2245, "2g.32gb"), ("DC-2-16Q", 2249, "2g.32gb"), ("DC-2-32C", 2255, "2g.32gb"),
])
def test_the_drivers_mig_backed_ids_are_kept_and_not_marked_inferred(short, num, profile):
    t = by_short(RTX4500)[short]
    assert t.num == num and "id" not in t.inferred and t.gpu_instance_profile == profile
    assert t.name == f"NVIDIA RTX PRO 4500 Blackwell {short}"  # the driver's casing here: "RTX PRO"


def test_what_no_source_states_is_marked_inferred():
    ts = by_short(RTX4500)
    for t in RTX4500.types:
        assert ("id" in t.inferred) is (not t.mig_backed) is (isinstance(t.num, int) and t.num >= 9960), t.name
    assert "max_instances" not in ts["DC-16C"].inferred and "max_instances" not in ts["DC-2-8C"].inferred
    assert ts["DC-1-16Q"].max_instances == 2 and "max_instances" not in ts["DC-1-16Q"].inferred
    assert "max_instances" in ts["DC-1-2Q"].inferred and "name" in ts["DC-2B"].inferred
    assert {"sriov_total_vfs", "time-sliced type ids"} <= set(RTX4500.inferred)
    assert "MIG placements" in MIG_INFERRED[RTX4500.key]
    assert len({t.num for t in RTX4500.types}) == len(RTX4500.types)


def test_the_full_gpu_placeholders_are_named_and_marked():
    for key, (short, num) in zip(("B200", "GB200", "B300"), PLACEHOLDER_IDS.items(), strict=True):
        t = by_short(catalog.board(key))[short]
        assert t.num == num and t.inferred == ("id",) and not t.mig_backed


@pytest.mark.parametrize("short", ["DC-2-16Q", "DC-1-8C", "DC-16Q", "DC-32C"])
def test_a_shared_short_name_is_the_gpus_own_boards_type(short):
    """Point 4: DC-* names are shared by both boards; the GPU's PCI ids decide whose type it is."""
    mine, theirs = catalog.known_type(short, RTX4500), catalog.known_type(short, RTX6000)
    assert mine is by_short(RTX4500)[short] and theirs is by_short(RTX6000)[short]
    assert mine.num != theirs.num and mine.max_instances < theirs.max_instances
    if mine.mig_backed:
        assert catalog.gi_profile_of(short, RTX4500) != catalog.gi_profile_of(short, RTX6000)


def test_discovery_and_a_layout_read_a_shared_name_on_each_gpus_board(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE", "RTX-PRO-4500-BSE"))
    inv = sim.discover()
    got = {g.index: next(t for t in g.types if t.short_name == "DC-2-16Q") for g in inv.gpus}
    assert (got[0].id, got[0].gpu_instance_profile, got[0].max_per_instance) == ("1567", "2g.48gb", 3)
    assert (got[1].id, got[1].gpu_instance_profile, got[1].max_per_instance) == ("2249", "2g.32gb", 2)
    plan = make_plan(inv, layout({"index": 0, "vgpus": {"DC-16Q": 2}}, {"index": 1, "vgpus": {"DC-16Q": 2}}))
    ids = {a.type_id for a in plan.actions if type(a).__name__ == "SetVgpuType"}
    assert ids == {str(by_short(RTX6000)["DC-16Q"].num), str(by_short(RTX4500)["DC-16Q"].num)}


def test_discover_types_marks_what_is_inferred_and_the_placeholders(make_sim):
    sim = make_sim(host("RTX-PRO-4500-BSE", "B200", "L40S"))
    inv = sim.discover()
    text = inventory_table(inv, types=True, wide=True)
    rtx, b200, l40s = text.split("Types on GPU")[1:]
    row = {next(w for w in line.split() if w.startswith("DC-")): line.split()[-1]
           for line in rtx.splitlines() if "Blackwell DC-" in line}
    assert row["DC-16C"] == "id" and row["DC-2-32C"] == "-" and row["DC-1-2Q"] == "max_instances"
    rtx, b200 = " ".join(rtx.split()), " ".join(b200.split())  # the notes wrap at 80 columns
    assert "infers sriov_total_vfs, time-sliced type ids, MIG placements" in rtx
    assert "NVIDIA publishes no id for the 8 type(s) marked 'id' (9960, 9961, 9962, ...)" in rtx
    assert "come from its driver only" in rtx
    assert "no id for the 1 type(s) marked 'id' (9950)" in b200
    assert "INFERRED" not in l40s and "publishes no id" not in l40s
    gpu = json.loads(inv.model_dump_json())["gpus"][0]
    types = {t["short_name"]: t for t in gpu["types"]}
    assert types["DC-16C"]["inferred"] == ["id"] and types["DC-2-16C"]["inferred"] == []
    assert "time-sliced type ids" in gpu["inferred"]


def test_a_placeholder_gives_way_to_the_drivers_own_id(make_sim):
    """A real driver lists DC-16C under its own id: discovery keeps that one type, not the
    catalog's placeholder beside it."""
    sim = make_sim(host("RTX-PRO-4500-BSE"))
    placeholder = str(by_short(RTX4500)["DC-16C"].num)
    files = list(sim.root.rglob("creatable_vgpu_types"))
    assert files
    for f in files:
        f.write_text(re.sub(rf"^{placeholder}\s+:", "2300  :", f.read_text(), flags=re.M))
    types = sim.discover().gpus[0].types
    dc16c = [t for t in types if t.short_name == "DC-16C"]
    assert [(t.id, t.inferred) for t in dc16c] == [("2300", [])]
    assert any(t.id == str(by_short(RTX4500)["DC-16Q"].num) for t in types)  # the others stay


def test_a_driver_name_the_catalog_lacks_still_gets_its_own_boards_maximum(make_sim):
    """Vendor VFIO prints no maximum: the catalog's is taken, by PCI ids, never the RTX PRO 6000's
    for a shared short name (DC-16Q: 2 on the 4500, 6 on the 6000) when the long name is new."""
    sim = make_sim(host("RTX-PRO-4500-BSE"))
    for f in sim.root.rglob("creatable_vgpu_types"):
        f.write_text(f.read_text().replace("NVIDIA RTX PRO 4500 Blackwell ", "NVIDIA RTX PRO 4500 BSE "))
    types = {t.short_name: t for t in sim.discover().gpus[0].types}
    assert types["DC-16Q"].name == "NVIDIA RTX PRO 4500 BSE DC-16Q"
    assert (types["DC-16Q"].max_instances, types["DC-8C"].max_instances) == (2, 4)


def test_mig_profiles_and_placements_inside_an_instance():
    profiles = {p.name: p for p in mig_profiles(RTX4500.key)}
    assert {n: p.instances for n, p in profiles.items()} == {"1g.16gb": 2, "2g.32gb": 1}
    ts = by_short(RTX4500)
    assert instance_placements(RTX4500.key, ts["DC-1-3B"]) == (3, (0, 3, 6, 9, 12))
    assert instance_placements(RTX4500.key, ts["DC-2-8Q"]) == (8, (0, 8, 16, 24))
    assert instance_placements(RTX4500.key, ts["DC-1-2Q"]) == (2, tuple(range(0, 16, 2)))  # no 96 GiB rule
    assert slots(RTX4500.key) == 32
    assert placements(RTX4500.key) == {2: tuple(range(0, 32, 2)), 3: (0, 3, 6, 9, 12, 16, 19, 22, 25, 28),
                                       8: (0, 8, 16, 24), 16: (0, 16), 32: (0,)}


def test_discover_shortens_the_model_in_its_table_and_keeps_it_whole_in_json(make_sim):
    """Point 4's leftover: "RTX PRO 4500 Blackwell Server Edition" wrapped the MODEL column over 4 lines."""
    sim = make_sim(host("RTX-PRO-4500-BSE", "RTX-PRO-6000-BSE"))
    inv = sim.discover()
    table = inventory_table(inv).split("\n\n")[0].splitlines()
    assert len(table) == 4 and "RTX PRO 4500  " in table[2] and "RTX PRO 6000  " in table[3], table
    assert json.loads(inv.model_dump_json())["gpus"][0]["product_name"] == (
        "GB203 [RTX PRO 4500 Blackwell Server Edition]")
