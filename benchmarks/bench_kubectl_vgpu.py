"""``kubectl vgpu`` as an admin runs it (issue #37): the whole ``kubectl-vgpu`` process against a
local API server, on one simulated 4-GPU node and on 100 nodes.

The cluster is :class:`~dra_bridge.sim.cluster.SimCluster` (the node agent publishes the default
preset's slices: 4 GPUs, T4 x 2, A100 in MIG mode, L40S) with one pod holding a T4 vGPU; for 100
nodes its slices are copied under 99 more node names (Node objects too), as agents on identical
nodes would publish them. The API server runs in this process: the wall figure includes its
answers (Python, so slower than kube-apiserver); the CPU figure is the child's own user + system
time (``getrusage(RUSAGE_CHILDREN)``): imports, requests, the capacity model, the table. Each is
the median of ``ROUNDS`` runs. Peer: ``kubectl get resourceslices -o json`` (Go) on the same server,
one LIST of what the plugin lists among others.

Bounds (#37): <= 0.3 s CPU on one node; <= 1 s on 100 nodes.
"""

from __future__ import annotations

import copy
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .common import HEADER, row

ROUNDS = int(os.environ.get("VGPUCTL_BENCH_RUNS", "5"))
BOUND_1 = 0.3  # s CPU, one node
BOUND_100 = 1.0  # s, 100 nodes
ROOT = Path(__file__).resolve().parents[1]


def _plugin() -> list[str]:
    """The plugin's entry point as pip's ``kubectl-vgpu`` wrapper calls it, from this checkout."""
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); from vgpuctl.main import "
                                  "kubectl_plugin; sys.exit(kubectl_plugin())"]


def _kubectl() -> str | None:
    exe = Path(sys.executable).with_name("kubectl")
    return str(exe) if exe.exists() else shutil.which("kubectl")


def _timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def copy_node(c, node: str, slices: list[dict]) -> None:
    """Publish ``slices`` (one node's) again as node ``node``'s, with its Node object."""
    c.rest("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for s in slices:
        s2 = copy.deepcopy(s)
        meta = s2["metadata"]
        s2["metadata"] = {"name": meta["name"].replace(c.node, node), "labels": meta.get("labels") or {}}
        s2["spec"]["nodeName"] = node
        s2["spec"]["pool"]["name"] = s2["spec"]["pool"]["name"].replace(c.node, node)
        c.rest("POST", "/apis/resource.k8s.io/v1/resourceslices", s2)


def _measure(argv: list[str], peer: list[str] | None) -> tuple[float, float, float | None]:
    walls, cpus, peers = [], [], []
    for _ in range(ROUNDS):  # interleaved with the peer
        w, c = _timed(argv)
        walls.append(w)
        cpus.append(c)
        if peer:
            peers.append(_timed(peer)[1])
    return statistics.median(walls), statistics.median(cpus), statistics.median(peers) if peers else None


def run() -> list[str]:
    from dra_bridge.sim.cluster import SimCluster
    from kubevirt_templates.render import render as render_templates
    from tests.system.test_cordon import t4

    kubectl = _kubectl()
    lines = [f"kubectl vgpu, whole process against a local API server (in this process), median of {ROUNDS}; "
             f"{os.cpu_count()} CPUs; CPU: the child's user + system; peer: kubectl get resourceslices -o json "
             "(its CPU)", HEADER]
    with SimCluster(render=render_templates, version="1.37", health=False) as c:
        c.launch(t4("T4-8Q", 1, gpu_index=0), name="pod-a")
        assert c.base is not None and c.srv is not None
        kc = c.srv.kubeconfig(c.base / "kubeconfig")
        argv = [*_plugin(), "--kubeconfig", str(kc)]
        peer = [kubectl, "--kubeconfig", str(kc), "get", "resourceslices", "-o", "json"] if kubectl else None
        slices = c.slices()
        for nodes in (1, 100):
            for i in range(len({s["spec"].get("nodeName") for s in c.slices()}), nodes):
                copy_node(c, f"node-{i:03d}", slices)
            wall, cpu, p = _measure(argv, peer)
            bound = BOUND_1 if nodes == 1 else BOUND_100
            verdict = ("within" if cpu <= bound else "OVER") + f" #37's {bound:g} s bound (CPU)"
            lines.append(row(f"kubectl vgpu, {nodes} node{'s' if nodes > 1 else ''} x 4 GPUs: CPU", f"{cpu:.2f} s",
                             f"{p:.2f} s" if p else "-", cpu / p if p else None, verdict))
            lines.append(row("  wall (with the local server's answers)", f"{wall:.2f} s", "-", None,
                             "" if nodes == 1 else ("within" if wall <= bound else "OVER") + f" {bound:g} s (wall)"))
    return lines
