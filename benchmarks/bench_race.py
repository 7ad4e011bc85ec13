"""A scheduler race on a server without compatibility groups (issue #14): how many allocations that
mix vGPU sizes on one equal-size GPU reach prepare.

8 x T4 in ``dra`` mode, Kubernetes 1.36 shape with binding conditions (every size of an empty
GPU). Each round allocates 24 claims of random T4 sizes from ONE snapshot of the slices (as two
scheduler instances, or binding cycles running behind allocations, would), with Kubernetes'
own allocator (1.36) where its program is built, else the scheduler model (``--allocator``);
the counters keep every GPU within its framebuffer, but nothing in the slices keeps two
sizes off one GPU. Then the agent's decision (``agent.binder.decide``) runs over the allocations:
each refused one fails at PreBind and is retried; whatever it would confirm reaches prepare.
Peer: the same slices without binding conditions, where every mixing allocation reaches prepare
(and fails there: NVIDIA's equal-size mode refuses a second size). Also timed: the agent's
decision over a round's claims (the scheduler polls the conditions every 5 s: the bound).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client

from dra_bridge.agent.binder import decide
from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.apiclient.objects import body
from dra_bridge.pool.devices import PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.selectors import default_selectors
from dra_bridge.sim.apiserver import LocalApiServer
from kubevirt_templates.render import render
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from mdev_manager.sim.node import sim_node
from tests.support.upstream_allocator import UpstreamScheduler

from .common import HEADER, row, scheduler_allocator

DRIVER = "vgpu.kubevirt.io"
ROUNDS, CLAIMS = 20, 24
SIZES = ["T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q", "T4-16Q"]


def _claim(profile: str, i: int) -> dict:
    (t,) = render("claim-template", {"profile": profile, "name": f"t{i}"})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"u{i}",
                         "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z"},
            "spec": t["spec"]["spec"]}


def run() -> list[str]:
    layouts = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})
    with tempfile.TemporaryDirectory(prefix="vgrace") as d:
        sim = sim_node(Path(d) / "t4", HostSpec(name="T4", node="n-t4", gpus=[GpuGroup(board="T4", count=8)]))
        reconcile(sim.env, sim.io, layouts)
        inv = discover(sim.env, sim.io)
    pool = build_pool(inv, PoolPolicy.default(), DRIVER, server_version=(1, 36), binding_conditions=True)
    slices = build_slices(pool, driver=DRIVER, node_name="n-t4", pool_name="n-t4", generation=1,
                          server_version=(1, 36))
    classes = [o for o in render("deviceclasses") if o["kind"] == "DeviceClass"]
    rng = random.Random(14)
    allocated = mixing = refused = confirmed_mixing = 0
    decide_s: list[float] = []
    up, which = scheduler_allocator("1.36")
    for _ in range(ROUNDS):
        # one snapshot for the whole round: Kubernetes' own allocator (1.36 defaults) or the model
        alloc = (Allocator(slices, classes, default_selectors()) if up is None
                 else UpstreamScheduler(up, slices, classes, []))
        claims = []
        for i in range(CLAIMS):
            claim = _claim(rng.choice(SIZES), i)
            try:
                _, (allocation,) = alloc.allocate([claim])
            except Unsatisfiable:
                continue
            claim["status"] = {"allocation": allocation}
            claims.append(claim)
        allocated += len(claims)
        # mixing: an allocation whose size differs from the first one made on its GPU
        first: dict[str, str] = {}
        for c in claims:
            dev = pool.device(c["status"]["allocation"]["devices"]["results"][0]["device"])
            assert dev is not None  # the allocator allocated it from this pool
            size = dev.capacity["memory"]
            if first.setdefault(dev.gpu, size) != size:
                mixing += 1
        t0 = time.perf_counter()
        verdicts, _ = decide(claims, pool, {}, driver=DRIVER, pool_name="n-t4")
        decide_s.append(time.perf_counter() - t0)
        refused += sum(not v.ok for v in verdicts)
        sizes_ok: dict[str, set] = {}
        for v in verdicts:
            if v.ok:
                sizes_ok.setdefault(v.gpu, set()).add(v.size_mib)
        confirmed_mixing += sum(len(s) - 1 for s in sizes_ok.values())
    reach = confirmed_mixing  # allocations of a second size the agent would let through
    lines = [f"Scheduler race, 8 x T4 at 1.36 (binding conditions): {ROUNDS} rounds x {CLAIMS} claims of random "
             f"sizes from one snapshot; {which}", HEADER,
             row("allocations mixing sizes on a GPU", f"{mixing} of {allocated}", "same", None,
                 "what the counters alone let through"),
             row("mixing allocations reaching prepare", str(reach), str(mixing), None,
                 f"target 0; ours: refused at PreBind ({refused}); peer: every size without binding conditions"),
             row("agent decision per round (ms)", f"{min(decide_s) * 1e3:.2f}", "5000", min(decide_s) / 5.0,
                 f"fastest of {ROUNDS}; bound: the scheduler polls the conditions every 5 s")]
    return lines + window()


def window() -> list[str]:
    """The opt-in first-allocation shape (no groups, no binding conditions): how long an empty GPU
    keeps offering every size after its first allocation is stored, with the running agent (a
    watch of the claims wakes it; it republishes the GPU). Allocations of another size in that
    window reach prepare and fail there."""
    base = Path(tempfile.mkdtemp(prefix="vgw", dir="/tmp"))
    times: list[float] = []
    try:
        sim = sim_node(base / "h", HostSpec(name="T4", node="n-t4", gpus=[GpuGroup(board="T4", count=2)]))
        with LocalApiServer(version="1.36", feature_gates={"DRADeviceBindingConditions": False}) as srv:
            api = srv.api_client()
            client.CoreV1Api(api).create_node(body({"metadata": {"name": sim.node}}))
            cfg = ServeConfig(node_name=sim.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                              server_version=(1, 36), resync_seconds=3600, sizes_by_first_allocation=True,
                              layout_file=None)
            daemon = Daemon(cfg, sim.env, sim.io, api).start()
            thread = threading.Thread(target=daemon.run, daemon=True)
            thread.start()
            res = client.ResourceV1Api(api)

            def gpu0_sizes() -> set[str]:
                return {d["capacity"]["memory"]["value"] for s in srv.objects("resourceslices")
                        for d in s["spec"].get("devices") or [] if d["attributes"]["gpuIndex"]["int"] == 0
                        and d["attributes"]["type"]["string"] == "vgpu"}

            def until(cond, limit=30.0) -> float:
                t0 = time.perf_counter()
                while not cond():
                    if time.perf_counter() - t0 > limit:
                        raise RuntimeError("the agent did not republish")
                    time.sleep(0.005)
                return time.perf_counter() - t0

            until(lambda: len(gpu0_sizes()) > 1)
            device = next(d["name"] for s in srv.objects("resourceslices") for d in s["spec"].get("devices") or []
                          if d["attributes"]["gpuIndex"]["int"] == 0 and d.get("capacity", {}).get("memory", {})
                          .get("value") == "8Gi")
            for i in range(5):
                srv.add({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": f"w{i}", "namespace": "default"},
                         "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                             "deviceClassName": "vgpu.kubevirt.io"}}]}},
                         "status": {"allocation": {"devices": {"results": [{
                             "request": "vgpu", "driver": DRIVER, "pool": sim.node, "device": device}]}}}})
                times.append(until(lambda: gpu0_sizes() == {"8Gi"}))
                res.delete_namespaced_resource_claim(f"w{i}", "default")
                until(lambda: len(gpu0_sizes()) > 1)
            daemon.stop()
            thread.join(30)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ms = sorted(t * 1e3 for t in times)
    return [row("first-allocation shape: window (ms)", f"{ms[0]:.0f}", "-", None,
                f"fastest of {len(ms)} (median {ms[len(ms) // 2]:.0f} ms): from an allocation stored to its GPU "
                "republished with that size; binding conditions close it (0 mixes reach prepare)")]
