"""Scheduler model at scale (issue #5): 10,000 claims on 1,000 simulated nodes of 8 GPUs.

One ``a100-node`` host (8 x A100-40GB, mdev on SR-IOV VFs) is simulated, reconciled for DRA
and published by our own pool and slice builders for Kubernetes 1.37; its slices are then
cloned for 1,000 nodes (own ``nodeName``, pool and slice names; the device entries are shared,
as an informer's cache of identical nodes would hold equal objects). 10,000 ResourceClaims
of a few profiles (vGPU profiles selected by CEL on ``profile``, vGPUs selected by CEL on the
``memory`` capacity, whole GPUs) are allocated one after the other, as many pods would be.

Peer, run side by side: the same allocator without its selector-result cache, so that every
claim evaluates its CEL selectors on every device of the node it tries (what a scheduler
without cross-claim caching does). It runs on fewer claims; its rate is per claim too.
Peak memory: the process's maximum RSS (``getrusage``) and the RSS the allocator added.
"""

from __future__ import annotations

import gc
import json
import resource
import time
from typing import Any

from dra_bridge.pool.devices import PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.selectors import CelSelectors
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile

from .common import HEADER, percentile, row, sim_host

D = "vgpu.kubevirt.io"
NODES = 1000
CLAIMS = 10_000
PEER_CLAIMS = 100
DRA_ALL = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})

CLASSES = [
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vgpu.kubevirt.io"},
     "spec": {"selectors": [{"cel": {"expression":
         f'device.driver == "{D}" && device.attributes["{D}"].type == "vgpu"'}}]}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "passthrough.vgpu.kubevirt.io"},
     "spec": {"selectors": [{"cel": {"expression":
         f'device.driver == "{D}" && device.attributes["{D}"].type == "passthrough"'}}]}},
]

