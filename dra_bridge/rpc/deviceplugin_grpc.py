"""Kubelet-facing gRPC transport for the classic device plugin API (``v1beta1``).

One :class:`DevicePluginServer` serves one extended resource (one
:class:`~dra_bridge.rpc.types.DevicePluginBackend`) on its own socket in the kubelet's device plugin
directory, and registers it with the kubelet through ``kubelet.sock``.
:class:`KubeletWatcher` notices the kubelet re-creating ``kubelet.sock`` (a kubelet
restart, which also wipes the plugin sockets) and brings every plugin back:
re-binds its socket if it disappeared, then registers again.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.rpc.proto import vgpuctl_deviceplugin_v1beta1_pb2 as dp_pb2
from dra_bridge.rpc.proto import vgpuctl_deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dra_bridge.rpc.sockets import check_socket_path, prepare_socket, remove_socket
from dra_bridge.rpc.types import ContainerAllocation, DevicePluginBackend, DpDevice

log = logging.getLogger(__name__)

DEVICE_PLUGIN_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEFAULT_DEVICE_PLUGIN_DIR = NodePaths().device_plugin_dir
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SOCKET_PREFIX = "vgpuctl-"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def socket_name_for(resource_name: str, prefix: str = DEFAULT_SOCKET_PREFIX) -> str:
    """``nvidia.com/GRID_T4-1Q`` -> ``vgpuctl-nvidia.com_GRID_T4-1Q.sock``."""
    return f"{prefix}{_UNSAFE.sub('_', resource_name)}.sock"


_Snapshot = tuple[tuple[str, bool, int | None], ...]


def _snapshot(devices: Iterable[DpDevice | dict[str, Any]]) -> _Snapshot:
    out = []
    for d in devices:
        dev = d if isinstance(d, DpDevice) else DpDevice.model_validate(d)
        out.append((dev.id, dev.healthy, dev.numa_node))
    return tuple(out)


def _list_response(snap: _Snapshot) -> Any:
    resp = dp_pb2.ListAndWatchResponse()
    for dev_id, healthy, numa in snap:
        d = resp.devices.add(ID=dev_id, health=HEALTHY if healthy else UNHEALTHY)
        if numa is not None:
            d.topology.nodes.add(ID=numa)
    return resp


# --------------------------------------------------------------------------- servicer


class _DevicePluginServicer(dp_grpc.DevicePluginServicer):
    def __init__(self, server: DevicePluginServer) -> None:
        self._server = server

    @property
    def _backend(self) -> DevicePluginBackend:
        return self._server.backend

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._server.options()

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        srv = self._server
        done = threading.Event()
        context.add_callback(done.set)
        srv._track_stream(done)
        try:
            last: _Snapshot | None = None
            while not done.is_set() and last is None:
                try:
                    last = _snapshot(self._backend.devices())
                except Exception:  # noqa: BLE001
                    log.exception("device plugin %s: listing devices failed", srv.resource_name)
                    done.wait(srv.watch_timeout)
            if last is None:
                return
            yield _list_response(last)
            last_check = time.monotonic()
            while not done.is_set():
                try:
                    changed = self._backend.wait_for_change(srv.watch_timeout)
                    if done.is_set():
                        break
                    now = time.monotonic()
                    resync = srv.resync_interval is not None and now - last_check >= srv.resync_interval
                    if not (changed or resync):
                        continue
                    last_check = now
                    current = _snapshot(self._backend.devices())
                except Exception:  # noqa: BLE001
                    log.exception("device plugin %s: watching devices failed", srv.resource_name)
                    done.wait(srv.watch_timeout)
                    continue
                if current != last:
                    last = current
                    yield _list_response(current)
        finally:
            srv._untrack_stream(done)

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        resp = dp_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            available = list(creq.available_deviceIDs)
            must = list(creq.must_include_deviceIDs)
            try:
                ids = [str(i) for i in self._backend.preferred(available, must, int(creq.allocation_size))]
            except Exception as exc:  # noqa: BLE001
                log.exception("device plugin %s: preferred allocation failed", self._server.resource_name)
                context.abort(grpc.StatusCode.INTERNAL, f"preferred allocation failed: {type(exc).__name__}: {exc}")
            resp.container_responses.add(deviceIDs=ids)
        return resp

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        resp = dp_pb2.AllocateResponse()
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            try:
                raw = self._backend.allocate(ids)
                alloc = raw if isinstance(raw, ContainerAllocation) else ContainerAllocation.model_validate(raw)
            except Exception as exc:  # noqa: BLE001
                log.exception("device plugin %s: allocate %s failed", self._server.resource_name, ids)
                context.abort(grpc.StatusCode.INTERNAL, f"allocate {ids} failed: {type(exc).__name__}: {exc}")
            c = resp.container_responses.add()
            c.envs.update(alloc.envs)
            c.annotations.update(alloc.annotations)
            for d in alloc.devices:
                c.devices.add(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for m in alloc.mounts:
                c.mounts.add(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for name in alloc.cdi_devices:
                c.cdi_devices.add(name=name)
        return resp

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return dp_pb2.PreStartContainerResponse()


# --------------------------------------------------------------------------- server


class DevicePluginServer:
    """Serve one backend on ``<device_plugin_dir>/<socket_name_for(resource)>``.

    ``watch_timeout``: how long one ``backend.wait_for_change`` call may block; it
    bounds how quickly ListAndWatch streams end after :meth:`stop`.
    ``resync_interval``: re-read ``backend.devices()`` at least this often even
    without a change signal (guards against a missed notification); None: never.
    """

    def __init__(
        self,
        backend: DevicePluginBackend,
        device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR,
        *,
        socket_prefix: str = DEFAULT_SOCKET_PREFIX,
        watch_timeout: float = 1.0,
        resync_interval: float | None = 30.0,
        register_timeout: float = 5.0,
        max_workers: int = 8,
    ) -> None:
        self.backend = backend
        self.device_plugin_dir = Path(device_plugin_dir)
        self.socket_path = self.device_plugin_dir / socket_name_for(backend.resource_name, socket_prefix)
        self.kubelet_socket = self.device_plugin_dir / KUBELET_SOCKET
        self.watch_timeout = watch_timeout
        self.resync_interval = resync_interval
        self.register_timeout = register_timeout
        self.max_workers = max_workers
        check_socket_path(self.socket_path)
        check_socket_path(self.kubelet_socket)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._streams: set[threading.Event] = set()

    @property
    def resource_name(self) -> str:
        return self.backend.resource_name

    @property
    def endpoint(self) -> str:
        """What the kubelet is told: the socket file name, relative to its directory."""
        return self.socket_path.name

    @property
    def running(self) -> bool:
        return self._server is not None

    def options(self) -> Any:
        return dp_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def start(self) -> None:
        with self._lock:
            if self._server is not None:
                raise RuntimeError(f"device plugin {self.resource_name} already started")
            server = grpc.server(
                ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=f"dp-{self.endpoint}")
            )
            dp_grpc.add_DevicePluginServicer_to_server(_DevicePluginServicer(self), server)
            server.add_insecure_port(prepare_socket(self.socket_path))
            server.start()
            self._server = server
        log.info("device plugin %s serving %s", self.resource_name, self.socket_path)

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (ends ListAndWatch streams) and remove the socket."""
        with self._lock:
            server, self._server = self._server, None
            streams = list(self._streams)
        for ev in streams:
            ev.set()
        if server is not None:
            server.stop(grace).wait(timeout=(grace or 0) + 5)
        try:
            remove_socket(self.socket_path)
        except OSError as exc:
            log.warning("cannot remove %s: %s", self.socket_path, exc)

    def restart(self) -> None:
        self.stop(grace=0)
        self.start()

    def socket_present(self) -> bool:
        try:
            return stat.S_ISSOCK(self.socket_path.lstat().st_mode)
        except FileNotFoundError:
            return False

    def register(self, timeout: float | None = None) -> None:
        """Call ``v1beta1.Registration/Register`` on ``kubelet.sock``; raises grpc.RpcError on failure."""
        timeout = self.register_timeout if timeout is None else timeout
        request = dp_pb2.RegisterRequest(
            version=DEVICE_PLUGIN_VERSION,
            endpoint=self.endpoint,
            resource_name=self.resource_name,
            options=self.options(),
        )
        with grpc.insecure_channel(f"unix:{os.path.abspath(self.kubelet_socket)}") as channel:
            dp_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
        log.info("device plugin %s registered with the kubelet as %s", self.resource_name, self.endpoint)

    def __enter__(self) -> DevicePluginServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track_stream(self, ev: threading.Event) -> None:
        with self._lock:
            self._streams.add(ev)
            if self._server is None:
                ev.set()

    def _untrack_stream(self, ev: threading.Event) -> None:
        with self._lock:
            self._streams.discard(ev)


