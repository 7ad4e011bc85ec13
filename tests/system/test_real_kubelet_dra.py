"""The node side on Kubernetes' own code (issue #39.3): the kubelet's DRA manager drives ``vgpuctl serve``.

On the real control plane (tests/support/controlplane.py), for pods the real kube-scheduler placed:
``kubelet-dra`` (tests/kubelet/k8s-1.37, built from k8s.io/kubernetes v1.37.2) runs the kubelet's
pkg/kubelet/cm/dra manager and pkg/kubelet/pluginmanager for the node; ``vgpuctl --simulate serve``
runs as its own process on a simulated host. The manager finds the agent's registration socket in
plugins_registry/, registers it, and calls NodePrepareResources / NodeUnprepareResources on its DRA
socket, keeping its claim info cache and checkpoint as a kubelet does.

Stood in for, there being no container runtime (kubelet-dra's header says how): the pod workers
(a pod bound to the node is prepared; one deleted, unprepared), the runtime (containers count as
started once prepared: the pod is written Running by the node side, with the CDI IDs a runtime would get
printed), the status manager's final delete of a terminated pod, and, after a restart, the first
round of the manager's own reconcile loop (every 60 s in v1.37.2, its first before the driver has
registered): the pods the checkpoint names that are gone are unprepared once the driver registers.

Skipped where Go is absent (failed under ``CI=true``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dra_bridge.sim.kubelet import node_object
from mdev_manager.discovery import discover
from mdev_manager.models import Vgpu
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node
from tests.support.controlplane import RealControlPlane
from tests.support.deploy import Kubectl, needs_kubectl
from tests.support.dra import DRA_LAYOUT, DRIVER, cdi_device, short_tmp
from tests.support.kubelet_dra import KubeletDra, binary

pytestmark = [pytest.mark.go, needs_kubectl]

VGPUCTL = [sys.executable, "-m", "vgpuctl.main"]
TEMPLATE = "vgpu-a100-4c"
A100 = "0000:16:00.0"  # the default preset's A100 40GB (gpu-2)


@dataclass
class Node:
    cp: RealControlPlane
    name: str
    base: Path
    kubelet: KubeletDra
    kubectl: Kubectl

    @property
    def root(self) -> Path:
        return self.base / "kl"

    @property
    def cdi_root(self) -> Path:
        return self.base / "cdi"

    def vgpus(self) -> list[Vgpu]:
        """The vGPUs on the simulated host now, as discovery reads its sysfs."""
        sim = sim_node(self.base / "sim", None)
        return discover(sim.env, sim.io, node=self.name).all_vgpus()

    def checkpoint(self) -> dict:
        """The DRA manager's checkpoint (the kubelet's format: a JSON envelope of a JSON document)."""
        return json.loads(json.loads((self.root / "dra_manager_state").read_text())["Data"])

    def claim(self, pod: dict) -> dict:
        (st,) = pod["status"]["resourceClaimStatuses"]
        return self.cp.get_object("resourceclaims", st["resourceClaimName"], "default")


def render(*args: str) -> str:
    return subprocess.run([*VGPUCTL, "render", *args], capture_output=True, text=True, check=True).stdout


def vgpu_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never",
                     "resourceClaims": [{"name": "vgpu", "resourceClaimTemplateName": TEMPLATE}],
                     "containers": [{"name": "vm", "image": "registry.invalid/virt-launcher",
                                     "resources": {"claims": [{"name": "vgpu"}]}}]}}


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """The real control plane; a simulated host with the ``dra`` layout, its Node object, kubelet-dra
    for it and ``vgpuctl --simulate serve`` (started after kubelet-dra, which wipes the node's
    ResourceSlices when it starts, as the kubelet does); DeviceClasses and an A100-4C claim template."""
    binary()  # skip (fail under CI=true) before starting anything
    with short_tmp("kd") as base, RealControlPlane() as cp:
        sim = sim_node(base / "sim", "default")
        assert reconcile(sim.env, sim.io, DRA_LAYOUT, node=sim.node).ok
        name = sim.node
        obj = node_object(name, kubelet_version="v1.37.2")
        obj["status"]["capacity"] = obj["status"]["allocatable"] = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        cp.add(obj)
        (base / "kl").mkdir()
        kubelet = KubeletDra(cp.kubeconfig_path, name, base / "kl", base / "kubelet-dra.log").start()
        kubelet.event("ready")
        serve_log = open(base / "serve.log", "wb")
        # --resync 5: after kubelet-dra's restart wiped the slices, the agent publishes them again at
        # its next resync (upstream's slice controller waits its 30 s sync delay after a change)
        serve = subprocess.Popen(
            [*VGPUCTL, "--simulate", "default", "--sim-dir", str(base / "sim"), "serve", "--node-name", name,
             "--kubeconfig", str(cp.kubeconfig_path), "--kubelet-root", str(base / "kl"),
             "--cdi-root", str(base / "cdi"), "--metrics-port", "0", "--resync", "5", "--plain-logs"],
            stdout=serve_log, stderr=subprocess.STDOUT)
        try:
            reg = kubelet.event("registered", "the plugin watcher registers vgpuctl serve")
            assert reg["driver"] == DRIVER
            assert reg["endpoint"] == str(base / "kl" / "plugins" / DRIVER / "dra.sock")
            (base / "home").mkdir()
            k = Kubectl(cp.kubeconfig_path, base / "home")
            k("apply", "-f", "-", stdin=render("deviceclasses"))
            k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C"))
            yield Node(cp, name, base, kubelet, k)
        finally:
            kubelet.stop()
            serve.terminate()
            serve.wait(30)
            serve_log.close()
            print((base / "serve.log").read_text()[-3000:])
            print(kubelet.log_tail())


def _prepared(node: Node, name: str) -> tuple[dict, dict]:
    """(the prepared event, the pod as the API server has it then) for a pod just created."""
    node.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(vgpu_pod(name)))
    event = node.kubelet.event("prepared", f"pod {name} prepared by the kubelet's DRA manager", pod=f"default/{name}")
    return event, node.cp.get_object("pods", name, "default")


def test_a_pod_the_scheduler_placed_is_prepared_by_the_kubelets_manager_and_unprepared_when_deleted(node):
    before = {v.id for v in node.vgpus()}
    event, pod = _prepared(node, "vm-1")
    # placed by kube-scheduler, on this node, its claim made by the controller and allocated there
    assert pod["spec"]["nodeName"] == node.name
    claim = node.claim(pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, node.name)
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    assert event["claims"] == [claim["metadata"]["uid"]]
    # the node side set the phase
    assert pod["status"]["phase"] == "Running"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    # the agent made the vGPU on the host, of the allocated device's GPU and type
    (made,) = [v for v in node.vgpus() if v.id not in before]
    assert (made.gpu, made.type_name.split()[-1]) == (A100, "A100-4C")
    # the CDI IDs the runtime would get, from the manager's cache, each resolving in the CDI files written
    ids = event["cdi"]["vm"]
    assert ids and all(cdi_device(node.cdi_root, i) for i in ids)
    # the device's health in the container's status: the agent's health stream, through the kubelet's
    # own client and cache (it streams from registration on, before any pod is placed)
    (status,) = pod["status"]["containerStatuses"]
    (health,) = status["allocatedResourcesStatus"]
    assert health["name"] == "claim:vgpu"
    assert [(r["resourceID"] in ids, r["health"]) for r in health["resources"]] == [(True, "Healthy")]
    # the manager's checkpoint holds the claim for the pod, with the device the scheduler allocated
    (held,) = [c for c in node.checkpoint()["ClaimInfoStateList"] if c["ClaimUID"] == claim["metadata"]["uid"]]
    assert list(held["PodUIDs"]) == [pod["metadata"]["uid"]]
    (dev,) = held["DriverState"][DRIVER]["Devices"]
    assert (dev["PoolName"], dev["DeviceName"], dev["CDIDeviceIDs"]) == (node.name, result["device"], ids)

    # a graceful delete: the node side unprepares, then deletes the pod
    node.kubectl("delete", "pod", "vm-1", "--wait=false")
    gone = node.kubelet.event("unprepared", "the deleted pod unprepared", uid=pod["metadata"]["uid"])
    assert (gone["why"], gone["claims"]) == ("terminating", [claim["metadata"]["uid"]])
    node.kubelet.event("deleted", "the terminated pod deleted by the node side", uid=pod["metadata"]["uid"])
    assert node.cp.get_object("pods", "vm-1", "default") is None
    assert {v.id for v in node.vgpus()} == before
    assert not list(node.cdi_root.glob(f"*{claim['metadata']['uid']}*"))
    assert [c for c in node.checkpoint()["ClaimInfoStateList"] if c["ClaimUID"] == claim["metadata"]["uid"]] == []


def test_a_restart_rereads_the_checkpoint_and_unprepares_a_pod_deleted_while_it_was_down(node):
    before = {v.id for v in node.vgpus()}
    kept_event, kept = _prepared(node, "vm-kept")
    lost_event, lost = _prepared(node, "vm-lost")
    made = {v.id: v for v in node.vgpus() if v.id not in before}
    assert len(made) == 2
    kept_uid, lost_uid = kept["metadata"]["uid"], lost["metadata"]["uid"]

    assert node.kubelet.stop() == 0
    # deleted outright while the node side is down: nobody unprepares it, its vGPU stays for now
    node.kubectl("delete", "pod", "vm-lost", "--grace-period=0", "--force")
    assert node.cp.get_object("pods", "vm-lost", "default") is None
    assert set(made) <= {v.id for v in node.vgpus()}

    node.kubelet.start()
    held = node.kubelet.event("checkpoint")["pods"]
    assert {u: p["claims"] for u, p in held.items()} == {kept_uid: kept_event["claims"], lost_uid: lost_event["claims"]}
    # the pod given to UnprepareResources carries only its UID: the claim comes from the checkpoint
    gone = node.kubelet.event("unprepared", "the pod deleted while down unprepared after the restart", uid=lost_uid)
    assert (gone["why"], gone["claims"]) == ("gone while stopped", lost_event["claims"])
    left = {v.id for v in node.vgpus()} - before
    assert len(left) == 1 and left < set(made)  # the lost pod's vGPU removed, the kept pod's there
    # the pod still bound is prepared again (the manager restores its entries unprepared and calls
    # NodePrepareResources again): the agent answers the same devices, the same CDI IDs, no new vGPU
    again = node.kubelet.event("prepared", "the pod still bound, after the restart", uid=kept_uid)
    assert (again["claims"], again["cdi"]) == (kept_event["claims"], kept_event["cdi"])
    assert {v.id for v in node.vgpus()} - before == left
    assert [c["ClaimUID"] for c in node.checkpoint()["ClaimInfoStateList"]] == kept_event["claims"]

    # the node goes on: a new pod is placed (the agent published again what the restart wiped) and prepared
    event, pod = _prepared(node, "vm-after")
    assert pod["spec"]["nodeName"] == node.name and event["cdi"]["vm"]
    for name, uid in (("vm-kept", kept_uid), ("vm-after", pod["metadata"]["uid"])):
        node.kubectl("delete", "pod", name, "--wait=false")
        node.kubelet.event("unprepared", f"{name} unprepared", uid=uid)
    assert {v.id for v in node.vgpus()} == before
