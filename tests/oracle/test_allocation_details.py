"""What an allocation result holds besides its devices, model against upstream on every minor
(issue #39): tolerations, the claim's config and binding conditions, and what a pod's admin-access
claim holds for its other claims. Each model test checks a recorded upstream outcome (runs where Go
is absent); its ``upstream`` twin checks that upstream still says so."""

from __future__ import annotations

import copy

import pytest

from tests.oracle.test_upstream_allocator import TAINT, agree, claim, model_outcome, offered, published
from tests.support.upstream_allocator import MINORS, chosen, detail
from tests.system.test_no_overcommit import MIXED_SIZE

#: per minor, recorded from upstream (the results loop and "Populate configs" of Allocate in each
#: release's structured/internal/incubating): whether a result carries its request's tolerations
#: (1.35+), and whether a claim config keeps its "requests" where it names every request (up to
#: 1.36; 1.37 clears them, "empty means all")
RESULT_DETAILS = {"1.34": (False, True), "1.35": (True, True), "1.36": (True, True), "1.37": (True, False)}


def _first_available_tolerating(minor: str) -> tuple[list[dict], dict]:
    """t4-node's slices and a firstAvailable claim (a config per alternative) that tolerates TAINT."""
    slices = published("t4-node", None, minor, ())
    c = claim(next(k for k in offered(slices) if k.get("first_available")), 0)
    for sub in c["spec"]["devices"]["requests"][0]["firstAvailable"]:
        sub["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
    return slices, c


def _check_details(minor: str, d: dict) -> None:
    tolerations, named = RESULT_DETAILS[minor]
    (r,) = d["results"]
    assert r["tolerations"] == ([{"key": TAINT["key"], "operator": "Exists", "value": "", "effect": "",
                                  "tolerationSeconds": None}] if tolerations else [])
    (cfg,) = d["config"]  # the chosen alternative's config only
    assert cfg["opaque"]["parameters"]["vgpuType"].lower() == r["request"].split("/")[1]
    assert cfg["requests"] == ([r["request"]] if named else [])


@pytest.mark.parametrize("minor", MINORS)
def test_regression_result_holds_the_chosen_config_and_the_minor_s_tolerations(minor):
    """The model put every firstAvailable alternative's config into the result, not only the
    chosen one's (the driver was handed two vGPU types), never the tolerations, and kept
    "requests" on 1.37."""
    slices, c = _first_available_tolerating(minor)
    got = model_outcome(minor, None, slices, [], [c], "sim-t4", full=True)
    assert got[0] == "allocated"
    _check_details(minor, got[1][0])


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS)
def test_result_details_upstream(upstream, minor):
    slices, c = _first_available_tolerating(minor)
    answer = agree(upstream(minor), minor, None, slices, [], [c], "sim-t4")
    _check_details(minor, detail(answer["allocations"][0]))


def _pair_with_one_config() -> dict:
    """Two T4-1Q under matchAttribute, one claim config naming both requests."""
    c = claim({"profile": "T4-1Q"}, 0, "matchAttribute")
    (cfg,) = claim({"profile": "T4-1Q"}, 1)["spec"]["devices"]["config"]
    c["spec"]["devices"]["config"] = [dict(cfg, requests=["a", "b"])]
    return c


@pytest.mark.parametrize("minor", MINORS)
def test_regression_a_config_naming_two_requests(minor):
    """Recorded upstream: up to 1.36 a claim config is added once per request it names (twice
    here, ``continue`` in "Populate configs"); 1.37 adds it once, "requests" cleared."""
    slices = published("t4-node", None, minor, ())
    got = model_outcome(minor, None, slices, [], [_pair_with_one_config()], "sim-t4", full=True)
    want = [{"requests": []}] if minor == "1.37" else [{"requests": ["a", "b"]}] * 2
    assert [{"requests": c["requests"]} for c in got[1][0]["config"]] == want


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS)
def test_a_config_naming_two_requests_upstream(upstream, minor):
    slices = published("t4-node", None, minor, ())
    answer = agree(upstream(minor), minor, None, slices, [], [_pair_with_one_config()], "sim-t4")
    assert len(answer["allocations"][0]["devices"]["config"]) == (1 if minor == "1.37" else 2)


def _admin_then_plain() -> list[dict]:
    admin = claim({"profile": "T4-1A"}, 0)
    admin["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    return [admin, claim({"profile": "T4-1A"}, 1)]


@pytest.mark.parametrize("minor", MINORS)
def test_regression_a_device_a_pod_takes_with_admin_access_is_in_use_for_its_other_claims(minor):
    """The model gave the device the pod's admin-access claim took to its next claim too; upstream
    (``allocatingDevices``, checked by ``deviceInUse``) holds it for the rest of the attempt."""
    slices = published("t4-node", None, minor, ())
    got = model_outcome(minor, None, slices, [], _admin_then_plain(), "sim-t4")
    assert [a[0][3] for a in got[1]] == ["gpu-0-vgpu-1gb-0", "gpu-0-vgpu-1gb-1"]


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS)
def test_admin_access_in_the_same_pod_upstream(upstream, minor):
    slices = published("t4-node", None, minor, ())
    answer = agree(upstream(minor), minor, None, slices, [], _admin_then_plain(), "sim-t4")
    assert [chosen(a)[0][3] for a in answer["allocations"]] == ["gpu-0-vgpu-1gb-0", "gpu-0-vgpu-1gb-1"]


#: a server and scheduler with binding conditions on (1.34 and 1.35 have them off by default)
BINDING_ON = {"DRAPartitionableDevices": True, "DRADeviceTaints": True, "DRADeviceBindingConditions": True}


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS)
def test_binding_conditions_in_the_result_upstream(upstream, minor):
    """A size slot of mixed-node carries the driver's binding conditions into the result on every
    minor where the gates are on, in the model as upstream."""
    gates = BINDING_ON if minor in ("1.34", "1.35") else {}
    slices = published("mixed-node", MIXED_SIZE, minor, tuple(sorted(gates.items())))
    answer = agree(upstream(minor), minor, gates or None, slices, [], [claim({"profile": "A40-12Q"}, 0)],
                   slices[0]["spec"]["nodeName"])
    (r,) = detail(answer["allocations"][0])["results"]
    assert (r["bindingConditions"], r["bindingFailureConditions"]) == (
        ["vgpu.kubevirt.io/SizeAssigned"], ["vgpu.kubevirt.io/SizeConflict"])


def test_detail_tells_tolerations_config_and_binding_conditions_apart():
    """The comparison sees each field it is meant to compare, and only the API defaults are filled."""
    base = {"devices": {"results": [{"request": "r", "driver": "d", "pool": "p", "device": "x",
                                     "tolerations": [{"key": "k", "operator": "Exists"}],
                                     "bindingConditions": ["a"], "bindingFailureConditions": ["b"]}],
                        "config": [{"source": "FromClaim", "requests": ["r"], "opaque": {"driver": "d"}}]}}
    changes = [("tolerations", [{"key": "k"}]), ("bindingConditions", ["c"]), ("bindingFailureConditions", [])]
    for field, value in changes:
        other = copy.deepcopy(base)
        other["devices"]["results"][0][field] = value
        assert detail(other) != detail(base), field
    other = copy.deepcopy(base)
    del other["devices"]["config"][0]["requests"]
    assert detail(other) != detail(base)
    defaulted = copy.deepcopy(base)
    defaulted["devices"]["results"][0]["tolerations"] = [{"key": "k", "operator": "Exists", "value": ""}]
    assert detail(defaulted) == detail(base)
