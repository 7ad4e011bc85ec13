"""Blackwell's mixed-size placements (#38.2): floor(slots * j / max), the same in both modes.

The rule is the driver's (``_kvgpumgrSetHeterogeneousResources_GB100``; the worked ids of
../shared/reference/blackwell-vgpu.md §0 are copied here by hand, so a wrong rule cannot hide on
both sides). On the simulated RTX PRO 6000 the node manager places mixed sizes exactly, sets the
mode only once the VFs exist, and the maxima are those of equal-size mode.
"""

from __future__ import annotations

import json

import pytest

from mdev_manager import catalog
from mdev_manager.catalog_placements import blackwell, max_in_mixed_mode, placement_size, placements, slots
from mdev_manager.config import ConfigError
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.mdev_manager.test_mixed_size import assert_exact
from tests.support.simnodes import layout
from vgpuctl.main import main

RTX = "RTX-PRO-6000-BSE"
GPU = "0000:10:00.0"  # a one-GPU host's GPU


def _mult(size: int, n: int) -> tuple[int, ...]:
    return tuple(size * j for j in range(n))


WORKED = {24: (0, 24, 48, 72), 32: (0, 32, 64), 48: (0, 48), 12: _mult(12, 8), 3: _mult(3, 32)}


def test_the_worked_ids_of_the_reference():
    table = placements(RTX)
    assert slots(RTX) == 96
    for size, ids in WORKED.items():
        assert table[size] == ids, size


def test_no_power_of_two_loss_every_size_keeps_its_equal_size_maximum():
    for t in catalog.board(RTX).types:
        if not t.mig_backed:
            assert max_in_mixed_mode(RTX, t.fb_mib) == t.max_instances, t.name


def test_the_rule_floors_and_the_2_gib_profile_holds_3_slots_of_96():
    assert blackwell(96, {16: 6, 96: 1}) == {16: (0, 16, 32, 48, 64, 80), 96: (0,)}
    assert blackwell(10, {3: 3}) == {3: (0, 3, 6)}  # floor(10 j / 3)
    assert blackwell(24, {2: 12, 3: 8}) == {2: _mult(2, 12), 3: _mult(3, 8)}  # one 1g.24gb instance's DC-1-2/3
    assert placement_size(2, 96) == 3 and placement_size(2, 24) == 2 and placement_size(4, 96) == 4
    ids = blackwell(96, {2: 32})[2]  # "only 32 instances of 2GB are supported even though it can accommodate 48"
    assert ids == _mult(3, 32) and all(b - a >= placement_size(2, 96) for a, b in zip(ids, ids[1:], strict=False))


def _host(mixed: bool = False, vfs: bool = True) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=RTX, mixed_size=mixed, vfs_enabled=vfs)])


def test_a_mixed_layout_fills_the_96_slots_exactly(make_sim):
    sim = make_sim(_host(vfs=True))
    vgpus = {"DC-24Q": 1, "DC-12Q": 2, "DC-8C": 3, "NVIDIA RTX Pro 6000 Blackwell DC-6Q": 4}  # 24+24+24+24
    out = reconcile(sim.env, sim.io, layout({"index": 0, "mixedSize": True, "vgpus": vgpus}), read_back=True)
    assert out.ok, out
    g = sim.discover().gpu(GPU)
    assert g.mixed_size and len(g.vgpus) == 10
    assert_exact(sim, GPU)
    assert all(t.available_instances == 0 for t in g.types if not t.mig_backed)  # every slot is held
    assert reconcile(sim.env, sim.io, layout({"index": 0, "mixedSize": True, "vgpus": vgpus})).changed == 0


def test_mixing_sizes_without_the_mode_is_refused(make_sim):
    sim = make_sim(_host())
    with pytest.raises(ConfigError, match="mixedSize"):
        reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"DC-24Q": 1, "DC-12Q": 2}}))


def test_the_mode_is_set_after_the_vfs_are_enabled(make_sim, capsys, tmp_path):
    sim = make_sim(_host(vfs=False))
    doc = {"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mixedSize": True, "vgpus": {"DC-48Q": 1, "DC-16Q": 3}}]}}
    (tmp_path / "l.json").write_text(json.dumps(doc))
    assert main(["--simulate", "--sim-dir", str(sim.root), "apply", "-f", str(tmp_path / "l.json"), "-o", "json"]) == 0
    kinds = [[a["kind"] for a in r["plan"]["actions"]] for r in json.loads(capsys.readouterr().out)["rounds"]]
    enable = next(i for i, k in enumerate(kinds) if "enable_vfs" in k)
    mode = next(i for i, k in enumerate(kinds) if "set_mixed_size" in k)
    place = next(i for i, k in enumerate(kinds) if "set_placement" in k)
    assert enable < mode < place, kinds
    assert sim.discover().gpu(GPU).mixed_size
    assert_exact(sim, GPU)


def test_dra_counters_admit_exactly_the_disjoint_families_of_the_whole_table():
    """Every time-sliced size of the catalog (DC-3 .. DC-96, not only the C series the counter
    module's table pins): one counter set, every overlapping pair refused, the exhaustive counts equal."""
    from dra_bridge.pool import placements as pl
    from tests.dra_bridge.test_placement_counters import Published, check_argument, check_counts, ranges_of

    table = placements(RTX)
    enc = pl.encode(96, table)
    pub = Published(96, table, enc)
    assert [len(cs.counters) for cs in enc.counter_sets(0)] == [len(enc.parts)] and len(enc.parts) <= 32
    check_argument(96, pub)
    assert check_counts(96, pub) >= len(ranges_of(96, table))
