"""The Blackwell presets and their example layouts (#38.4): rtxpro-node (4 x RTX PRO 6000 BSE:
equal-size, mixed-size, MIG with several vGPUs per instance, passthrough) and b200-node (8 x B200
in MIG mode) apply, change nothing the second time, and come back after a reboot; their DRA
layouts publish within the API's limits (against upstream's own: tests/oracle/test_limits.py)."""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter

import pytest

from dra_bridge.api import compat
from mdev_manager.config import load_config
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim.hostspec import preset_names
from tests.support.simnodes import REPO
from vgpuctl.main import main

RTX_LAYOUT, B200_LAYOUT = REPO / "examples" / "rtxpro-layout.yaml", REPO / "examples" / "b200-layout.yaml"


def test_the_presets_are_listed():
    assert {"rtxpro-node", "b200-node"} <= set(preset_names())


def _summary(sim) -> list:
    inv = sim.discover()
    out = []
    for g in inv.gpus:
        types = Counter(v.type_name.split()[-1] for v in g.vgpus)
        shared = sorted(len(i.vgpus) for i in g.mig.instances) if g.mig and g.mig.enabled else []
        out.append((g.driver, g.mixed_size, dict(types), shared))
    return out


def test_rtxpro_node_holds_all_four_uses_and_comes_back_after_a_reboot(make_sim):
    sim = make_sim("rtxpro-node")
    layouts = load_config(RTX_LAYOUT, "default")
    assert reconcile(sim.env, sim.io, layouts, read_back=True).matches
    got = _summary(sim)
    assert got[0][2] == {"DC-24Q": 4} and not got[0][1]
    assert got[1][1] and got[1][2] == {"DC-48C": 1, "DC-24Q": 1, "DC-12C": 2}
    assert got[2][2] == {"DC-1-6Q": 8, "DC-2-24Q": 2} and got[2][3] == [2, 4, 4]  # shared instances
    assert got[3][0] == "vfio-pci" and got[3][2] == {}
    assert reconcile(sim.env, sim.io, layouts).changed == 0
    sim.host.reboot()
    reports = restore(sim.env, sim.io)
    assert all(r.ok for rep in reports for r in rep.results)
    assert _summary(sim) == got
    assert reconcile(sim.env, sim.io, layouts).changed == 0


def test_b200_node_gives_each_vgpu_its_own_instance(make_sim):
    sim = make_sim("b200-node")
    layouts = load_config(B200_LAYOUT, "default")
    assert reconcile(sim.env, sim.io, layouts, read_back=True).matches
    for _driver, _mixed, types, shared in _summary(sim):
        assert types == {"B200X-3-90C": 1, "B200X-1-23C": 3} and shared == [1, 1, 1, 1]
    assert reconcile(sim.env, sim.io, layouts).changed == 0


@pytest.mark.parametrize("preset, path", [("rtxpro-node", RTX_LAYOUT), ("b200-node", B200_LAYOUT)])
def test_the_dra_layouts_publish_within_the_limits(make_sim, preset, path):
    sim = make_sim(preset)
    assert reconcile(sim.env, sim.io, load_config(path, "dra")).matches
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--simulate", "--sim-dir", str(sim.root), "slices", "-o", "json", "--server-version", "1.37"]) == 0
    slices = json.loads(buf.getvalue())["items"]
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    assert devices
    for s in slices:
        assert len(s["spec"].get("devices") or []) <= compat.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        sets = s["spec"].get("sharedCounters") or []
        assert all(len(cs["counters"]) <= compat.MAX_COUNTERS_PER_COUNTER_SET for cs in sets)
    assert all(len(d.get("consumesCounters") or []) <= compat.MAX_COUNTER_CONSUMPTIONS_PER_DEVICE for d in devices)
