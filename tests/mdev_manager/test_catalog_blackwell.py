"""Blackwell boards in the catalog (#38): the driver's type ids, what is inferred, names.

Facts from ../shared/reference/blackwell-vgpu.md; each assertion pins one fact the reference
states, or one it marks inferred (which the catalog must mark too).
"""

from __future__ import annotations

import json

import pytest

from mdev_manager import catalog
from mdev_manager.catalog_mig import MEMORY_SLICES, MIG_INFERRED, mig_profiles
from mdev_manager.config import ConfigError
from mdev_manager.plan import make_plan
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import layout

RTX, B200, B300, GB200 = (catalog.board(k) for k in ("RTX-PRO-6000-BSE", "B200", "B300", "GB200"))


def by_short(board: catalog.BoardSpec) -> dict[str, catalog.TypeSpec]:
    return {t.short_name: t for t in board.types}


@pytest.mark.parametrize("board, short, num", [
    (RTX, "DC-1-2Q", 1546), (RTX, "DC-1-3B", 2158), (RTX, "DC-1-24Q", 1561), (RTX, "DC-2-12C", 1566),
    (RTX, "DC-4-96C", 1587), (RTX, "DC-3Q", 1519), (RTX, "DC-3A", 1520), (RTX, "DC-6Q", 1523),
    (B200, "B200X-1-23C", 2152), (B200, "B200X-1-23CME", 2151), (B200, "B200X-7-180C", 2157),
    (B300, "B300X-1-34C", 2258), (B300, "B300X-7-269C", 2264),
    (GB200, "GB200-1-24CME", 1445), (GB200, "GB200-7-189C", 1460),
])
def test_the_drivers_type_ids_are_kept_and_not_marked_inferred(board, short, num):
    t = by_short(board)[short]
    assert t.num == num and "id" not in t.inferred


def test_every_id_the_reference_does_not_give_is_marked_inferred():
    rtx = by_short(RTX)
    assert "id" in rtx["DC-4Q"].inferred and "id" in rtx["DC-96C"].inferred
    for b in (B200, B300, GB200):  # the full-GPU time-sliced types: no id found
        full = [t for t in b.types if not t.mig_backed]
        assert len(full) == 1 and full[0].max_instances == 1 and "id" in full[0].inferred
    assert "max_instances" in rtx["DC-1-2A"].inferred and "max_instances" not in rtx["DC-1-2Q"].inferred
    for b in (RTX, B200, B300, GB200):
        assert "sriov_total_vfs" in b.inferred and "MIG placements" in MIG_INFERRED[b.key]
        nums = [t.num for t in b.types]
        assert len(nums) == len(set(nums)), f"{b.key}: a type id twice"


def test_driver_names_and_counts():
    rtx = by_short(RTX)
    assert rtx["DC-1-24Q"].name == "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q"  # "RTX Pro", as the driver
    assert {t.max_instances for t in RTX.types if not t.mig_backed} <= {32, 24, 16, 12, 8, 6, 4, 3, 2, 1}
    assert max(t.max_instances for t in RTX.types if not t.mig_backed) == 32  # NON_MIG limit
    assert max(t.max_instances for t in RTX.types if t.mig_backed) == 48  # MIG-backed limit


@pytest.mark.parametrize("short, profile, per_instance", [
    ("DC-1-2Q", "1g.24gb", 12), ("DC-1-24C", "1g.24gb", 1), ("DC-2-12Q", "2g.48gb", 4),
    ("DC-2-48A", "2g.48gb", 1), ("DC-4-24Q", "4g.96gb", 4), ("DC-4-32C", "4g.96gb", 3),
])
def test_mig_time_slicing_types_name_their_instance_and_its_share(short, profile, per_instance):
    t = by_short(RTX)[short]
    assert t.gpu_instance_profile == profile and t.max_per_instance == per_instance
    assert catalog.gi_profile_of(short) == profile == catalog.gi_profile_of(t.name)


def test_gb100_boards_take_a_whole_instance_and_every_profile_exists():
    rtx4500 = catalog.board("RTX-PRO-4500-BSE")
    assert RTX.mig_timeslicing and rtx4500.mig_timeslicing and not any(b.mig_timeslicing for b in (B200, B300, GB200))
    for b in (RTX, rtx4500, B200, B300, GB200):
        names = {p.name for p in mig_profiles(b.key)}
        for t in b.types:
            if t.mig_backed:
                assert t.gpu_instance_profile in names, (b.key, t.name)
                assert (t.max_per_instance is not None) is b.mig_timeslicing
    assert catalog.gi_profile_of("GB200-3-95C") == "3g.93gb"  # mig-parted's name, not the type's
    assert MEMORY_SLICES["RTX-PRO-6000-BSE"] == 4 and MEMORY_SLICES["B200"] == 8
    assert {p.name: p.instances for p in mig_profiles("RTX-PRO-6000-BSE")}["1g.24gb"] == 4