# (weight, device class, request selector or None)
PROFILES = [
    (30, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "A100-4C"'),
    (20, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "A100-10C"'),
    (10, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "A100-20C"'),
    (20, "vgpu.kubevirt.io", f'device.capacity["{D}"].memory.compareTo(quantity("8Gi")) >= 0 && '
                             f'device.capacity["{D}"].memory.isLessThan(quantity("20Gi"))'),
    (20, "passthrough.vgpu.kubevirt.io", None),
]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def template_slices() -> list[dict]:
    with sim_host("a100-node") as (host, env, io):
        assert reconcile(env, io, DRA_ALL).ok
        inv = discover(env, io, node="template")
    pool = build_pool(inv, PoolPolicy.default(), D, server_version=(1, 37))
    return build_slices(pool, driver=D, node_name="template", pool_name="template", generation=1,
                        server_version=(1, 37))


def cluster(template: list[dict], nodes: int = NODES) -> list[dict]:
    """``nodes`` copies of a node's slices, each with its own node, pool and slice names."""
    out = []
    for i in range(nodes):
        node = f"gpu-node-{i:04d}"
        for k, s in enumerate(template):
            spec = dict(s["spec"], nodeName=node, pool=dict(s["spec"]["pool"], name=node))
            meta = {"name": f"{node}-{D.replace('.', '-')}-{k}", "labels": s["metadata"].get("labels", {})}
            out.append({"apiVersion": s["apiVersion"], "kind": s["kind"], "metadata": meta, "spec": spec})
    return out


def claims(n: int = CLAIMS) -> list[dict]:
    """``n`` ResourceClaims cycling through the profiles by weight (deterministic)."""
    wheel = [p for p in PROFILES for _ in range(p[0] // 10)]
    out = []
    for i in range(n):
        _, cls, expr = wheel[(i * 7) % len(wheel)]
        body: dict[str, Any] = {"deviceClassName": cls}
        if expr:
            body["selectors"] = [{"cel": {"expression": expr}}]
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": f"vm-{i}-gpu", "namespace": "vms", "uid": f"uid-{i}"},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}})
    return out


class NoSelectorCache(Allocator):
    """The peer: selectors evaluated with CEL on every device for every claim (no result cache)."""

    def candidates(self, node, req):
        exprs = self._class_selectors(req.device_class) + list(req.selectors)
        return [d for d in self.by_node.get(node, []) + self.by_node.get(None, [])
                if all(self.sel.matches(e, d) for e in exprs)]


def _allocate(alloc: Allocator, todo: list[dict]) -> tuple[float, float, list[float], int]:
    """(CPU seconds, wall seconds, per-claim wall latencies, unsatisfiable count)."""
    lat, failed = [], 0
    c0, t0 = time.process_time(), time.perf_counter()
    for c in todo:
        t = time.perf_counter()
        try:
            alloc.allocate([c])
        except Unsatisfiable:
            failed += 1
        lat.append(time.perf_counter() - t)
    return time.process_time() - c0, time.perf_counter() - t0, lat, failed


def run_first_fit() -> list[str]:
    lines = ["First fit: 10,000 claims on 1,000 nodes of 8 A100 (cloned slices)", HEADER]
    template = template_slices()
    slices = cluster(template)
    n_devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    todo = claims()
    gc.collect()
    rss0 = _rss_mib()

    c0, t0 = time.process_time(), time.perf_counter()
    ours = Allocator(slices, CLASSES, CelSelectors())
    build_cpu, build = time.process_time() - c0, time.perf_counter() - t0
    cpu, wall, lat, failed = _allocate(ours, todo)
    grown = _rss_mib() - rss0
    used_nodes = len({d[1] for d in ours.state.taken})
    del ours
    gc.collect()

    c0, t0 = time.process_time(), time.perf_counter()
    peer = NoSelectorCache(slices, CLASSES, CelSelectors())
    peer_build_cpu = time.process_time() - c0
    peer_cpu, peer_wall, peer_lat, peer_failed = _allocate(peer, todo[:PEER_CLAIMS])
    del peer

    n, m = len(todo), PEER_CLAIMS
    lines.append(row(f"build: {NODES} nodes x 8 GPUs, {n_devices:,} devices", f"{build_cpu:.2f} s",
                     f"{peer_build_cpu:.2f} s", None,
                     f"CPU time; wall {build:.2f} s; {len(slices):,} ResourceSlices"))
    lines.append(row(f"claims/s, {n:,} claims, CPU time (one core)", f"{n / cpu:,.0f}/s", f"{m / peer_cpu:,.1f}/s",
                     (n / cpu) / (m / peer_cpu), f"target >= 1,000/s; peer: no selector cache, {m} claims"))
    lines.append(row("claims/s, wall clock", f"{n / wall:,.0f}/s", f"{m / peer_wall:,.1f}/s",
                     (n / wall) / (m / peer_wall), "shared machine: wall >= CPU"))
    lines.append(row("latency per claim p50 / p99 (wall)",
                     f"{percentile(lat, 50) * 1e3:.2f}/{percentile(lat, 99) * 1e3:.2f} ms",
                     f"{percentile(peer_lat, 50) * 1e3:.0f}/{percentile(peer_lat, 99) * 1e3:.0f} ms", None, ""))
    lines.append(row("claims allocated / unsatisfiable", f"{n - failed}/{failed}",
                     f"{m - peer_failed}/{peer_failed}", None, f"{used_nodes} nodes in use (first fit)"))
    lines.append(row("peak memory (process max RSS)", f"{_maxrss_mib():.0f} MiB", "-", None,
                     "whole process, incl. the 1,000 nodes' slices"))
    lines.append(row("memory added by the allocator (RSS)", f"{grown:.0f} MiB", "-", None,
                     "parsed pools, state and caches, after 10,000 claims"))
    return lines


# --------------------------------------------------------------------------- scheduler-like
# kube-scheduler does not take the first node that fits: it filters nodes, starting where the last
# pod's search stopped, until percentageOfNodesToScore of them are feasible (adaptive: 50 - N/125 %,
# 42 % = 420 of 1,000 nodes; pkg/scheduler/schedule_one.go numFeasibleNodesToFind), then scores
# them. Here every node has its own device objects (as an informer's cache holds them), and the
# cluster mixes three kinds of nodes.
SCHED_NODES = (("a100-node", 400), ("l40s-node", 300), ("t4-node", 300))
SCHED_CLAIMS = 300
SCHED_PEER_CLAIMS = 2
FEASIBLE = 420
SCHED_PROFILES = [
    (20, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "A100-4C"'),
    (20, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "L40S-4Q"'),
    (20, "vgpu.kubevirt.io", f'device.attributes["{D}"].profile == "T4-2Q"'),
    (20, "vgpu.kubevirt.io", f'device.capacity["{D}"].memory.compareTo(quantity("8Gi")) >= 0'),
    (20, "passthrough.vgpu.kubevirt.io", None),
]


def _template(preset: str) -> list[dict]:
    with sim_host(preset) as (host, env, io):
        assert reconcile(env, io, DRA_ALL).ok
        inv = discover(env, io, node="template")
    pool = build_pool(inv, PoolPolicy.default(), D, server_version=(1, 37))
    return build_slices(pool, driver=D, node_name="template", pool_name="template", generation=1,
                        server_version=(1, 37))


def mixed_cluster() -> list[dict]:
    """1,000 nodes of three kinds, every slice (and device) its own object."""
    out, i = [], 0
    for preset, count in SCHED_NODES:
        text = json.dumps(_template(preset))
        for _ in range(count):
            node = f"gpu-node-{i:04d}"
            for k, s in enumerate(json.loads(text)):  # a fresh copy per node
                s["spec"]["nodeName"], s["spec"]["pool"]["name"] = node, node
                s["metadata"] = {"name": f"{node}-{k}", "labels": s["metadata"].get("labels", {})}
                out.append(s)
            i += 1
    return out


def _search(alloc: Allocator, c: dict, start: int) -> tuple[list[str], int]:
    """The peer's Filter phase: a fresh search of each node in turn from ``start`` (nothing taken, nothing
    remembered) until ``FEASIBLE`` fit; (those nodes, how many were looked at)."""
    nodes, feasible, k = alloc.nodes, [], 0
    for k in range(len(nodes)):
        n = nodes[(start + k) % len(nodes)]
        if alloc._solve(n, [c], alloc.state) is not None:
            feasible.append(n)
            if len(feasible) >= FEASIBLE:
                break
    return feasible, k + 1


def _schedule(alloc: Allocator, todo: list[dict]) -> tuple[float, list[float], int, list[int]]:
    """(CPU seconds, per-claim latencies, unschedulable, nodes filtered per claim): filter from
    the last stop until ``FEASIBLE`` nodes fit, take the first of them (scoring left out). Ours filters
    with the allocator's own Filter phase (its per-shape index of the nodes that fit); the peer searches."""
    nodes, start = alloc.nodes, 0
    lat, failed, scanned = [], 0, []
    c0 = time.process_time()
    for c in todo:
        t = time.perf_counter()
        if isinstance(alloc, NoSelectorCache):
            feasible, seen = _search(alloc, c, start)
        else:
            feasible, seen = alloc.filter([c], start, FEASIBLE)
        start = (start + seen) % len(nodes)
        scanned.append(seen)
        if feasible:
            alloc.allocate([c], node=feasible[0])
        else:
            failed += 1
        lat.append(time.perf_counter() - t)
    return time.process_time() - c0, lat, failed, scanned


def run_scheduler_like() -> list[str]:
    global PROFILES
    lines = [f"Scheduler-like: filter until {FEASIBLE} of 1,000 mixed nodes fit (400 x 8 A100, 300 x 4 L40S, "
             "300 x 4 T4), distinct device objects per node", HEADER]
    slices = mixed_cluster()
    n_devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    saved, PROFILES = PROFILES, SCHED_PROFILES
    try:
        todo = claims(SCHED_CLAIMS)
    finally:
        PROFILES = saved
    ours = Allocator(slices, CLASSES, CelSelectors())
    cpu, lat, failed, scanned = _schedule(ours, todo)
    del ours
    peer = NoSelectorCache(slices, CLASSES, CelSelectors())
    peer_cpu, peer_lat, _, _ = _schedule(peer, todo[:SCHED_PEER_CLAIMS])
    del peer
    n, m = len(todo), SCHED_PEER_CLAIMS
    lines.append(row(f"claims/s ({n_devices:,} devices), CPU", f"{n / cpu:,.1f}/s", f"{m / peer_cpu:,.2f}/s",
                     (n / cpu) / (m / peer_cpu), f"peer: no selector cache, {m} claims; {n - failed}/{n} scheduled"))
    lines.append(row("latency per claim p50 / p99 (wall)",
                     f"{percentile(lat, 50) * 1e3:.0f}/{percentile(lat, 99) * 1e3:.0f} ms",
                     f"{percentile(peer_lat, 50) * 1e3:.0f}/{percentile(peer_lat, 99) * 1e3:.0f} ms", None,
                     f"nodes filtered per claim: median {sorted(scanned)[len(scanned) // 2]}"))
    return lines


def run() -> list[str]:
    return run_first_fit() + [""] + run_scheduler_like()


if __name__ == "__main__":
    print("\n".join(run()))
