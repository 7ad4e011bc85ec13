"""End to end as a user runs it (issue #39.4): the real control plane of Kubernetes 1.37 and of
1.34, each with its default gates (tests/controlplane; issue #39.2: the newest and the oldest supported
minor), ``vgpuctl --simulate PRESET serve`` as a process with the preset's ``dra``
layout, and the node side (tests/controlplane/nodeside.py) as a process: it registered the Node, it
prepares the pods kube-scheduler binds there through the plugin's sockets and sets their phase. No
test here writes a pod's status; pods and templates go in with kubectl.

Per preset: every GPU filled by the real scheduler, each pod Running with the vGPU its claim names
on the host; one more stays Pending with the scheduler's reason; freeing a GPU lets it run; a pod
deleted outright has its vGPU removed. On ``default``: the agent refuses a second vGPU size on a GPU
at bind time (binding conditions, where the server keeps them; where it keeps no counters, 1.34's
defaults, a GPU offers one size and a pod of another stays Pending), and ``vgpuctl conformance
--kubeconfig`` passes 5 of 5, pod logs read through the API server from the node side's kubelet endpoint.

Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from dra_bridge.api.names import DEFAULT_DRIVER as DRIVER
from dra_bridge.api.names import PASSTHROUGH_CLASS, VGPU_CLASS
from dra_bridge.scheduling import capacity
from dra_bridge.scheduling.objects import dev_gpu, devices_by_key
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.controlplane.up import SimulatedNode
from tests.support.controlplane import (
    MINOR_PARAMS,
    RealControlPlane,
    openssl_needed,  # noqa: F401 (an autouse fixture)
    poll,
)
from tests.support.deploy import Kubectl, needs_kubectl

pytestmark = [pytest.mark.go, needs_kubectl]


VGPUCTL = [sys.executable, "-m", "vgpuctl"]
WAIT = 120.0
PRESETS = ["default", "mixed-node", "mig-node", "rtxpro-node"]


def wait_for(pred, what: str, timeout: float = WAIT):
    return poll(pred, what, timeout, 0.2)


def render(*args: str) -> str:
    return subprocess.run([*VGPUCTL, "render", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module", params=MINOR_PARAMS)
def cp(request):
    """One control plane per minor, its default gates: every test here runs on each."""
    with RealControlPlane(minor=request.param) as c:
        yield c


@pytest.fixture(scope="module")
def k(cp, tmp_path_factory):
    kc = Kubectl(cp.kubeconfig_path, tmp_path_factory.mktemp("kubectl-home"))
    kc("apply", "-f", "-", stdin=render("deviceclasses"))
    return kc


def _cel(s: str) -> str:
    return json.dumps(s)


def template(name: str, gpu: capacity.GpuCapacity, prof: capacity.ProfileFit) -> dict:
    """One device of ``prof`` on ``gpu`` (its index), as a user's ResourceClaimTemplate asks."""
    d = _cel(DRIVER)
    sels = [f"device.attributes[{d}].gpuIndex == {gpu.index}"]
    req: dict = {"name": "gpu", "exactly": {"deviceClassName": PASSTHROUGH_CLASS if prof.kind == "passthrough"
                                                              else VGPU_CLASS}}
    spec: dict = {"requests": [req]}
    if prof.kind != "passthrough":
        sels.append(f"has(device.attributes[{d}].vgpuTypes) ? device.attributes[{d}].vgpuTypes.contains("
                    f"{_cel(' ' + prof.profile + ' ')}) : device.attributes[{d}].profile == {_cel(prof.profile)}")
        spec["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": prof.profile}}}]
    req["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in sels]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": {"devices": spec}}}


