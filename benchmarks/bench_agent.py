"""The node agent at rest (issue #15): CPU and API requests of an idle resync, and its memory.

* Idle resync, on the largest preset (16 L40S x 32 VFs, mdev on VFs, every GPU in ``dra`` mode)
  against the local API server: CPU time (``process_time``, this process only: the API server
  runs in a thread of it, so its share is measured apart and subtracted) of a periodic resync
  that finds nothing changed, beside a forced full resync (what every periodic resync did
  before) — fastest of ``RUNS``, interleaved. API requests per idle resync beside a model of
  upstream's slice controller (k8s.io/dynamic-resource-allocation/resourceslice: an informer,
  no periodic LIST, writes only on change: 0 requests when idle) and the bytes one LIST of the
  node's slices would move.
* ``vgpuctl serve`` as a separate process (real imports, real sockets) against ``vgpuctl sim
  apiserver``: resident memory (VmRSS) once it is ready, on the default preset and the largest,
  beside the bound the issue sets (80 MB) and a Python that imports only the serve path's modules.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kubernetes import client
from kubernetes import config as kconfig

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.apiclient.objects import body
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import parse_config
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import load_host
from mdev_manager.sim.node import sim_node
from tests.support.dra import claim_object

from .common import HEADER, register_plugin, row

RUNS = int(os.environ.get("VGPUCTL_BENCH_RUNS", "5"))
DRA_ALL = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})
RSS_BOUND_MB = 80
PREPARED = int(os.environ.get("VGPUCTL_BENCH_PREPARED", "512"))


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _idle_resync(lines: list[str]) -> None:
    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix="vgagent") as d, LocalApiServer(version="1.36") as srv:
        sim = sim_node(Path(d) / "host", "bench-large")
        reconcile(sim.env, sim.io, DRA_ALL)
        cfg = ServeConfig(node_name=sim.node, kubelet_root=Path(d) / "kl", cdi_root=Path(d) / "cdi", metrics_port=None,
                          resync_seconds=30.0, full_resync_seconds=3600)
        daemon = Daemon(cfg, sim.env, sim.io, srv.api_client())
        try:
            daemon.resync()
            daemon.resync(force=False)  # warm
            idle, full = float("inf"), float("inf")
            for _ in range(RUNS):
                srv.reset_counters()
                idle = min(idle, _cpu(lambda: daemon.resync(force=False)))
                requests = [r for r in srv.request_log if r.verb != "watch"]
                full = min(full, _cpu(lambda: daemon.resync(force=True)))
            listed = sum(len(str(o)) for o in daemon.publisher.existing(all_pools=True).values())
            n_dev = len(daemon._pool.devices)
        finally:
            daemon.publisher.close()
    lines.append(row(f"idle resync CPU ({n_dev} devices published)", f"{idle * 1000:.1f} ms", f"{full * 1000:.0f} ms",
                     idle / full, "peer: a full resync (discover, reconcile, build, compare); bound: 50 ms"))
    lines.append(row("API requests per idle resync", str(len(requests)), "0", None,
                     f"peer: upstream's informer-based slice controller; a LIST would move {listed / 1e6:.2f} MB"))


def _first_vgpu_once(in_place: bool) -> tuple[int, float, int]:
    """(slice writes, CPU of the resync, slices) after the first vGPU on an empty GPU of the largest preset
    at 1.36 (binding conditions: the GPU narrows to the size it settled). ``in_place=False``: the peer,
    the publisher as it was before 12-08, which bumped the generation and wrote every slice."""
    from dra_bridge.apiclient.publisher import Publisher
    from tests.support.dra import add_claim

    class Bumping(Publisher):
        def _in_place(self, have, want, generation, membership):
            return super()._in_place(have, want, generation, False)

    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix="vgfirst") as d, LocalApiServer(version="1.36") as srv:
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "sim-large"}})
        sim = sim_node(Path(d) / "host", "bench-large")
        reconcile(sim.env, sim.io, DRA_ALL)
        cfg = ServeConfig(node_name=sim.node, kubelet_root=Path(d) / "kl", cdi_root=Path(d) / "cdi", metrics_port=None,
                          resync_seconds=3600.0, full_resync_seconds=3600)
        daemon = Daemon(cfg, sim.env, sim.io, srv.api_client())
        if not in_place:
            daemon.publisher.__class__ = Bumping
        try:
            daemon.resync()
            assert daemon.inventory is not None
            gpu = daemon.inventory.gpus[len(daemon.inventory.gpus) // 2]
            dev = next(x for x in daemon._pool.devices if x.gpu == gpu.address and x.binding_conditions)
            ref = add_claim(srv, "first", [("vgpu", dev.name)], node=sim.node)
            assert daemon.driver.prepare([ref])[ref.uid].error is None
            srv.reset_counters()
            cpu = _cpu(lambda: daemon.resync(force=False))
            writes = sum(1 for w in srv.writes if w.resource == "resourceslices")
            return writes, cpu, len(srv.objects("resourceslices"))
        finally:
            daemon.publisher.close()


def _first_vgpu(lines: list[str], runs: int = 3) -> None:
    ours, peer = [], []
    for _ in range(runs):  # interleaved
        ours.append(_first_vgpu_once(True))
        peer.append(_first_vgpu_once(False))
    (w, _, n), (pw, _, _) = min(ours, key=lambda r: r[1]), min(peer, key=lambda r: r[1])
    cpu, pcpu = min(r[1] for r in ours), min(r[1] for r in peer)
    lines.append(row("resync after the first vGPU on an empty GPU (1.36, largest preset): slice writes, CPU",
                     f"{w} writes, {cpu * 1000:.0f} ms", f"{pw} writes, {pcpu * 1000:.0f} ms", cpu / pcpu,
                     f"peer: the generation bumped, all {n} slices written (before 12-08); CPU of this process "
                     "(the local API server in it), least of the interleaved runs"))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _prepare_through(kc: Path, kl: Path, node: str, count: int) -> int:
    """Register the running agent's plugin with a kubelet model and prepare ``count`` one-vGPU
    claims (one type per GPU, spread over the GPUs) through its socket; the claims prepared."""
    api = kconfig.new_client_from_config(str(kc))
    res = client.ResourceV1Api(api)
    d = "vgpu.kubevirt.io"
    by_gpu: dict[str | int | None, list[str]] = {}
    first_type: dict[str | int | None, str | int | None] = {}
    for s in res.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        for dev in s.spec.devices or []:
            attrs = {k: (v.string if v.string is not None else v.int) for k, v in (dev.attributes or {}).items()}
            if attrs.get("type") != "vgpu":
                continue
            gpu = attrs["gpuIndex"]
            if first_type.setdefault(gpu, attrs["typeId"]) == attrs["typeId"]:
                by_gpu.setdefault(gpu, []).append(dev.name)
    names = [devs[i] for i in range(max(map(len, by_gpu.values()))) for devs in by_gpu.values() if i < len(devs)]
    reg = register_plugin(kl)
    done = 0
    with reg.client("v1") as plugin:
        for i, name in enumerate(names[:count]):
            claim = claim_object(f"c{i}", [("vgpu", name)], node=node, driver=d)
            status = claim.pop("status")
            made = res.create_namespaced_resource_claim("default", body(claim))
            made.status = status
            res.replace_namespaced_resource_claim_status(f"c{i}", "default", api.sanitize_for_serialization(made))
            assert made.metadata is not None  # the server's answer names the claim
            out = plugin.prepare([("default", made.metadata.uid, f"c{i}")])
            done += out[made.metadata.uid]["error"] == ""
    return done


def _serve_rss(preset: str, settle: float = 3.0, prepare: int = 0) -> tuple[float, int]:
    """(VmRSS in MB, claims prepared) of ``vgpuctl --simulate PRESET serve`` once ready (published,
    plugin up), after ``prepare`` claims through its socket, and a few seconds of resyncs later."""
    with tempfile.TemporaryDirectory(prefix="vgrss", dir="/tmp") as d:
        kc = Path(d) / "kc"
        kl = Path(d) / "k"  # unix socket paths must stay short
        cli = [sys.executable, "-m", "vgpuctl.main"]
        api = subprocess.Popen([*cli, "sim", "apiserver", "--kubeconfig-out", str(kc), "--version", "1.36"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if kc.exists():
                    break
                time.sleep(0.05)
            env = {**os.environ, "VGPUCTL_SIM_DIR": str(Path(d) / "sim")}
            port = _free_port()
            srv = subprocess.Popen([*cli, "--simulate", preset, "serve", "--kubeconfig", str(kc), "--metrics-port",
                                    str(port), "--resync", "1",
                                    "--kubelet-root", str(kl), "--cdi-root", str(Path(d) / "cdi")],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 600
                while not _ready(port):
                    if srv.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"vgpuctl serve ({preset}) did not become ready")
                    time.sleep(0.2)
                done = _prepare_through(kc, kl, _node_of(preset), prepare) if prepare else 0
                time.sleep(settle)
                return _rss_kb(srv.pid) / 1024, done
            finally:
                srv.terminate()
                srv.wait(timeout=30)
        finally:
            api.terminate()
            api.wait(timeout=30)


def _node_of(preset: str) -> str:
    return load_host(preset).node


def _imports_rss() -> float:
    # what serve imports before it serves: the agent, and the API client its ``connect`` imports
    code = ("import vgpuctl.commands.serve, dra_bridge.agent.daemon, dra_bridge.apiclient.client; "
            "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


def run() -> list[str]:
    lines = ["Node agent at rest", HEADER]
    _idle_resync(lines)
    _first_vgpu(lines)
    imports = _imports_rss()
    for preset, prepare in (("default", 0), ("bench-large", 0), ("bench-large", PREPARED)):
        mb, done = _serve_rss(preset, prepare=prepare)
        what = f"{done} vGPUs prepared" if prepare else "after start"
        lines.append(row(f"serve RSS, {what} ({preset})", f"{mb:.0f} MB", f"{RSS_BOUND_MB} MB", mb / RSS_BOUND_MB,
                         f"peer: the bound; the serve path's imports alone take {imports:.0f} MB"))
    return lines
