"""What the node agent publishes on the largest presets stays within the validation limits of the
linked upstream ``k8s.io/api`` (read from the oracle program, ``allocator-<minor> limits``), and
the scheduler model enforces upstream's devices-per-claim limit (issue #30, point 5)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from dra_bridge.scheduling.allocator import CLAIM_LIMIT
from tests.oracle.test_upstream_allocator import GROUPS, LAYOUT, published
from tests.support.simnodes import REPO
from tests.support.upstream_allocator import MINORS, require


def example_dra(name: str) -> str:
    """An example layout's ``dra`` layout, named as ``published`` reads it (``mixed``)."""
    doc = yaml.safe_load((REPO / "examples" / name).read_text())
    return yaml.safe_dump({"version": doc["version"], "layouts": {"mixed": doc["layouts"]["dra"]}})


#: (preset, layout): the most devices (bench-large: 16 x L40S, 1,744 devices) and the most counters
#: and consumptions per device (MIG-backed, time-sliced and whole GPUs on one node); the Blackwell
#: nodes (#38): 4 x RTX PRO 6000 (equal-size, mixed-size on 96 slots, MIG, whole) and 8 x B200 in MIG mode
LARGEST = [("bench-large", None), ("mig-node", LAYOUT), ("rtxpro-node", example_dra("rtxpro-layout.yaml")),
           ("b200-node", example_dra("b200-layout.yaml"))]


def upstream_limits(minor: str) -> dict[str, int]:
    out = subprocess.run([str(require(minor)), "limits"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["limits"]


def problems(slices: list[dict], lim: dict[str, int]) -> list[str]:
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
@pytest.mark.parametrize("preset,layout", LARGEST, ids=[p for p, _ in LARGEST])
def test_the_largest_presets_publish_within_upstream_limits(minor, preset, layout):
    lim = upstream_limits(minor)
    assert CLAIM_LIMIT == lim["AllocationResultsMaxSize"]
    gates = [()] + ([tuple(GROUPS.items())] if minor == "1.37" else [])
    for server in gates:
        slices = published(preset, layout, minor, server)
        assert problems(slices, lim) == []
        if preset == "bench-large":  # full slices: the agent splits at the limit, not below it
            sizes = [len(s["spec"].get("devices") or []) for s in slices]
            assert max(sizes) == lim["ResourceSliceMaxDevicesWithAdvancedFeatures"], sizes
