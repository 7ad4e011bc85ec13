"""``vgpuctl serve``: the node agent. Reconcile, publish, serve the kubelet, report health.

One resync = reconcile the layout (when one is given; devices held by prepared claims
count as in use) -> discover -> build the pool -> publish slices. It runs at start, on
udev events where udev exists, and every ``resync_seconds``. SIGTERM stops the servers
and removes their sockets; vGPUs stay (the kubelet unprepares claims, not us).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

from mdev_manager.config import GpuLayout, load_config
from mdev_manager.discovery import discover
from mdev_manager.env import HostEnv
from mdev_manager.hostio import HostIO, RealIO
from mdev_manager.models import Inventory
from mdev_manager.reconcile import reconcile

from .claims import ApiClaimSource
from .devices import Pool, build_pool
from .driver import Driver
from .grpc_plugin import KubeletPlugin
from .observe import Metrics, ProbeServer
from .paths import DEFAULT_DRIVER, PluginPaths
from .policy import policy_from_layout
from .publisher import Publisher

log = logging.getLogger(__name__)


class ServeConfig(BaseModel):
    node_name: str = Field(description="this node (NODE_NAME from the downward API)")
    driver: str = DEFAULT_DRIVER
    layout_file: Path | None = None
    layout: str = "default"
    resync_seconds: float = 30.0
    server_version: tuple[int, int] | None = None
    metrics_port: int | None = 8080
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_root: Path = Path("/var/run/cdi")
    health_poll_seconds: float = 5.0


class Daemon:
    def __init__(self, cfg: ServeConfig, env: HostEnv, io: HostIO | None = None, api_client=None):
        self.cfg = cfg
        self.env = env
        self.io = io or RealIO()
        self.api_client = api_client
        self.metrics = Metrics()
        self.paths = PluginPaths(driver=cfg.driver, kubelet_root=cfg.kubelet_root, cdi_root=cfg.cdi_root)
        self.publisher = Publisher(api_client, driver=cfg.driver, node_name=cfg.node_name, version=cfg.server_version)
        self.layouts: list[GpuLayout] | None = load_config(cfg.layout_file, cfg.layout) if cfg.layout_file else None
        self._pool = Pool()
        self.inventory: Inventory | None = None
        self.driver = Driver(env=env, paths=self.paths, pool_name=cfg.node_name, claims=ApiClaimSource(api_client),
                             pool=lambda: self._pool, io=self.io)
        self.plugin = KubeletPlugin(cfg.driver, self.driver, cfg.kubelet_root,
                                    health_poll_interval=cfg.health_poll_seconds)
        self.probes: ProbeServer | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ one resync
    def resync(self) -> dict:
        with self._lock:
            try:
                if self.layouts is not None:
                    out = reconcile(self.env, self.io, self.layouts, usage_extra=self.driver.usage(),
                                    node=self.cfg.node_name)
                    for r in out.rounds:
                        for f in (r.report.failed if r.report else []):
                            log.warning("layout step failed: %s: %s %s", f.step, f.error, f.message)
                inv = discover(self.env, self.io, node=self.cfg.node_name)
                policy = policy_from_layout(inv, self.layouts)
                pool = build_pool(inv, policy, self.cfg.driver, server_version=self.publisher.version,
                                  pcie_roots={g.address: g.pcie_root for g in inv.gpus if g.pcie_root})
                self._pool, self.inventory = pool, inv
                result = self.publisher.sync(pool)
            except Exception:
                self.metrics.resyncs.labels("error").inc()
                log.exception("resync failed")
                raise
            self.metrics.resyncs.labels("ok").inc()
            for verb, n in (("create", result.created), ("update", result.updated), ("delete", result.deleted)):
                if n:
                    self.metrics.api_writes.labels(verb).inc(n)
            for kind in ("vgpu", "passthrough"):
                self.metrics.devices.labels(kind).set(sum(1 for d in pool.devices if d.kind == kind))
            self.metrics.gpus.set(len(inv.gpus))
            self.metrics.vgpus.set(len(inv.all_vgpus()))
            self.metrics.prepared_claims.set(len(self.driver.cp.claims))
            return result.model_dump()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "Daemon":
        undone = self.driver.recover()
        if undone:
            log.warning("undid %d half-prepared claims left by a crash: %s", len(undone), ", ".join(undone))
        self._wrap_prepare()
        self.resync()
        self.plugin.start()
        if self.cfg.metrics_port is not None:
            self.probes = ProbeServer(self.metrics, lambda: self._ready and self.plugin.running,
                                      port=self.cfg.metrics_port).start()
        self._watch_udev()
        self._ready = True
        return self

    def _wrap_prepare(self) -> None:
        """Time every prepare for the histogram without the driver knowing about metrics."""
        inner = self.driver.prepare

        def prepare(claims):
            t0 = time.perf_counter()
            out = inner(claims)
            per = (time.perf_counter() - t0) / max(1, len(claims))
            for uid, res in out.items():
                self.metrics.prepare_seconds.observe(per)
                if res.error:
                    self.metrics.prepare_errors.inc()
            return out

        self.driver.prepare = prepare

    def _watch_udev(self) -> None:
        """Wake the loop on PCI / mdev uevents; without udev the periodic resync covers it."""
        if self.env.sys_root != Path("/sys"):
            return
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context())
            monitor.filter_by("pci")
            monitor.filter_by("mdev")
            observer = pyudev.MonitorObserver(monitor, callback=lambda _dev: self._wake.set(), name="udev")
            observer.daemon = True
            observer.start()
        except Exception as exc:
            log.info("udev events unavailable (%s); resyncing every %ss", exc, self.cfg.resync_seconds)

    def run(self) -> None:
        """Resync until stopped (SIGTERM/SIGINT when called from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        while not self._stop.is_set():
            self._wake.wait(self.cfg.resync_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.resync()
            except Exception:
                pass  # logged and counted in resync; the next round tries again
        self._shutdown()

    def trigger(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _shutdown(self) -> None:
        self._ready = False
        self.plugin.stop()
        if self.probes:
            self.probes.stop()
        log.info("stopped; sockets removed, devices left in place")
