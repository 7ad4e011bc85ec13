"""Cordon, drain and uncordon a GPU (issue #26, point 2) on the simulated cluster: the real agent
(its run loop: the cordon reaches it through the watch of its Node), the local API server, the
scheduler model and the kubelet. A cordoned GPU takes no new claim while another GPU serves it;
``drain`` lists a running pod and a VM, evicts the pod only when asked, waits for the VM (which
cannot live-migrate) and is done once it is gone; ``uncordon`` gives the GPU back. Where the server
drops device taints (1.35 defaults) the agent withdraws the GPU's free devices and keeps the held one.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest

from dra_bridge.api.names import ANNOTATION_CORDON, TAINT_KEY_CORDON
from dra_bridge.sim.cluster import SimCluster
from dra_bridge.sim.controlplane import ControlPlane
from kubevirt_templates.render import render
from vgpuctl.main import main

DRIVER = "vgpu.kubevirt.io"
T4_0, T4_1 = "0000:10:00.0", "0000:13:00.0"


def t4(profile: str, i: int, gpu_index: int | None = None, labels: dict | None = None) -> list[dict]:
    """A claim template for ``profile`` (on GPU ``gpu_index`` if given) and a pod using it."""
    (t,) = render("claim-template", {"profile": profile, "name": f"t{i}"})
    if gpu_index is not None:
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"].append(
            {"cel": {"expression": f'device.attributes["{DRIVER}"].gpuIndex == {gpu_index}'}})
    (pod,) = render("passthrough-pod", {"name": f"w{i}", "claim_template": f"t{i}"})
    pod["metadata"]["labels"] = dict(labels or {})
    return [t, pod]


@contextmanager
def agent_running(c: SimCluster):
    """The node agent's own loop (``Daemon.run``): it resyncs when its Node's cordon changes."""
    t = threading.Thread(target=c.daemon.run, name="agent", daemon=True)
    t.start()
    try:
        yield
    finally:
        c.daemon.stop()
        t.join(30)


def vg(capsys, c: SimCluster, *args: str) -> tuple[int, str]:
    """``vgpuctl ARGS --kubeconfig`` the cluster's, in this process; every line fits 80 columns."""
    code = main([*args, "--kubeconfig", str(c.srv.kubeconfig(c.base / "kubeconfig"))])
    out, err = capsys.readouterr()
    if "wide" not in args:
        assert all(len(line) <= 80 for line in out.splitlines()), out
    return code, out + err


def gpu_devices(c: SimCluster, index: int) -> list[dict]:
    return [d for s in c.slices() for d in s["spec"].get("devices") or [] if d["attributes"]["gpuIndex"]["int"] == index]


def wait_for(what: str, cond, seconds: float = 30.0) -> None:
    pause = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if cond():
            return
        pause.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_cordoned_gpu_takes_no_new_claim_while_another_serves_and_uncordon_gives_it_back(capsys):
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c):
        code, out = vg(capsys, c, "cordon", f"{c.node}/0", "--reason", "driver upgrade")
        assert code == 0, out
        assert f"{c.node}/0" in out and T4_0 in out and "NoSchedule" in out and "cordoned:" in out
        note = json.loads(c.rest("GET", f"/api/v1/nodes/{c.node}")["metadata"]["annotations"][ANNOTATION_CORDON])
        assert note[T4_0]["reason"] == "driver upgrade" and note[T4_0]["index"] == 0
        assert all(d["taints"][0]["key"] == TAINT_KEY_CORDON for d in gpu_devices(c, 0))  # the server keeps taints
        assert not any(d.get("taints") for d in gpu_devices(c, 1))
        pinned = c.launch(t4("T4-8Q", 1, gpu_index=0), name="pinned")
        assert pinned.phase == "Pending" and f"{TAINT_KEY_CORDON}=:NoSchedule, not tolerated" in pinned.reason
        served = c.launch(t4("T4-8Q", 2), name="served")
        assert served.phase == "Running", served.reason
        assert [d.gpu for d in served.devices] == [T4_1]  # GPU 1 serves the profile meanwhile

        code, out = vg(capsys, c, "uncordon", f"{c.node}/0")
        assert code == 0 and "uncordoned" in out, out
        assert not any(d.get("taints") for d in gpu_devices(c, 0))
        assert c.schedule(pinned) and c.run(pinned), pinned.reason
        assert [d.gpu for d in pinned.devices] == [T4_0]


