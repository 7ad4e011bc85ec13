"""The vGPU live-migration handover on the device-plugin path (issue #40.1): KubeVirt's
VGPULiveMigration moves a VM holding one mdev vGPU from a source node to a target node.

Two simulated nodes, each with its own host, its own node agent (``serve --device-plugin``, the real
device plugin servers) and a kubelet (:mod:`tests.support.dpnodes`: the device manager's accounting,
``Allocate`` over gRPC, the PodResources API), one API server. The test plays KubeVirt: the VM's
virt-launcher pod on the source, the migration target pod on the target (same resource, so its
kubelet allocates a vGPU of the same type through the target agent's plugin), QEMU on each side
holding the vfio group ``Allocate`` handed out; on success the source QEMU ends, then its pod is
deleted; on a failure half-way the target's QEMU ends and its pod is deleted, the source runs on.

At every step, and after an agent restart on either side at any step, the accounting of both nodes
is exact: no vGPU is held by two pods; every vGPU a pod or a QEMU holds is counted used by the
kubelet, by the API (allocatable less the pods' requests, what the scheduler sees) and by the agent
(its free-vGPU metric); the agent never removes, re-creates or hides a vGPU.
"""

from __future__ import annotations

import json
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dra_bridge.scheduling.classic import ClassicResource, classic_nodes
from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.cluster import _resource_types
from tests.support.dpnodes import AdmissionError, DpNode, make_dp_node
from tests.support.tmp import short_root
from vgpuctl.main import main

RES = "nvidia.com/GRID_T4-8Q"
TYPE = "GRID T4-8Q"
#: two GPUs of T4-8Q each (2 vGPUs per T4), the node's other GPUs unmanaged
LAYOUT = yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "vgpu", "vgpus": {"T4-8Q": 2}}, {"index": 1, "mode": "vgpu", "vgpus": {"T4-8Q": 2}}]}})
DRIVER = "580.95.02"
NS = "default"


def rest_of(api):
    """One request through the API client's transport (as SimCluster.rest)."""
    from dra_bridge.apiclient.errors import api_exception

    def rest(method: str, path: str, body: dict | None = None, *, patch: bool = False) -> dict:
        ctype = "application/merge-patch+json" if patch else "application/json"
        m, url, headers, data, _ = api.param_serialize(method, path, header_params={
            "Content-Type": ctype, "Accept": "application/json"}, body=body, auth_settings=["BearerToken"])
        r = api.call_api(m, url, headers, data)
        payload = r.read()
        if not 200 <= r.status < 300:
            raise api_exception()(status=r.status, reason=r.reason, body=payload)
        return json.loads(payload)

    return rest


@dataclass
class Cluster:
    srv: LocalApiServer
    rest: object
    nodes: dict[str, DpNode]
    base: Path

    def node(self, name: str) -> DpNode:
        return self.nodes[name]

    def kubeconfig(self) -> str:
        return str(self.srv.kubeconfig(self.base / "kubeconfig"))


@contextmanager
def cluster(*specs: tuple[str, str, str | None]):
    """Nodes ``(name, layout, host driver version or None: the preset's)`` with their agents running."""
    with tempfile.TemporaryDirectory(dir=short_root(), prefix="mig") as d, \
            LocalApiServer(version="1.35", extra_resources=_resource_types()) as srv:
        api = srv.api_client()
        rest = rest_of(api)
        nodes: dict[str, DpNode] = {}
        try:
            for name, layout, version in specs:
                n = nodes[name] = make_dp_node(Path(d), name, "t4-node", layout, api, rest, driver_version=version)
                assert n.inventory().all_vgpus() == []  # the agent creates them
                n.start_agent()
                n.kubelet.sync_node_status()
            yield Cluster(srv, rest, nodes, Path(d))
        finally:
            for n in nodes.values():
                n.stop_agent()
                n.kubelet.close()


# ------------------------------------------------------------------ KubeVirt's part, played by the test


