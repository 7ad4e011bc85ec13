"""Kubelet-facing gRPC transport of the DRA driver (no business logic here).

:class:`KubeletPlugin` serves, for one driver name:

- the plugin-watcher registration service (``pluginregistration.Registration``) on
  ``<kubelet_root>/plugins_registry/<driver>-reg.sock``; the kubelet finds the socket,
  calls ``GetInfo`` and then ``NotifyRegistrationStatus``;
- the DRA service in both API versions, ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  and ``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``, plus the device health
  service ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` on
  ``<kubelet_root>/plugins/<driver>/dra.sock``; registration lists every one of them.

Everything the kubelet asks is handed to a :class:`~dra_bridge.rpc.types.DraDriver`; whatever the driver
raises is turned into a per-claim error string, so a failing driver never takes the
server down. Sub-request names are answered as their parent request (firstAvailable).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from pydantic import ValidationError

from dra_bridge.api.nodepaths import DEFAULT_KUBELET_ROOT, NodePaths
from dra_bridge.rpc.proto import vgpuctl_dra_health_v1_pb2 as health_v1_pb2
from dra_bridge.rpc.proto import vgpuctl_dra_health_v1_pb2_grpc as health_v1_grpc
from dra_bridge.rpc.proto import vgpuctl_dra_health_v1alpha1_pb2 as health_v1alpha1_pb2
from dra_bridge.rpc.proto import vgpuctl_dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from dra_bridge.rpc.proto import vgpuctl_dra_v1_pb2 as dra_v1_pb2
from dra_bridge.rpc.proto import vgpuctl_dra_v1_pb2_grpc as dra_v1_grpc
from dra_bridge.rpc.proto import vgpuctl_dra_v1beta1_pb2 as dra_v1beta1_pb2
from dra_bridge.rpc.proto import vgpuctl_dra_v1beta1_pb2_grpc as dra_v1beta1_grpc
from dra_bridge.rpc.proto import vgpuctl_pluginregistration_pb2 as reg_pb2
from dra_bridge.rpc.proto import vgpuctl_pluginregistration_pb2_grpc as reg_grpc
from dra_bridge.rpc.sockets import SocketKeeper, check_socket_path, prepare_socket, remove_socket
from dra_bridge.rpc.types import ClaimRef, DeviceHealthRecord, DraDriver, PrepareResult, RegistrationState

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
# Registration's supported_versions names gRPC services as "<proto package>.<service>"; the kubelet
# takes the first DRAPlugin it knows (pkg/kubelet/cm/dra/plugin, validateSupportedServices) and
# watches health only on a DRAResourceHealth listed there, v1 before v1alpha1 (pickHealthService;
# kubernetes/kubelet pkg/apis/dra-health/*/types.go DRAResourceHealthService).
SUPPORTED_VERSIONS: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES: tuple[str, ...] = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
# DeviceHealth.message: the kubelet keeps 1024 characters (longer: 1021 and "...").
MAX_HEALTH_MESSAGE = 1024

_DRIVER_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


# --------------------------------------------------------------------------- answers


HealthState = dict[tuple[str, str], tuple[bool | None, str]]  # (pool, device) -> (healthy, message)
_DEFAULT_MESSAGE = {True: "healthy", False: "unhealthy (the driver gave no reason)", None: "health unknown"}


def parent_request_names(names: Sequence[str]) -> list[str]:
    """``gpu/a100`` -> ``gpu``: the kubelet hands a container only the devices whose request
    names contain the container's request, which never names a sub-request. As the upstream
    helper does before answering NodePrepareResources (k8s.io/dynamic-resource-allocation
    ``kubeletplugin/draplugin.go``, stripSubrequestNames)."""
    return [n.split("/", 1)[0] for n in names]


def health_message(healthy: bool | None, message: str = "") -> str:
    """``message`` (or a default for the status), cut as the kubelet would cut it."""
    text = message or _DEFAULT_MESSAGE[healthy]
    return text if len(text) <= MAX_HEALTH_MESSAGE else text[: MAX_HEALTH_MESSAGE - 3] + "..."


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        try:
            return f"{exc.code().name}: {exc.details()}"
        except Exception:  # noqa: BLE001
            pass
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- servicers


class _RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: KubeletPlugin) -> None:
        self._plugin = plugin

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        p = self._plugin
        return reg_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=p.driver_name,
            endpoint=str(p.dra_socket),
            supported_versions=list(p.advertised_services),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._plugin._record_registration(bool(request.plugin_registered), request.error)
        return reg_pb2.RegistrationStatusResponse()


class _DraServicer:
    """NodePrepareResources / NodeUnprepareResources for one API version."""

    def __init__(self, plugin: KubeletPlugin, pb2: ModuleType) -> None:
        self._plugin = plugin
        self._pb2 = pb2
        self._has_share_id = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name

    @staticmethod
    def _claims(request: Any) -> list[ClaimRef]:
        return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb2 = self._pb2
        claims = self._claims(request)
        results = self._plugin._prepare(claims)
        resp = pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for d in result.devices:
                dev = entry.devices.add(
                    request_names=parent_request_names(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=d.cdi_device_ids,
                )
                if d.share_id is not None and self._has_share_id:  # v1 only: v1beta1's Device has none
                    dev.share_id = d.share_id
        return resp

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb2 = self._pb2
        claims = self._claims(request)
        results = self._plugin._unprepare(claims)
        resp = pb2.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            entry = resp.claims[uid]
            if error:
                entry.error = error
        return resp


class _HealthServicer:
    """NodeWatchResources for one health API version (v1 and v1alpha1 share the messages)."""

    def __init__(self, plugin: KubeletPlugin, pb2: ModuleType) -> None:
        self._plugin = plugin
        self._pb2 = pb2
        self._status = {True: pb2.HEALTHY, False: pb2.UNHEALTHY, None: pb2.UNKNOWN}

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        p = self._plugin
        source = getattr(p.driver, "health", None)
        if not callable(source):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"driver {p.driver_name} reports no device health")
        done = threading.Event()
        context.add_callback(done.set)
        p._track_stream(done)
        last: HealthState | None = None
        last_sent = 0.0
        try:
            while not done.is_set():
                state = p._poll_health(last)
                now = time.time()
                resend = p.health_resend_interval
                if state is not None and (
                    last is None or state != last or (resend is not None and now - last_sent >= resend)
                ):
                    yield self._response(state, now)
                    last, last_sent = state, now
                done.wait(p.health_poll_interval)
        finally:
            p._untrack_stream(done)

    def _response(self, state: HealthState, now: float) -> Any:
        pb2, timeout = self._pb2, self._plugin.health_check_timeout_seconds
        resp = pb2.NodeWatchResourcesResponse()
        for (pool, device), (healthy, message) in sorted(state.items()):
            resp.devices.add(
                device=pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                health=self._status[healthy],
                last_updated_time=int(now),
                health_check_timeout_seconds=timeout,
                message=message,
            )
        return resp


# --------------------------------------------------------------------------- plugin


class KubeletPlugin:
    """Serve one DRA driver to the kubelet over unix sockets.

    ``health_poll_interval``: seconds between two ``driver.health()`` calls per
    open health stream; a response is sent initially and whenever the state
    changes (and, if ``health_resend_interval`` is set, at least that often).
    ``serialize``: call the driver for one request at a time. ``supported_versions``: the DRA
    services registration lists (the health services follow when the driver has ``health()``).
    ``watch_sockets``: bind a socket again when it is removed behind the plugin's back (its
    directory removed and re-created with the kubelet's state, or the file alone), noticed by
    inotify or, at the latest, after ``socket_poll_interval`` seconds (:class:`SocketKeeper`).
    """

    def __init__(
        self,
        driver_name: str,
        driver: DraDriver,
        kubelet_root: Path = DEFAULT_KUBELET_ROOT,
        *,
        health_poll_interval: float = 5.0,
        health_resend_interval: float | None = None,
        health_check_timeout_seconds: int = 0,
        supported_versions: Sequence[str] = SUPPORTED_VERSIONS,
        max_workers: int = 10,
        serialize: bool = True,
        watch_sockets: bool = True,
        socket_poll_interval: float = 1.0,
    ) -> None:
        if not _DRIVER_NAME_RE.match(driver_name) or len(driver_name) > 63:
            raise ValueError(f"invalid DRA driver name {driver_name!r}")
        self.driver_name = driver_name
        self.driver = driver
        self.kubelet_root = Path(kubelet_root)
        self.health_poll_interval = health_poll_interval
        self.health_resend_interval = health_resend_interval
        self.health_check_timeout_seconds = health_check_timeout_seconds
        self.supported_versions = tuple(supported_versions)
        self.max_workers = max_workers
        paths = NodePaths(driver=driver_name, kubelet_root=self.kubelet_root)
        self.registration_socket = paths.registration_socket
        self.plugin_dir = paths.data_dir
        self.dra_socket = paths.dra_socket
        check_socket_path(self.registration_socket)
        check_socket_path(self.dra_socket)

        self._driver_lock: threading.Lock | None = threading.Lock() if serialize else None
        self._state_lock = threading.Lock()
        self._registration: RegistrationState | None = None
        self._registered_event = threading.Event()
        self._streams: set[threading.Event] = set()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self.watch_sockets = watch_sockets
        self.socket_poll_interval = socket_poll_interval
        self._serve_lock = threading.RLock()  # start, stop and the keeper's rebinds, one at a time
        self._keeper: SocketKeeper | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        return self._dra_server is not None

    @property
    def advertised_services(self) -> tuple[str, ...]:
        """What registration lists: the DRA services, and the health services when the driver
        reports health (as the upstream helper lists health only when the plugin serves it)."""
        health = HEALTH_SERVICES if callable(getattr(self.driver, "health", None)) else ()
        return self.supported_versions + health

    def start(self) -> None:
        """Bind both sockets and start serving (service first, then registration); then keep them
        bound (:meth:`_rebind`) unless ``watch_sockets`` is off."""
        with self._serve_lock:
            if self.running:
                raise RuntimeError(f"DRA plugin {self.driver_name} already started")
            self._forget_registration()
            self._dra_server = self._serve_dra()
            try:
                self._reg_server = self._serve_registration()
            except BaseException:
                self.stop(grace=0)
                raise
            if self.watch_sockets:
                self._keeper = SocketKeeper(
                    # the registration socket waits for the kubelet's plugins_registry; the DRA socket's
                    # directory is the plugin's own, made again below the kubelet's plugins directory
                    {"registration": (self.registration_socket, self.registration_socket.parent),
                     "dra": (self.dra_socket, self.plugin_dir.parent)},
                    self._rebind, poll_interval=self.socket_poll_interval)
                for name in ("registration", "dra"):
                    self._keeper.mark(name)
                self._keeper.start()
        log.info(
            "DRA plugin %s serving %s (registration %s)", self.driver_name, self.dra_socket, self.registration_socket
        )

    def _serve_dra(self) -> grpc.Server:
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=f"dra-{self.driver_name}")
        )
        dra_v1_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, dra_v1_pb2), server)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, dra_v1beta1_pb2), server)
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(self, health_v1_pb2), server)
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(self, health_v1alpha1_pb2), server)
        server.add_insecure_port(prepare_socket(self.dra_socket))
        server.start()
        return server

    def _serve_registration(self) -> grpc.Server:
        server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"dra-reg-{self.driver_name}"))
        reg_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(prepare_socket(self.registration_socket))
        server.start()
        return server

    def _rebind(self, names: list[str]) -> None:
        """Serve again on sockets removed behind the plugin's back (the keeper's thread).

        A server whose socket file is gone is stopped first: gRPC unlinks its socket path when it
        stops, which would remove the new socket. A new DRA socket also gets a new registration:
        the kubelet registers the plugin again and dials the new socket at once, not after its
        reconnect backoff. Until the kubelet answers, :attr:`registered` is False (it deregistered
        the plugin when the registration socket went).
        """
        with self._serve_lock:
            keeper = self._keeper
            if not self.running or keeper is None:  # stopped meanwhile
                return
            if "dra" in names:
                log.warning("DRA socket %s is gone: serving it again", self.dra_socket)
                self._end_streams()  # the kubelet opens its health stream again on the new socket
                self._stop_server(self._dra_server, grace=1.0)
                self._dra_server = self._serve_dra()  # raises: the old one stays recorded, the keeper retries
                keeper.mark("dra")
            if "registration" in names:
                log.warning("registration socket %s is gone: serving it again for the kubelet to register the "
                            "plugin anew", self.registration_socket)
            self._forget_registration()  # before the old socket goes: no one sees it gone and us registered
            self._stop_server(self._reg_server, grace=0)
            self._reg_server = self._serve_registration()
            keeper.mark("registration")

    @staticmethod
    def _stop_server(server: grpc.Server | None, grace: float | None) -> None:
        if server is not None:
            server.stop(grace).wait(timeout=(grace or 0) + 5)

    def _end_streams(self) -> None:
        with self._state_lock:
            streams = list(self._streams)
        for ev in streams:
            ev.set()

    def _forget_registration(self) -> None:
        with self._state_lock:
            self._registration = None
            self._registered_event.clear()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop watching the sockets, stop both servers, end open health streams, remove both socket files."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()  # outside the lock: a rebind under way takes it
        with self._serve_lock:
            reg_server, self._reg_server = self._reg_server, None
            dra_server, self._dra_server = self._dra_server, None
            self._end_streams()
            # Registration socket first: the kubelet then deregisters the plugin.
            for server in (reg_server, dra_server):
                self._stop_server(server, grace)
            for path in (self.registration_socket, self.dra_socket):
                try:
                    remove_socket(path)
                except OSError as exc:
                    log.warning("cannot remove %s: %s", path, exc)
            self._forget_registration()

    def __enter__(self) -> KubeletPlugin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- registration

    @property
    def registered(self) -> bool:
        """True once the kubelet said it registered the plugin (and did not say otherwise since)."""
        with self._state_lock:
            return self._registration is not None and self._registration.plugin_registered

    @property
    def registration_status(self) -> RegistrationState | None:
        with self._state_lock:
            return self._registration

    def wait_registered(self, timeout: float) -> bool:
        """Wait for a NotifyRegistrationStatus call; return :attr:`registered`."""
        self._registered_event.wait(timeout)
        return self.registered

    def _record_registration(self, ok: bool, error: str) -> None:
        with self._state_lock:
            self._registration = RegistrationState(plugin_registered=ok, error=error, at=time.time())
        if ok:
            log.info("kubelet registered DRA plugin %s", self.driver_name)
        else:
            log.error("kubelet did not register DRA plugin %s: %s", self.driver_name, error or "no reason given")
        self._registered_event.set()

    # ----------------------------------------------------------------- driver calls

    def _call(self, fn: Any, claims: list[ClaimRef]) -> Any:
        if self._driver_lock is None:
            return fn(claims)
        with self._driver_lock:
            return fn(claims)

    def _prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        if not claims:
            return {}
        try:
            raw = self._call(self.driver.prepare, list(claims))
            if not isinstance(raw, Mapping):
                raise TypeError(f"driver.prepare returned {type(raw).__name__}, not a mapping")
        except Exception as exc:  # noqa: BLE001 - every failure becomes a per-claim error
            log.exception("DRA driver %s: prepare of %d claim(s) failed", self.driver_name, len(claims))
            msg = f"prepare failed: {_error_text(exc)}"
            return {c.uid: PrepareResult(error=msg) for c in claims}
        out: dict[str, PrepareResult] = {}
        for c in claims:
            r = raw.get(c.uid)
            if r is None:
                out[c.uid] = PrepareResult(error=f"driver returned no result for claim {c.namespace}/{c.name} ({c.uid})")
                continue
            try:
                out[c.uid] = r if isinstance(r, PrepareResult) else PrepareResult.model_validate(r)
            except ValidationError as exc:
                out[c.uid] = PrepareResult(error=f"driver returned an invalid result: {exc}")
        return out

    def _unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        if not claims:
            return {}
        try:
            raw = self._call(self.driver.unprepare, list(claims))
            if not isinstance(raw, Mapping):
                raise TypeError(f"driver.unprepare returned {type(raw).__name__}, not a mapping")
        except Exception as exc:  # noqa: BLE001
            log.exception("DRA driver %s: unprepare of %d claim(s) failed", self.driver_name, len(claims))
            msg = f"unprepare failed: {_error_text(exc)}"
            return {c.uid: msg for c in claims}
        out: dict[str, str | None] = {}
        for c in claims:
            if c.uid not in raw:
                out[c.uid] = f"driver returned no result for claim {c.namespace}/{c.name} ({c.uid})"
            else:
                err = raw[c.uid]
                out[c.uid] = str(err) if err else None
        return out

    def _poll_health(self, previous: HealthState | None) -> HealthState | None:
        """Current health map, or None if unknown and nothing was sent yet.

        When the driver fails, every device already reported becomes unknown, saying why.
        """
        try:
            records = self.driver.health()  # type: ignore[attr-defined]
            state: HealthState = {}
            for r in records:
                rec = r if isinstance(r, DeviceHealthRecord) else DeviceHealthRecord.model_validate(r)
                state[(rec.pool, rec.device)] = (rec.healthy, health_message(rec.healthy, rec.message))
            return state
        except Exception as exc:  # noqa: BLE001
            log.exception("DRA driver %s: health() failed", self.driver_name)
            if previous is None:
                return None
            failed = health_message(None, f"health check failed: {_error_text(exc)}")
            return {key: (None, failed) for key in previous}

    def _track_stream(self, ev: threading.Event) -> None:
        with self._state_lock:
            self._streams.add(ev)
            if self._dra_server is None:
                ev.set()

    def _untrack_stream(self, ev: threading.Event) -> None:
        with self._state_lock:
            self._streams.discard(ev)