def test_drain_lists_its_holders_evicts_pods_only_when_asked_and_waits_for_the_vm(capsys, monkeypatch):
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c), ControlPlane(c):
        for obj in t4("T4-8Q", 1, gpu_index=0) + t4("T4-8Q", 2, gpu_index=0, labels={"vm.kubevirt.io/name": "vm-a",
                                                                                 "kubevirt.io": "virt-launcher"}):
            path = ("/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates" if obj["kind"] != "Pod"
                    else "/api/v1/namespaces/default/pods")
            c.rest("POST", path, obj)
        c.rest("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances", {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "vm-a"},
            "spec": {}, "status": {"conditions": [{"type": "LiveMigratable", "status": "False",
                                                   "reason": "HostDeviceNotLiveMigratable"}]}})

        def phase(pod: str) -> str | None:
            pods = {p["metadata"]["name"]: p for p in c.rest("GET", "/api/v1/namespaces/default/pods")["items"]}
            return (pods[pod].get("status") or {}).get("phase") if pod in pods else None

        wait_for("both pods running", lambda: phase("w1") == phase("w2") == "Running")
        before = {v.id for v in c.inventory().all_vgpus()}

        import vgpuctl.cli.gpus as gpus_module

        wait_until, said = gpus_module.wait_until, []

        def waiting(*a, **kw):  # what a pipe (a CI log) has shown when the wait starts (newcomer finding 6)
            now = capsys.readouterr()
            said.append(now.out + now.err)
            print(now.out, end="")
            return wait_until(*a, **kw)

        monkeypatch.setattr(gpus_module, "wait_until", waiting)
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--timeout", "0")  # lists, evicts nothing
        assert code == 3, out
        assert "waiting up to" not in out and out.count("pod default/w1") == 1, out  # no wait: the report alone
        assert "pod default/w1" in out and "VM default/vm-a" in out and "not migratable" in out and "not drained" in out
        assert phase("w1") == "Running" and {v.id for v in c.inventory().all_vgpus()} == before

        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--evict", "--timeout", "5", "-o", "json")
        # a pipe is told at the start what the wait is for (stderr beside -o json)
        assert "waiting up to 5s for 2 holder(s) to leave (evicting their pods):" in said[-1], said
        assert "pod default/w1" in said[-1], said
        report = json.loads(out[:out.rindex("}") + 1])
        assert code == 3 and report["evicted"] == {"default/w1": "accepted"}  # the VM's pod is not evicted
        assert [h["vm"] for g in report["gpus"] for h in g["holders"]] == ["default/vm-a"]
        assert phase("w1") is None and phase("w2") == "Running"
        assert len(c.inventory().all_vgpus()) == len(before) - 1  # the pod's vGPU went with it, the VM's stays

        c.rest("DELETE", "/api/v1/namespaces/default/pods/w2")  # the VM is shut down (or migrated) by its owner
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--timeout", "30")
        assert code == 0 and "drained" in out, out
        assert all(d["taints"][0]["key"] == TAINT_KEY_CORDON for d in gpu_devices(c, 0))  # still cordoned
        code, out = vg(capsys, c, "uncordon", f"{c.node}/0")
        assert code == 0, out


def test_without_device_taints_the_agent_withdraws_the_free_devices_and_keeps_the_held_one(capsys):
    with SimCluster(render=render, version="1.35", feature_gates={}, health=False) as c, agent_running(c):
        assert c.daemon.kept.taints is False  # 1.35's default gates drop devices[].taints
        held = c.launch(t4("T4-8Q", 1, gpu_index=0), name="held")
        assert held.phase == "Running", held.reason
        published = {d["name"] for d in gpu_devices(c, 0)}
        assert len(published) > 1

        code, out = vg(capsys, c, "cordon", f"{c.node}/0")
        assert code == 0 and "NoSchedule" in out, out
        assert [d["name"] for d in gpu_devices(c, 0)] == [held.devices[0].device]  # the held device stays
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--timeout", "0", "-o", "wide")
        assert code == 3 and "withdrawn" in out and held.pod in out, out
        waiting = c.launch(t4("T4-8Q", 2, gpu_index=0), name="waiting")
        assert waiting.phase == "Pending"
        assert [d.gpu for d in c.launch(t4("T4-8Q", 3), name="served").devices] == [T4_1]

        code, out = vg(capsys, c, "uncordon", f"{c.node}/0")
        assert code == 0, out
        assert {d["name"] for d in gpu_devices(c, 0)} == published
        assert c.schedule(waiting) and c.run(waiting), waiting.reason


def test_no_execute_lets_the_clusters_device_taint_controller_evict_and_a_toleration_stays(capsys):
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c), ControlPlane(c):
        (t, pod) = t4("T4-8Q", 1, gpu_index=0)
        (t2, stays) = t4("T4-8Q", 2, gpu_index=0)
        t2["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": TAINT_KEY_CORDON, "operator": "Exists", "effect": "NoExecute"}]  # the admin's test workload
        for obj in (t, t2):
            c.rest("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates", obj)
        for obj in (pod, stays):
            c.rest("POST", "/api/v1/namespaces/default/pods", obj)
        pods = lambda: {p["metadata"]["name"]: (p.get("status") or {}).get("phase")  # noqa: E731
                        for p in c.rest("GET", "/api/v1/namespaces/default/pods")["items"]}
        wait_for("both pods running", lambda: pods() == {"w1": "Running", "w2": "Running"})
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--effect", "NoExecute", "--timeout", "5")
        assert code == 3 and "NoExecute" in out, out  # the tolerating pod stays, and is waited for
        wait_for("the untolerating pod evicted", lambda: pods() == {"w2": "Running"})
        c.rest("DELETE", "/api/v1/namespaces/default/pods/w2")
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--effect", "NoExecute", "--timeout", "30")
        assert code == 0, out


