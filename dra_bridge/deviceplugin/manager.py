"""The classic device plugin's lifecycle: :class:`DevicePluginManager` serves one
:class:`~dra_bridge.rpc.deviceplugin_grpc.DevicePluginServer` per resource of the node's
inventory, starts and stops them as resources come and go on :meth:`DevicePluginManager.refresh`,
and keeps them registered across kubelet restarts.

The pieces it composes: :func:`~dra_bridge.deviceplugin.resources.compute_resources` (which
resources), :class:`~dra_bridge.deviceplugin.backend.VgpuResource` (one resource's health and
allocation), :class:`~mdev_manager.host.watch.HostWatcher` (wakes the streams on host changes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dra_bridge.api.names import DEFAULT_RESOURCE_PREFIX, ResourceKind, normalize_prefix
from dra_bridge.deviceplugin.backend import VgpuResource
from dra_bridge.deviceplugin.resources import compute_resources
from dra_bridge.rpc.deviceplugin_grpc import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_SOCKET_PREFIX,
    DevicePluginServer,
    KubeletWatcher,
)
from dra_bridge.rpc.podresources import DEFAULT_POD_RESOURCES_SOCKET, allocated_devices
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO
from mdev_manager.host.watch import HostWatcher
from mdev_manager.models import Inventory, Usage

log = logging.getLogger(__name__)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ManagedServer(DevicePluginServer):
    """A server that refuses to start again once retired (the kubelet watcher may race
    us), and whose streams end at once on stop instead of after their next wait."""

    backend: VgpuResource

    def __init__(self, backend: VgpuResource, *a: Any, **kw: Any) -> None:
        super().__init__(backend, *a, **kw)
        self._life = threading.RLock()
        self.retired = False

    def start(self) -> None:
        with self._life:
            if self.retired:
                raise RuntimeError(f"device plugin {self.resource_name} was retired")
            super().start()

    def stop(self, grace: float | None = 1.0) -> None:
        with self._lock:
            streams = list(self._streams)
        for ev in streams:
            ev.set()
        self.backend.watcher.bump()  # wakes their wait_for_change: they see the end now
        super().stop(grace)

    def retire(self, grace: float | None = 0.5) -> None:
        with self._life:
            self.retired = True
            self.stop(grace)


class _KubeletWatcher(KubeletWatcher):
    """A :class:`KubeletWatcher` that can also forget a server."""

    def remove(self, server: DevicePluginServer) -> None:
        with self._lock:
            self._servers = [s for s in self._servers if s is not server]
            self._pending = [s for s in self._pending if s is not server]

    def check_once(self) -> None:
        super().check_once()
        with self._lock:
            self._pending = [s for s in self._pending if any(s is t for t in self._servers)]


class ResourceStatus(_Model):
    resource: str
    kind: ResourceKind
    env_var: str
    socket: str
    running: bool
    devices: dict[str, str | None]  # id -> problem (None: healthy)


class RefreshResult(_Model):
    added: list[str] = []
    removed: list[str] = []
    updated: list[str] = []
    warnings: list[str] = []


InventorySource = Inventory | Callable[[], Inventory]


class DevicePluginManager:
    """Serve one device plugin per resource of the node's inventory.

    ``inventory``: an :class:`Inventory` or a callable returning a fresh one (default:
    ``discover(env, io)``), used when :meth:`start` / :meth:`refresh` get none.
    ``exclude``: GPU addresses / device ids not to advertise (or a callable taking the
    inventory), e.g. GPUs whose layout mode is ``dra``.
    ``host_dev_root``: the host's ``/dev`` as the kubelet sees it (device spec host
    paths), default ``env.dev_root``. ``pod_resources_socket``: for :meth:`usage`; None
    skips it. ``poll_interval``: host listing poll behind inotify. ``watch_timeout`` /
    ``resync_interval``: see :class:`DevicePluginServer`.
    """

    def __init__(
        self,
        env: HostEnv,
        io: HostIO | None = None,
        inventory: InventorySource | None = None,
        prefix: str = DEFAULT_RESOURCE_PREFIX,
        device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR,
        *,
        exclude: Iterable[str] | Callable[[Inventory], Iterable[str]] | None = None,
        host_dev_root: Path | None = None,
        pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET,
        node: str = "",
        socket_prefix: str = DEFAULT_SOCKET_PREFIX,
        poll_interval: float = 2.0,
        kubelet_poll_interval: float = 1.0,
        watch_timeout: float = 1.0,
        resync_interval: float | None = 30.0,
        register_timeout: float = 5.0,
        use_inotify: bool = True,
    ) -> None:
        self.env = env
        self.io = io or RealIO()
        self.prefix = normalize_prefix(prefix)
        self.device_plugin_dir = Path(device_plugin_dir)
        self.node = node
        self._source = inventory
        self._exclude = exclude
        self.host_dev_root = host_dev_root
        self.pod_resources_socket = pod_resources_socket
        self._server_kw = dict(socket_prefix=socket_prefix, watch_timeout=watch_timeout,
                               resync_interval=resync_interval, register_timeout=register_timeout)
        self.watcher = HostWatcher.for_env(env, poll_interval=poll_interval, use_inotify=use_inotify)
        self.kubelet = _KubeletWatcher((), self.device_plugin_dir, poll_interval=kubelet_poll_interval)
        self._lock = threading.RLock()
        self._backends: dict[str, VgpuResource] = {}
        self._servers: dict[str, _ManagedServer] = {}
        self.warnings: list[str] = []
        self._started = False

    # ----------------------------------------------------------------- views
    @property
    def resources(self) -> dict[str, VgpuResource]:
        with self._lock:
            return dict(self._backends)

    @property
    def servers(self) -> dict[str, DevicePluginServer]:
        with self._lock:
            return dict(self._servers)

    @property
    def running(self) -> bool:
        return self._started

    def status(self) -> list[ResourceStatus]:
        out = []
        servers = self.servers
        for name, b in self.resources.items():
            srv = servers.get(name)
            out.append(ResourceStatus(
                resource=name, kind=b.kind, env_var=b.env_var, socket=str(srv.socket_path) if srv else "",
                running=bool(srv and srv.running), devices={d.id: b.problem(d) for d in b.device_infos()}))
        return out

    def usage(self, timeout: float = 5.0) -> Usage:
        """Our resources' devices the kubelet allocated to pods (PodResources API)."""
        if self.pod_resources_socket is None:
            return Usage()
        return allocated_devices(self.pod_resources_socket, self.prefix, env=self.env, io=self.io, timeout=timeout)

    # ----------------------------------------------------------------- lifecycle
    def _inventory(self, inventory: Inventory | None) -> Inventory:
        if inventory is not None:
            return inventory
        if isinstance(self._source, Inventory):
            return self._source
        if callable(self._source):
            return self._source()
        return discover(self.env, self.io, node=self.node)

    def start(self, inventory: Inventory | None = None) -> DevicePluginManager:
        """Compute the resources, watch the host and the kubelet socket.

        Servers start and register once ``kubelet.sock`` exists (at once if it does).
        """
        with self._lock:
            if self._started:
                raise RuntimeError("DevicePluginManager already started")
            self.watcher.start()
            try:
                self.refresh(inventory)
                self.kubelet.start()
            except BaseException:
                self.watcher.stop()
                raise
            self._started = True
        return self

    def refresh(self, inventory: Inventory | None = None,
                withheld: Callable[[list[tuple[str, list[str]]]], tuple[dict[str, str], dict[str, str]]] | None = None,
                ) -> RefreshResult:
        """Re-read the inventory: start plugins for new resources, stop those gone, update devices.
        ``withheld``: given each GPU and the ids of its advertised devices, the cordoned GPUs and the
        devices to advertise Unhealthy, each with why (:func:`dra_bridge.pool.cordon.withheld_classic`)."""
        inv = self._inventory(inventory)
        excl = self._exclude(inv) if callable(self._exclude) else (self._exclude or ())
        specs, warnings = compute_resources(inv, self.prefix, excl)
        result = RefreshResult(warnings=warnings)
        for w in warnings:
            log.warning("device plugin: %s", w)
        with self._lock:
            self.warnings = warnings
            for name in [n for n in self._backends if n not in specs or specs[n].kind != self._backends[n].kind]:
                self._retire(name)
                result.removed.append(name)
            for name, spec in specs.items():
                backend = self._backends.get(name)
                if backend is not None:
                    if [d.model_dump() for d in backend.device_infos()] != [d.model_dump() for d in spec.devices]:
                        backend.set_devices(spec.devices)
                        result.updated.append(name)
                    continue
                backend = VgpuResource(name, spec.kind, self.env, self.io, self.watcher, spec.devices,
                                       host_dev_root=self.host_dev_root)
                server = _ManagedServer(backend, self.device_plugin_dir, **self._server_kw)
                self._backends[name] = backend
                self._servers[name] = server
                self.kubelet.add(server)
                result.added.append(name)
                if name in result.removed:
                    result.removed.remove(name)
                    result.updated.append(name)
        if withheld is not None:
            per_gpu: dict[str, list[str]] = {}
            for spec in specs.values():
                for d in spec.devices:
                    per_gpu.setdefault(d.gpu, []).append(d.id)
            cordoned, devices = withheld(sorted(per_gpu.items()))
            with self._lock:
                backends = list(self._backends.values())
            for backend in backends:
                infos = backend.device_infos()
                backend.set_withheld({d.gpu: cordoned[d.gpu] for d in infos if d.gpu in cordoned},
                                     {d.id: devices[d.id] for d in infos if d.id in devices})
        for name in result.added:
            log.info("device plugin: new resource %s", name)
        for name in result.removed:
            log.info("device plugin: resource %s is gone", name)
        return result

    def _retire(self, name: str) -> None:
        server = self._servers.pop(name, None)
        self._backends.pop(name, None)
        if server is not None:
            self.kubelet.remove(server)
            server.retire()

    def stop(self) -> None:
        """Stop every plugin (sockets removed) and the watchers; the devices stay."""
        with self._lock:
            self.kubelet.stop()
            names = list(self._servers)
            threads = [threading.Thread(target=self._retire, args=(n,), name=f"dp-stop-{i}", daemon=True)
                       for i, n in enumerate(names)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10.0)
            self.watcher.stop()
            self._started = False

    def __enter__(self) -> DevicePluginManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
