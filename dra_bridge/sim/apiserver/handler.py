"""HTTP side of the local API server: routing Kubernetes REST paths, answering, streaming watches.

One :class:`Handler` per connection (HTTP/1.1 keep-alive); it maps a request to a
:class:`Route` (verb, resource, namespace, name, subresource), applies the server's fault
injections, calls the :class:`~.store.Store` and writes JSON. Watches are chunked streams
fed from the store's event history.
"""

from __future__ import annotations

import copy
import json
import select
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from dra_bridge.sim.apiserver import discovery, openapi, openapi_pb, rawjson, tables
from dra_bridge.sim.apiserver import errors as E
from dra_bridge.sim.apiserver.errors import ApiError, FieldError
from dra_bridge.sim.apiserver.patch import APPLY_PATCH
from dra_bridge.sim.apiserver.resources import ResourceType
from dra_bridge.sim.apiserver.store import Store

MUTATING_VERBS = ("create", "update", "patch", "delete", "deletecollection")
_NOT_FOUND = "the server could not find the requested resource"
_NOT_ALLOWED = "the server does not allow this method on the requested resource"


def truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class App(Protocol):
    """What the handler needs of the server object (:class:`~.server.LocalApiServer`)."""

    store: Store
    resources: tuple[ResourceType, ...]
    pod_logs: dict[tuple[str, str], str]
    watch_timeout: float
    version: str
    git_version: str
    _lock: Any
    _conns: set[socket.socket]

    @property
    def host(self) -> str: ...

    def version_info(self) -> dict: ...

    def _record(self, method: str, path: str, verb: str, resource: str, namespace: str | None,
                name: str | None, code: int) -> None: ...

    def _wrote(self, verb: str, resource: str, names: list[str]) -> None: ...

    def _injected(self, verb: str, rt: ResourceType | None, sub: str | None, namespace: str | None,
                  name: str | None) -> ApiError | None: ...