def pod(name: str, tmpl: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchFields": [
                             {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
                     "containers": [{"name": "vm", "image": "registry.invalid/virt-launcher",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def apply(k: Kubectl, *objs: dict) -> None:
    k("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))


def phase(cp: RealControlPlane, name: str) -> str | None:
    p = cp.get_object("pods", name, "default")
    return None if p is None else (p.get("status") or {}).get("phase")


def unschedulable(cp: RealControlPlane, name: str) -> str | None:
    """The scheduler's reason for leaving the pod Pending: its PodScheduled condition's message,
    once it also said so in a FailedScheduling event."""
    p = cp.get_object("pods", name, "default")
    cond = next((c for c in (p.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})
    if cond.get("status") != "False" or cond.get("reason") != "Unschedulable" or p["spec"].get("nodeName"):
        return None
    events = [e for e in cp.objects("events", "default") if e["involvedObject"].get("name") == name
              and e.get("reason") == "FailedScheduling" and (e.get("source") or {}).get("component",
                                                                                      e.get("reportingComponent"))
              in ("default-scheduler", None)]
    return cond.get("message") if events else None


def allocated(cp: RealControlPlane, name: str) -> list[dict]:
    p = cp.get_object("pods", name, "default")
    out = []
    for st in (p.get("status") or {}).get("resourceClaimStatuses") or []:
        c = cp.get_object("resourceclaims", st["resourceClaimName"], "default")
        out += c["status"]["allocation"]["devices"]["results"]
    return out


def host_vgpus(node: SimulatedNode) -> dict[str, str]:
    """vGPU id -> its GPU's PCI address, read from the simulated host itself."""
    sim = sim_node(node.host_dir, None)
    return {v.id: v.gpu for v in discover(sim.env, sim.io, node=node.node).all_vgpus()}


def gpu_plan(cp: RealControlPlane, node: str) -> list[tuple[capacity.GpuCapacity, capacity.ProfileFit]]:
    """Per GPU of the node, what fills it in the fewest pods: the vGPU profile with the fewest
    (at least two) that fit, or the whole GPU where it offers no vGPU."""
    cap = capacity.compute(cp.objects("resourceslices"), cp.objects("resourceclaims"), driver=DRIVER)
    plan = []
    for g in cap.gpus:
        if g.node != node:
            continue
        vgpu = [p for p in g.profiles if p.kind == "vgpu" and p.fits >= 2]
        whole = [p for p in g.profiles if p.kind == "passthrough" and p.fits == 1]
        choice = min(vgpu, key=lambda p: (p.fits, p.profile)) if vgpu else (whole[0] if whole else None)
        if choice is not None:
            plan.append((g, choice))
    return plan


def cleanup(cp: RealControlPlane, k: Kubectl, node: str) -> None:
    k("delete", "pods", "--all", "--grace-period=1", "--wait=true", "--timeout=60s")
    k("delete", "resourceclaimtemplates", "--all")


@pytest.mark.parametrize("preset", PRESETS)
def test_the_real_scheduler_fills_every_gpu_and_the_node_side_runs_what_it_binds(preset, cp, k, short_base):
    """Every GPU of the preset filled; one more Pending with the scheduler's reason; freeing a GPU
    runs it; a pod deleted outright gives its vGPU back on the host."""
    with SimulatedNode(cp.kubeconfig_path, preset, short_base / "n", resync=5) as node:
        plan = gpu_plan(cp, node.node)
        assert plan, f"{preset}: no GPU offered"
        pods: dict[int, list[str]] = {}
        for g, prof in plan:
            tmpl = f"{preset}-g{g.index}"
            apply(k, template(tmpl, g, prof))
            pods[g.index] = [f"{preset}-g{g.index}-{i}" for i in range(prof.fits)]
            apply(k, *(pod(n, tmpl, node.node) for n in pods[g.index]))
        names = [n for ns in pods.values() for n in ns]
        wait_for(lambda: all(phase(cp, n) == "Running" for n in names), f"{preset}: {len(names)} pods Running", 240)
        # each pod's claim holds a device of its GPU; every vGPU on the host is one of those, one for one
        held = {n: allocated(cp, n) for n in names}
        by_gpu = {g.index: g.gpu for g, _ in plan}
        devices = devices_by_key(cp.objects("resourceslices"))
        for idx, ns in pods.items():
            for n in ns:
                (res,) = held[n]
                assert (res["driver"], res["pool"]) == (DRIVER, node.node)
                assert dev_gpu(devices[(DRIVER, node.node, res["device"])]) == by_gpu[idx], (n, res)
        vgpu_pods = [n for (g, prof) in plan if prof.kind == "vgpu" for n in pods[g.index]]
        on_host = host_vgpus(node)
        assert len(on_host) == len(vgpu_pods), (on_host, vgpu_pods)
        assert sorted(on_host.values()) == sorted(by_gpu[g.index] for g, p in plan if p.kind == "vgpu"
                                                   for _ in range(p.fits))
        # full: one more of each stays Pending with the scheduler's reason
        extras = {g.index: f"{preset}-g{g.index}-extra" for g, _ in plan}
        apply(k, *(pod(extras[g.index], f"{preset}-g{g.index}", node.node) for g, _ in plan))
        reasons = {i: wait_for(lambda n=n: unschedulable(cp, n), f"{n} unschedulable") for i, n in extras.items()}
        assert all("cannot allocate all claims" in r for r in reasons.values()), reasons
        # freeing one pod of each GPU lets its extra run
        k("delete", "pods", *[ns[0] for ns in pods.values()], "--wait=false")
        wait_for(lambda: all(phase(cp, n) == "Running" for n in extras.values()), f"{preset}: extras Running")
        # a pod deleted outright (no grace): its claim is unprepared, its vGPU leaves the host
        victim = next((pods[g.index][1] for g, p in plan if p.kind == "vgpu"), None)
        if victim is not None:
            (res,) = held[victim]
            before = host_vgpus(node)
            k("delete", "pod", victim, "--grace-period=0", "--force")
            wait_for(lambda: len(host_vgpus(node)) == len(before) - 1, f"{victim}'s vGPU removed")
        cleanup(cp, k, node.node)
        assert node.serve is not None and node.serve.poll() is None, node.serve_log.read_text()[-2000:]


@pytest.fixture
def short_base():
    from tests.support.dra import short_tmp

    with short_tmp("e2e") as base:
        yield base


def test_a_second_size_on_a_gpu_is_refused_at_bind_time(cp, k, short_base):
    """Two sizes allocated on one equal-size T4 while the agent is paused (both wait in PreBind for
    its binding conditions); resumed, the agent confirms the first and refuses the second, which the
    scheduler then finds no room for: it stays Pending, never bound."""
    kept = cp.kept()
    missing = [w for w, on in (("counters", kept.counters), ("binding conditions", kept.binding_conditions)) if not on]
    if missing:
        pytest.skip(f"Kubernetes {cp.minor}'s default gates keep no {' nor '.join(missing)}: a GPU offers one size "
                    "(test_without_counters_a_gpu_offers_one_size...)")
    with SimulatedNode(cp.kubeconfig_path, "default", short_base / "n", node_name="bind-node") as node:
        cap = capacity.compute(cp.objects("resourceslices"), cp.objects("resourceclaims"), driver=DRIVER)
        t4 = next(g for g in cap.gpus if g.node == node.node and g.index == 0)
        profs = {p.profile: p for p in t4.profiles}
        apply(k, template("t4-1q", t4, profs["T4-1Q"]), template("t4-2q", t4, profs["T4-2Q"]))
        assert node.serve is not None
        os.kill(node.serve.pid, signal.SIGSTOP)
        try:
            apply(k, pod("first", "t4-1q", node.node))
            wait_for(lambda: allocated_or_none(cp, "first"), "first allocated")
            apply(k, pod("second", "t4-2q", node.node))
            wait_for(lambda: allocated_or_none(cp, "second"), "second allocated beside it")
        finally:
            os.kill(node.serve.pid, signal.SIGCONT)
        wait_for(lambda: phase(cp, "first") == "Running", "first Running")
        refused = wait_for(lambda: [e["message"] for e in cp.objects("events", "default")
                                    if e["involvedObject"].get("name") == "second"
                                    and e.get("reason") == "FailedScheduling" and "binding" in e.get("message", "")],
                           "second refused at bind time")
        print(refused)
        assert wait_for(lambda: unschedulable(cp, "second"), "second Pending")
        assert not cp.get_object("pods", "second", "default")["spec"].get("nodeName")
        sizes = {v for v in host_vgpus(node).values()}
        assert len(sizes) == 1
        cleanup(cp, k, node.node)


def test_without_counters_a_gpu_offers_one_size_and_a_pod_of_another_stays_pending(cp, k, short_base):
    """Where the server keeps no shared counters (1.34's defaults: DRAPartitionableDevices is alpha,
    off), nothing can keep two sizes of an empty T4 apart, so the agent offers one vGPU type per GPU
    and not the whole GPU (dra_bridge/pool/safe.py): a pod of that type runs, a pod asking another
    type of the same T4 stays Pending with the scheduler's reason, and the host holds one size."""
    if cp.kept().counters:
        pytest.skip(f"Kubernetes {cp.minor}'s default gates keep counters: a GPU offers every size "
                    "(test_a_second_size_on_a_gpu_is_refused_at_bind_time)")
    with SimulatedNode(cp.kubeconfig_path, "default", short_base / "n", node_name="one-size-node") as node:
        cap = capacity.compute(cp.objects("resourceslices"), cp.objects("resourceclaims"), driver=DRIVER)
        t4 = next(g for g in cap.gpus if g.node == node.node and g.index == 0)
        offered = [p for p in t4.profiles if p.kind == "vgpu"]  # the types of one size (T4-1Q, T4-1B, ...)
        assert len({p.memory for p in offered}) == 1 and offered[0].memory == 1 << 30, t4.profiles
        assert [p for p in t4.profiles if p.kind != "vgpu"] == [], t4.profiles
        offered = [p for p in offered if p.profile == "T4-1Q"]
        other = dataclasses.replace(offered[0], profile="T4-2Q")
        offered = offered[0]
        apply(k, template("t4-offered", t4, offered), template("t4-other", t4, other))
        apply(k, pod("offered", "t4-offered", node.node), pod("other", "t4-other", node.node))
        wait_for(lambda: phase(cp, "offered") == "Running", "offered Running")
        reason = wait_for(lambda: unschedulable(cp, "other"), "other Pending")
        assert "cannot allocate all claims" in reason, reason
        assert not cp.get_object("pods", "other", "default")["spec"].get("nodeName")
        assert len(host_vgpus(node)) == 1
        cleanup(cp, k, node.node)


def allocated_or_none(cp: RealControlPlane, name: str) -> bool:
    p = cp.get_object("pods", name, "default")
    for st in (p.get("status") or {}).get("resourceClaimStatuses") or []:
        c = cp.get_object("resourceclaims", st["resourceClaimName"], "default")
        if c and (c.get("status") or {}).get("allocation"):
            return True
    return False


def test_conformance_passes_on_the_real_control_plane(cp, k, short_base, tmp_path):
    """``vgpuctl conformance --kubeconfig``: 5 of 5, check 1 from the cluster's scheduler, each
    workload's health check read from its log as the API server proxies it from the node side. Where
    the server keeps no counters (1.34's defaults) a T4 offers 16 of its smallest size, so 16 workloads
    (``--max-workloads 16``; check 1 says so by default), and check 4 fails, saying why: without
    counters no GPU offers itself whole beside its vGPUs."""
    counters = bool(cp.kept().counters)
    with SimulatedNode(cp.kubeconfig_path, "default", short_base / "n", node_name="conformance-node"):
        p = subprocess.run([*VGPUCTL, "conformance", "--kubeconfig", str(cp.kubeconfig_path), "--node",
                            "conformance-node", "-o", "json", "--junit", ""]
                           + ([] if counters else ["--max-workloads", "16"]), capture_output=True, text=True,
                           timeout=900, cwd=tmp_path)
        assert p.stdout, p.stderr
        rep = json.loads(p.stdout)
        checks = {c["number"]: (c["status"], c["detail"]) for c in rep["checks"]}
        want = {n: "passed" if counters or n != 4 else "failed" for n in range(1, 6)}
        assert {n: s for n, (s, _) in checks.items()} == want, checks
        assert "the cluster's scheduler allocates" in checks[1][1]
        if not counters:
            assert "nor shared counters" in checks[4][1], checks[4]
        assert p.returncode == (0 if counters else 1)


def test_no_execute_cordon_evicts_and_the_node_side_unprepares(cp, k, short_base):
    """``vgpuctl cordon --effect NoExecute`` of the L40S: upstream's device-taint-eviction controller
    deletes the pod holding its vGPU; the node side unprepares the claim and confirms the deletion,
    so the pod is gone outright (the wait of test_real_controlplane's eviction test handles that,
    which raised TypeError before) and its vGPU leaves the host."""
    from tests.system.test_real_controlplane import evicted

    if not cp.kept().taints:
        pytest.skip(f"Kubernetes {cp.minor}'s default gates keep no device taints (DRADeviceTaints is off): "
                    "nothing evicts (tests/system/test_real_controlplane.py's cordon test: free devices withdrawn)")
    with SimulatedNode(cp.kubeconfig_path, "default", short_base / "n", node_name="evict-node") as node:
        def published_l40s():  # the node's slices may still be coming when it says ready: wait for the L40S's
            cap = capacity.compute(cp.objects("resourceslices"), cp.objects("resourceclaims"), driver=DRIVER)
            g = next((g for g in cap.gpus if g.node == node.node and g.index == 3), None)
            p = next((p for p in g.profiles if p.profile.endswith("L40S-8Q")), None) if g else None
            return (g, p) if p else None

        l40s, prof = wait_for(published_l40s, "the L40S published with its L40S-8Q profile")
        apply(k, template("l40s-x", l40s, prof), pod("evicted", "l40s-x", node.node))
        wait_for(lambda: phase(cp, "evicted") == "Running", "Running")
        assert len(host_vgpus(node)) == 1
        kc = ["--kubeconfig", str(cp.kubeconfig_path), "--wait", "30"]
        out = subprocess.run([*VGPUCTL, "cordon", f"{node.node}/3", "--effect", "NoExecute", *kc],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        try:
            seen: list[dict] = []
            wait_for(lambda: evicted(cp, "evicted", seen), "evicted")
            wait_for(lambda: cp.get_object("pods", "evicted", "default") is None, "gone once the node side confirmed")
            wait_for(lambda: not host_vgpus(node), "its vGPU removed from the host")
        finally:
            subprocess.run([*VGPUCTL, "uncordon", f"{node.node}/3", *kc], capture_output=True, text=True, timeout=120)
        cleanup(cp, k, node.node)