# --------------------------------------------------------------------------- watcher


def _socket_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class KubeletWatcher:
    """Keep device plugins registered across kubelet restarts.

    Polls ``<device_plugin_dir>/kubelet.sock`` every ``poll_interval`` seconds. When a
    socket appears that was not seen before (first start, or the kubelet re-created
    it), every plugin is (re)started if its socket is gone (the kubelet wipes the
    directory on start) or not running, then registered. Plugins whose registration
    failed are retried on the next poll.
    """

    def __init__(
        self,
        servers: Iterable[DevicePluginServer] = (),
        device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR,
        *,
        poll_interval: float = 1.0,
    ) -> None:
        self.device_plugin_dir = Path(device_plugin_dir)
        self.kubelet_socket = self.device_plugin_dir / KUBELET_SOCKET
        self.poll_interval = poll_interval
        self._servers: list[DevicePluginServer] = list(servers)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._ever_seen = False
        self._pending: list[DevicePluginServer] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0  # successful Register calls, for observability/tests
        self.kubelet_restarts = 0

    @property
    def servers(self) -> list[DevicePluginServer]:
        with self._lock:
            return list(self._servers)

    def add(self, server: DevicePluginServer) -> None:
        with self._lock:
            self._servers.append(server)
            if self._seen is not None:
                self._pending.append(server)

    def check_once(self) -> None:
        """One poll: react to a new kubelet socket, retry failed registrations."""
        ident = _socket_identity(self.kubelet_socket)
        with self._lock:
            if ident is None:
                self._seen = None
                self._pending = []
                return
            if ident != self._seen:
                if self._ever_seen:
                    self.kubelet_restarts += 1
                    log.info("kubelet socket %s was re-created: re-registering device plugins", self.kubelet_socket)
                self._seen = ident
                self._ever_seen = True
                self._pending = list(self._servers)
            pending, self._pending = self._pending, []
        failed: list[DevicePluginServer] = []
        for server in pending:
            try:
                if not server.running:
                    server.start()
                elif not server.socket_present():
                    log.info("socket %s disappeared: restarting device plugin", server.socket_path)
                    server.restart()
                server.register()
                with self._lock:
                    self.registrations += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("device plugin %s: registration failed, will retry: %s", server.resource_name, exc)
                failed.append(server)
        if failed:
            with self._lock:
                if self._seen == ident:
                    self._pending.extend(s for s in failed if s not in self._pending)

    def _run(self) -> None:
        while True:
            try:
                self.check_once()
            except Exception:  # noqa: BLE001
                log.exception("kubelet watcher poll failed")
            if self._stop.wait(self.poll_interval):
                return

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("KubeletWatcher already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet-watcher", daemon=True)
        self._thread.start()

    def stop(self, stop_servers: bool = False, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if stop_servers:
            for server in self.servers:
                server.stop()

    def __enter__(self) -> KubeletWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
