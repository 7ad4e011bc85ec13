"""Cordoned GPUs (issue #26, point 2), the pure parts and the server's side: the cordon annotation,
what the published pool does for it (taints where kept, else withdrawal, held devices kept),
DeviceTaintRules as the scheduler model sees them, which servers keep device taints and serve
DeviceTaintRule (by effect), the eviction subresource, the GPU view's holders and drain plan."""

from __future__ import annotations

import pytest
from kubernetes import client

from dra_bridge.api import compat
from dra_bridge.api.names import TAINT_KEY_CORDON
from dra_bridge.apiclient.kept import probe_kept
from dra_bridge.apiclient.maintenance import MaintenanceApi
from dra_bridge.pool.cordon import NODE, CordonEntry, cordoned_pool, entry_for, format_cordon, parse_cordon
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.gpuview import build_views, migration_state, plan_drain
from dra_bridge.scheduling.selectors import default_selectors
from dra_bridge.scheduling.taints import tainted_slices, to_evict, tolerates
from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.dra import DRIVER, make_node

T4_0, T4_1 = "0000:10:00.0", "0000:13:00.0"
ANY = [{"metadata": {"name": "any"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_node(tmp_path_factory.mktemp("cordon"), "default", version=(1, 37)).build_pool()


def slices_of(pool, node="node-a"):
    return build_slices(pool, driver=DRIVER, node_name=node, pool_name=node, generation=1, server_version=(1, 37))


def claim(name: str, gpu_index: int | None = None, tolerate: bool = False) -> dict:
    sels = [{"cel": {"expression": f'device.attributes["{DRIVER}"].type == "vgpu"'}}]
    if gpu_index is not None:
        sels.append({"cel": {"expression": f'device.attributes["{DRIVER}"].gpuIndex == {gpu_index}'}})
    exactly = {"deviceClassName": "any", "selectors": sels}
    if tolerate:
        exactly["tolerations"] = [{"key": TAINT_KEY_CORDON, "operator": "Exists"}]
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def allocated_gpu(slices, c) -> int:
    _, (allocation,) = Allocator(slices, ANY, default_selectors()).allocate([c])
    dev = allocation["devices"]["results"][0]["device"]
    return int(dev.split("-")[1])


def test_the_annotation_round_trips_and_refuses_what_it_cannot_read():
    cordon = {T4_0: CordonEntry(effect="NoExecute", since="2026-11-28T10:00:00Z", reason="driver 580", index=0),
              NODE: CordonEntry()}
    assert parse_cordon(format_cordon(cordon)) == cordon
    assert format_cordon({}) is None and parse_cordon(None) == {} and parse_cordon("") == {}
    for bad in ("not json", "[1]", '{"0000:10:00.0": {"effect": "PreferNoSchedule"}}'):
        with pytest.raises(ValueError):
            parse_cordon(bad)
    # the node's cordon covers every GPU; NoExecute wins over NoSchedule
    assert entry_for({NODE: CordonEntry()}, T4_1).effect == "NoSchedule"
    assert entry_for(cordon, T4_0).effect == "NoExecute" and entry_for({T4_0: CordonEntry()}, T4_1) is None


def test_where_taints_are_kept_every_device_of_the_gpu_is_tainted_and_the_pool_itself_is_untouched(pool):
    out, effect = cordoned_pool(pool, {T4_0: CordonEntry(since="2026-11-28T10:00:00Z")}, taints=True)
    mine = [d for d in out.devices if d.gpu == T4_0]
    assert mine and all(d.taints == [{"key": TAINT_KEY_CORDON, "effect": "NoSchedule",
                                      "timeAdded": "2026-11-28T10:00:00Z"}] for d in mine)
    assert not any(d.taints for d in out.devices if d.gpu != T4_0)
    assert not any(d.taints for d in pool.devices)  # prepare still finds every device as it was
    assert effect.tainted == {T4_0: len(mine)}
    published = [d for s in slices_of(out) for d in s["spec"].get("devices") or []]
    assert all(d.get("taints") for d in published if d["attributes"]["gpuIndex"]["int"] == 0)


def test_without_taints_the_free_devices_are_withdrawn_and_held_ones_stay(pool):
    held = next(d.name for d in pool.devices if d.gpu == T4_0 and d.kind == "vgpu")
    out, effect = cordoned_pool(pool, {T4_0: CordonEntry()}, taints=False, in_use={held})
    assert [d.name for d in out.devices if d.gpu == T4_0] == [held]
    assert len([d for d in out.devices if d.gpu != T4_0]) == len([d for d in pool.devices if d.gpu != T4_0])
    assert effect.kept == {T4_0: 1} and effect.withdrawn[T4_0] == len([d for d in pool.devices if d.gpu == T4_0]) - 1
    assert slices_of(out)  # still valid slices: the counter set stays for the held device


def test_the_allocator_honours_the_cordon_taint_and_a_toleration(pool):
    tainted = slices_of(cordoned_pool(pool, {T4_0: CordonEntry()}, taints=True)[0])
    with pytest.raises(Unsatisfiable):
        allocated_gpu(tainted, claim("pinned", gpu_index=0))
    assert allocated_gpu(tainted, claim("any-t4")) != 0
    assert allocated_gpu(tainted, claim("test-after-upgrade", gpu_index=0, tolerate=True)) == 0


def test_a_device_taint_rule_taints_what_it_selects_as_if_the_driver_had(pool):
    slices = slices_of(pool)
    rule = {"metadata": {"name": "r", "creationTimestamp": "2026-11-28T10:00:00Z"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "node-a"},
                     "taint": {"key": TAINT_KEY_CORDON, "effect": "NoSchedule"}}}
    seen = tainted_slices(slices, [rule])
    assert all(d["taints"][0]["timeAdded"] == "2026-11-28T10:00:00Z" for s in seen for d in s["spec"].get("devices") or [])
    assert not any(d.get("taints") for s in slices for d in s["spec"].get("devices") or [])  # copies
    with pytest.raises(Unsatisfiable):
        allocated_gpu(seen, claim("x"))
    other = {**rule, "spec": {**rule["spec"], "deviceSelector": {"pool": "node-b"}}}
    nothing = {**rule, "spec": {"taint": rule["spec"]["taint"]}}  # no selector: no device
    assert tainted_slices(slices, [other, nothing]) == slices


@pytest.mark.parametrize("version, gates, kept", [
    ("1.34", {}, False), ("1.35", {}, False), ("1.35", {"DRADeviceTaints": True}, True), ("1.36", {}, True),
    ("1.37", {}, True), ("1.37", {"DRADeviceTaints": False, "DRADeviceTaintRules": False}, False)])
def test_which_servers_keep_device_taints_is_found_by_a_dry_run(version, gates, kept):
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        assert probe_kept(srv.api_client(), compat.version_tuple(version)).taints is kept
        assert compat.kept_by_gates(compat.version_tuple(version), srv.feature_gates).taints is kept


@pytest.mark.parametrize("version, gates, api", [
    ("1.34", {}, None), ("1.34", {"DRADeviceTaints": True}, "v1alpha3"), ("1.35", {}, None),
    ("1.35", {"DRADeviceTaints": True, "DRADeviceTaintRules": True}, "v1alpha3"), ("1.36", {}, None),
    ("1.36", {"DRADeviceTaintRules": True}, "v1beta2"), ("1.37", {}, "v1")])
def test_device_taint_rules_are_served_at_each_versions_api_only_with_their_gate(version, gates, api):
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        m = MaintenanceApi(srv.api_client(), compat.version_tuple(version))
        assert m.rule_api_version == f"resource.k8s.io/{api or m.rule_api_version.split('/')[1]}"
        rule = {"apiVersion": m.rule_api_version, "kind": "DeviceTaintRule", "metadata": {"name": "probe"},
                "spec": {"deviceSelector": {"driver": DRIVER, "pool": "node-a"},
                         "taint": {"key": TAINT_KEY_CORDON, "effect": "NoSchedule"}}}
        assert m.rules_served(rule) is (api is not None)
        assert m.taint_rules() == []  # the dry run stored nothing
        if api:
            m.put_rule(rule)
            m.put_rule(rule)  # again: replaced, not a conflict
            assert [r["metadata"]["name"] for r in m.taint_rules()] == ["probe"]
            assert m.delete_rule("probe") and not m.delete_rule("probe")


def test_an_eviction_deletes_the_pod():
    with LocalApiServer(version="1.37") as srv:
        core = client.CoreV1Api(srv.api_client())
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "busybox"}]}})
        m = MaintenanceApi(srv.api_client(), (1, 37))
        assert m.evict("default", "p") is None
        assert core.list_namespaced_pod("default").items == []
        assert m.evict("default", "p") is None  # gone already: done