def test_the_alias_subsystem_is_the_same_board():
    assert catalog.match_board("0x10de", "0x2bb5", "0x220b") is RTX
    assert catalog.match_board("0x10de", "0x2901", "0x20da") is B200


def test_a_short_name_is_read_on_the_gpus_own_board_first():
    other = catalog.BoardSpec(key="X", vendor_id="0x10de", device_id="0x9999", framebuffer_mib=32768,
                              framework="vendor-vfio", types=[catalog.TypeSpec(num=1, name="NVIDIA X DC-8C",
                                                                               max_instances=4)])
    assert catalog.known_type("DC-8C", other).max_instances == 4
    assert catalog.known_type("DC-8C", RTX).max_instances == 12
    assert catalog.known_type("DC-8C").max_instances == 12


def host(*boards: str, vfs: bool = True) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=b, vfs_enabled=vfs) for b in boards])


@pytest.mark.parametrize("ref", ["DC-8Q", "NVIDIA RTX Pro 6000 Blackwell DC-8Q", "dc-8q"])
def test_layouts_take_long_and_short_names(make_sim, ref):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    plan = make_plan(sim.discover(), layout({"index": 0, "vgpus": {ref: 3}}))
    assert [a for a in plan.actions if type(a).__name__ == "SetVgpuType"]


@pytest.mark.parametrize("ref, hint", [("DC-7Q", "'DC-6Q' or 'DC-8Q'"),
                                       ("NVIDIA RTX Pro 6000 Blackwell DC-7Q", "'DC-6Q' or 'DC-8Q'"),
                                       ("DC-1-5Q", "'DC-1-4Q' or 'DC-1-6Q'")])
def test_a_typo_suggests_the_nearest_real_type(make_sim, ref, hint):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    with pytest.raises(ConfigError, match=f"did you mean {hint}"):
        make_plan(sim.discover(), layout({"index": 0, "vgpus": {ref: 1}}))


def test_discover_types_shows_what_is_inferred(make_sim):
    from vgpuctl.output.text import inventory_table

    sim = make_sim(host("RTX-PRO-6000-BSE", "L40S"))
    inv = sim.discover()
    text = inventory_table(inv, types=True, wide=True)
    rtx, l40s = text.split("Types on GPU 1")
    assert "INFERRED" in rtx and "INFERRED" not in l40s
    row = next(line for line in rtx.splitlines() if "DC-4Q" in line)
    assert row.split()[-1] == "id"
    assert "infers sriov_total_vfs, MIG placements" in rtx
    doc = json.loads(inv.model_dump_json())
    gpu = doc["gpus"][0]
    assert "sriov_total_vfs" in gpu["inferred"] and doc["gpus"][1]["inferred"] == []
    types = {t["short_name"]: t for t in gpu["types"]}
    assert types["DC-4Q"]["inferred"] == ["id"] and types["DC-3Q"]["inferred"] == []
    assert types["DC-2-12Q"]["gpu_instance_profile"] == "2g.48gb"


@pytest.mark.parametrize("key", ["RTX-PRO-6000-BSE", "RTX-PRO-4500-BSE", "B200", "B300", "GB200"])
def test_nvml_probe_puts_the_driver_beside_the_catalog(make_sim, key):
    from mdev_manager.nvmlprobe import differences, probe

    sim = make_sim(host(key))
    rec = probe(sim.io.nvml()).gpus[0]
    board = catalog.board(key)
    assert differences(rec, board) == []  # the simulated driver is built from the catalog
    # a real driver that answers otherwise: each difference named, inferred ones said so
    rec.vgpu_types[-1].max_instances += 1
    full = {"RTX-PRO-6000-BSE": 1521, "RTX-PRO-4500-BSE": 9966, "B200": 9950, "B300": 9952,
            "GB200": 9951}[key]  # ids the catalog infers
    renumbered = next(t for t in rec.vgpu_types if t.id == full)
    renumbered.id = 1600
    rec.mig.profiles[0]["placements"] = rec.mig.profiles[0]["placements"][:1]
    got = differences(rec, board)
    short = renumbered.name.split()[-1]
    assert any(d.startswith(f"type 1600 {renumbered.name!r}: not in the catalog; the catalog has {short}")
               and d.endswith("(the catalog's is inferred)") for d in got), got
    assert any("driver max" in d for d in got) and any("placements" in d and "inferred" in d for d in got), got


def test_the_nvml_probe_command_says_whether_the_catalog_agrees(make_sim, capsys):
    from vgpuctl.main import main

    sim = make_sim(host("RTX-PRO-6000-BSE", "L40S"))
    assert main(["--simulate", "--sim-dir", str(sim.root), "nvml-probe"]) == 0
    out = capsys.readouterr().out
    assert "catalog board RTX-PRO-6000-BSE: agrees with the driver" in out
    assert main(["--simulate", "--sim-dir", str(sim.root), "nvml-probe", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(g["catalog_board"], g["catalog_differences"]) for g in doc["gpus"]] == [
        ("RTX-PRO-6000-BSE", []), ("L40S", [])]
