"""A lost GPU on the real 1.37 control plane (issue #40.4): with the opt-in ``serve --gpu-lost-effect
NoExecute`` the agent publishes the GPU's devices with a ``vgpu.kubevirt.io/gpu-lost`` NoExecute taint
and kube-controller-manager's device-taint eviction deletes the pod whose claim holds it; by default the
taint is NoSchedule and the pod stays. The agent runs as ``vgpuctl serve`` runs it (its loop in a
thread, its health poll); the fault is raised as ``vgpuctl sim health ADDRESS lost`` raises it. No
kubelet: an evicted pod is left terminating (or gone).

Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from mdev_manager.sim import SimIO
from tests.support.controlplane import RealControlPlane
from tests.support.deploy import Kubectl, needs_kubectl
from tests.support.dra import DRIVER, make_node, pool_slices, short_tmp
from tests.system.test_real_controlplane import (
    VGPUCTL,
    Serving,
    _vgpu_pod,
    evicted,
    node_for,
    render,
    wait_for,
)

pytestmark = [pytest.mark.go, needs_kubectl]

LOST = f"{DRIVER}/gpu-lost"


@pytest.fixture(scope="module")
def cp():
    with RealControlPlane() as c:
        yield c


@pytest.fixture
def k(cp, tmp_path):
    return Kubectl(cp.kubeconfig_path, tmp_path)


def _daemon(node, cp, base: Path, effect: str) -> Daemon:
    # the periodic resync polls each GPU's health first (serve --resync): a second here, not 30
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=0,
                      resync_seconds=1.0, health_poll_seconds=0.1, gpu_lost_effect=effect)
    return Daemon(cfg, node.env, SimIO(node.host), cp.api_client())


def _scheduled(cp, k, name: str, template: str, daemon: Daemon) -> tuple[str, str]:
    """The pod made, scheduled by kube-scheduler; (its claim's device, that device's GPU)."""
    k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod(name, template)))
    wait_for(lambda: cp.get_object("pods", name, "default")["spec"].get("nodeName"), f"{name} scheduled", 90)
    claim = wait_for(lambda: (cp.get_object("pods", name, "default")["status"].get("resourceClaimStatuses")
                              or [{}])[0].get("resourceClaimName"), f"{name}'s claim", 30)
    results = wait_for(lambda: ((cp.get_object("resourceclaims", claim, "default") or {}).get("status", {})
                                .get("allocation", {}).get("devices", {}).get("results")), f"{claim} allocated", 30)
    device = results[0]["device"]
    return device, daemon._pool.device(device).gpu


def _lost_taints(cp, node: str, device: str) -> list[dict]:
    return [t for s in pool_slices(cp, node=node) for d in s["spec"].get("devices", []) if d["name"] == device
            for t in d.get("taints") or [] if t["key"] == LOST]


def _setup(cp, k, base: Path):
    node = make_node(base / "n", "default", version=(1, 37))
    if cp.get_object("nodes", node.node) is None:
        cp.add(node_for(node.node))
    k("apply", "-f", "-", stdin=render("deviceclasses"))
    k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=L40S-8Q", "--set", "name=l40s-h"))
    k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C", "--set", "name=a100-h"))
    return node


def test_opt_in_no_execute_evicts_the_pod_whose_gpu_is_lost(cp, k):
    with short_tmp("cph") as base:
        node = _setup(cp, k, base)
        with Serving(_daemon(node, cp, base, "NoExecute")) as daemon:
            device, gpu = _scheduled(cp, k, "lost-evicted", "l40s-h", daemon)
            node.host.health(gpu, "lost")  # vgpuctl sim health GPU lost
            (taint,) = wait_for(lambda: _lost_taints(cp, node.node, device), "the gpu-lost taint published", 30)
            assert taint["effect"] == "NoExecute"
            seen: list[dict] = []
            wait_for(lambda: evicted(cp, "lost-evicted", seen), "evicted", 60)
            if seen:  # seen terminating (a pod deleted outright is only seen gone)
                reasons = {c["type"]: c.get("reason") for c in seen[-1]["status"].get("conditions") or []}
                assert reasons.get("DisruptionTarget") == "DeletionByDeviceTaintManager", reasons
            node.host.health(gpu, "lost", clear=True)


def test_by_default_a_lost_gpu_is_no_schedule_and_its_pod_stays(cp, k):
    """The barrier: a second pod, on another GPU that an admin cordons NoExecute after the loss was
    published, is evicted by the same controller; the first pod is still there after that."""
    with short_tmp("cpk") as base:
        node = _setup(cp, k, base)
        with Serving(_daemon(node, cp, base, "NoSchedule")) as daemon:
            device, gpu = _scheduled(cp, k, "lost-stays", "l40s-h", daemon)
            _other, other_gpu = _scheduled(cp, k, "cordon-evicted", "a100-h", daemon)
            assert other_gpu != gpu
            node.host.health(gpu, "lost")
            (taint,) = wait_for(lambda: _lost_taints(cp, node.node, device), "the gpu-lost taint published", 30)
            assert taint["effect"] == "NoSchedule"
            target = f"{node.node}/{other_gpu}"
            kc = ["--kubeconfig", str(cp.kubeconfig_path), "--wait", "30"]
            out = subprocess.run([*VGPUCTL, "cordon", target, "--effect", "NoExecute", *kc],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
            try:
                wait_for(lambda: evicted(cp, "cordon-evicted", []), "the cordoned GPU's pod evicted", 60)
                pod = cp.get_object("pods", "lost-stays", "default")
                assert pod is not None and not pod["metadata"].get("deletionTimestamp"), pod and pod["metadata"]
            finally:
                subprocess.run([*VGPUCTL, "uncordon", target, *kc], capture_output=True, text=True, timeout=120)
                node.host.health(gpu, "lost", clear=True)
            k("delete", "pod", "lost-stays", "--wait=false")
