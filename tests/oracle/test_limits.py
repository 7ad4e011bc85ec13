"""What the node agent publishes on the largest presets stays within the validation limits of the
linked upstream ``k8s.io/api`` (read from the oracle program, ``allocator-<minor> limits``), and
the scheduler model enforces upstream's devices-per-claim limit (issue #30, point 5)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dra_bridge.scheduling.allocator import CLAIM_LIMIT
from tests.oracle.test_upstream_allocator import GROUPS, LAYOUT, OPTED_IN, published
from tests.support.upstream_allocator import MINORS, require
from tests.system.test_no_overcommit import B200, RTXPRO

#: (preset, layout): the most devices (bench-large: 16 x L40S, 1,744 devices) and the most counters
#: and consumptions per device (MIG-backed, time-sliced and whole GPUs on one node); the Blackwell
#: nodes (#38): 4 x RTX PRO 6000 (equal-size, mixed-size on 96 slots, MIG, whole) and 8 x B200 in MIG mode
#: 8 x RTX PRO 6000 in MIG mode, every GPU's instances shared by DC-1-6Q and DC-2-24Q and the GPU whole
#: beside them: one counter set of 32 (the grid, dra_bridge/pool/migshare.py) and 21 devices per GPU
RTXPRO8 = """\
version: vgpuctl/v1
layouts:
  mixed:
    - all: true
      mode: dra
      migMode: true
      passthrough: true
      vgpus: {DC-1-6Q: 16, DC-2-24Q: 4}
