"""A local Kubernetes API server (tests, demo, conformance, kubectl): real HTTP, Kubernetes REST semantics.

Serves the resources of :mod:`.resources` (resource.k8s.io/v1 DRA kinds, the core kinds a DRA
driver touches and the kinds deploy/ installs) with create / get / list / update / patch /
delete / deletecollection / watch, the ``status`` subresource, label and field selectors,
optimistic concurrency through ``resourceVersion``, finalizers, the fields a disabled
feature gate drops on write (:mod:`.featuregates`), and validation of every written object
against the OpenAPI schema of the configured Kubernetes version (``kubernetes-validate``,
when installed) plus the DRA rules of :mod:`.dra_rules` and :mod:`.dra_claims`. For kubectl:
printer columns as ``meta.k8s.io`` Tables (:mod:`.tables`), managedFields and server-side apply
(:mod:`.managedfields`), OpenAPI v2 and v3 (:mod:`.openapi`).

It is a ``http.server.ThreadingHTTPServer`` on 127.0.0.1 with an ephemeral port (or the one
given), running in a background thread; use it as a context manager::

    with LocalApiServer(version="1.35") as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        ...

Storage and REST semantics are in :mod:`.store`, HTTP routing in :mod:`.handler`, discovery
documents in :mod:`.discovery`; this module is the object tests hold: lifecycle, clients,
kubeconfig, fault injection and request counters.
"""

from __future__ import annotations

import copy
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from dra_bridge.api import compat as featuregates
from dra_bridge.sim.apiserver import discovery
from dra_bridge.sim.apiserver import errors as E
from dra_bridge.sim.apiserver.errors import ApiError
from dra_bridge.sim.apiserver.handler import Handler, HTTPServer
from dra_bridge.sim.apiserver.resources import DEFAULT_RESOURCES, ResourceType, taint_rule_resource
from dra_bridge.sim.apiserver.store import Store, sort_key

if TYPE_CHECKING:
    from dra_bridge.apiclient.objects import ApiClient, Configuration

SUPPORTED_MINORS = range(34, 38)


class Write(NamedTuple):
    verb: str
    resource: str  # "resourceslices", "resourceclaims/status", ...
    name: str


class RequestRecord(NamedTuple):
    method: str
    path: str
    verb: str  # a Kubernetes verb, or "discovery" for /version, /api, /apis...
    resource: str
    namespace: str | None
    name: str | None
    code: int


@dataclass
class Injection:
    """A fault: the next ``times`` matching requests fail with ``status`` (and/or wait ``delay``)."""

    verb: str | None
    resource: str | None
    status: int | None
    times: int | None  # None: forever
    name: str | None = None
    namespace: str | None = None
    reason: str | None = None
    message: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    hits: int = 0

    @property
    def remaining(self) -> int | None:
        return None if self.times is None else max(0, self.times - self.hits)

    def matches(self, verb: str, rt: ResourceType | None, sub: str | None,
                namespace: str | None, name: str | None) -> bool:
        if self.remaining == 0:
            return False
        if self.verb not in (None, "*", verb):
            return False
        if self.resource not in (None, "*"):
            if rt is None:
                return False
            suffix = f"/{sub}" if sub else ""
            if self.resource not in (rt.plural + suffix, rt.key + suffix):
                return False
        if self.name is not None and self.name != name:
            return False
        if self.namespace is not None and self.namespace != namespace:
            return False
        return True

    def error(self, verb: str, rt: ResourceType | None, name: str | None) -> ApiError | None:
        if self.status is None:
            return None
        plural, group = (rt.plural, rt.group) if rt else ("", "")
        reason = self.reason
        if reason is None:
            reason = "AlreadyExists" if (self.status == 409 and verb == "create") else \
                E.DEFAULT_REASONS.get(self.status, "Unknown")
        message = self.message or f"injected {self.status} {reason} for {verb} " \
                                  f"{E.qualified_resource(plural, group)}" + \
                                  (f' "{name}"' if name else "")
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        details: dict[str, Any] = {"name": name or "", "group": group, "kind": plural}  # JSON: StatusDetails
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        return ApiError(self.status, message, reason=reason, details=details, headers=headers)


def _parse_version(version: str | int | float) -> tuple[int, int, int]:
    text = str(version).strip().lstrip("v")
    parts = text.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
        patch = int(parts[2]) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        raise ValueError(f"unparseable Kubernetes version {version!r}") from None
    if major != 1 or minor not in SUPPORTED_MINORS:
        raise ValueError(f"Kubernetes {version} not supported: use 1.34 .. 1.37")
    return major, minor, patch


