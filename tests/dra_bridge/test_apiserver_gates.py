"""Feature gates of the local API server: per-version defaults, parsing, and the fields dropped on write."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from dra_bridge.api.compat import FeatureGateError, defaults, known, parse_gates, resolve
from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.apiserver.featuregates import drop_disabled

DRIVER = "gpu.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def rest(srv: LocalApiServer, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def partitioned_slice(name: str = "s", groups: list[str] | None = None) -> dict:
    """A 1.34-style slice: a counter set and a device consuming it, per-device node selection off."""
    consumption = {"counterSet": "gpu-0", "counters": {"memory": {"value": "8Gi"}}}
    if groups is not None:
        consumption["compatibilityGroups"] = groups
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                     "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "16Gi"}}}],
                     "devices": [{"name": "vgpu-0", "consumesCounters": [consumption]}]}}


def devices_slice(name: str = "d", groups: list[str] | None = None) -> dict:
    """A 1.35+ devices-only slice (its counter set lives in another slice of the pool)."""
    obj = partitioned_slice(name, groups)
    del obj["spec"]["sharedCounters"]
    return obj


# ----------------------------------------------------------------------------- the table
@pytest.mark.parametrize("gate, expected", [
    # 1.34, 1.35, 1.36, 1.37 (None: the version has no such gate)
    ("DRAPartitionableDevices", (False, False, True, True)),
    ("DRADeviceCompatibilityGroups", (None, None, None, False)),
    ("DRAConsumableCapacity", (False, False, True, True)),
    ("DRADeviceBindingConditions", (False, False, True, True)),
    ("DRADeviceTaints", (False, False, True, True)),
    ("DRAExtendedResource", (False, False, True, True)),
    ("DRAAdminAccess", (True, True, True, True)),
    ("DRAPrioritizedList", (True, True, True, True)),
    ("DRAResourceClaimDeviceStatus", (True, True, True, True)),
    ("DRADeviceTaintRules", (None, False, False, True)),
    ("DRAListTypeAttributes", (None, None, False, False)),
    ("DRAOptionalNodeOperations", (None, None, None, False)),
])
def test_defaults_per_version(gate, expected):
    got = tuple(defaults(v).get(gate) for v in ("1.34", "1.35", "1.36", "1.37"))
    assert got == expected


def test_defaults_accept_version_forms_and_refuse_unsupported():
    assert defaults("v1.35.2") == defaults((1, 35)) == defaults("1.35")
    with pytest.raises(ValueError):
        defaults("1.33")


def test_parse_gates():
    assert parse_gates("DRAPartitionableDevices=false, DRADeviceTaints=True,") == {
        "DRAPartitionableDevices": False, "DRADeviceTaints": True}
    assert parse_gates("") == {} and parse_gates(None) == {}


@pytest.mark.parametrize("text, words", [
    ("DRAPartitionableDevices", ["'DRAPartitionableDevices'", "NAME=true|false"]),
    ("DRAPartitionableDevices=maybe", ["'DRAPartitionableDevices=maybe'", "'maybe'"]),
    ("DRAPartitionableDevices=true,NoSuchGate=false", ["'NoSuchGate=false'", "DRAPartitionableDevices",
                                                        "DRADeviceCompatibilityGroups"]),
])
def test_parse_errors_name_the_item_and_the_allowed_names(text, words):
    with pytest.raises(FeatureGateError) as exc:
        parse_gates(text)
    assert isinstance(exc.value, ValueError)
    for w in words:
        assert w in str(exc.value)


def test_resolve_refuses_what_kube_apiserver_refuses():
    with pytest.raises(FeatureGateError, match="starts in 1.37"):
        resolve("1.36", {"DRADeviceCompatibilityGroups": True})
    with pytest.raises(FeatureGateError, match="locked to true"):
        resolve("1.37", {"DRAPrioritizedList": False})
    assert resolve("1.35", {"DRAPrioritizedList": False})["DRAPrioritizedList"] is False
    all_alpha = resolve("1.37", {"AllAlpha": True, "DRADerivedAttributes": False})
    assert all_alpha["DRADeviceCompatibilityGroups"] is True and all_alpha["DRADerivedAttributes"] is False
    assert "DRADeviceCompatibilityGroups" in known("1.37") and "DRADeviceCompatibilityGroups" not in known("1.36")


def test_unknown_gate_refused_by_the_server():
    with pytest.raises(ValueError, match="NoSuchGate"):
        LocalApiServer(version="1.37", feature_gates={"NoSuchGate": True})
    with pytest.raises(ValueError, match="DRADeviceCompatibilityGroups"):
        LocalApiServer(version="1.35", feature_gates={"DRADeviceCompatibilityGroups": False})


def test_without_gates_every_gate_is_on_and_nothing_is_dropped():
    srv = LocalApiServer(version="1.34")
    assert srv.feature_gates and all(srv.feature_gates.values())
    stored = srv.add(partitioned_slice())
    assert stored["spec"]["sharedCounters"] and stored["spec"]["devices"][0]["consumesCounters"]


def test_real_defaults_with_an_empty_mapping():
    assert LocalApiServer(version="1.35", feature_gates={}).feature_gates == defaults("1.35")


# ----------------------------------------------------------------------------- drop on create
def test_partitionable_devices_off_drops_counters_and_per_device_node_selection_on_create():
    with LocalApiServer(version="1.34", feature_gates={"DRAPartitionableDevices": False}) as srv:
        code, created = rest(srv, "POST", SLICES, partitioned_slice())
        assert code == 201, created
        assert "sharedCounters" not in created["spec"]
        assert created["spec"]["devices"] == [{"name": "vgpu-0"}]
        code, got = rest(srv, "GET", f"{SLICES}/s")
        assert got["spec"] == created["spec"]
        per_device = {**partitioned_slice("p"), "spec": {
            "driver": DRIVER, "perDeviceNodeSelection": True,
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0", "nodeName": "node-a"}]}}
        code, body = rest(srv, "POST", SLICES, per_device)
        # as upstream: with the selection fields gone, the slice names no node and is invalid
        assert code == 422 and "nodeName" in body["message"]


def test_partitionable_devices_default_on_1_36_keeps_counters():
    with LocalApiServer(version="1.36", feature_gates={}) as srv:
        code, created = rest(srv, "POST", SLICES, devices_slice())
        assert code == 201 and created["spec"]["devices"][0]["consumesCounters"]


def test_compatibility_groups_dropped_by_default_on_1_37_kept_when_enabled():
    with LocalApiServer(version="1.37", feature_gates={}) as srv:
        code, created = rest(srv, "POST", SLICES, devices_slice(groups=["fb-8g"]))
        assert code == 201, created
        consumption = created["spec"]["devices"][0]["consumesCounters"][0]
        assert "compatibilityGroups" not in consumption and consumption["counterSet"] == "gpu-0"
    with LocalApiServer(version="1.37", feature_gates={"DRADeviceCompatibilityGroups": True}) as srv:
        code, created = rest(srv, "POST", SLICES, devices_slice(groups=["fb-8g"]))
        assert created["spec"]["devices"][0]["consumesCounters"][0]["compatibilityGroups"] == ["fb-8g"]


def test_claim_and_class_fields_dropped_on_create():
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                 "deviceClassName": "vgpu", "adminAccess": True,
                 "tolerations": [{"key": "k", "operator": "Exists"}]}}]}}}
    with LocalApiServer(version="1.35", feature_gates={"DRAAdminAccess": False}) as srv:
        code, created = rest(srv, "POST", CLAIMS, claim)
        assert code == 201, created
        # adminAccess by the override, tolerations by 1.35's default (DRADeviceTaints alpha, off)
        assert created["spec"]["devices"]["requests"][0]["exactly"] == {"deviceClassName": "vgpu"}
        cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vgpu"},
               "spec": {"extendedResourceName": "example.com/gpu"}}
        code, created = rest(srv, "POST", CLASSES, cls)
        assert code == 201 and "extendedResourceName" not in created["spec"]
    with LocalApiServer(version="1.36", feature_gates={}) as srv:
        code, created = rest(srv, "POST", CLASSES, cls)
        assert created["spec"]["extendedResourceName"] == "example.com/gpu"


def test_prioritized_list_off_leaves_an_invalid_request_as_upstream():
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
                 {"name": "a", "deviceClassName": "vgpu"}]}]}}}
    with LocalApiServer(version="1.35", feature_gates={"DRAPrioritizedList": False}) as srv:
        code, body = rest(srv, "POST", CLAIMS, claim)
        assert code == 422 and "firstAvailable" in body["message"]


def test_claim_status_fields_dropped_on_status_update():
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "vgpu"}}]}}}
    status = {"allocation": {"devices": {"results": [
        {"request": "r", "driver": DRIVER, "pool": "node-a", "device": "vgpu-0"}]}},
        "devices": [{"driver": DRIVER, "pool": "node-a", "device": "vgpu-0"}]}
    with LocalApiServer(version="1.35", feature_gates={"DRAResourceClaimDeviceStatus": False}) as srv:
        code, created = rest(srv, "POST", CLAIMS, claim)
        code, updated = rest(srv, "PUT", f"{CLAIMS}/c/status", {**created, "status": status})
        assert code == 200, updated
        assert "devices" not in updated["status"] and updated["status"]["allocation"]


# ----------------------------------------------------------------------------- ratcheting on update
def test_update_keeps_fields_the_old_object_used_and_drops_new_ones():
    with LocalApiServer(version="1.35", feature_gates={"DRAPartitionableDevices": True}) as srv:
        code, old = rest(srv, "POST", SLICES, devices_slice("old"))
        assert code == 201 and old["spec"]["devices"][0]["consumesCounters"]
        code, plain = rest(srv, "POST", SLICES, {**devices_slice("plain"), "spec": {
            **devices_slice()["spec"], "devices": [{"name": "vgpu-0"}]}})
        assert code == 201

        srv.set_feature_gates({"DRAPartitionableDevices": False})  # a restart with the gate off
        more = dict(old)
        more["spec"] = {**old["spec"], "devices": old["spec"]["devices"] + [
            {"name": "vgpu-1", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "8Gi"}}}]}]}
        code, updated = rest(srv, "PUT", f"{SLICES}/old", more)
        assert code == 200, updated
        assert all(d["consumesCounters"] for d in updated["spec"]["devices"])  # in use before: kept

        adding = dict(plain)
        adding["spec"] = devices_slice()["spec"]  # the plain slice starts consuming counters
        code, updated = rest(srv, "PUT", f"{SLICES}/plain", adding)
        assert code == 200 and updated["spec"]["devices"] == [{"name": "vgpu-0"}]

        code, created = rest(srv, "POST", SLICES, devices_slice("new"))
        assert "consumesCounters" not in created["spec"]["devices"][0]


def test_drop_rules_directly():
    gates = defaults("1.37")
    new, old = devices_slice(groups=["a"]), devices_slice(groups=["b"])
    assert drop_disabled(new, old, gates) == []  # the old slice used groups: kept
    dropped = drop_disabled(new, None, gates)
    assert [(d.gate, d.path) for d in dropped] == [
        ("DRADeviceCompatibilityGroups", "spec.devices[0].consumesCounters[0].compatibilityGroups")]
    off = {**gates, "DRAPartitionableDevices": False}
    paths = [d.path for d in drop_disabled(partitioned_slice(), None, off)]
    assert paths == ["spec.sharedCounters", "spec.devices[0].consumesCounters"]
    # a gate the version does not have is not the server's to drop: the schema refuses the field
    assert drop_disabled(devices_slice(groups=["a"]), None, defaults("1.36")) == []


@pytest.mark.parametrize("version, gates, refused", [
    ("1.37", {"DRADeviceTaints": False}, "DRADeviceTaintRules is enabled, but depends on features that are "
                                         "disabled: [DRADeviceTaints]"),
    ("1.37", {"DRAPartitionableDevices": False, "DRADeviceCompatibilityGroups": True},
     "DRADeviceCompatibilityGroups is enabled, but depends on features that are disabled: [DRAPartitionableDevices]"),
    ("1.37", {"DRADeviceTaints": False, "DRADeviceTaintRules": False}, None),
    ("1.34", {"DRAResourceClaimDeviceStatus": False, "DRADeviceBindingConditions": True}, None),  # no check yet
])
def test_a_gate_whose_dependency_is_off_is_refused_as_kube_apiserver_refuses_it(version, gates, refused):
    """kube-apiserver 1.37.2 exits on ``--feature-gates DRADeviceTaints=false`` ("DRADeviceTaintRules is
    enabled, but depends on features that are disabled: [DRADeviceTaints]", seen on the real control
    plane); the local server took it and served a combination no cluster runs."""
    if refused is None:
        assert resolve(version, gates)
    else:
        with pytest.raises(FeatureGateError, match=re.escape(refused)):
            resolve(version, gates)

