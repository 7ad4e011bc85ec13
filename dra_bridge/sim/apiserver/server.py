"""A local Kubernetes API server (tests, demo, conformance): real HTTP, Kubernetes REST semantics.

Serves the resources of :mod:`.resources` (resource.k8s.io/v1 DRA kinds and the core
kinds a DRA driver touches) with create / get / list / update / patch / delete /
deletecollection / watch, the ``status`` subresource, label and field selectors,
optimistic concurrency through ``resourceVersion``, finalizers, and validation of
every written object against the OpenAPI schema of the configured Kubernetes
version (``kubernetes-validate``, when installed) plus the DRA rules of :mod:`.dra_rules`.

It is a ``http.server.ThreadingHTTPServer`` on 127.0.0.1 with an ephemeral port,
running in a background thread; use it as a context manager::

    with LocalApiServer(version="1.35") as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        ...
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import random
import select
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from dra_bridge.sim.apiserver import errors as E
from dra_bridge.sim.apiserver.errors import ApiError, FieldError
from dra_bridge.sim.apiserver.patch import apply_patch
from dra_bridge.sim.apiserver.resources import DEFAULT_RESOURCES, ResourceType, field_value
from dra_bridge.sim.apiserver.selectors import field_matcher, label_matcher
from dra_bridge.sim.apiserver.validation import kind_schema, resolver, validate_object

SUPPORTED_MINORS = range(34, 38)
MUTATING_VERBS = ("create", "update", "patch", "delete", "deletecollection")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand alphabet


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
        details = {"name": name or "", "group": group, "kind": plural}
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        return ApiError(self.status, message, reason=reason, details=details, headers=headers)


@dataclass
class _Event:
    rv: int
    key: str  # ResourceType.key
    type: str  # ADDED / MODIFIED / DELETED
    obj: dict
    old: dict | None = None


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _meta(obj: dict) -> dict:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _sort_key(obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _prune_unknown(obj: Any, schema: dict, resolve, path: str, dropped: list[str]) -> Any:
    """Drop fields the schema does not know (fieldValidation=Ignore/Warn), recording them."""
    schema = resolve(schema)
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in obj.items():
            sub_path = f"{path}.{k}" if path else k
            if isinstance(props, dict) and k in props:
                out[k] = _prune_unknown(v, props[k], resolve, sub_path, dropped)
            elif isinstance(extra, dict):
                out[k] = _prune_unknown(v, extra, resolve, sub_path, dropped)
            elif isinstance(props, dict) and extra is False:
                dropped.append(sub_path)
            else:
                out[k] = v
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [_prune_unknown(v, schema["items"], resolve, f"{path}[{i}]", dropped)
                for i, v in enumerate(obj)]
    return obj


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    app: "LocalApiServer"


class LocalApiServer:
    """A Kubernetes API server on ``http://127.0.0.1:<ephemeral port>`` for tests.

    :param version: Kubernetes version served (``"1.34"`` .. ``"1.37"``, ``"v1.35.2"`` ok);
        sets ``/version`` and the OpenAPI schemas and DRA rules used for validation.
    :param validate: validate written objects (schema + DRA rules); on by default.
    :param field_validation: default for requests without ``?fieldValidation=``:
        ``"Strict"`` (unknown fields are 422 Invalid), ``"Warn"`` or ``"Ignore"``
        (unknown fields dropped, with a ``Warning`` header for Warn).
    :param strict_namespaces: namespaced writes need an existing Namespace (404 otherwise),
        as with the NamespaceLifecycle admission plugin. ``default`` and ``kube-system`` exist.
    :param extra_resources: more :class:`ResourceType` entries to serve.
    :param watch_timeout: server-side cap for watches without ``timeoutSeconds``.
    :param max_history: watch events kept; older resourceVersions get 410 Expired.
    """

    def __init__(self, version: str = "1.35", *, validate: bool = True,
                 field_validation: str = "Strict", strict_namespaces: bool = False,
                 extra_resources: Iterable[ResourceType] = (), watch_timeout: float = 300.0,
                 max_history: int = 100_000):
        _, self.minor, patch = _parse_version(version)
        self.version = f"1.{self.minor}"
        self.git_version = f"v1.{self.minor}.{patch}"
        self.validate = validate
        self.field_validation = field_validation
        self.strict_namespaces = strict_namespaces
        self.watch_timeout = watch_timeout
        self.max_history = max_history
        self.resources: tuple[ResourceType, ...] = tuple(DEFAULT_RESOURCES) + tuple(extra_resources)

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._rv = 0
        self._store: dict[str, dict[tuple[str, str], dict]] = {rt.key: {} for rt in self.resources}
        self._events: list[_Event] = []
        self._event_rvs: list[int] = []
        self._compacted_rv = 0
        self._injections: list[Injection] = []
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._clients: list[Any] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

        self.writes: list[Write] = []
        self.pod_logs: dict[tuple[str, str], str] = {}  # GET pods/<name>/log serves these
        self.requests: Counter[str] = Counter()
        self.requests_by_resource: Counter[tuple[str, str]] = Counter()
        self.request_log: list[RequestRecord] = []

        for ns in ("default", "kube-system"):
            self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LocalApiServer":
        if self._httpd is not None:
            return self
        self._stopping = False
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
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
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
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

    def __enter__(self) -> "LocalApiServer":
        return self.start()

    def __exit__(self, *exc) -> None:
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
    def client_configuration(self):
        """A ``kubernetes.client.Configuration`` for this server (plain HTTP, no auth)."""
        from kubernetes import client

        cfg = client.Configuration(host=self.url, no_proxy="127.0.0.1,localhost")
        cfg.verify_ssl = False
        return cfg

    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for this server; closed by :meth:`stop`."""
        from kubernetes import client

        api = client.ApiClient(self.client_configuration())
        self._clients.append(api)
        return api

    def kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (for ``kubernetes.config.load_kube_config``)."""
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local-apiserver", "cluster": {"server": self.url}}],
            "users": [{"name": "local-user", "user": {}}],
            "contexts": [{"name": "local-apiserver", "context": {
                "cluster": "local-apiserver", "user": "local-user", "namespace": namespace}}],
            "current-context": "local-apiserver",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
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

    def resource_type(self, resource: str) -> ResourceType:
        """Look a resource up by ``plural``, ``plural.group``, kind or singular name."""
        for rt in self.resources:
            if resource == rt.key:
                return rt
        for rt in self.resources:
            if resource in (rt.plural, rt.kind, rt.singular) or resource in rt.short_names:
                return rt
        raise KeyError(f"unknown resource {resource!r}")

    def set_pod_log(self, namespace: str, name: str, text: str) -> None:
        """What ``GET .../pods/<name>/log`` answers (the fake has no containers that write one)."""
        with self._lock:
            self.pod_logs[(namespace, name)] = text

    def objects(self, resource: str, namespace: str | None = None) -> list[dict]:
        """Deep copies of the stored objects of ``resource`` (all namespaces if None)."""
        rt = self.resource_type(resource)
        with self._lock:
            items = [copy.deepcopy(o) for (ns, _), o in self._store[rt.key].items()
                     if namespace is None or ns == namespace]
        return sorted(items, key=_sort_key)

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        rt = self.resource_type(resource)
        with self._lock:
            obj = self._store[rt.key].get((namespace or "" if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def add(self, obj: dict, *, validate: bool = True) -> dict:
        """Store ``obj`` as if created through the API (keeps its status; not counted)."""
        rt = self._rt_for_object(obj)
        ns = (obj.get("metadata") or {}).get("namespace") or ("default" if rt.namespaced else None)
        return self._create(rt, ns, obj, {}, keep_status=True, validate=validate)

    def remove(self, resource: str, name: str, namespace: str | None = None) -> dict:
        """Delete an object directly (ignores finalizers; watchers see DELETED)."""
        rt = self.resource_type(resource)
        with self._lock:
            key = (namespace or "" if rt.namespaced else "", name)
            old = self._store[rt.key].get(key)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            return self._commit(rt, key, None, old, "DELETED")

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def compact(self) -> None:
        """Forget watch history: watches from an older resourceVersion get 410 Expired."""
        with self._lock:
            self._compacted_rv = self._rv
            self._events.clear()
            self._event_rvs.clear()

    def _rt_for_object(self, obj: dict) -> ResourceType:
        for rt in self.resources:
            if rt.kind == obj.get("kind") and rt.api_version == obj.get("apiVersion"):
                return rt
        raise KeyError(f"no resource for {obj.get('apiVersion')} {obj.get('kind')}")

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, rec: RequestRecord) -> None:
        with self._lock:
            self.request_log.append(rec)
            self.requests[rec.verb] += 1
            if rec.resource:
                self.requests_by_resource[(rec.verb, rec.resource)] += 1

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

    def _commit(self, rt: ResourceType, key: tuple[str, str], new: dict | None, old: dict | None,
                etype: str) -> dict:
        """Store ``new`` (``None`` deletes), bump the resourceVersion and emit a watch event."""
        with self._cond:
            self._rv += 1
            if new is None:
                assert old is not None
                obj = copy.deepcopy(old)
                _meta(obj)["resourceVersion"] = str(self._rv)
                del self._store[rt.key][key]
            else:
                obj = new
                _meta(obj)["resourceVersion"] = str(self._rv)
                self._store[rt.key][key] = obj
            self._events.append(_Event(self._rv, rt.key, etype, copy.deepcopy(obj),
                                       copy.deepcopy(old) if etype == "MODIFIED" else None))
            self._event_rvs.append(self._rv)
            if len(self._events) > self.max_history:
                drop = len(self._events) - self.max_history // 2
                self._compacted_rv = self._events[drop - 1].rv
                del self._events[:drop]
                del self._event_rvs[:drop]
            self._cond.notify_all()
            return copy.deepcopy(obj)

    # ------------------------------------------------------------------ validation
    def _check(self, rt: ResourceType, obj: dict, old: dict | None, query: dict,
               warnings: list[str], validate: bool = True) -> dict:
        mode = (query.get("fieldValidation") or self.field_validation or "Strict").capitalize()
        if mode not in ("Strict", "Warn", "Ignore"):
            raise E.bad_request(f'fieldValidation must be one of Strict, Warn, Ignore, got "{mode}"')
        if mode != "Strict":
            schema = kind_schema(self.version, rt.kind, rt.api_version, True)
            if schema is not None:
                dropped: list[str] = []
                obj = _prune_unknown(obj, schema, resolver(self.version), "", dropped)
                if mode == "Warn":
                    warnings += [f'unknown field "{p}"' for p in dropped]
        if not (self.validate and validate):
            return obj
        errors = validate_object(obj, old, self.version, strict=True,
                                 name_is_label=(rt.kind == "Namespace" and rt.group == ""))
        if rt.immutable_spec and old is not None and obj.get("spec") != old.get("spec"):
            errors.append(FieldError("spec", "Invalid value: field is immutable"))
        if errors:
            name = (obj.get("metadata") or {}).get("name") or ""
            raise E.invalid(rt.kind, rt.group, name, errors)
        return obj

    # ------------------------------------------------------------------ verbs
    def _object_key(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return (namespace or "") if rt.namespaced else "", name

    def _get_stored(self, rt: ResourceType, namespace: str | None, name: str) -> dict:
        obj = self._store[rt.key].get(self._object_key(rt, namespace, name))
        if obj is None:
            raise E.not_found(rt.plural, rt.group, name)
        return obj

    def _check_body(self, rt: ResourceType, body: Any, namespace: str | None) -> dict:
        if not isinstance(body, dict):
            raise E.bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("apiVersion") not in (None, "", rt.api_version):
            raise E.bad_request(f"the API version in the data ({obj['apiVersion']}) does not match "
                                f"the expected API version ({rt.api_version})")
        if obj.get("kind") not in (None, "", rt.kind):
            raise E.bad_request(f"the kind in the data ({obj['kind']}) does not match the expected "
                                f"kind ({rt.kind})")
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = _meta(obj)
        if rt.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise E.bad_request("the namespace of the provided object does not match the "
                                    "namespace sent on the request")
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        return obj

    def _create(self, rt: ResourceType, namespace: str | None, body: Any, query: dict,
                warnings: list[str] | None = None, keep_status: bool = False,
                validate: bool = True) -> dict:
        warnings = [] if warnings is None else warnings
        obj = self._check_body(rt, body, namespace)
        meta = _meta(obj)
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created",
                           reason="InternalError")
        with self._lock:
            if rt.namespaced and self.strict_namespaces and \
                    ("", meta["namespace"]) not in self._store["namespaces"]:
                raise E.not_found("namespaces", "", meta["namespace"])
            if not meta.get("name") and meta.get("generateName"):
                for _ in range(100):
                    candidate = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
                    if self._object_key(rt, namespace, candidate) not in self._store[rt.key]:
                        meta["name"] = candidate
                        break
            for server_set in ("uid", "creationTimestamp", "deletionTimestamp",
                               "deletionGracePeriodSeconds", "selfLink", "managedFields"):
                meta.pop(server_set, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if rt.has_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if rt.status_subresource and rt.initial_status is not None and not keep_status:
                if rt.initial_status:
                    obj["status"] = copy.deepcopy(rt.initial_status)
                else:
                    obj.pop("status", None)
            obj = self._check(rt, obj, None, query, warnings, validate)
            key = self._object_key(rt, _meta(obj).get("namespace"), _meta(obj)["name"])
            if key in self._store[rt.key]:
                raise E.already_exists(rt.plural, rt.group, key[1])
            if query.get("dryRun"):
                return obj
            return self._commit(rt, key, obj, None, "ADDED")

    def _update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, query: dict,
                sub: str | None, warnings: list[str]) -> dict:
        obj = self._check_body(rt, body, namespace)
        meta = _meta(obj)
        if meta.get("name") and meta["name"] != name:
            raise E.bad_request(f"the name of the object ({meta['name']}) does not match the name "
                                f"on the URL ({name})")
        meta["name"] = name
        with self._lock:
            old = self._get_stored(rt, namespace, name)
            old_meta = old["metadata"]
            if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name, E.STALE)
            if meta.get("uid") and meta["uid"] != old_meta["uid"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: UID in precondition: {meta['uid']}, "
                                 f"UID in object meta: {old_meta['uid']}")
            if sub == "status":
                new = copy.deepcopy(old)
                if "status" in obj:
                    new["status"] = obj["status"]
                else:
                    new.pop("status", None)
            else:
                new = obj
                if rt.status_subresource:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                for kept in ("uid", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation"):
                    if kept in old_meta:
                        meta[kept] = old_meta[kept]
                    else:
                        meta.pop(kept, None)
                meta.pop("managedFields", None)
                meta.pop("selfLink", None)
                if rt.has_generation and new.get("spec") != old.get("spec"):
                    meta["generation"] = int(old_meta.get("generation") or 0) + 1
            _meta(new)["resourceVersion"] = old_meta["resourceVersion"]
            new = self._check(rt, new, old, query, warnings)
            if query.get("dryRun"):
                return new
            key = self._object_key(rt, namespace, name)
            if new == old:  # no-op: no new resourceVersion, no watch event
                return copy.deepcopy(old)
            if old_meta.get("deletionTimestamp") and not _meta(new).get("finalizers"):
                return self._commit(rt, key, None, new, "DELETED")
            return self._commit(rt, key, new, old, "MODIFIED")

    def _patch(self, rt: ResourceType, namespace: str | None, name: str, body: Any,
               content_type: str, query: dict, sub: str | None, warnings: list[str]) -> dict:
        with self._lock:
            old = self._get_stored(rt, namespace, name)
            schema = kind_schema(self.version, rt.kind, rt.api_version, True)
            patched = apply_patch(copy.deepcopy(old), body, content_type, schema,
                                  resolver(self.version))
            if not isinstance(patched, dict):
                raise E.bad_request("the patch must produce a JSON object")
            wanted_rv = ((body.get("metadata") or {}).get("resourceVersion")
                         if isinstance(body, dict) else None)
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name, E.STALE)
            _meta(patched)["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self._update(rt, namespace, name, patched, query, sub, warnings)

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, options: Any,
                query: dict) -> dict:
        options = options if isinstance(options, dict) else {}
        pre = options.get("preconditions") or {}
        with self._lock:
            old = self._get_stored(rt, namespace, name)
            old_meta = old["metadata"]
            if pre.get("uid") and pre["uid"] != old_meta["uid"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: UID in precondition: {pre['uid']}, "
                                 f"UID in object meta: {old_meta['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != old_meta["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: ResourceVersion in precondition: "
                                 f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                 f"{old_meta['resourceVersion']}")
            if query.get("dryRun") or options.get("dryRun"):
                return copy.deepcopy(old)
            key = self._object_key(rt, namespace, name)
            if old_meta.get("finalizers"):
                if old_meta.get("deletionTimestamp"):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(rt, key, new, old, "MODIFIED")
            return self._commit(rt, key, None, old, "DELETED")

    def _matcher(self, rt: ResourceType, namespace: str | None, query: dict):
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"), rt.allowed_field_selectors, field_value)

        def match(obj: dict) -> bool:
            if rt.namespaced and namespace and (obj.get("metadata") or {}).get("namespace") != namespace:
                return False
            return labels(obj) and fields(obj)

        return match

    def _list(self, rt: ResourceType, namespace: str | None, query: dict) -> dict:
        match = self._matcher(rt, namespace, query)
        with self._lock:
            items = sorted((o for o in self._store[rt.key].values() if match(o)), key=_sort_key)
            items = [copy.deepcopy(o) for o in items]
            rv = str(self._rv)
        meta: dict[str, Any] = {"resourceVersion": rv}
        token = query.get("continue")
        if token:
            try:
                start = tuple(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
            except Exception:
                raise E.bad_request("continue key is not valid") from None
            items = [o for o in items if _sort_key(o) > start]
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = _sort_key(items[limit - 1])
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "start": list(last)}).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        for item in items:  # list items carry no kind / apiVersion, as in Kubernetes
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _deletecollection(self, rt: ResourceType, namespace: str | None, options: Any,
                          query: dict) -> tuple[dict, list[str]]:
        match = self._matcher(rt, namespace, query)
        deleted, names = [], []
        with self._lock:
            targets = sorted((o for o in self._store[rt.key].values() if match(o)), key=_sort_key)
            for obj in targets:
                meta = obj["metadata"]
                deleted.append(self._delete(rt, meta.get("namespace"), meta["name"], options, query))
                names.append(meta["name"])
            rv = str(self._rv)
        for item in deleted:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return ({"kind": rt.list_kind, "apiVersion": rt.api_version,
                 "metadata": {"resourceVersion": rv}, "items": deleted}, names)

    # ------------------------------------------------------------------ watch
    def _watch_events(self, rt: ResourceType, after_rv: int, match) -> tuple[list[dict], int]:
        """Events for ``rt`` after ``after_rv`` as the client sees them (selector-aware)."""
        out = []
        start = bisect.bisect_right(self._event_rvs, after_rv)
        last = after_rv
        for ev in self._events[start:]:
            last = ev.rv
            if ev.key != rt.key:
                continue
            now = match(ev.obj)
            if ev.type == "MODIFIED":
                before = match(ev.old) if ev.old is not None else now
                etype = ("MODIFIED" if before else "ADDED") if now else ("DELETED" if before else None)
            else:
                etype = ev.type if now else None
            if etype:
                out.append({"type": etype, "object": copy.deepcopy(ev.obj)})
        return out, last

    # ------------------------------------------------------------------ discovery
    def version_info(self) -> dict:
        return {
            "major": "1", "minor": str(self.minor),
            "emulationMajor": "1", "emulationMinor": str(self.minor),
            "minCompatibilityMajor": "1", "minCompatibilityMinor": str(self.minor - 1),
            "gitVersion": self.git_version,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64",
        }

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rt in self.resources:
            if rt.group:
                versions = groups.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return groups

    def _api_group(self, group: str) -> dict:
        versions = self._groups()[group]
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
                "preferredVersion": gvs[0]}

    def _resource_list(self, group: str, version: str) -> dict | None:
        rts = [rt for rt in self.resources if rt.group == group and rt.version == version]
        if not rts:
            return None
        resources = []
        for rt in rts:
            entry = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                     "kind": rt.kind, "verbs": list(rt.verbs)}
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            resources.append(entry)
            if rt.status_subresource:
                resources.append({"name": f"{rt.plural}/status", "singularName": "",
                                  "namespaced": rt.namespaced, "kind": rt.kind,
                                  "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


@dataclass
class _Route:
    verb: str
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None
    discovery: Any = None  # response body for non-resource GETs
    resource_label: str = ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    server_version = "LocalApiServer"

    # ------------------------------------------------------------------ plumbing
    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes: without this, Nagle + delayed ACK
        # add ~40 ms to every request on a kept-alive connection
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.app._lock:
            self.server.app._conns.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.app._lock:
                self.server.app._conns.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # ------------------------------------------------------------------ routing
    def _route(self, method: str, parts: list[str], query: dict) -> _Route:
        app = self.server.app
        if method == "GET":
            joined = "/" + "/".join(parts)
            if joined in ("/healthz", "/readyz", "/livez"):
                return _Route("discovery", discovery="ok")
            if joined == "/version":
                return _Route("discovery", discovery=app.version_info())
            if joined == "/api":
                return _Route("discovery", discovery={
                    "kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                    "serverAddress": app.host}]})
            if joined == "/apis":
                groups = [app._api_group(g) for g in app._groups()]
                for g in groups:
                    g.pop("kind"), g.pop("apiVersion")
                return _Route("discovery", discovery={"kind": "APIGroupList", "apiVersion": "v1",
                                                      "groups": groups})
            if len(parts) == 2 and parts[0] == "apis" and parts[1] in app._groups():
                return _Route("discovery", discovery=app._api_group(parts[1]))
            if len(parts) == 2 and parts[0] == "api":
                doc = app._resource_list("", parts[1])
                if doc:
                    return _Route("discovery", discovery=doc)
            if len(parts) == 3 and parts[0] == "apis":
                doc = app._resource_list(parts[1], parts[2])
                if doc:
                    return _Route("discovery", discovery=doc)
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource",
                           reason="NotFound")
        by_plural = {rt.plural: rt for rt in app.resources
                     if rt.group == group and rt.version == version}
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
            rt = by_plural.get(rest[0])
            if rt is not None and not rt.namespaced:
                rt = None
        else:
            rt = by_plural.get(rest[0])
        if rt is None or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource",
                           reason="NotFound")
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub == "log" and rt.key == "pods" and method == "GET" and namespace and name:
            return _Route("log", rt, namespace, name, sub, resource_label="pods/log")
        if sub is not None and not (sub == "status" and rt.status_subresource):
            raise ApiError(404, "the server could not find the requested resource",
                           reason="NotFound")
        if name is None:
            verb = {"GET": "watch" if _truthy(query.get("watch")) else "list",
                    "POST": "create", "DELETE": "deletecollection"}.get(method)
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or (verb not in rt.verbs and sub is None):
            raise ApiError(405, "the server does not allow this method on the requested resource",
                           reason="MethodNotAllowed")
        if sub and verb not in ("get", "update", "patch"):
            raise ApiError(405, "the server does not allow this method on the requested resource",
                           reason="MethodNotAllowed")
        if namespace is None and rt.namespaced and verb == "create":
            raise ApiError(404, "the server could not find the requested resource",
                           reason="NotFound")
        if namespace is None and rt.namespaced and name is not None:
            raise ApiError(404, "the server could not find the requested resource",
                           reason="NotFound")
        label = rt.plural + (f"/{sub}" if sub else "")
        return _Route(verb, rt, namespace, name, sub, resource_label=label)

    def _serve(self, method: str) -> None:
        app = self.server.app
        split = urlsplit(self.path)
        parts = [unquote(p) for p in split.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        route = _Route("unknown")
        recorded = False

        def record(code: int) -> None:
            # before the response goes out, so a test that got its answer sees the count
            nonlocal recorded
            if not recorded:
                recorded = True
                app._record(RequestRecord(method, self.path, route.verb, route.resource_label,
                                          route.namespace, route.name, code))

        try:
            raw = self._read_body()
            route = self._route(method, parts, query)
            if route.verb == "discovery":
                record(200)
                if isinstance(route.discovery, str):
                    self._send_text(200, route.discovery)
                else:
                    self._send_json(200, route.discovery)
                return
            injected = app._injected(route.verb, route.rt, route.sub, route.namespace, route.name)
            if injected is not None:
                raise injected
            body = None
            if raw:
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise E.bad_request(f"the request body is not valid JSON: {exc}") from None
            if route.verb == "watch":
                self._watch(route, query, lambda: record(200))
                return
            if route.verb == "log":  # a container's log: what set_pod_log stored (404 without the pod)
                app._get_stored(route.rt, route.namespace, route.name)
                record(200)
                self._send_text(200, app.pod_logs.get((route.namespace, route.name), ""))
                return
            code, result, warnings, names = self._dispatch(route, body, query)
            if route.verb in MUTATING_VERBS and not query.get("dryRun"):
                with app._lock:
                    for n in names:
                        app.writes.append(Write(route.verb, route.resource_label, n))
            headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else {}
            record(code)
            self._send_json(code, result, headers)
        except ApiError as err:
            record(err.code)
            self._send_json(err.code, err.status(), err.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the fake: report it like an apiserver would
            err = ApiError(500, f"local apiserver internal error: {type(exc).__name__}: {exc}",
                           reason="InternalError")
            record(500)
            try:
                self._send_json(500, err.status())
            except OSError:
                self.close_connection = True
        finally:
            record(500)

    def _dispatch(self, route: _Route, body: Any, query: dict):
        app = self.server.app
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.sub
        assert rt is not None
        warnings: list[str] = []
        if route.verb == "get":
            with app._lock:
                return 200, copy.deepcopy(app._get_stored(rt, ns, name)), warnings, []
        if route.verb == "list":
            return 200, app._list(rt, ns, query), warnings, []
        if route.verb == "create":
            obj = app._create(rt, ns, body, query, warnings)
            return 201, obj, warnings, [obj["metadata"]["name"]]
        if route.verb == "update":
            obj = app._update(rt, ns, name, body, query, sub, warnings)
            return 200, obj, warnings, [name]
        if route.verb == "patch":
            obj = app._patch(rt, ns, name, body, self.headers.get("Content-Type", ""), query, sub,
                             warnings)
            return 200, obj, warnings, [name]
        if route.verb == "delete":
            options = dict(body or {})
            return 200, app._delete(rt, ns, name, options, query), warnings, [name]
        if route.verb == "deletecollection":
            result, names = app._deletecollection(rt, ns, body or {}, query)
            return 200, result, warnings, names
        raise AssertionError(route.verb)

    # ------------------------------------------------------------------ watch
    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, route: _Route, query: dict, started) -> None:
        app = self.server.app
        rt = route.rt
        assert rt is not None
        match = app._matcher(rt, route.namespace, query)
        timeout = query.get("timeoutSeconds")
        try:
            timeout_s = min(float(timeout), app.watch_timeout) if timeout else app.watch_timeout
        except ValueError:
            raise E.bad_request(f"invalid timeoutSeconds {timeout!r}") from None
        deadline = time.monotonic() + timeout_s
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        rv_param = query.get("resourceVersion") or ""
        initial_events = _truthy(query.get("sendInitialEvents"))
        pending: list[dict] = []
        with app._lock:
            if rv_param in ("", "0") or initial_events:
                items = sorted((o for o in app._store[rt.key].values() if match(o)), key=_sort_key)
                pending = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in items]
                cursor = app._rv
                if initial_events and bookmarks:
                    pending.append(self._bookmark(rt, cursor, initial_end=True))
            else:
                try:
                    cursor = int(rv_param)
                except ValueError:
                    raise E.bad_request(f"invalid resource version {rv_param!r}") from None
                if cursor < app._compacted_rv:
                    err = E.gone(f"too old resource version: {cursor} ({app._compacted_rv})")
                    pending = [{"type": "ERROR", "object": err.status()}]
                    cursor = -1
        started()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            while True:
                for ev in pending:
                    self._write_chunk(json.dumps(ev).encode() + b"\n")
                pending = []
                if cursor < 0:
                    break
                with app._cond:
                    if not app._stopping and time.monotonic() < deadline:
                        events, cursor = app._watch_events(rt, cursor, match)
                        if not events:
                            app._cond.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                            events, cursor = app._watch_events(rt, cursor, match)
                        pending = events
                    stopping = app._stopping
                if pending:
                    continue
                if stopping or time.monotonic() >= deadline or self._client_gone():
                    break
            if bookmarks and cursor >= 0 and not app._stopping:
                self._write_chunk(json.dumps(self._bookmark(rt, cursor)).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> dict:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                               "metadata": meta}}
