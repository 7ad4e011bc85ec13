"""DRA bridge: API writes per resync, prepare latency, slice building (issue #3).

Peers, run side by side: a naive publisher that rewrites every slice each resync (what a
controller without diffing does), and for prepare the same claims prepared without the
checkpoint's fsync (the cost of crash safety).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.publisher import Publisher
from dra_bridge.kubeletplugin.driver import Driver
from dra_bridge.pool.devices import GpuPolicy, PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.rpc.types import ClaimRef
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.host.io import RealIO
from mdev_manager.reconcile import reconcile

from .common import HEADER, best_of, percentile, row, sim_host

DRA_ALL = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})


def _api_writes(lines: list[str]) -> None:
    with sim_host("default") as (host, env, io), LocalApiServer(version="1.36") as srv:
        reconcile(env, io, DRA_ALL)
        inv = discover(env, io)
        pub = Publisher(srv.api_client(), driver="vgpu.kubevirt.io", node_name="sim-node-1")
        pool = build_pool(inv, PoolPolicy.default(), "vgpu.kubevirt.io", server_version=pub.version)
        pub.sync(pool)
        unchanged = pub.sync(pool).writes
        # one device changes: the A100 is no longer offered whole (its passthrough device goes)
        a100 = next(g for g in inv.gpus if g.framework == "mdev-sriov")
        changed_pool = build_pool(inv, PoolPolicy(gpus={a100.address: GpuPolicy(passthrough=False)},
                                                  others=GpuPolicy()), "vgpu.kubevirt.io",
                                  server_version=pub.version)
        one = pub.sync(changed_pool).writes
        naive = len(srv.objects("resourceslices"))  # a rewrite-all controller writes every slice
    lines.append(row("API writes per resync, nothing changed", str(unchanged), str(naive), None, "target 0"))
    lines.append(row("API writes per resync, one device changes", str(one), str(naive), None, "target 1"))


class _NoFsyncIO(RealIO):
    def write_atomic(self, path, data, durable=True):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(data)


def _prepare(lines: list[str], n: int = 1000) -> None:
    with sim_host("default") as (host, env, io):
        reconcile(env, io, DRA_ALL)
        inv = discover(env, io)
        pool = build_pool(inv, PoolPolicy.default(), "vgpu.kubevirt.io", server_version=(1, 37))
        t4 = [d.name for d in pool.devices if d.kind == "vgpu" and "t4-1q" in d.name and d.gpu == inv.gpus[0].address]

        def claim(i):
            return {"metadata": {"name": f"c{i}", "namespace": "bench", "uid": f"00000000-0000-4000-8000-{i:012d}"},
                    "status": {"allocation": {"devices": {"results": [
                        {"request": "vgpu", "driver": "vgpu.kubevirt.io", "pool": "sim-node-1", "device": t4[0]}]}}}}

        class Claims:
            def get(self, ns, name):
                return claim(int(name[1:]))

        def run(paths_io) -> list[float]:
            with tempfile.TemporaryDirectory(dir="/tmp") as d:
                drv = Driver(env=env, paths=NodePaths.under(Path(d)), pool_name="sim-node-1", claims=Claims(),
                             pool=lambda: pool, io=io)
                drv.store.io = paths_io
                lat = []
                for i in range(n):
                    ref = ClaimRef(namespace="bench", uid=f"00000000-0000-4000-8000-{i:012d}", name=f"c{i}")
                    t0 = time.perf_counter()
                    res = drv.prepare([ref])[ref.uid]
                    lat.append(time.perf_counter() - t0)
                    assert res.error is None, res.error
                    drv.unprepare([ref])  # keep the GPU from filling: one vGPU at a time
                return lat

        ours = run(io)
        peer = run(_NoFsyncIO())
    for p in (50, 99):
        a, b = percentile(ours, p) * 1000, percentile(peer, p) * 1000
        lines.append(row(f"prepare latency p{p} ({n} claims, fsync)", f"{a:.2f} ms", f"{b:.2f} ms", a / b,
                         "peer: no fsync" + ("; target p99 < 20 ms" if p == 99 else "")))


def _slices(lines: list[str]) -> None:
    with sim_host("bench-large") as (host, env, io):
        inv = discover(env, io)
        t_disc = best_of(lambda: discover(env, io), 1)
        pol = PoolPolicy.default()

        def build():
            pool = build_pool(inv, pol, "vgpu.kubevirt.io", server_version=(1, 37))
            return build_slices(pool, driver="vgpu.kubevirt.io", node_name="sim-large", pool_name="sim-large",
                                generation=1, server_version=(1, 37))

        slices = build()
        t = best_of(build)
    n_dev = sum(len(s["spec"].get("devices") or []) for s in slices)
    lines.append(row(f"build slices, 16 GPUs ({n_dev} devices, {len(slices)} slices)", f"{t * 1000:.0f} ms",
                     f"{t_disc * 1000:.0f} ms", t / t_disc, "peer: discovering the same node"))


def run() -> list[str]:
    lines = ["DRA bridge", HEADER]
    _api_writes(lines)
    _prepare(lines)
    _slices(lines)
    return lines