"""
SHARED8 = str(Path(__file__).with_name("rtxpro8-node.yaml"))
LARGEST = [("bench-large", None), ("mig-node", LAYOUT), ("rtxpro-node", RTXPRO), ("b200-node", B200),
           (SHARED8, RTXPRO8)]


def upstream_limits(minor: str) -> dict[str, int]:
    out = subprocess.run([str(require(minor)), "limits"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["limits"]


def problems_1_34(slices: list[dict], lim: dict[str, int]) -> list[str]:
    """1.34's limits, summed over counter sets (types.go of k8s.io/api v0.34: ResourceSliceMaxSharedCounters,
    ResourceSliceMaxCountersPerDevice, ResourceSliceMaxDeviceCountersPerSlice)."""
    out = []
    for s in slices:
        spec, name = s["spec"], s["metadata"]["name"]
        devices = spec.get("devices") or []
        if len(devices) > lim["ResourceSliceMaxDevices"]:
            out.append(f"{name}: {len(devices)} devices")
        shared = sum(len(cs.get("counters") or {}) for cs in spec.get("sharedCounters") or [])
        if shared > lim["ResourceSliceMaxSharedCounters"]:
            out.append(f"{name}: {shared} shared counters")
        per_slice = 0
        for d in devices:
            consumed = sum(len(c.get("counters") or {}) for c in d.get("consumesCounters") or [])
            per_slice += consumed
            if consumed > lim["ResourceSliceMaxCountersPerDevice"]:
                out.append(f"{name}/{d['name']}: consumes {consumed} counters")
            fields = len(d.get("attributes") or {}) + len(d.get("capacity") or {})
            if fields > lim["ResourceSliceMaxAttributesAndCapacitiesPerDevice"]:
                out.append(f"{name}/{d['name']}: {fields} attributes and capacities")
            if len(d.get("taints") or []) > lim["DeviceTaintsMaxLength"]:
                out.append(f"{name}/{d['name']}: {len(d['taints'])} taints")
            if len(d.get("bindingConditions") or []) > lim["BindingConditionsMaxSize"]:
                out.append(f"{name}/{d['name']}: {len(d['bindingConditions'])} binding conditions")
        if per_slice > lim["ResourceSliceMaxDeviceCountersPerSlice"]:
            out.append(f"{name}: its devices consume {per_slice} counters")
    return out


def problems(slices: list[dict], lim: dict[str, int]) -> list[str]:
    if "ResourceSliceMaxSharedCounters" in lim:
        return problems_1_34(slices, lim)
    out = []
    for s in slices:
        spec, name = s["spec"], s["metadata"]["name"]
        devices = spec.get("devices") or []
        advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
        most = lim["ResourceSliceMaxDevicesWithAdvancedFeatures" if advanced else "ResourceSliceMaxDevices"]
        if len(devices) > most:
            out.append(f"{name}: {len(devices)} devices, at most {most}")
        sets = spec.get("sharedCounters") or []
        if len(sets) > lim["ResourceSliceMaxCounterSets"]:
            out.append(f"{name}: {len(sets)} counter sets")
        out += [f"{name}: set {cs['name']} has {len(cs.get('counters') or {})} counters" for cs in sets
                if len(cs.get("counters") or {}) > lim["ResourceSliceMaxCountersPerCounterSet"]]
        for d in devices:
            cons = d.get("consumesCounters") or []
            if len(cons) > lim["ResourceSliceMaxDeviceCounterConsumptionsPerDevice"]:
                out.append(f"{name}/{d['name']}: {len(cons)} counter consumptions")
            out += [f"{name}/{d['name']}: consumes {len(c.get('counters') or {})} counters of {c['counterSet']}"
                    for c in cons if len(c.get("counters") or {}) > lim["ResourceSliceMaxCountersPerCounterSet"]]
            fields = len(d.get("attributes") or {}) + len(d.get("capacity") or {})
            if fields > lim["ResourceSliceMaxAttributesAndCapacitiesPerDevice"]:
                out.append(f"{name}/{d['name']}: {fields} attributes and capacities")
            if len(d.get("taints") or []) > lim["DeviceTaintsMaxLength"]:
                out.append(f"{name}/{d['name']}: {len(d['taints'])} taints")
            if len(d.get("bindingConditions") or []) > lim["BindingConditionsMaxSize"]:
                out.append(f"{name}/{d['name']}: {len(d['bindingConditions'])} binding conditions")
    return out


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("preset,layout", LARGEST, ids=[Path(p).stem for p, _ in LARGEST])
def test_the_largest_presets_publish_within_upstream_limits(minor, preset, layout):
    lim = upstream_limits(minor)
    assert CLAIM_LIMIT == lim["AllocationResultsMaxSize"]
    gates = [()] + ([tuple(GROUPS.items())] if minor == "1.37" else [])
    if minor in ("1.34", "1.35"):  # a server that keeps counters, taints and binding conditions too
        gates.append(tuple(sorted(OPTED_IN.items())))
    for server in gates:
        slices = published(preset, layout, minor, server)
        assert problems(slices, lim) == []
        sets = [cs for sl in slices for cs in sl["spec"].get("sharedCounters") or []]
        if preset == SHARED8 and sets:  # where counters are kept: the shared instances, not their fallback
            assert len(sets) == 8 and all(len(cs["counters"]) == 32 for cs in sets)
            assert sum(1 for sl in slices for d in sl["spec"].get("devices") or [] if "-at-" in d["name"]) == 8 * 20
        advanced = any(d.get("taints") or d.get("consumesCounters") for s in slices for d in s["spec"].get("devices") or [])
        if preset == "bench-large" and advanced and minor != "1.34":
            # full slices: the agent splits at the limit, not below it
            sizes = [len(s["spec"].get("devices") or []) for s in slices]
            assert max(sizes) == lim["ResourceSliceMaxDevicesWithAdvancedFeatures"], sizes


def test_1_34_limits_sum_counters_over_sets():
    """1.34 limits counters summed over a slice's sets and a device's consumptions; 1.35 per set:
    two sets of 20 counters break 1.34's 32 but not 1.35's 32 per set."""
    counters = {f"c{i}": {"value": "1"} for i in range(20)}
    one = {"metadata": {"name": "s"}, "spec": {
        "sharedCounters": [{"name": "a", "counters": counters}, {"name": "b", "counters": counters}],
        "devices": [{"name": "d", "consumesCounters": [{"counterSet": "a", "counters": counters},
                                                       {"counterSet": "b", "counters": counters}]}]}}
    v134 = {"ResourceSliceMaxDevices": 128, "ResourceSliceMaxSharedCounters": 32, "ResourceSliceMaxCountersPerDevice": 32,
            "ResourceSliceMaxDeviceCountersPerSlice": 1024, "ResourceSliceMaxAttributesAndCapacitiesPerDevice": 32,
            "DeviceTaintsMaxLength": 4, "BindingConditionsMaxSize": 4}
    v135 = {"ResourceSliceMaxDevices": 128, "ResourceSliceMaxDevicesWithAdvancedFeatures": 64,
            "ResourceSliceMaxCounterSets": 8, "ResourceSliceMaxCountersPerCounterSet": 32,
            "ResourceSliceMaxDeviceCounterConsumptionsPerDevice": 2, "ResourceSliceMaxAttributesAndCapacitiesPerDevice": 32,
            "DeviceTaintsMaxLength": 16, "BindingConditionsMaxSize": 4}
    assert problems([one], v134) == ["s: 40 shared counters", "s/d: consumes 40 counters"]
    assert problems([one], v135) == []
