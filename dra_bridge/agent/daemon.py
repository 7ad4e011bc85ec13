"""``vgpuctl serve``: the node agent. Reconcile, publish, serve the kubelet, report health.

One resync = reconcile the layout (when one is given; devices held by prepared claims
count as in use) -> discover -> build the pool -> publish slices. It runs at start, every
``resync_seconds`` (skipped when nothing changed), and on uevents (:mod:`.hotplug`: udev where
the host's ``/sys`` is, else the event source given): an event marks the GPUs it names to be read
again and wakes the loop for a resync that reads only those, not a forced one. SIGTERM stops the servers
and removes their sockets; vGPUs stay (the kubelet unprepares claims, not us).

The layout is read again when the node label names another one or the file's content
changes. The content is hashed through the path on every resync, not watched: kubelet updates
a mounted ConfigMap by swapping a ``..data`` symlink, which an inotify watch on the path misses.

Every host write (restore, reconcile, the kubelet plugin's prepare and unprepare) holds the
node lock (:mod:`mdev_manager.host.lock`), so a hand-run ``vgpuctl apply`` waits for it, and
the agent for the hand-run one. The state label reads ``success`` only when the node matches
its layout: devices in use that hold it back make it ``pending``, with the reason in the
``vgpu.kubevirt.io/config.reason`` annotation. Events on the Node (:mod:`.events`) say when a
layout is applied, blocked or failed; the metrics (:mod:`.observe`) carry the layout state and
the free vGPUs per GPU and profile (:mod:`.capacity`).

:class:`Daemon` holds the state; its parts live beside it: the layout (:mod:`.layoutsync`), the uevent
watch (:mod:`.eventwatch`), what the API server keeps and the node is told (:mod:`.serverfields`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from dra_bridge.agent.binder import SizeBinder, bind_loop, host_sizes, prepared_devices
from dra_bridge.agent.capacity import free_vgpus
from dra_bridge.agent.config import ServeConfig  # also imported from here by vgpuctl serve and the tests
from dra_bridge.agent.cordon import NodeCordon
from dra_bridge.agent.events import LayoutEvents, one_line
from dra_bridge.agent.eventwatch import EventWatch
from dra_bridge.agent.gpustate import GpuStates
from dra_bridge.agent.health import GpuHealthWatch
from dra_bridge.agent.hotplug import EventSource
from dra_bridge.agent.layoutsync import LayoutSync, content_digest
from dra_bridge.agent.observe import Metrics, ProbeServer
from dra_bridge.agent.serverfields import ServerFields
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.claims import ApiClaimSource
from dra_bridge.apiclient.claimwatch import ClaimCache
from dra_bridge.apiclient.kept import KeptFields
from dra_bridge.apiclient.nodes import node_metadata
from dra_bridge.apiclient.publisher import Publisher
from dra_bridge.kubeletplugin.driver import Driver
from dra_bridge.pool.cordon import withheld_classic
from dra_bridge.pool.devices import Pool, PoolPolicy
from dra_bridge.pool.health import healthy_pool
from dra_bridge.pool.policy import policy_from_layout, with_outside
from dra_bridge.pool.shape import node_pool
from dra_bridge.rpc.dra_grpc import KubeletPlugin
from dra_bridge.rpc.types import ClaimRef, PrepareResult
from mdev_manager import numbering
from mdev_manager.config import ConfigError, GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO
from mdev_manager.host.lock import NodeLock
from mdev_manager.models import Inventory, Usage
from mdev_manager.plan import select_gpus
from mdev_manager.restore import restore
from mdev_manager.usage import collect_usage

log = logging.getLogger(__name__)


class Daemon(LayoutSync, EventWatch, ServerFields):
    def __init__(self, cfg: ServeConfig, env: HostEnv, io: HostIO | None = None, api_client: Any = None,
                 events: EventSource | None = None):
        self.cfg = cfg
        self.env = env
        self.io = io or RealIO()
        self.api_client = api_client
        self.metrics = Metrics()
        self.paths = NodePaths(driver=cfg.driver, kubelet_root=cfg.kubelet_root, cdi_root=cfg.cdi_root)
        self.publisher = Publisher(api_client, driver=cfg.driver, node_name=cfg.node_name, version=cfg.server_version,
                                   on_error=lambda code: self.metrics.api_errors.labels(code).inc())
        self.layouts: list[GpuLayout] | None = None
        self._layout_name = cfg.layout
        self._labels: dict[str, str] = {}
        self._annotations: dict[str, str] | None = None  # None: not read (no label options)
        self.events = LayoutEvents(api_client, cfg.node_name)
        self._digest: str | None = None  # content hash of the layout file the layouts came from
        self.node_lock = NodeLock(env, f"vgpuctl serve (node agent of {cfg.node_name})")
        self._pool = Pool()
        self.inventory: Inventory | None = None
        self.gpu_states = GpuStates(env, self.io, cfg.node_name)  # each GPU's state, read again where it changed
        self.claim_api = ApiClaimSource(api_client)  # the driver's claims, and the binding rounds' writes
        self.driver = Driver(env=env, paths=self.paths, pool_name=cfg.node_name, claims=self.claim_api,
                             pool=lambda: self._pool, io=self.io)
        # not serialised: the driver holds each claim's GPUs' locks, so claims on other GPUs go on meanwhile
        self.plugin = KubeletPlugin(cfg.driver, self.driver, cfg.kubelet_root,
                                    health_poll_interval=cfg.health_poll_seconds, serialize=False)
        self.probes: ProbeServer | None = None
        self.kept = KeptFields()  # which DRA fields the server keeps (probe, then every write's answer)
        self._claims_changed = 0  # bumped by every prepare and unprepare
        self._claims_lock = threading.Lock()  # (prepares of claims on different GPUs run at once)
        self._last_key: tuple | None = None  # what the last complete resync saw (see _unchanged)
        self._last_full = 0.0
        self._last_check = 0.0  # the last safety-net check (every GPU in MIG mode read again)
        self._safe_warned: list[str] = []
        self._probed_at: float | None = None
        self._kept_annotated: str | None = None
        self.binder = SizeBinder(cfg.driver, cfg.node_name)  # sizes confirmed through binding conditions
        self.cordon = NodeCordon(api_client, cfg.node_name, wake=self.trigger)  # vgpuctl cordon, from a watch
        self.claim_cache: ClaimCache | None = None  # the binding loop's watch of the claims
        self._bind_lock = threading.Lock()
        self.health = GpuHealthWatch(self.io, api_client, cfg.node_name, cfg.health_quiet_seconds, self.env,
                                     lost_effect=cfg.gpu_lost_effect)
        self.driver.gpu_health = self.health.messages  # the kubelet's health service says it per device
        self.driver.touched = self._touched  # a claim's GPUs are read again, not the whole node
        self.driver.gpu_state = self.gpu_states.gpu  # a prepare plans on the GPU's state in memory
        self._driver_label: str | None = None  # the host driver version last labelled ("": none to read)
        # the node's GPU numbering, which device names carry (an earlier release kept it in the data dir)
        numbering.adopt(self.env, self.io, self.paths.gpu_ids)
        self.device_plugins = None
        self._dp_exclude: set[str] = set()
        self._applied_layout: str | None = None
        self._recorded: tuple[str, str | None] | None = None  # (layout, file digest) last recorded (applied.py)
        self._failed: tuple[str, str | None] | None = None  # (layout, file digest) rejected: not retried
        self._last_good: list[GpuLayout] | None = None  # the last layout applied: published while a new one fails
        self.event_source = events  # None: udev where sys_root is /sys, else none (the periodic resync covers it)
        self._wake = threading.Event()
        self._forced = threading.Event()  # a trigger (cordon): resync even if nothing seems changed
        self._stop = threading.Event()
        self._ready = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ one resync
    def _resync_key(self, claims_changed: int | None = None, host: str | None = None) -> tuple:
        """What a resync's outcome depends on, cheaply: the host's fingerprint (``host``: as the resync
        read it before it read any GPU, else read now), the layout's name and
        file content, the claims prepared (a count of prepares and unprepares), the fields the server keeps,
        the node's cordon (from a watch), the GPU sizes the binding rounds settled (a republish that
        failed is made again)."""
        name = self.cfg.layout
        if self.cfg.layout_label:
            name = node_metadata(self.api_client, self.cfg.node_name)[0].get(self.cfg.layout_label, name)
        digest = content_digest(self.cfg.layout_file) if self.cfg.layout_file else None
        claims = self._claims_changed if claims_changed is None else claims_changed
        return (host or self.gpu_states.read_host_print(), name, digest, claims, self.kept, self.cordon.key(),
                self.health.tracker.key(), tuple(sorted(self.binder.assigned.items())))

    def _unchanged(self) -> bool:
        """Nothing a resync depends on changed since the last complete one, which is recent enough."""
        now = time.monotonic()
        full_every = self.cfg.full_resync_seconds or 10 * self.cfg.resync_seconds
        if self._last_key is None or now - self._last_full >= full_every or \
                self._probed_at is None or now - self._probed_at >= self.cfg.probe_seconds:
            return False
        if self.gpu_states.pending():  # a prepare or a uevent named GPUs to read again
            return False
        return self._resync_key() == self._last_key and self.publisher.is_current()

    def resync(self, force: bool = True) -> dict:
        """One resync. ``force=False`` (the periodic loop) skips it when :meth:`_unchanged` says so."""
        with self._lock:
            polled = _health_key(self.inventory)
            self.health.poll(self.inventory)  # cheap NVML reads: a GPU turning sick makes the resync run
            if not force and self._unchanged():
                self.metrics.resyncs.labels("unchanged").inc()
                return {"unchanged": True}
            claims = self._claims_changed  # a prepare during the resync makes the next one run
            now = time.monotonic()
            check = now - self._last_check >= (self.cfg.full_resync_seconds or 10 * self.cfg.resync_seconds)
            with self.metrics.resync_seconds.time():
                result = self._resync(check, polled)
            if check:
                self._last_check = now
            # the host as this resync read it (no second listing): a change made meanwhile shows next time
            self._last_key, self._last_full = self._resync_key(claims, self.gpu_states.host_print), time.monotonic()
            return result

    def _resync(self, check: bool = False, polled: tuple | None = None) -> dict:
        """``polled``: the GPUs whose health the caller just read (:func:`_health_key`): not read again."""
        rejected: ConfigError | None = None
        seen: Usage | None = None  # who used what when the layout was applied (None: not applied)
        try:
            try:
                layouts = self._current_layouts()
                if layouts is not None:
                    seen = self._apply_layout(layouts)
            except ConfigError as exc:
                # a rejected layout changes nothing on the node, so what the last good one
                # offers is still true and stays published; the error is raised after that
                rejected, layouts = exc, self._last_good
                if layouts is None:
                    raise
            before = self.driver.records()  # an unprepare drops its record after its vGPU: named here
            inv = self.gpu_states.current(check=check)  # only the GPUs that changed are read again
            if inferred_mixed(inv):  # maybe a read torn by a prepare: read those again with the host still
                self.gpu_states.touched(g.address for g in inv.gpus if g.mixed_size and g.placements is None)
                with self.node_lock.hold():
                    inv = self.gpu_states.current(check=check)
            records = self.driver.records()  # a prepare records its vGPU before making it: named here
            numbering.record(self.env, self.io, [(g.address, g.vendor_id) for g in inv.gpus])
            self._label_driver_version(inv)
            policy = policy_from_layout(inv, layouts)
            if self.device_plugins is not None:
                if layouts is None:
                    policy = PoolPolicy()  # classic-only node: the device plugin advertises everything
                # a GPU offered through DRA is never also advertised by the device plugin
                self._dp_exclude = set(policy.gpus) | (
                    {g.address for g in inv.gpus} if policy.others is not None else set())
                self.device_plugins.refresh(inv, withheld=self._classic_cordon)
            # vGPUs no claim holds keep their room from the claims (#36.2)
            policy = with_outside(policy, inv, {d.vgpu_id for rec in (*before, *records) for d in rec.devices
                                                if d.vgpu_id})
            self._check_fields()
            shape = self.shape()
            if shape.binding:  # a GPU freed since the last binding round is offered whole now
                self.binder.observe_host(self._pool, host_sizes(inv, records))
            pool = node_pool(inv, layouts, self.cfg.driver, shape,
                             narrow=self.binder.policy, policy=policy)
            if not shape.counters and pool.warnings != self._safe_warned:  # said once per change
                for warning in pool.warnings:
                    log.warning("%s", warning)
                self._safe_warned = list(pool.warnings)
            self._pool, self.inventory = pool, inv
            held = {d.device for rec in self.driver.records() for d in rec.devices}  # stays published
            if _health_key(inv) != polled:  # GPUs came, went or changed driver since the caller's poll
                self.health.poll(inv)
            healthy, _sick = healthy_pool(pool, self.health.tracker, self.cfg.driver, taints=self.kept.taints is True,
                                          in_use=held)
            result = self.cordon.publish(self.publisher, healthy, self.kept, held)
            self._note_fields(self.kept.merged(self.publisher.kept))
        except Exception as exc:  # one line in the log (the traceback at debug level)
            self.metrics.resyncs.labels("error").inc()
            log.error("resync failed: %s", one_line(exc))
            log.debug("resync failed", exc_info=True)
            raise
        self.metrics.resyncs.labels("ok").inc()
        for verb, n in (("create", result.created), ("update", result.updated), ("delete", result.deleted)):
            if n:
                self.metrics.api_writes.labels(verb).inc(n)
        for kind in ("vgpu", "passthrough"):
            self.metrics.devices.labels(kind).set(sum(1 for d in pool.devices if d.kind == kind))
        self.metrics.set_node(inv, pool, {r.uid: r for r in self.driver.records()})
        self.metrics.set_free_vgpus(self._free_vgpus(inv, pool, layouts, seen))
        if rejected is not None:
            raise rejected
        return result.model_dump()

    def _classic_cordon(self, gpus: list[tuple[str, list[str]]]) -> tuple[dict[str, str], dict[str, str]]:
        """A cordon on the device-plugin path: a cordoned GPU's free devices are advertised Unhealthy, so
        the kubelet admits no new pod on them (what pods hold, from PodResources, stays; where that cannot
        be read every device of the GPU is withheld: a cordon must hold)."""
        cordon = self.cordon.current()
        if not cordon or self.device_plugins is None:
            return {}, {}
        usage = self.device_plugins.usage()
        return withheld_classic(gpus, cordon, () if usage.warnings else [*usage.mdevs, *usage.pci])

    def _free_vgpus(self, inv: Inventory, pool: Pool, layouts: list[GpuLayout] | None,
                    seen: Usage | None) -> dict[tuple[str, str], int]:
        """Free vGPUs per GPU and profile. The users are the ones the layout's apply just saw
        (``seen``); the host is scanned only when no apply ran and a vgpu-mode GPU holds vGPUs."""
        vgpu_mode = {a for a, e in select_gpus(inv, layouts).items() if e.mode == "vgpu"} if layouts else set()
        usage = seen or Usage()
        if seen is None and any(g.vgpus for g in inv.gpus if g.address in vgpu_mode):
            usage = collect_usage(self.env, self.io, self._usage())
        return free_vgpus(inv, pool, vgpu_mode, usage)

    def bind(self, claims: list[dict] | None = None) -> int:
        """Confirm or refuse the allocations waiting on our binding conditions (``claims``: as a
        watch keeps them; None: LIST); republish when a GPU's size was settled or freed. Returns
        how many were decided."""
        if not self.shape().binding:
            return 0
        with self._bind_lock:
            try:  # decide on the host as it is: a vGPU made by hand since the last resync takes its room
                self.resync(force=False)
            except Exception:  # noqa: BLE001 - said by resync; the GPUs it read are current all the same
                pass
            records = self.driver.records()  # the claims prepared now: current where a discovery is not
            verdicts, changed = self.binder.bind(self.claim_api, self._pool, host_sizes(self.inventory, records),
                                                 claims, prepared_devices(records, self.cfg.node_name))
            for v in verdicts:
                (log.info if v.ok else log.warning)("claim %s/%s device %s: %s", v.namespace, v.claim, v.device,
                                                    v.message)
            if changed:
                self.resync()
            if self.binder.failed is not None:
                raise self.binder.failed  # the loop says so and tries again
            return len(verdicts)

    def _bind_loop(self) -> None:
        self.claim_cache = ClaimCache(self.api_client)
        bind_loop(self.claim_cache, active=lambda: bool(self.shape().binding), bind=self.bind, stop=self._stop,
                  retry_seconds=self.cfg.bind_seconds)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Daemon:
        with self.node_lock.hold():  # after a reboot: saved vGPUs first, then the layout
            restored = restore(self.env, self.io, self.driver.usage())
        if any(r.changed for r in restored):
            log.info("restored %d saved vGPUs and VFs", sum(r.changed for r in restored))
        with self.node_lock.hold():
            undone = self.driver.recover()
        if undone:
            log.warning("undid %d half-prepared claims left by a crash: %s", len(undone), ", ".join(undone))
        self._wrap_prepare()
        if self.cfg.device_plugin:
            from dra_bridge.deviceplugin.manager import DevicePluginManager

            self.device_plugins = DevicePluginManager(
                self.env, self.io, prefix=self.cfg.resource_prefix,
                inventory=lambda: self.inventory or discover(self.env, self.io, node=self.cfg.node_name),
                device_plugin_dir=self.paths.device_plugin_dir,
                pod_resources_socket=self.paths.pod_resources_socket,
                node=self.cfg.node_name, exclude=lambda _inv: self._dp_exclude)
        self._watch_events()  # before the first read: a change made while it runs is heard, not missed
        try:
            self.resync()
        except Exception as exc:  # logged in resync; the kubelet must still reach the plugin (unprepare)
            log.warning("first resync failed (%s); serving the kubelet plugin anyway, next try in %ss",
                        one_line(exc), self.cfg.resync_seconds)
            if self.inventory is None:
                self.inventory = discover(self.env, self.io, node=self.cfg.node_name)
        if self.device_plugins is not None:
            self.device_plugins.start(self.inventory)
        self.plugin.start()
        if self.cfg.metrics_port is not None:
            self.probes = ProbeServer(self.metrics, lambda: self._ready and self.plugin.running,
                                      port=self.cfg.metrics_port).start()
        self._ready = True
        return self

    def _wrap_prepare(self) -> None:
        """Time every prepare for the histogram without the driver knowing about metrics; prepare
        and unprepare write to the host, so they hold the node lock, shared: each holds only its claim's
        GPUs' locks (:mod:`dra_bridge.kubeletplugin.gpulocks`), so claims on other GPUs are prepared
        meanwhile, and a hand-run ``vgpuctl apply`` (or the agent's reconcile) waits for all of them."""
        inner, inner_unprepare = self.driver.prepare, self.driver.unprepare

        def unprepare(claims: list[ClaimRef]) -> dict[str, str | None]:
            with self.node_lock.hold(shared=True):  # beside other claims' calls, each under its GPUs' locks
                self._claim_changed()
                out = inner_unprepare(claims)
            if self.claim_cache is not None:  # an allocation withheld for a device it freed is answered now
                self.claim_cache.changed.set()
            return out

        def prepare(claims: list[ClaimRef]) -> dict[str, PrepareResult]:
            t0 = time.perf_counter()
            with self.node_lock.hold(shared=True):
                self._claim_changed()
                out = inner(claims)
            per = (time.perf_counter() - t0) / max(1, len(claims))
            for _uid, res in out.items():
                self.metrics.prepare_seconds.observe(per)
                if res.error:
                    self.metrics.prepare_errors.inc()
            return out

        self.driver.prepare = prepare  # type: ignore[method-assign]
        self.driver.unprepare = unprepare  # type: ignore[method-assign]

    def _claim_changed(self) -> None:
        with self._claims_lock:
            self._claims_changed += 1

    def _touched(self, gpus: set[str] | None) -> None:
        """A prepare or unprepare changed these GPUs (None: it cannot say which): the next resync reads
        them again, and only them."""
        if gpus is None:
            self.gpu_states.invalidate()
        else:
            self.gpu_states.touched(gpus)

    def run(self) -> None:
        """Resync until stopped (SIGTERM/SIGINT when called from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        binder = threading.Thread(target=self._bind_loop, name="bind", daemon=True)
        binder.start()
        while not self._stop.is_set():
            self._wake.wait(self.cfg.resync_seconds)  # a uevent (its GPUs marked), a trigger, or the period
            self._wake.clear()
            forced = self._forced.is_set()
            self._forced.clear()
            if self._stop.is_set():
                break
            try:
                self.resync(force=forced)
            except Exception:
                pass  # logged and counted in resync; the next round tries again
        self._shutdown()

    def trigger(self) -> None:
        self._forced.set()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _shutdown(self) -> None:
        self._ready = False
        if self.event_source is not None:
            self.event_source.stop()
        self.plugin.stop()
        if self.device_plugins is not None:
            self.device_plugins.stop()
        if self.probes:
            self.probes.stop()
        self.publisher.close()
        self.cordon.stop()
        log.info("stopped; sockets removed, devices left in place")


def _health_key(inv: Inventory | None) -> tuple | None:
    """What a health poll of ``inv`` reads: each GPU and its driver (the same key: the same reads, so a
    resync polls once, not twice ms apart; in the simulator each NVML read waits for the GPU writes in flight)."""
    return None if inv is None else tuple((g.address, g.vendor_id, g.driver) for g in inv.gpus)


def inferred_mixed(inv: Inventory) -> bool:
    """Whether a GPU's mixed-size mode was inferred from sysfs (no NVML mode for it) as on. The
    inference (a GPU holding a vGPU while another size still reads available) is only as good as
    one consistent read: a discovery without the node lock, concurrent with a prepare, can see the
    new vGPU and the other sizes' availability from before it, and an equal-size GPU then published
    every size unnarrowed, without binding conditions, beside a vGPU of one size (#36.2: a slot the
    next resync withdrew before its prepare)."""
    return any(g.mixed_size and g.placements is None for g in inv.gpus)