def test_cordon_says_what_its_effect_does_to_what_runs_there(capsys):
    """NoSchedule keeps what runs; NoExecute, where the server keeps taints, has the cluster evict (issue #36)."""
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c):
        code, out = vg(capsys, c, "cordon", f"{c.node}/0")
        assert code == 0 and "what runs there keeps running" in out, out
        code, out = vg(capsys, c, "cordon", f"{c.node}/1", "--effect", "NoExecute")
        assert code == 0 and "NoExecute" in out, out
        assert "keeps running" not in out and "the cluster evicts the pods and VMs" in " ".join(out.split()), out


@pytest.mark.parametrize("args, message", [
    (["cordon"], "name a GPU"), (["cordon", "sim-node-1/7"], "node 'sim-node-1' publishes no such GPU; its GPUs: 0"),
    (["cordon", "0"], "which node?"), (["uncordon", "--node", "nowhere"], "node 'nowhere' not found")])
def test_a_gpu_that_is_not_there_is_bad_input(capsys, message, args):
    with SimCluster(render=render, version="1.37", health=False) as c:
        code, out = vg(capsys, c, *args)
        assert code == 2 and message in out, out


def _vm_on_gpu0(c: SimCluster, i: int, vm: str, *, migratable: bool, plan: str | None = None) -> None:
    """A VM's virt-launcher pod holding a T4-8Q of GPU 0, and its VMI (LiveMigratable as given; the
    simulated migration controller follows ``plan``)."""
    for obj in t4("T4-8Q", i, gpu_index=0, labels={"vm.kubevirt.io/name": vm, "kubevirt.io": "virt-launcher"}):
        path = ("/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates" if obj["kind"] != "Pod"
                else "/api/v1/namespaces/default/pods")
        c.rest("POST", path, obj)
    cond = {"type": "LiveMigratable", "status": str(migratable)}
    if not migratable:
        cond["reason"] = "HostDeviceNotLiveMigratable"
    c.rest("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": vm, "annotations": {"sim.vgpuctl.io/migration": plan} if plan else {}},
        "spec": {}, "status": {"nodeName": c.node, "conditions": [cond]}})


def _running(c: SimCluster, *pods: str) -> bool:
    items = {p["metadata"]["name"]: p for p in c.rest("GET", "/api/v1/namespaces/default/pods")["items"]}
    return all((items.get(p, {}).get("status") or {}).get("phase") == "Running" for p in pods)


def test_drain_migrate_moves_the_migratable_vms_and_says_what_became_of_each(capsys):
    """Issue #33.3: per VM, migrated to node X, failed (reason) or not migratable (reason); a migration
    that does not end in time is said so; pods are left alone without --evict."""
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c), ControlPlane(c):
        _vm_on_gpu0(c, 1, "vm-moves", migratable=True, plan="succeed:node-b")
        _vm_on_gpu0(c, 2, "vm-pinned", migratable=False)
        wait_for("both VMs' pods running", lambda: _running(c, "w1", "w2"))
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--migrate", "--timeout", "20", "-o", "json")
        report = json.loads(out[:out.rindex("}") + 1])
        assert code == 3  # the pinned VM still holds GPU 0
        assert report["migrations"] == {
            "default/vm-moves": {"result": "migrated", "node": "node-b"},
            "default/vm-pinned": {"result": "not-migratable", "reason": "HostDeviceNotLiveMigratable"}}
        assert report["evicted"] == {}
        migs = c.rest("GET", "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations")["items"]
        assert [m["spec"]["vmiName"] for m in migs] == ["vm-moves"]  # one migration, for the migratable VM
        assert [h["vm"] for g in report["gpus"] for h in g["holders"]] == ["default/vm-pinned"]


@pytest.mark.parametrize(("plan", "result", "line"), [
    ("fail:target has no GRID T4-8Q free", "failed", "VM default/vm-a: migration failed (target has no GRID T4-8Q free)"),
    ("hang", "timed-out", "VM default/vm-a: migration not finished in time (phase Running)"),
])
def test_drain_migrate_reports_a_failed_or_unfinished_migration(capsys, plan, result, line):
    with SimCluster(render=render, version="1.37", health=False) as c, agent_running(c), ControlPlane(c):
        _vm_on_gpu0(c, 1, "vm-a", migratable=True, plan=plan)
        wait_for("the VM's pod running", lambda: _running(c, "w1"))
        before = {v.id for v in c.inventory().all_vgpus()}
        code, out = vg(capsys, c, "drain", f"{c.node}/0", "--migrate", "--timeout", "3")
        assert code == 3 and line in out, out
        assert _running(c, "w1") and {v.id for v in c.inventory().all_vgpus()} == before  # the VM keeps its vGPU