def vmi(name: str, migratable: bool | None, migration: dict | None = None) -> dict:
    conds = [] if migratable is None else [{"type": "LiveMigratable", "status": str(migratable),
                                            "reason": None if migratable else "HostDeviceNotLiveMigratable"}]
    return {"metadata": {"name": name, "namespace": "default"},
            "status": {"conditions": conds, **({"migrationState": migration} if migration else {})}}


def test_a_vms_migration_state_reads_kubevirts_words():
    assert migration_state(vmi("a", False)) == "not migratable (HostDeviceNotLiveMigratable)"
    assert migration_state(vmi("a", True)) == "migratable"
    assert migration_state(vmi("a", True, {"targetNode": "node-b"})) == "migrating to node-b"
    assert migration_state(vmi("a", True, {"completed": True, "failed": True})) == "migration failed"
    assert migration_state(None) == "no VMI"


def test_the_view_finds_each_holder_and_drain_evicts_only_what_may_move(pool):
    slices = slices_of(pool)
    devs = [d["name"] for s in slices for d in s["spec"].get("devices") or []
            if d["attributes"]["gpuIndex"]["int"] == 0 and d["attributes"]["type"]["string"] == "vgpu"]
    claims, pods = [], []
    for i, vm in enumerate([None, "vm-pinned", "vm-mobile"]):
        claims.append({"metadata": {"name": f"c{i}", "namespace": "default"}, "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a",
                                                    "device": devs[i]}]}},
            "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"}]}})
        pods.append({"metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}",
                                  "labels": {"vm.kubevirt.io/name": vm} if vm else {}}, "status": {"phase": "Running"}})
    vmis = [vmi("vm-pinned", False), vmi("vm-mobile", True)]
    (gpu0, *others) = build_views(slices, claims, pods, vmis, cordons={"node-a": format_cordon({T4_0: CordonEntry()})})
    assert (gpu0.node, gpu0.index, gpu0.address, gpu0.cordon, gpu0.cordon_how) == ("node-a", 0, T4_0, "NoSchedule",
                                                                                   "pending")
    assert [(h.claim, h.pods, h.vm, h.migration) for h in gpu0.holders] == [
        ("default/c0", ["default/p0"], None, None),
        ("default/c1", ["default/p1"], "default/vm-pinned", "not migratable (HostDeviceNotLiveMigratable)"),
        ("default/c2", ["default/p2"], "default/vm-mobile", "migratable")]
    assert not any(v.holders for v in others)
    assert plan_drain([gpu0], evict=False).evict == []
    plan = plan_drain([gpu0], evict=True)
    assert plan.evict == ["default/p0", "default/p2"] and len(plan.wait) == 3 and not plan.done


def test_tolerations_and_the_eviction_controllers_choice():
    taint = {"key": TAINT_KEY_CORDON, "effect": "NoExecute"}
    assert tolerates([{"key": TAINT_KEY_CORDON, "operator": "Exists"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)  # no key, Exists: every taint
    assert not tolerates([{"key": TAINT_KEY_CORDON, "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert not tolerates([{"key": TAINT_KEY_CORDON, "value": "x"}], taint) and not tolerates([], taint)
    slices = [{"spec": {"driver": DRIVER, "pool": {"name": "n"}, "devices": [{"name": "d0", "taints": [taint]},
                                                                              {"name": "d1"}]}}]

    def allocated(name, device, tolerations=()):
        return {"metadata": {"name": name, "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"tolerations": list(tolerations)}}]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "n", "device": device}]}}}}

    claims = [allocated("on-d0", "d0"), allocated("on-d1", "d1"),
              allocated("tolerant", "d0", [{"key": TAINT_KEY_CORDON, "operator": "Exists"}])]
    assert list(to_evict(claims, slices)) == [("ns", "on-d0")]
