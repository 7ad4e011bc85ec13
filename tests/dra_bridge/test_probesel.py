"""The capacity probes' selectors answered in Python (:mod:`dra_bridge.scheduling.probesel`) say what
CEL says: the same bool, or the same error, for every probe form on well-formed and odd devices; on
well-formed devices CEL is never loaded (``kubectl vgpu`` stays light)."""

from __future__ import annotations

import pytest

from dra_bridge.scheduling import capacity
from dra_bridge.scheduling.pools import read_pools
from dra_bridge.scheduling.probesel import ProbeSelectors
from dra_bridge.scheduling.selectors import CelSelectors
from tests.dra_bridge.test_capacity import t4_slices

DRV = "vgpu.kubevirt.io"
GPU = "0000:10:00.0"


def _device(name: str, attrs: dict, capacity_: dict | None = None) -> dict:
    return {"name": name, "attributes": attrs, "capacity": capacity_ or {"memory": {"value": "8Gi"}}}


WELL_FORMED = [
    _device("vgpu", {"type": {"string": "vgpu"}, "profile": {"string": "T4-8Q"}, "gpuIndex": {"int": 0},
                     "parentPciBusID": {"string": GPU}}),
    _device("slot", {"type": {"string": "vgpu"}, "vgpuTypes": {"string": " T4-4Q T4-8Q "}, "gpuIndex": {"int": 1},
                     f"{DRV}/parentPciBusID": {"string": GPU}}),
    _device("whole", {"type": {"string": "passthrough"}, "gpuIndex": {"int": 0},
                      "resource.kubernetes.io/pciBusID": {"string": GPU}}),
]
ODD = [
    _device("no-type", {"profile": {"string": "T4-8Q"}}),
    _device("int-type", {"type": {"int": 3}, "gpuIndex": {"string": "0"}, "profile": {"int": 8}}),
    _device("types-int", {"type": {"string": "vgpu"}, "vgpuTypes": {"int": 1}, "profile": {"string": "T4-8Q"}}),
    _device("twice", {"type": {"string": "vgpu"}, f"{DRV}/type": {"string": "passthrough"}}),
    _device("bool-index", {"type": {"string": "vgpu"}, "gpuIndex": {"bool": False}}),
    _device("version", {"type": {"version": "1.2.3"}, "gpuIndex": {"int": 0}}),
    _device("bad-quantity", {"type": {"string": "vgpu"}}, {"memory": {"value": "lots"}}),
    _device("two-kinds", {"type": {"string": "vgpu", "int": 1}}),
]


def _expressions() -> list[str]:
    out = [s["cel"]["expression"] for s in capacity._probe_class(DRV)["spec"]["selectors"]]
    for kind, prof, index, gpu in (("vgpu", "T4-8Q", 0, None), ("vgpu", "T4-4Q", None, GPU), ("vgpu", 'a"b\\c', 1, None),
                                   ("passthrough", None, None, GPU), ("passthrough", None, 0, None)):
        probe = capacity._probe(DRV, kind, prof, index, gpu)
        out += [s["cel"]["expression"] for s in probe["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    return [*dict.fromkeys(out), 'device.attributes["vgpu.kubevirt.io"].gpuIndex > 0', 'device.driver == "other.io"']


def _devices(raw: list[dict]):
    slices = [{"metadata": {"name": "s"}, "spec": {"driver": DRV, "nodeName": "n1", "devices": raw,
                                                    "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}}]
    return [d for p in read_pools(slices).values() for d in p.devices]


def _answer(sel, expr, d):
    try:
        return sel.matches(expr, d)
    except Exception as exc:  # noqa: BLE001 - the error is the answer compared
        return type(exc).__name__


@pytest.mark.parametrize("expr", _expressions())
def test_probe_selectors_answer_as_cel_on_every_device(expr):
    devices = _devices(WELL_FORMED + ODD)
    assert len(devices) == len(WELL_FORMED + ODD)
    probe, cel = ProbeSelectors(), CelSelectors()
    assert [_answer(probe, expr, d) for d in devices] == [_answer(cel, expr, d) for d in devices]


def test_well_formed_devices_are_answered_without_cel():
    """Each probe's selectors in order until one fails, as the allocator evaluates them."""
    sel = ProbeSelectors()
    answers = []
    for kind, prof, index, gpu in (("vgpu", "T4-8Q", 0, None), ("vgpu", "T4-4Q", None, GPU),
                                   ("passthrough", None, None, GPU), ("passthrough", None, 0, None)):
        probe = capacity._probe(DRV, kind, prof, index, gpu)
        exprs = [s["cel"]["expression"] for s in probe["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
        for d in _devices(WELL_FORMED):
            answers.append(all(sel.matches(e, d) for e in exprs))
    assert True in answers and False in answers
    assert sel._cel is None  # CEL not loaded for them
    sel.matches(_expressions()[-2], _devices(WELL_FORMED)[0])  # any other expression: CEL
    assert sel._cel is not None


def test_capacity_with_probe_selectors_equals_capacity_with_cel():
    slices = t4_slices(groups=True) + t4_slices(groups=False, node="n2")
    assert capacity.compute(slices, []).to_dict() == capacity.compute(slices, [], selectors=CelSelectors()).to_dict()