@dataclass
class Route:
    verb: str
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None
    discovery: Any = None  # response body for non-resource GETs (bytes: sent as they are)
    resource_label: str = ""
    content_type: str = "application/json"


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    app: App

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: tuple[str, int]) -> None:
        """A client that gave up (a timeout, a dropped watch) is normal here; anything else is printed."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def discovery_route(app: App, parts: list[str], accept: str = "") -> Route | None:
    """The answer to a GET of a non-resource path (``/version``, ``/apis``, ``/openapi/...``), if it is one."""
    joined = "/" + "/".join(parts)
    resources = app.resources
    if joined in ("/healthz", "/readyz", "/livez"):
        return Route("discovery", discovery="ok")
    if joined == "/version":
        return Route("discovery", discovery=app.version_info())
    if joined == "/api":
        return Route("discovery", discovery=discovery.api_versions(app.host))
    if joined == "/apis":
        return Route("discovery", discovery=discovery.api_group_list(resources))
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in discovery.groups(resources):
        return Route("discovery", discovery=discovery.api_group(resources, parts[1]))
    if joined == "/openapi/v2":
        if openapi_pb.MEDIA_TYPE in accept or "protobuf" in accept.split(",")[0]:
            return Route("discovery", discovery=openapi.v2_protobuf(app.version, app.git_version, resources),
                         content_type=openapi_pb.CONTENT_TYPE)
        return Route("discovery", discovery=openapi.v2(app.version, app.git_version, resources))
    if joined == "/openapi/v3":
        return Route("discovery", discovery=openapi.v3_root(app.version, resources))
    if parts[:2] == ["openapi", "v3"]:
        doc = None
        if len(parts) == 4 and parts[2] == "api":
            doc = openapi.v3_group_version(app.version, resources, "", parts[3])
        elif len(parts) == 5 and parts[2] == "apis":
            doc = openapi.v3_group_version(app.version, resources, parts[3], parts[4])
        return Route("discovery", discovery=doc) if doc else None
    listing = None
    if len(parts) == 2 and parts[0] == "api":
        listing = discovery.resource_list(resources, "", parts[1])
    elif len(parts) == 3 and parts[0] == "apis":
        listing = discovery.resource_list(resources, parts[1], parts[2])
    return Route("discovery", discovery=listing) if listing else None


def resource_route(app: App, method: str, parts: list[str], query: dict) -> Route:
    """The Kubernetes verb, resource and object a REST path names (404 / 405 as kube-apiserver)."""
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, _NOT_FOUND, reason="NotFound")
    by_plural = {rt.plural: rt for rt in app.resources if rt.group == group and rt.version == version}
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
        rt = by_plural.get(rest[0])
        if rt is not None and not rt.namespaced:
            rt = None
    else:
        rt = by_plural.get(rest[0])
    if rt is None or len(rest) > 3:
        raise ApiError(404, _NOT_FOUND, reason="NotFound")
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    if sub == "log" and rt.key == "pods" and method == "GET" and namespace and name:
        return Route("log", rt, namespace, name, sub, resource_label="pods/log")
    if sub == "eviction" and rt.key == "pods" and method == "POST" and namespace and name:
        return Route("evict", rt, namespace, name, sub, resource_label="pods/eviction")
    if sub is not None and not (sub == "status" and rt.status_subresource):
        raise ApiError(404, _NOT_FOUND, reason="NotFound")
    if name is None:
        verb = {"GET": "watch" if truthy(query.get("watch")) else "list",
                "POST": "create", "DELETE": "deletecollection"}.get(method)
    else:
        verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None or (verb not in rt.verbs and sub is None):
        raise ApiError(405, _NOT_ALLOWED, reason="MethodNotAllowed")
    if sub and verb not in ("get", "update", "patch"):
        raise ApiError(405, _NOT_ALLOWED, reason="MethodNotAllowed")
    if namespace is None and rt.namespaced and (verb == "create" or name is not None):
        raise ApiError(404, _NOT_FOUND, reason="NotFound")
    label = rt.plural + (f"/{sub}" if sub else "")
    return Route(verb, rt, namespace, name, sub, resource_label=label)


def parse_body(raw: bytes, content_type: str) -> Any:
    """The request body: JSON, or YAML for a server-side apply (kubectl sends JSON there too)."""
    if not raw:
        return None
    if content_type.split(";")[0].strip().lower() in (APPLY_PATCH, "application/yaml"):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise E.bad_request(f"error decoding YAML: {exc}") from None
    try:
        # an opaque config's parameters are kept as sent, byte for byte (see rawjson); only bodies that
        # carry one pay for the slower decoder
        return rawjson.loads(raw) if b'"opaque"' in raw else json.loads(raw)
    except json.JSONDecodeError as exc:
        raise E.bad_request(f"the request body is not valid JSON: {exc}") from None


def field_manager(query: dict, user_agent: str) -> str:
    """Who a write is recorded for: ``?fieldManager=``, else the client's name from its User-Agent."""
    manager = query.get("fieldManager") or user_agent.split("/", 1)[0][:128]
    if len(manager) > 128:
        raise E.invalid("UpdateOptions", "meta.k8s.io", "", [FieldError(
            "fieldManager", 'Too long: may not be more than 128 bytes', reason="FieldValueTooLong")])
    return manager


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HTTPServer
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

    def _send_bytes(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
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

    # ------------------------------------------------------------------ one request
    def _serve(self, method: str) -> None:
        app = self.server.app
        split = urlsplit(self.path)
        parts = [unquote(p) for p in split.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        route = Route("unknown")
        recorded = False

        def record(code: int) -> None:
            # before the response goes out, so a test that got its answer sees the count
            nonlocal recorded
            if not recorded:
                recorded = True
                app._record(method, self.path, route.verb, route.resource_label,
                            route.namespace, route.name, code)

        try:
            raw = self._read_body()
            route = (discovery_route(app, parts, self.headers.get("Accept", "")) if method == "GET" else None) or \
                resource_route(app, method, parts, query)
            if route.verb == "discovery":
                record(200)
                if isinstance(route.discovery, str):
                    self._send_text(200, route.discovery)
                elif isinstance(route.discovery, bytes):
                    self._send_bytes(200, route.discovery, route.content_type)
                else:
                    self._send_json(200, route.discovery)
                return
            injected = app._injected(route.verb, route.rt, route.sub, route.namespace, route.name)
            if injected is not None:
                raise injected
            body = parse_body(raw, self.headers.get("Content-Type", ""))
            form = tables.negotiate(self.headers.get("Accept", ""))
            if route.verb == "watch":
                self._watch(route, query, lambda: record(200), form)
                return
            rt = route.rt
            assert rt is not None  # resource_route's routes all name their resource
            if route.verb == "evict":  # policy/v1 Eviction: the pod is deleted (no PodDisruptionBudget here)
                assert route.namespace is not None and route.name is not None  # an eviction names its pod
                app.store.delete(rt, route.namespace, route.name, dict((body or {}).get("deleteOptions") or {}),
                                 query)
                app._wrote("create", route.resource_label, [route.name])
                record(201)
                self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                      "code": 201})
                return
            if route.verb == "log":  # a container's log: what set_pod_log stored (404 without the pod)
                assert route.namespace is not None and route.name is not None  # resource_route: both, for a log
                app.store.get_stored(rt, route.namespace, route.name)
                record(200)
                self._send_text(200, app.pod_logs.get((route.namespace, route.name), ""))
                return
            code, result, warnings, names = self._dispatch(route, body, query)
            if form and route.verb in ("get", "list"):
                result = tables.convert(rt, result, form, query)
            if route.verb in MUTATING_VERBS and not query.get("dryRun"):
                app._wrote(route.verb, route.resource_label, names)
            headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else {}
            record(code)
            self._send_json(code, result, headers)
        except ApiError as err:
            record(err.code)
            self._send_json(err.code, err.status(), err.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the fake: report it like an apiserver would
            internal = ApiError(500, f"local apiserver internal error: {type(exc).__name__}: {exc}",
                                reason="InternalError")
            record(500)
            try:
                self._send_json(500, internal.status())
            except OSError:
                self.close_connection = True
        finally:
            record(500)

    def _dispatch(self, route: Route, body: Any, query: dict) -> tuple[int, Any, list[str], list[str]]:
        """(status code, the JSON answer, warnings, the names of the objects written)."""
        store = self.server.app.store
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.sub
        assert rt is not None
        warnings: list[str] = []
        manager = field_manager(query, self.headers.get("User-Agent", ""))
        if route.verb == "list":
            return 200, store.list(rt, ns, query), warnings, []
        if route.verb == "create":
            obj = store.create(rt, ns, body, query, warnings, manager=manager)
            return 201, obj, warnings, [obj["metadata"]["name"]]
        if route.verb == "deletecollection":
            result, names = store.deletecollection(rt, ns, body or {}, query)
            return 200, result, warnings, names
        assert name is not None, route.verb  # the verbs below are an object's: resource_route names it
        if route.verb == "get":
            with store.lock:
                return 200, copy.deepcopy(store.get_stored(rt, ns, name)), warnings, []
        if route.verb == "update":
            obj = store.update(rt, ns, name, body, query, sub, warnings, manager)
            return 200, obj, warnings, [name]
        if route.verb == "patch":
            obj, created = store.patch(rt, ns, name, body, self.headers.get("Content-Type", ""), query, sub,
                                       warnings, manager)
            return 201 if created else 200, obj, warnings, [name]
        if route.verb == "delete":
            return 200, store.delete(rt, ns, name, dict(body or {}), query), warnings, [name]
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

    def _watch(self, route: Route, query: dict, started: Callable[[], None], form: tuple[str, str] | None = None) -> None:
        app = self.server.app
        store = app.store
        rt = route.rt
        assert rt is not None
        match = store.matcher(rt, route.namespace, query)
        timeout = query.get("timeoutSeconds")
        try:
            timeout_s = min(float(timeout), app.watch_timeout) if timeout else app.watch_timeout
        except ValueError:
            raise E.bad_request(f"invalid timeoutSeconds {timeout!r}") from None
        deadline = time.monotonic() + timeout_s
        bookmarks = truthy(query.get("allowWatchBookmarks"))
        rv_param = query.get("resourceVersion") or ""
        initial_events = truthy(query.get("sendInitialEvents"))
        pending: list[dict] = []
        with store.lock:
            if rv_param in ("", "0") or initial_events:
                pending = store.initial_events(rt, match)
                cursor = store.rv
                if initial_events and bookmarks:
                    pending.append(self._bookmark(rt, cursor, initial_end=True))
            else:
                try:
                    cursor = int(rv_param)
                except ValueError:
                    raise E.bad_request(f"invalid resource version {rv_param!r}") from None
                if cursor < store.compacted_rv:
                    err = E.gone(f"too old resource version: {cursor} ({store.compacted_rv})")
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
                    if form and ev["type"] not in ("ERROR", "BOOKMARK"):
                        ev = {"type": ev["type"], "object": tables.convert(rt, ev["object"], form, query)}
                    self._write_chunk(json.dumps(ev).encode() + b"\n")
                pending = []
                if cursor < 0:
                    break
                with store.cond:
                    if not store.stopping and time.monotonic() < deadline:
                        events, cursor = store.watch_events(rt, cursor, match)
                        if not events:
                            store.cond.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                            events, cursor = store.watch_events(rt, cursor, match)
                        pending = events
                    stopping = store.stopping
                if pending:
                    continue
                if stopping or time.monotonic() >= deadline or self._client_gone():
                    break
            if bookmarks and cursor >= 0 and not store.stopping:
                self._write_chunk(json.dumps(self._bookmark(rt, cursor)).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> dict:
        m: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            m["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                               "metadata": m}}