def launcher_pod(vm: str, pod: str, node: str, *, migration: str | None = None) -> dict:
    """A virt-launcher pod of ``vm`` bound to ``node`` asking one T4-8Q (the migration target pod
    carries the migration's uid, as virt-controller labels it)."""
    labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vm}
    if migration:
        labels["kubevirt.io/migrationJobUID"] = migration
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NS, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "virt-launcher",
                                                       "resources": {"limits": {RES: "1"}, "requests": {RES: "1"}}}]}}


def start_pod(c: Cluster, node: str, pod: dict, *, qemu: bool = True) -> dict:
    """The pod is created, its kubelet admits it (Allocate), QEMU opens the vGPU; the Allocate answer."""
    stored = c.rest("POST", f"/api/v1/namespaces/{NS}/pods", pod)
    answer = c.node(node).kubelet.admit(stored)[RES]
    c.rest("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
           {"status": {"phase": "Running"}}, patch=True)
    if qemu:
        c.node(node).start_qemu(f"{NS}/{pod['metadata']['name']}", answer)
    return answer


def delete_pod(c: Cluster, node: str, name: str) -> None:
    """Its containers end (QEMU with them, if still running), the pod goes, the kubelet frees its devices."""
    n = c.node(node)
    if f"{NS}/{name}" in n.qemus:
        n.stop_qemu(f"{NS}/{name}")
    c.rest("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
    n.kubelet.pod_deleted(NS, name)


def vmi(vm: str, node: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": vm},
            "spec": {}, "status": {"nodeName": node, "conditions": [{"type": "LiveMigratable", "status": "True"}]}}


# ------------------------------------------------------------------ the accounting, checked


def check(c: Cluster, start: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Every node's accounting (see the module docstring); returns each node's pod -> vGPU ids."""
    for n in c.nodes.values():
        n.kubelet.sync_node_status()
    api_view = {cn.node: cn for cn in classic_nodes(c.rest("GET", "/api/v1/nodes")["items"],
                                                     c.rest("GET", "/api/v1/pods")["items"])}
    held_by = {}
    for name, n in c.nodes.items():
        inv = n.inventory()
        vgpus = {v.id: v for v in inv.all_vgpus() if v.type_name == TYPE}
        assert set(vgpus) == start[name], f"{name}: the agent removed or re-created a vGPU"
        allocs = {pod: by[RES] for pod, by in n.kubelet.allocated().items() if RES in by}
        flat = [i for ids in allocs.values() for i in ids]
        assert len(flat) == len(set(flat)), f"{name}: a vGPU held by two pods: {allocs}"
        assert set(flat) <= set(vgpus), f"{name}: a pod holds a vGPU the host does not have"
        # every QEMU runs on the vGPU its own pod was allocated (the group it opened is that vGPU's)
        for pod, pid in n.qemus.items():
            (vid,) = allocs[pod]
            held = {f.readlink().name for f in (n.sim.root / "proc" / str(pid) / "fd").iterdir()}
            assert str(vgpus[vid].iommu_group) in held, f"{name}: {pod}'s QEMU holds {held}, not {vid}'s group"
        # the kubelet advertises every vGPU healthy, the used ones too (its accounting keeps them apart)
        assert n.kubelet.healthy(RES) == sorted(vgpus)
        used = set(flat)
        assert n.kubelet.free(RES) == sorted(set(vgpus) - used)
        # what the scheduler sees: allocatable less the pods' requests
        r = api_view[name].resources.get(RES) or ClassicResource(RES, 0)
        assert (r.allocatable, r.used, r.free) == (len(vgpus), len(used), len(vgpus) - len(used))
        # the agent's own count: a vGPU a pod holds (before its QEMU opens it too) or a QEMU holds is not free
        free = n.agent_free()
        for g in {v.gpu for v in vgpus.values()}:
            idle = [i for i, v in vgpus.items() if v.gpu == g and i not in used]
            assert free[(g, "T4-8Q")] == len(idle), f"{name} GPU {g}: agent counts {free[(g, 'T4-8Q')]} free, {idle}"
        held_by[name] = allocs
    return held_by


SUCCESS = ["running", "target-allocated", "target-started", "source-left", "source-deleted"]
FAILURE = ["running", "target-allocated", "target-started", "target-failed"]


def handover(c: Cluster, steps: list[str], on_step) -> dict:
    """The VM ``vm-a`` on node-a, migrated to node-b through ``steps``; ``on_step(step)`` after each."""
    c.rest("POST", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstances", vmi("vm-a", "node-a"))
    seen: dict = {}
    for step in steps:
        if step == "running":
            seen["source"] = start_pod(c, "node-a", launcher_pod("vm-a", "virt-launcher-vm-a-src", "node-a"))
        elif step == "target-allocated":  # the target pod admitted: its vGPU allocated, not opened yet
            seen["target"] = start_pod(c, "node-b", launcher_pod("vm-a", "virt-launcher-vm-a-tgt", "node-b",
                                                                 migration="mig-1"), qemu=False)
        elif step == "target-started":  # the target QEMU takes the incoming VM: it is on both nodes
            c.node("node-b").start_qemu(f"{NS}/virt-launcher-vm-a-tgt", seen["target"])
        elif step == "source-left":  # switched over: the source QEMU ended, its pod not deleted yet
            c.node("node-a").stop_qemu(f"{NS}/virt-launcher-vm-a-src")
        elif step == "source-deleted":
            delete_pod(c, "node-a", "virt-launcher-vm-a-src")
            c.rest("PATCH", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstances/vm-a/status",
                   {"status": {"nodeName": "node-b"}}, patch=True)
        elif step == "target-failed":  # the migration fails half-way: the target goes, the source stays
            delete_pod(c, "node-b", "virt-launcher-vm-a-tgt")
        on_step(step)
    return seen


def _cases():
    for path, steps in (("succeeds", SUCCESS), ("fails", FAILURE)):
        for side in ("source", "target"):
            for step in steps:
                yield pytest.param(steps, side, step, id=f"{path}-restart-{side}-at-{step}")


@pytest.mark.parametrize(("steps", "side", "restart_at"), list(_cases()))
def test_the_handover_keeps_the_accounting_exact_on_both_nodes(steps, side, restart_at):
    with cluster(("node-a", LAYOUT, None), ("node-b", LAYOUT, None)) as c:
        start = {name: {v.id for v in n.inventory().all_vgpus()} for name, n in c.nodes.items()}
        assert all(len(ids) == 4 for ids in start.values())
        states: dict[str, dict] = {}

        def on_step(step: str) -> None:
            states[step] = check(c, start)
            if step == restart_at:
                c.node("node-a" if side == "source" else "node-b").restart_agent()
                assert check(c, start) == states[step]  # the restart changed nothing anybody counts

        seen = handover(c, steps, on_step)
        src_id, = seen["source"]["ids"]
        tgt_id, = seen["target"]["ids"]
        a, b = "default/virt-launcher-vm-a-src", "default/virt-launcher-vm-a-tgt"
        # the target's vGPU is one of the target agent's, of the same type, handed out by Allocate
        assert seen["target"]["envs"] == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-8Q": tgt_id} and tgt_id in start["node-b"]
        assert states["target-started"] == {"node-a": {a: [src_id]}, "node-b": {b: [tgt_id]}}
        if steps is SUCCESS:
            # the source's vGPU stays used until the VM's pod is gone, not merely its QEMU
            assert states["source-left"]["node-a"] == {a: [src_id]}
            assert states["source-deleted"] == {"node-a": {}, "node-b": {b: [tgt_id]}}
        else:
            # the target's vGPU is free again; the source keeps its own, its QEMU still running on it
            assert states["target-failed"] == {"node-a": {a: [src_id]}, "node-b": {}}
            assert a in c.node("node-a").qemus


def test_a_full_target_refuses_the_target_pod_and_the_source_keeps_its_vgpu():
    """The target kubelet cannot admit a fifth T4-8Q pod: the migration fails before a vGPU moves."""
    with cluster(("node-a", LAYOUT, None), ("node-b", LAYOUT, None)) as c:
        start = {name: {v.id for v in n.inventory().all_vgpus()} for name, n in c.nodes.items()}
        for i in range(4):
            start_pod(c, "node-b", launcher_pod(f"vm-b{i}", f"virt-launcher-vm-b{i}", "node-b"))
        start_pod(c, "node-a", launcher_pod("vm-a", "virt-launcher-vm-a-src", "node-a"))
        before = check(c, start)
        with pytest.raises(AdmissionError, match="requested 1, available 0"):
            start_pod(c, "node-b", launcher_pod("vm-a", "virt-launcher-vm-a-tgt", "node-b", migration="m"))
        c.rest("DELETE", f"/api/v1/namespaces/{NS}/pods/virt-launcher-vm-a-tgt")
        assert check(c, start) == before


# ------------------------------------------------------------------ non-targets: kubectl vgpu, drain --migrate

LAYOUT_4Q = yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "vgpu", "vgpus": {"T4-4Q": 4}}]}})
OTHER_DRIVER = "580.105.06"


def vg(capsys, c: Cluster, *args: str, plugin: bool = False) -> tuple[int, str]:
    """``vgpuctl ARGS`` (``kubectl vgpu ARGS``) against the cluster, in this process; lines fit 80 columns."""
    from vgpuctl.main import kubectl_plugin

    argv = [*args, "--kubeconfig", c.kubeconfig()]
    code = kubectl_plugin(argv) if plugin else main(argv)
    out, err = capsys.readouterr()
    if "wide" not in args and "json" not in args:
        assert all(len(line) <= 80 for line in out.splitlines()), out
    return code, out + err


def _vm_on_a(c: Cluster) -> None:
    c.rest("POST", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstances", vmi("vm-a", "node-a"))
    start_pod(c, "node-a", launcher_pod("vm-a", "virt-launcher-vm-a", "node-a"))
    for n in c.nodes.values():
        n.kubelet.sync_node_status()


def test_kubectl_vgpu_shows_why_a_node_cannot_take_the_vm(capsys):
    """node-b has the type but another host driver, node-c the driver but not the type: neither is a
    target, each says why; the agents' driver labels are what is compared."""
    with cluster(("node-a", LAYOUT, None), ("node-b", LAYOUT, OTHER_DRIVER), ("node-c", LAYOUT_4Q, None)) as c:
        _vm_on_a(c)
        labels = {n["metadata"]["name"]: n["metadata"]["labels"].get("vgpu-host-driver-version.kubevirt.io/nvidia")
                  for n in c.rest("GET", "/api/v1/nodes")["items"]}
        assert labels == {"node-a": DRIVER, "node-b": OTHER_DRIVER, "node-c": DRIVER}
        code, out = vg(capsys, c, plugin=True)
        assert code == 0, out
        flat = " ".join(out.split())
        assert "node-a 580.95.02 GRID_T4-8Q 4 1 3 1 VM" in flat, out
        assert "node-b 580.105.06 GRID_T4-8Q 4 0 4 -" in flat and "node-c 580.95.02 GRID_T4-4Q 4 0 4 -" in flat, out
        assert ("VM default/vm-a (GRID_T4-8Q on node-a): no node can take it: node-b: host driver 580.105.06, "
                "node-a has 580.95.02; node-c: offers no GRID_T4-8Q") in flat, out
        code, out = vg(capsys, c, "-o", "json", plugin=True)
        doc = json.loads(out)
        assert doc["liveMigration"] == [{"vm": "default/vm-a", "node": "node-a", "resource": RES,
                                         "migration": "migratable", "targets": [], "notTargets": {
                                             "node-b": "host driver 580.105.06, node-a has 580.95.02",
                                             "node-c": "offers no GRID_T4-8Q"}}]
        # a node with the driver and the type, free: a target
        c.node("node-b").sim.host.upgrade_driver(DRIVER)
        c.node("node-b").agent_free()  # its next resync labels the node again
        code, out = vg(capsys, c, plugin=True)
        assert "VM default/vm-a (GRID_T4-8Q on node-a): can move to node-b; not to node-c: offers no" in \
            " ".join(out.split()), out
        # node-c's layout turns to T4-8Q: its agent creates them and its plugin advertises them
        c.node("node-c").layout_file.write_text(LAYOUT)
        c.node("node-c").agent_free()
        c.node("node-c").kubelet.wait_for_devices(RES, lambda devs: len(devs) == 4)
        c.node("node-c").kubelet.sync_node_status()
        code, out = vg(capsys, c, plugin=True)
        assert "VM default/vm-a (GRID_T4-8Q on node-a): can move to node-b, node-c" in " ".join(out.split()), out


def test_drain_migrate_refuses_before_anything_moves_when_no_node_can_take_a_vm(capsys):
    with cluster(("node-a", LAYOUT, None), ("node-b", LAYOUT, OTHER_DRIVER), ("node-c", LAYOUT_4Q, None)) as c:
        _vm_on_a(c)
        code, out = vg(capsys, c, "drain", "--node", "node-a", "--migrate", "--timeout", "5")
        assert code == 3, out
        flat = " ".join(out.split())
        assert "VM default/vm-a (GRID_T4-8Q on node-a): no node can take it: node-b: host driver 580.105.06" in flat
        assert "nothing was cordoned or migrated" in flat, out
        migs = c.rest("GET", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations")["items"]
        assert migs == []
        node_a = c.rest("GET", "/api/v1/nodes/node-a")["metadata"]
        assert "vgpu.kubevirt.io/cordon" not in (node_a.get("annotations") or {})
        code, out = vg(capsys, c, "drain", "--node", "node-a", "--migrate", "-o", "json")
        assert code == 3 and json.loads(out)["refused"]["default/vm-a"]["notTargets"]["node-c"] == \
            "offers no GRID_T4-8Q"


def _until(what: str, cond, seconds: float = 30.0):
    pause = threading.Event()
    for _ in range(int(seconds / 0.05)):
        got = cond()
        if got:
            return got
        pause.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_drain_migrate_moves_a_device_plugin_vm_to_the_node_that_can_take_it(capsys):
    """The whole handover under ``drain --node --migrate``: one migration object, the test playing
    KubeVirt (target pod and QEMU on node-b, the source's QEMU and pod gone), the drain done once the
    source pod is gone and reporting the VM migrated to node-b; node-c (no T4-8Q) was never a choice."""
    with cluster(("node-a", LAYOUT, None), ("node-b", LAYOUT, None), ("node-c", LAYOUT_4Q, None)) as c:
        start = {name: {v.id for v in n.inventory().all_vgpus() if v.type_name == TYPE} for name, n in c.nodes.items()}
        _vm_on_a(c)
        c.node("node-a").run_loop()  # the agent acts on the cordon
        result: dict = {}
        drain = threading.Thread(target=lambda: result.update(code=main(
            ["drain", "--node", "node-a", "--migrate", "--timeout", "60", "-o", "json",
             "--kubeconfig", c.kubeconfig()])), daemon=True)
        drain.start()
        mig_path = f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations"
        (mig,) = _until("the migration object", lambda: c.rest("GET", mig_path)["items"])
        assert mig["spec"]["vmiName"] == "vm-a"
        c.rest("PATCH", f"{mig_path}/{mig['metadata']['name']}/status", {"status": {"phase": "Running"}}, patch=True)
        answer = start_pod(c, "node-b", launcher_pod("vm-a", "virt-launcher-vm-a-tgt", "node-b",
                                                     migration=mig["metadata"]["uid"]))
        c.node("node-a").stop_qemu(f"{NS}/virt-launcher-vm-a")
        delete_pod(c, "node-a", "virt-launcher-vm-a")
        c.rest("PATCH", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstances/vm-a/status", {"status": {
            "nodeName": "node-b", "migrationState": {"targetNode": "node-b", "completed": True}}}, patch=True)
        c.rest("PATCH", f"{mig_path}/{mig['metadata']['name']}/status", {"status": {
            "phase": "Succeeded", "migrationState": {"targetNode": "node-b"}}}, patch=True)
        drain.join(90)
        out = capsys.readouterr().out
        report = json.loads(out[out.index("{"):out.rindex("}") + 1])
        assert result["code"] == 0 and report["drained"], out
        assert not [n for n in report["notes"] if "not republished" in n], out  # the agent acted on the cordon
        assert report["migrations"] == {"default/vm-a": {"result": "migrated", "node": "node-b"}}
        assert [h["vm"] for h in report["heldBefore"]] == ["default/vm-a"]
        assert len(c.rest("GET", mig_path)["items"]) == 1
        # drained, node-a admits no new pod: its free vGPUs are withheld (Unhealthy) until uncordoned
        a = c.node("node-a")
        a.daemon.resync()
        a.kubelet.wait_for(lambda: a.kubelet.healthy(RES) == [])
        vg(capsys, c, "uncordon", "--node", "node-a", "--wait", "0")
        a.daemon.resync()
        a.kubelet.wait_for(lambda: set(a.kubelet.healthy(RES)) == start["node-a"])
        assert check(c, start) == {"node-a": {}, "node-b": {"default/virt-launcher-vm-a-tgt": answer["ids"]},
                                   "node-c": {}}


def test_a_gpu_drain_says_the_nodes_device_plugin_pods_are_not_attributed_to_it(capsys):
    """From the API a device-plugin vGPU is not tied to a GPU: a drain of one GPU (here a DRA GPU of the
    same node) does not wait for them, and says so, with the whole node's drain that includes them."""
    mixed = yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "vgpu", "vgpus": {"T4-8Q": 2}}, {"index": 2, "mode": "dra"}]}})
    with cluster(("node-a", mixed, None), ("node-b", LAYOUT, None)) as c:
        _vm_on_a(c)
        code, out = vg(capsys, c, "drain", "node-a/2", "--migrate", "--wait", "0", "--timeout", "0")
        assert code == 0, out
        assert ("note: node-a: 1 pod(s) hold device-plugin devices not attributed to a GPU; not waited for "
                "(vgpuctl drain --node node-a includes them)") in " ".join(out.split()), out
        assert c.rest("GET", f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations")["items"] == []


def test_a_cordon_withholds_the_free_device_plugin_vgpus_and_keeps_the_held_one(capsys):
    """``vgpuctl cordon --node NODE`` on the device-plugin path (what ``drain --node`` sets): every free vGPU is
    advertised Unhealthy (out of the Node's allocatable, so the kubelet admits no new pod on it), the VM
    keeps its vGPU, ``Allocate`` refuses any device of a cordoned GPU; ``uncordon`` gives them back. (A
    GPU alone cannot be named there: the cordon finds GPUs in the DRA slices, which this path has not.)"""
    with cluster(("node-a", LAYOUT, None)) as c:
        _vm_on_a(c)
        node = c.node("node-a")
        (vm_dev,) = node.kubelet.allocated()[f"{NS}/virt-launcher-vm-a"][RES]
        every = {v.id for v in node.inventory().all_vgpus() if v.type_name == TYPE}
        assert len(every) == 4 and set(node.kubelet.healthy(RES)) == every
        code, out = vg(capsys, c, "cordon", "--node", "node-a", "--wait", "0")
        assert code == 0, out
        node.daemon.resync()
        node.kubelet.wait_for(lambda: node.kubelet.healthy(RES) == [vm_dev])
        node.kubelet.sync_node_status()
        assert c.rest("GET", "/api/v1/nodes/node-a")["status"]["allocatable"][RES] == "1"
        assert node.kubelet.allocated()[f"{NS}/virt-launcher-vm-a"][RES] == [vm_dev]  # the VM keeps it
        with node.kubelet.device_plugin(RES) as plugin, pytest.raises(Exception, match="cordoned"):
            plugin.allocate([sorted(every - {vm_dev})[:1]])
        with pytest.raises(AdmissionError):
            start_pod(c, "node-a", launcher_pod("vm-b", "virt-launcher-vm-b", "node-a"))
        code, out = vg(capsys, c, "uncordon", "--node", "node-a", "--wait", "0")
        assert code in (0, 3) and "recorded" in out, out  # 3: not yet republished (no wait asked)
        node.daemon.resync()
        node.kubelet.wait_for(lambda: set(node.kubelet.healthy(RES)) == every)
        answer = start_pod(c, "node-a", launcher_pod("vm-c", "virt-launcher-vm-c", "node-a"))
        assert answer["ids"][0] in every - {vm_dev}