class LocalApiServer:
    """A Kubernetes API server on ``http://127.0.0.1:<port>`` for tests and ``vgpuctl sim apiserver``.

    :param version: Kubernetes version served (``"1.34"`` .. ``"1.37"``, ``"v1.35.2"`` ok);
        sets ``/version`` and the OpenAPI schemas, DRA rules and feature gates used on write.
    :param feature_gates: gates as ``kube-apiserver --feature-gates`` takes them, over the
        version's real defaults (:func:`.featuregates.defaults`); a disabled gate's fields are
        dropped on write as kube-apiserver does. ``None`` (the default) turns every gate of the
        version on, so nothing is dropped: what the tests and the demo rely on.
    :param validate: validate written objects (schema + DRA rules); on by default.
    :param field_validation: default for requests without ``?fieldValidation=``:
        ``"Strict"`` (unknown fields are 422 Invalid), ``"Warn"`` or ``"Ignore"``
        (unknown fields dropped, with a ``Warning`` header for Warn).
    :param strict_namespaces: namespaced writes need an existing Namespace (404 otherwise),
        as with the NamespaceLifecycle admission plugin. ``default`` and ``kube-system`` exist.
    :param extra_resources: more :class:`ResourceType` entries to serve.
    :param watch_timeout: server-side cap for watches without ``timeoutSeconds``.
    :param max_history: watch events kept; older resourceVersions get 410 Expired.
    :param port: port to listen on (0: an ephemeral one).
    """

    def __init__(self, version: str = "1.35", *, feature_gates: Mapping[str, bool] | None = None,
                 validate: bool = True, field_validation: str = "Strict",
                 strict_namespaces: bool = False, extra_resources: Iterable[ResourceType] = (),
                 watch_timeout: float = 300.0, max_history: int = 100_000, port: int = 0):
        _, self.minor, patch = _parse_version(version)
        self.version = f"1.{self.minor}"
        self.git_version = f"v1.{self.minor}.{patch}"
        self.feature_gates = (featuregates.all_enabled(self.version) if feature_gates is None
                              else featuregates.resolve(self.version, feature_gates))
        self.watch_timeout = watch_timeout
        served = (taint_rule_resource(self.version),) if featuregates.taint_rules_served(
            self.version, self.feature_gates) else ()  # KEP-5055: only with its gate, at its version's API
        by_key = {rt.key: rt for rt in (*DEFAULT_RESOURCES, *served, *extra_resources)}  # an extra one replaces ours
        self.store = Store(self.version, tuple(by_key.values()),
                           validate=validate, field_validation=field_validation,
                           strict_namespaces=strict_namespaces, max_history=max_history,
                           feature_gates=self.feature_gates)
        self.resources: tuple[ResourceType, ...] = self.store.resources
        self._lock = self.store.lock
        self._injections: list[Injection] = []
        self._conns: set[socket.socket] = set()
        self._clients: list[ApiClient] = []
        self._port = port
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

        self.writes: list[Write] = []
        self.pod_logs: dict[tuple[str, str], str] = {}  # GET pods/<name>/log serves these
        self.requests: Counter[str] = Counter()
        self.requests_by_resource: Counter[tuple[str, str]] = Counter()
        self.request_log: list[RequestRecord] = []

        for ns in ("default", "kube-system"):
            self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                      "status": {"phase": "Active"}})

    # settings read by tests and tools; the store owns them
    @property
    def validate(self) -> bool:
        return self.store.validate

    @property
    def field_validation(self) -> str:
        return self.store.field_validation

    @property
    def strict_namespaces(self) -> bool:
        return self.store.strict_namespaces

    @property
    def max_history(self) -> int:
        return self.store.max_history

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalApiServer:
        if self._httpd is not None:
            return self
        self.store.stopping = False
        httpd = HTTPServer(("127.0.0.1", self._port), Handler)
        httpd.app = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"local-apiserver-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        with self.store.cond:
            self.store.stopping = True
            self.store.cond.notify_all()
        httpd.shutdown()
        for client in self._clients:
            try:
                client.close()
            except Exception:
                pass
        self._clients.clear()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("LocalApiServer is not started")
        return self._httpd.server_address[1]

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    # ------------------------------------------------------------------ clients
    def client_configuration(self) -> Configuration:
        """A ``kubernetes.client.Configuration`` for this server (plain HTTP, no auth)."""
        from dra_bridge.apiclient.client import plain_http_configuration  # loads kubernetes: only for a client

        return plain_http_configuration(self.url)

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` for this server; closed by :meth:`stop`."""
        from dra_bridge.apiclient.client import plain_http_client  # loads kubernetes: only for a client

        api = plain_http_client(self.url)
        self._clients.append(api)
        return api

    def kubeconfig_document(self, *, namespace: str = "default") -> dict:
        """A kubeconfig (as a dict) naming this server, no credentials (it has no auth)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local-apiserver", "cluster": {"server": self.url}}],
            "users": [{"name": "local-user", "user": {}}],
            "contexts": [{"name": "local-apiserver", "context": {
                "cluster": "local-apiserver", "user": "local-user", "namespace": namespace}}],
            "current-context": "local-apiserver",
            "preferences": {},
        }

    def kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (``kubectl``, ``kubernetes.config.load_kube_config``).

        Written atomically (a temporary file renamed into place), so a reader never sees half of it.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(self.kubeconfig_document(namespace=namespace), sort_keys=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    # ------------------------------------------------------------------ test hooks
    def inject(self, verb: str | None = None, resource: str | None = None, status: int | None = 500,
               times: int | None = 1, *, name: str | None = None, namespace: str | None = None,
               reason: str | None = None, message: str | None = None,
               retry_after: int | None = None, delay: float = 0.0) -> Injection:
        """Fail the next ``times`` matching requests (``times=None``: all) with ``status``.

        ``verb`` is a Kubernetes verb (create, get, list, watch, update, patch, delete,
        deletecollection) and ``resource`` a plural (``"resourceslices"``,
        ``"resourceclaims/status"`` for the subresource, or ``plural.group``); ``None``
        matches any. The failing request has no effect. ``delay`` (seconds) sleeps before
        answering; with ``status=None`` the request then proceeds normally.
        """
        inj = Injection(verb, resource, status, times, name=name, namespace=namespace,
                        reason=reason, message=message, retry_after=retry_after, delay=delay)
        with self._lock:
            self._injections.append(inj)
        return inj

    def clear_injections(self) -> None:
        with self._lock:
            self._injections.clear()

    def reset_counters(self) -> None:
        with self._lock:
            self.writes.clear()
            self.requests.clear()
            self.requests_by_resource.clear()
            self.request_log.clear()

    def set_feature_gates(self, feature_gates: Mapping[str, bool] | None) -> dict[str, bool]:
        """Change the gates as a restart of kube-apiserver with other flags would, keeping storage.

        Objects stored while a gate was on keep its fields on later updates (upstream's rule).
        """
        gates = (featuregates.all_enabled(self.version) if feature_gates is None
                 else featuregates.resolve(self.version, feature_gates))
        with self._lock:
            self.feature_gates = gates
            self.store.feature_gates = dict(gates)
        return gates

    def resource_type(self, resource: str) -> ResourceType:
        """Look a resource up by ``plural``, ``plural.group``, kind or singular name."""
        return self.store.resource_type(resource)

    def set_pod_log(self, namespace: str, name: str, text: str) -> None:
        """What ``GET .../pods/<name>/log`` answers (the fake has no containers that write one)."""
        with self._lock:
            self.pod_logs[(namespace, name)] = text

    def objects(self, resource: str, namespace: str | None = None) -> list[dict]:
        """Deep copies of the stored objects of ``resource`` (all namespaces if None)."""
        rt = self.resource_type(resource)
        with self._lock:
            items = [copy.deepcopy(o) for (ns, _), o in self.store.objects[rt.key].items()
                     if namespace is None or ns == namespace]
        return sorted(items, key=sort_key)

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        rt = self.resource_type(resource)
        with self._lock:
            obj = self.store.objects[rt.key].get((namespace or "" if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def add(self, obj: dict, *, validate: bool = True) -> dict:
        """Store ``obj`` as if created through the API (keeps its status; not counted)."""
        rt = self.store.rt_for_object(obj)
        ns = (obj.get("metadata") or {}).get("namespace") or ("default" if rt.namespaced else None)
        return self.store.create(rt, ns, obj, {}, keep_status=True, validate=validate)

    def remove(self, resource: str, name: str, namespace: str | None = None) -> dict:
        """Delete an object directly (ignores finalizers; watchers see DELETED)."""
        rt = self.resource_type(resource)
        with self._lock:
            key = (namespace or "" if rt.namespaced else "", name)
            old = self.store.objects[rt.key].get(key)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            return self.store.commit(rt, key, None, old, "DELETED")

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self.store.rv)

    def compact(self) -> None:
        """Forget watch history: watches from an older resourceVersion get 410 Expired."""
        self.store.compact()

    # ------------------------------------------------------------------ discovery
    def version_info(self) -> dict:
        return discovery.version_info(self.minor, self.git_version)

    # ------------------------------------------------------------------ called by the handler
    def _record(self, method: str, path: str, verb: str, resource: str, namespace: str | None,
                name: str | None, code: int) -> None:
        with self._lock:
            self.request_log.append(RequestRecord(method, path, verb, resource, namespace, name, code))
            self.requests[verb] += 1
            if resource:
                self.requests_by_resource[(verb, resource)] += 1

    def _wrote(self, verb: str, resource: str, names: Iterable[str]) -> None:
        with self._lock:
            self.writes.extend(Write(verb, resource, n) for n in names)

    def _injected(self, verb: str, rt: ResourceType | None, sub: str | None,
                  namespace: str | None, name: str | None) -> ApiError | None:
        with self._lock:
            inj = next((i for i in self._injections if i.matches(verb, rt, sub, namespace, name)),
                       None)
            if inj is None:
                return None
            inj.hits += 1
        if inj.delay:
            time.sleep(inj.delay)
        return inj.error(verb, rt, name)
