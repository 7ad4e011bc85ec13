"""A fake kubelet that talks to our plugins over real unix sockets.

Its messages are compiled at test time from the upstream kubelet protos (the test's own
copies only when those are absent: :data:`tests.support.kubelet.protos.SOURCE` says which),
never ``dra_bridge.rpc.proto``: what both sides share is the wire format and the
method paths, as with the real kubelet.

- Device plugins: :meth:`FakeKubelet.start` serves ``v1beta1.Registration`` on
  ``<root>/device-plugins/kubelet.sock``, records every ``Register`` call and then,
  like the kubelet, dials the plugin's socket, calls ``GetDevicePluginOptions`` and
  keeps a ``ListAndWatch`` stream open, recording each device list.
  :meth:`FakeKubelet.device_plugin` gives a client for ``Allocate`` etc.
  :meth:`FakeKubelet.restart` deletes and re-creates ``kubelet.sock`` (and, like the
  real kubelet, wipes the other sockets in the directory).
- DRA: :meth:`FakeKubelet.register_dra_plugin` dials a ``*-reg.sock`` in
  ``<root>/plugins_registry``, calls ``GetInfo`` and ``NotifyRegistrationStatus`` and
  returns a :class:`DraClient` for the advertised endpoint (v1 or v1beta1), and which health
  API the kubelet would watch (:attr:`DraRegistration.health_version`). Both go
  through the one kubelet DRA client, :mod:`dra_bridge.rpc.dra_client` (also the
  simulated cluster's), handed this side's messages instead of our generated stubs.

Every call has a deadline and every wait a timeout, so no test can hang.
"""

from __future__ import annotations

import os
import queue
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_bridge.rpc import dra_client
from tests.support.kubelet import protos
from tests.support.kubelet.protos import DEVICE_PLUGIN, Method

RPC_TIMEOUT = 5.0
WAIT_TIMEOUT = 10.0

# Room needed under the root for the longest socket path we create.
_SOCKET_ROOM = 80


def short_root(tmp_path: Path) -> tuple[Path, Callable[[], None]]:
    """A directory for sockets: ``tmp_path`` if short enough, else a short /tmp dir.

    Returns the directory and a cleanup function (a no-op for ``tmp_path``).
    """
    if len(os.fsencode(str(tmp_path))) + _SOCKET_ROOM <= 107:
        return tmp_path, lambda: None
    d = Path(tempfile.mkdtemp(prefix="vk", dir="/tmp"))
    return d, lambda: shutil.rmtree(d, ignore_errors=True)


def _unix(path: Path) -> str:
    return f"unix:{os.path.abspath(path)}"


class StreamReader:
    """Reads a server stream in a thread; :meth:`get` waits with a timeout."""

    _END = object()

    def __init__(self, call: Any) -> None:
        self._call = call
        self._q: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._call:
                self._q.put(item)
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.ended.set()
            self._q.put(self._END)

    def get(self, timeout: float = WAIT_TIMEOUT) -> Any:
        """Next message; raises TimeoutError, or EOFError when the stream ended."""
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no stream message within {timeout}s") from None
        if item is self._END:
            self._q.put(self._END)
            raise EOFError(f"stream ended: {self.error!r}")
        return item

    def expect_nothing(self, within: float) -> None:
        """Assert that no message arrives within ``within`` seconds."""
        try:
            item = self._q.get(timeout=within)
        except queue.Empty:
            return
        if item is self._END:
            self._q.put(self._END)
            return
        raise AssertionError(f"unexpected stream message: {item}")

    def cancel(self) -> None:
        self._call.cancel()
        self._thread.join(WAIT_TIMEOUT)


# --------------------------------------------------------------------------- DRA


class DraClient(dra_client.DraClient):
    """The one kubelet DRA client (:class:`dra_bridge.rpc.dra_client.DraClient`) speaking
    through the test side's protos; its health stream is read with a timeout."""

    def __init__(self, endpoint: Path | str, version: str = "v1", timeout: float = RPC_TIMEOUT) -> None:
        super().__init__(endpoint, version, timeout, protos=protos)

    def watch_health(self, timeout: float = 60.0, version: str = "v1") -> StreamReader:  # type: ignore[override]
        return StreamReader(super().watch_health(timeout, version))


@dataclass
class DraRegistration:
    reg_socket: Path
    info: dict[str, Any]
    accepted: bool

    @property
    def health_version(self) -> str | None:
        """The health API the kubelet would watch for this plugin (None: none)."""
        return dra_client.pick_health_service(self.info["supported_versions"])

    def client(self, version: str = "v1", timeout: float = RPC_TIMEOUT) -> DraClient:
        return DraClient(self.info["endpoint"], version, timeout)


