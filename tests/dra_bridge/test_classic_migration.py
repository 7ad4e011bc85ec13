"""The device-plugin side as the API shows it (dra_bridge/scheduling/classic.py, pure): the scheduler's
sums per node and resource, and which nodes a VM holding a device-plugin vGPU can live-migrate to."""

from __future__ import annotations

from dra_bridge.scheduling.classic import classic_nodes, classic_views, drain_targets, migration_targets, pod_requests

RES = "nvidia.com/GRID_T4-8Q"
LABEL = "vgpu-host-driver-version.kubevirt.io/nvidia"


def node(name: str, driver: str | None = "580.95.02", unschedulable: bool = False, **alloc: int) -> dict:
    """A Node; ``GRID_T4_8Q=2``: allocatable nvidia.com/GRID_T4-8Q 2."""
    alloc = {k.replace("T4_", "T4-"): v for k, v in alloc.items()}
    return {"metadata": {"name": name, "labels": {LABEL: driver} if driver else {}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"allocatable": {"cpu": "8", **{f"nvidia.com/{k}": str(v) for k, v in alloc.items()}}}}


def pod(name: str, on: str, n: int = 1, *, vm: str | None = None, phase: str = "Running", res: str = RES,
        where: str = "limits") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {"vm.kubevirt.io/name": vm} if vm else {}},
            "spec": {"nodeName": on, "containers": [{"name": "compute", "resources": {where: {res: str(n), "cpu": "1"}}}]},
            "status": {"phase": phase}}


def vmi(name: str, migratable: bool = True) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"},
            "status": {"conditions": [{"type": "LiveMigratable", "status": str(migratable)}]}}


def test_a_pods_ask_counts_its_containers_and_its_largest_init_container():
    p = pod("p", "a", 1)
    p["spec"]["containers"].append({"name": "side", "resources": {"requests": {RES: "1"}}})
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {RES: "3"}}}]
    assert pod_requests(p) == {RES: 3}
    assert pod_requests(pod("q", "a", 2, where="requests")) == {RES: 2}
    assert pod_requests(pod("r", "a", 1, res="example.com/x")) == {}


def test_used_counts_every_pod_that_has_not_ended_a_terminating_one_too():
    ending = pod("t", "a", 1)
    ending["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    pods = [pod("p", "a", 1, vm="vm1"), ending, pod("done", "a", 1, phase="Succeeded"), pod("f", "a", 1, phase="Failed"),
            pod("unbound", "", 1)]
    (a,) = classic_nodes([node("a", GRID_T4_8Q=4), node("plain", driver=None)], pods, [vmi("vm1")])
    r = a.resources[RES]
    assert (r.allocatable, r.used, r.free) == (4, 2, 2)
    assert [(h.pod, h.vm, h.migration) for h in r.holders] == [("ns/p", "ns/vm1", "migratable"), ("ns/t", None, None)]


def test_free_never_goes_below_zero_when_pods_ask_more_than_the_kubelet_offers_now():
    (a,) = classic_nodes([node("a", GRID_T4_8Q=1)], [pod("p", "a", 1), pod("q", "a", 1)])
    assert (a.resources[RES].used, a.resources[RES].free) == (2, 0)


def test_each_node_that_cannot_take_the_vm_says_why():
    nodes = [node("src", GRID_T4_8Q=2), node("ok", GRID_T4_8Q=2), node("newer", "580.105.06", GRID_T4_8Q=2),
             node("other-type", GRID_T4_4Q=4), node("zero", GRID_T4_8Q=0), node("full", GRID_T4_8Q=1),
             node("cordoned", unschedulable=True, GRID_T4_8Q=2), node("unlabelled", None, GRID_T4_8Q=2)]
    pods = [pod("launcher", "src", vm="vm1"), pod("other", "full")]
    (t,) = migration_targets(classic_nodes(nodes, pods, [vmi("vm1")]), draining=["src", "ok"])
    assert (t.vm, t.node, t.resource, t.migration) == ("ns/vm1", "src", RES, "migratable")
    assert t.targets == {
        "cordoned": "unschedulable (cordoned)",
        "full": "no free GRID_T4-8Q (1 of 1 in use)",
        "newer": "host driver 580.105.06, src has 580.95.02",
        "ok": "being drained too",
        "other-type": "offers no GRID_T4-8Q",
        "unlabelled": "host driver version unknown (no vgpu-host-driver-version.kubevirt.io/nvidia label)",
        "zero": "offers no GRID_T4-8Q"}
    assert t.possible == [] and t.text().startswith("VM ns/vm1 (GRID_T4-8Q on src): no node can take it: ")
    (t,) = migration_targets(classic_nodes(nodes, pods, [vmi("vm1")]))
    assert t.possible == ["ok"] and t.text().startswith("VM ns/vm1 (GRID_T4-8Q on src): can move to ok; not to ")


def test_a_source_without_the_driver_label_has_no_target():
    nodes = [node("src", None, GRID_T4_8Q=1), node("b", GRID_T4_8Q=1)]
    (t,) = migration_targets(classic_nodes(nodes, [pod("l", "src", vm="vm1")]))
    assert t.targets == {"b": "host driver version of src unknown (no vgpu-host-driver-version.kubevirt.io/nvidia "
                              "label)"}


def test_a_nodes_classic_holders_are_one_view_for_a_whole_node_drain():
    cn = classic_nodes([node("a", GRID_T4_8Q=4), node("b", GRID_T4_8Q=4)],
                       [pod("l", "a", vm="vm1"), pod("w", "a"), pod("x", "b")], [vmi("vm1", migratable=False)])
    (v,) = classic_views(cn, ["a"])
    assert (v.name(), v.devices, v.kinds) == ("a/device-plugin", 4, ["device-plugin"])
    assert [(h.pods, h.vm, h.migration, h.profile) for h in v.holders] == [
        (["ns/l"], "ns/vm1", "not migratable", "GRID_T4-8Q"), (["ns/w"], None, None, "GRID_T4-8Q")]


def test_vms_drained_together_never_count_on_one_free_vgpu():
    """Three VMs leave src; b has 1 free, c has 1: the third VM has no target left, and says why; a VM
    KubeVirt does not call migratable is not planned (drain reports it not migratable)."""
    nodes = [node("src", GRID_T4_8Q=4), node("b", GRID_T4_8Q=2), node("c", GRID_T4_8Q=1)]
    pods = [pod(f"l{i}", "src", vm=f"vm{i}") for i in range(4)] + [pod("x", "b")]
    plan = drain_targets(classic_nodes(nodes, pods, [vmi("vm0"), vmi("vm1"), vmi("vm2"), vmi("vm3", False)]), ["src"])
    assert [(t.vm, t.possible) for t in plan] == [("ns/vm0", ["b", "c"]), ("ns/vm1", ["c"]), ("ns/vm2", [])]
    assert plan[1].targets["b"] == "its free GRID_T4-8Q go to the VMs drained before this one"
    assert plan[2].targets == {"b": "its free GRID_T4-8Q go to the VMs drained before this one",
                               "c": "its free GRID_T4-8Q go to the VMs drained before this one"}
