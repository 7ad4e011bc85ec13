"""Claim to prepared on the real control plane, per GPU mode (issue #37.4).

Kubernetes 1.37's own etcd, kube-apiserver, kube-scheduler and kube-controller-manager
(``build/controlplane/``, built by ``.ci/run``), a simulated node joined to it as a user runs it
(``vgpuctl --simulate PRESET serve`` with the preset's ``dra`` layout and the node side,
:class:`tests.controlplane.up.SimulatedNode`), and pods created one at a time, each with a claim
from a template (one vGPU of one size on one GPU). For each pod: from its creation to its claim
allocated, to the pod bound (``spec.nodeName``) and to the pod Running (the node side sets it once
the plugin prepared the claim). The peer, interleaved pod for pod on the same node: the same pod
with no claim, which measures the control plane's and the node side's own floor.

The cases: mixed-size placements (``mixed-node``, L40S), MIG-backed vGPUs (``mig-node``, A100 in
MIG mode), equal-size vGPUs (``default``, T4) with 1.37's default gates, where the agent confirms a
size by binding conditions and kube-scheduler re-checks them every 5 s, and the same with
``DRADeviceCompatibilityGroups`` on, where groups replace the binding conditions and nothing waits.
Timestamps are read by polling the API server every ``POLL`` seconds: each figure is good to about
that. Without Go (no control plane) it says so and measures nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .common import HEADER, percentile, row

PODS = int(os.environ.get("VGPUCTL_BENCH_CLAIM_PODS", "6"))
POLL = 0.02
WAIT = 120.0
#: (what, preset, GPU index, profile, feature gates)
CASES = [
    ("mixed-size placements", "mixed-node", 0, "L40S-4Q", {}),
    ("MIG-backed", "mig-node", 0, "A100-1-5C", {}),
    ("equal-size, binding conditions", "default", 0, "T4-1Q", {}),
    ("equal-size, compatibility groups", "default", 0, "T4-1Q", {"DRADeviceCompatibilityGroups": True}),
]
#: docs/allocation.md: kube-scheduler re-checks binding conditions every 5 s (PreBind's poll)
BINDING_RECHECK_S = 5.0


def run() -> list[str]:
    from tests.support import controlplane as cpmod

    exe = cpmod.binary_path()
    if not exe.exists():
        return [f"Claim to prepared on the real control plane: not run ({exe} is not built: "
                f"{cpmod.go_missing() or 'run .ci/run or tests/controlplane/build.sh 1.37'})"]
    out = [f"Claim to prepared on the real control plane (Kubernetes {cpmod.K8S_VERSION}, {PODS} pods one at a "
           f"time per case, each beside a pod with no claim; polled every {POLL * 1000:.0f} ms)", HEADER]
    only = os.environ.get("VGPUCTL_BENCH_CLAIM_CASES")  # e.g. "0,2": the cases by position
    for n, (what, preset, index, profile, gates) in enumerate(CASES):
        if only and str(n) not in only.split(","):
            continue
        claim, plain = measure(cpmod, preset, index, profile, gates)
        running = [t["running"] for t in claim]
        peer = [t["running"] for t in plain]
        p50, peer50 = percentile(running, 50), percentile(peer, 50)
        rest = running[1:] or running
        gate = f" with {', '.join(gates)}" if gates else ""
        out.append(row(what, f"{p50:.2f} s", f"{peer50:.2f} s", p50 / peer50 if peer50 else None,
                       f"{profile} on {preset}{gate}: create to Running p50; the first pod on the empty GPU "
                       f"{running[0]:.2f} s, the others p50 {percentile(rest, 50):.2f} s, max {max(rest):.2f} s; "
                       f"claim allocated p50 {percentile([t['allocated'] for t in claim], 50):.2f} s, pod bound "
                       f"p50 {percentile([t['bound'] for t in claim], 50):.2f} s"))
    out.append(f"bound: none in the issue. Expected: the first claim of a size on an empty equal-size GPU with binding "
               f"conditions waits for kube-scheduler's {BINDING_RECHECK_S:.0f} s re-check (docs/allocation.md); once "
               f"the GPU's size is settled its devices carry none, and no other case waits")
    return out


def measure(cpmod, preset: str, index: int, profile: str, gates: dict[str, bool]) -> tuple[list[dict], list[dict]]:
    """Per pod, seconds from its creation to each milestone: with a claim, and without (the peer)."""
    from tests.controlplane.up import SimulatedNode
    from tests.system.test_e2e_serve import pod, template

    claim: list[dict] = []
    plain: list[dict] = []
    from tests.support.deploy import Kubectl

    with cpmod.RealControlPlane(gates) as cp, tempfile.TemporaryDirectory(prefix="vgclaims-") as base:
        # objects with opaque parameters go in with kubectl, as a user's do: the API server keeps them
        # byte for byte, and only compact JSON lets the agent's status writes through (binder.py)
        k = Kubectl(cp.kubeconfig_path, base)
        k("apply", "-f", "-", stdin=render_deviceclasses())
        with SimulatedNode(cp.kubeconfig_path, preset, Path(base) / "n", resync=5) as node:
            node_logs.extend([node.serve_log, node.node_side_log])
            gpu = fitting_gpu(cp, node.node, index, profile)
            name = f"bench-{preset}-g{index}"
            k("apply", "-f", "-", stdin=yaml.safe_dump(template(name, gpu, next(p for p in gpu.profiles
                                                                             if p.profile == profile))))
            for i in range(PODS):
                claim.append(timed(cp, pod(f"{name}-{i}", name, node.node)))
                bare = pod(f"{name}-plain-{i}", name, node.node)
                del bare["spec"]["resourceClaims"], bare["spec"]["containers"][0]["resources"]
                plain.append(timed(cp, bare))
    return claim, plain


def render_deviceclasses() -> str:
    return subprocess.run([sys.executable, "-m", "vgpuctl", "render", "deviceclasses"], capture_output=True,
                          text=True, check=True).stdout


def fitting_gpu(cp, node: str, index: int, profile: str):
    """GPU ``index`` of the node as ``vgpuctl capacity`` reads it, once it offers ``PODS`` of ``profile``."""
    from dra_bridge.api.names import DEFAULT_DRIVER
    from dra_bridge.scheduling import capacity

    deadline = time.monotonic() + WAIT
    while True:
        cap = capacity.compute(cp.objects("resourceslices"), cp.objects("resourceclaims"), driver=DEFAULT_DRIVER)
        gpu = cap.gpu(node, index)
        fits = gpu and next((p.fits for p in gpu.profiles if p.profile == profile), 0)
        if gpu and fits and fits >= PODS:
            return gpu
        if time.monotonic() > deadline:
            raise RuntimeError(f"GPU {index} of {node} does not offer {PODS} x {profile} (offers {fits})")
        time.sleep(0.2)


node_logs: list[Path] = []


def timed(cp, obj: dict) -> dict:
    """Create the pod; the seconds until its claim is allocated, it is bound and it is Running."""
    name = obj["metadata"]["name"]
    t0 = time.monotonic()
    cp.add(obj)
    seen: dict[str, float] = {}
    deadline = t0 + WAIT
    while "running" not in seen:
        p = cp.get_object("pods", name, "default") or {}
        now = time.monotonic() - t0
        status = p.get("status") or {}
        if "allocated" not in seen and (claims := status.get("resourceClaimStatuses")):
            c = cp.get_object("resourceclaims", claims[0]["resourceClaimName"], "default") or {}
            if (c.get("status") or {}).get("allocation"):
                seen["allocated"] = now
        if "bound" not in seen and (p.get("spec") or {}).get("nodeName"):
            seen["bound"] = now
        if status.get("phase") == "Running":
            seen["running"] = now
        if time.monotonic() > deadline:
            logs = "; ".join(f"{log}: {log.read_text(errors='replace')[-1500:]}" for log in node_logs if log.exists())
            raise RuntimeError(f"pod {name} not Running within {WAIT:.0f}s: {status}; {logs}")
        time.sleep(POLL)
    seen.setdefault("allocated", seen["bound"])  # the peer has no claim
    return seen