# --------------------------------------------------------------------------- device plugins


class DevicePluginClient:
    """Kubelet side of ``v1beta1.DevicePlugin`` on one plugin socket."""

    def __init__(self, socket_path: Path, timeout: float = RPC_TIMEOUT) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(_unix(self.socket_path))
        svc = f"{DEVICE_PLUGIN}.DevicePlugin"
        self._options = Method(svc, "GetDevicePluginOptions")
        self._law = Method(svc, "ListAndWatch")
        self._preferred = Method(svc, "GetPreferredAllocation")
        self._allocate = Method(svc, "Allocate")
        self._prestart = Method(svc, "PreStartContainer")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DevicePluginClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def options(self) -> dict[str, bool]:
        r = self._options.unary(self._channel)(self._options.request(), timeout=self.timeout, wait_for_ready=True)
        return {
            "pre_start_required": r.pre_start_required,
            "get_preferred_allocation_available": r.get_preferred_allocation_available,
        }

    def list_and_watch(self, timeout: float = 60.0) -> StreamReader:
        return StreamReader(self._law.stream(self._channel)(self._law.request(), timeout=timeout))

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        creq = protos.message(f"{DEVICE_PLUGIN}.ContainerPreferredAllocationRequest")(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
        )
        r = self._preferred.unary(self._channel)(
            self._preferred.request(container_requests=[creq]), timeout=self.timeout
        )
        return list(r.container_responses[0].deviceIDs)

    def allocate(self, containers: list[list[str]]) -> list[dict[str, Any]]:
        creq = protos.message(f"{DEVICE_PLUGIN}.ContainerAllocateRequest")
        r = self._allocate.unary(self._channel)(
            self._allocate.request(container_requests=[creq(devices_ids=ids) for ids in containers]),
            timeout=self.timeout,
        )
        return [
            {
                "envs": dict(c.envs),
                "annotations": dict(c.annotations),
                "devices": [
                    {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
                    for d in c.devices
                ],
                "mounts": [
                    {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
                    for m in c.mounts
                ],
                "cdi_devices": [d.name for d in c.cdi_devices],
            }
            for c in r.container_responses
        ]

    def pre_start(self, ids: list[str]) -> None:
        self._prestart.unary(self._channel)(self._prestart.request(devices_ids=ids), timeout=self.timeout)

    @staticmethod
    def devices(resp: Any) -> list[dict[str, Any]]:
        """ListAndWatchResponse -> [{id, health, numa}]."""
        return [{"id": d.ID, "health": d.health, "numa": [n.ID for n in d.topology.nodes]} for d in resp.devices]


@dataclass
class _Watch:
    resource: str
    endpoint: str
    generation: int
    client: DevicePluginClient
    reader: StreamReader | None = None
    thread: threading.Thread | None = None
    options: dict[str, bool] = field(default_factory=dict)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        if self.reader is not None:
            self.reader.cancel()
        self.client.close()


class FakeKubelet:
    """See the module docstring. ``root`` plays the role of ``/var/lib/kubelet``."""

    def __init__(self, root: Path, *, rpc_timeout: float = RPC_TIMEOUT) -> None:
        self.root = Path(root)
        self.device_plugin_dir = self.root / "device-plugins"
        self.kubelet_socket = self.device_plugin_dir / "kubelet.sock"
        self.plugins_registry = self.root / "plugins_registry"
        self.rpc_timeout = rpc_timeout
        self.generation = 0  # bumped on every (re)start
        self.registrations: list[dict[str, Any]] = []
        self.device_lists: dict[str, list[list[dict[str, Any]]]] = {}
        self.options: dict[str, dict[str, bool]] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._watches: list[_Watch] = []
        self._register = Method(f"{DEVICE_PLUGIN}.Registration", "Register")

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.kubelet_socket.exists():
            self.kubelet_socket.unlink()
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"))
        handler = grpc.unary_unary_rpc_method_handler(
            self._on_register,
            request_deserializer=self._register.request.FromString,
            response_serializer=self._register.response.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(f"{DEVICE_PLUGIN}.Registration", {"Register": handler}),)
        )
        server.add_insecure_port(_unix(self.kubelet_socket))
        server.start()
        with self._cond:
            self.generation += 1
            self._server = server

    def stop(self) -> None:
        with self._cond:
            server, self._server = self._server, None
            watches, self._watches = self._watches, []
        for w in watches:
            with self._cond:
                w.closed = True
            w.close()
        if server is not None:
            server.stop(0).wait(WAIT_TIMEOUT)
        try:
            self.kubelet_socket.unlink()
        except FileNotFoundError:
            pass

    def restart(self, wipe_plugin_sockets: bool = True) -> None:
        """Simulate a kubelet restart: kubelet.sock is deleted and re-created.

        The real kubelet also removes every other socket in the device plugin
        directory when it starts; ``wipe_plugin_sockets`` does the same.
        """
        self.stop()
        if wipe_plugin_sockets:
            for p in self.device_plugin_dir.iterdir():
                if stat.S_ISSOCK(p.lstat().st_mode):
                    p.unlink()
        time.sleep(0.01)  # distinct ctime for the new socket even if the inode is reused
        self.start()

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- device plugin registration

    def _on_register(self, request: Any, context: grpc.ServicerContext) -> Any:
        rec = {
            "version": request.version,
            "endpoint": request.endpoint,
            "resource_name": request.resource_name,
            "options": {
                "pre_start_required": request.options.pre_start_required,
                "get_preferred_allocation_available": request.options.get_preferred_allocation_available,
            },
        }
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if "/" in request.endpoint:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"endpoint must be a file name: {request.endpoint}")
        with self._cond:
            rec["generation"] = self.generation
            self.registrations.append(rec)
            watch = _Watch(
                resource=request.resource_name,
                endpoint=request.endpoint,
                generation=self.generation,
                client=DevicePluginClient(self.device_plugin_dir / request.endpoint, self.rpc_timeout),
            )
            # A new registration for a resource replaces the previous endpoint.
            old = [w for w in self._watches if w.resource == request.resource_name]
            self._watches = [w for w in self._watches if w.resource != request.resource_name] + [watch]
            self._cond.notify_all()
        for w in old:
            w.close()
        watch.thread = threading.Thread(target=self._watch_plugin, args=(watch,), daemon=True)
        watch.thread.start()
        return self._register.response()

    def _watch_plugin(self, w: _Watch) -> None:
        """What the kubelet does after Register: options, then a ListAndWatch stream."""
        try:
            w.options = w.client.options()
            with self._cond:
                self.options[w.resource] = w.options
            reader = w.client.list_and_watch(timeout=120.0)
        except (grpc.RpcError, ValueError):
            return
        with self._cond:
            w.reader = reader
            closed = w.closed
        if closed:
            reader.cancel()
            return
        while True:
            try:
                resp = w.reader.get(timeout=120.0)
            except (TimeoutError, EOFError):
                return
            with self._cond:
                self.device_lists.setdefault(w.resource, []).append(DevicePluginClient.devices(resp))
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT_TIMEOUT) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError("condition not met within timeout")

    def registrations_for(self, resource: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r for r in self.registrations if r["resource_name"] == resource]

    def wait_for_registration(
        self, resource: str, count: int = 1, timeout: float = WAIT_TIMEOUT
    ) -> dict[str, Any]:
        self.wait_for(lambda: len([r for r in self.registrations if r["resource_name"] == resource]) >= count, timeout)
        return self.registrations_for(resource)[count - 1]

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = lambda devs: True,
        timeout: float = WAIT_TIMEOUT,
    ) -> list[dict[str, Any]]:
        """Wait until the latest device list received for ``resource`` satisfies ``predicate``."""
        result: list[list[dict[str, Any]]] = []

        def ok() -> bool:
            lists = self.device_lists.get(resource)
            if lists and predicate(lists[-1]):
                result.append(lists[-1])
                return True
            return False

        self.wait_for(ok, timeout)
        return result[0]

    def device_plugin(self, resource: str) -> DevicePluginClient:
        """A client for the endpoint ``resource`` last registered with (caller closes it)."""
        regs = self.registrations_for(resource)
        if not regs:
            raise KeyError(f"{resource} never registered")
        return DevicePluginClient(self.device_plugin_dir / regs[-1]["endpoint"], self.rpc_timeout)

    # ----------------------------------------------------------------- DRA plugin watcher

    def discover_dra_plugins(self) -> list[Path]:
        if not self.plugins_registry.is_dir():
            return []
        return sorted(p for p in self.plugins_registry.glob("*-reg.sock") if stat.S_ISSOCK(p.lstat().st_mode))

    def register_dra_plugin(self, reg_socket: Path, accept: bool = True, error: str = "") -> DraRegistration:
        """GetInfo + NotifyRegistrationStatus, as the kubelet's plugin watcher does."""

        def refuse(info: dra_client.PluginInfo) -> str | None:
            if info.type != "DRAPlugin":
                return f"unknown plugin type {info.type!r}"
            return None if accept else error

        info, refused = dra_client.register_plugin(reg_socket, refuse, timeout=self.rpc_timeout, protos=protos)
        return DraRegistration(reg_socket=Path(reg_socket), info=info.model_dump(), accepted=refused is None)
