"""A seeded random stream of mixed T4 sizes on the real control plane of 1.37 (issue #36.2, #36.3):
kube-scheduler allocates with binding conditions and waits in PreBind for the verdicts of
``vgpuctl serve``'s daemon (its loop and binding thread running, ``resync_seconds=2``); the
kubelet's side is the kubelet model over the agent's sockets. Every pod the scheduler binds is
prepared, no GPU holds two sizes, and once every pod is gone both T4 GPUs offer every size again
within one resync interval (and the scheduler's next attempt).

Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import random
import re

import pytest

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.sim.kubelet import KubeletClient
from mdev_manager.sim import SimIO
from tests.support.controlplane import RealControlPlane
from tests.support.deploy import Kubectl, needs_kubectl
from tests.support.dra import make_node, short_tmp
from tests.system.test_real_controlplane import Serving, node_for, render, wait_for

pytestmark = [pytest.mark.go, needs_kubectl]

PROFILES = ["T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q"]
RESYNC = 2.0
STEPS = 6


def _pod(name: str, template: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "vgpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "vm", "image": "registry.invalid/virt-launcher",
                                     "resources": {"claims": [{"name": "vgpu"}]}}]}}


def _template(profile: str) -> str:
    return f"t-{profile.lower()}"


def _t4_sizes(cp: RealControlPlane, node: str) -> dict[int, set[str]]:
    """T4 GPU index -> the memory sizes its published vGPU devices offer."""
    out: dict[int, set[str]] = {}
    for s in cp.objects("resourceslices"):
        if s["spec"].get("nodeName") != node:
            continue
        for d in s["spec"].get("devices") or []:
            a = d.get("attributes") or {}
            if (a.get("productName") or {}).get("string", "").find("T4") >= 0 and \
                    (a.get("type") or {}).get("string") == "vgpu":
                out.setdefault(a["gpuIndex"]["int"], set()).add(d["capacity"]["memory"]["value"])
    return out


def test_a_random_stream_through_the_real_scheduler_never_mixes_sizes_at_prepare(tmp_path):
    """The templates go in with kubectl, as a user's do: the opaque VgpuConfig the scheduler copies
    into each allocation is then stored as compact JSON, which kube-apiserver's merge patch of the
    agent's ``status.devices`` re-encodes unchanged (a body with spaces, as the Python client sends,
    would read as a change of the allocation: 422)."""
    rng = random.Random(36)
    with RealControlPlane() as cp, short_tmp("bsr") as base:
        k = Kubectl(cp.kubeconfig_path, tmp_path)
        node = make_node(base / "n", "default", version=(1, 37))
        cp.add(node_for(node.node))
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        for p in PROFILES:
            k("apply", "-f", "-", stdin=render("claim-template", "--set", f"profile={p}", "--set",
                                               f"name={_template(p)}"))
        cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                          resync_seconds=RESYNC, health_poll_seconds=0.5)
        daemon = Daemon(cfg, node.env, SimIO(node.host), cp.api_client())
        with Serving(daemon):
            assert daemon.shape().binding == "conditions"
            everything = wait_for(lambda: (s := _t4_sizes(cp, node.node)) and len(s) == 2 and s, "T4 published")
            assert all(len(v) == 5 for v in everything.values()), everything
            kubelet = KubeletClient(base / "kl").register()
            running: dict[str, tuple[str, str, str]] = {}  # pod -> its claim's (namespace, uid, name)
            failures: list[str] = []
            n = 0
            try:
                for _ in range(STEPS):
                    for name in [p for p in list(running) if rng.random() < 0.5]:
                        assert not any(kubelet.unprepare([running.pop(name)]).values())
                        cp.remove("pods", name, "default")
                    batch = []
                    for _ in range(rng.randint(2, 4)):
                        n += 1
                        name = f"p{n}"
                        cp.add(_pod(name, _template(rng.choice(PROFILES))))
                        batch.append(name)
                    for name in batch:
                        pod = wait_for(lambda n=name: _settled(cp, n), f"pod {name} bound or unschedulable", 90)
                        if not pod["spec"].get("nodeName"):
                            cp.remove("pods", name, "default")
                            continue
                        (st,) = pod["status"]["resourceClaimStatuses"]
                        claim = cp.get_object("resourceclaims", st["resourceClaimName"], "default")
                        ref = ("default", claim["metadata"]["uid"], claim["metadata"]["name"])
                        answer = kubelet.prepare([ref])[ref[1]]
                        if answer["error"]:
                            failures.append(f"{name}: {answer['error']}")
                            continue
                        running[name] = ref
                    for gpu in node.inventory().gpus:
                        sizes = {re.sub(r"^GRID T4-(\d+).*", r"\1", v.type_name) for v in gpu.vgpus}
                        if len(sizes) > 1:
                            failures.append(f"GPU {gpu.address} holds {sorted(sizes)}")
                assert failures == []
                # #36.3: every pod gone, each T4 GPU offers every size again within a resync interval
                for name, ref in list(running.items()):
                    assert not any(kubelet.unprepare([ref]).values())
                    cp.remove("pods", name, "default")
                # bounded by a resync and its publish, far below the binding loop's idle minute of #36.3
                wait_for(lambda: all(len(v) == 5 for v in _t4_sizes(cp, node.node).values()),
                         "every size offered again", RESYNC * 3 + 10)
            finally:
                kubelet.close()


def _settled(cp: RealControlPlane, name: str) -> dict | None:
    """The pod once bound (with its claim status), or once the scheduler said it does not fit."""
    pod = cp.get_object("pods", name, "default")
    if pod is None:
        return None
    if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("resourceClaimStatuses"):
        return pod
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" and \
                "cannot allocate all claims" in (c.get("message") or ""):
            return pod
    return None

