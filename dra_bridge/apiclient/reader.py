"""Plain JSON reads of a cluster without the Kubernetes client: ``kubectl vgpu`` in a blink.

The Kubernetes client costs most of a second of CPU to import (its package loads its config, dynamic
and validation modules, and each typed API class loads pydantic models of every object it names),
while a read-only command needs a handful of GETs answered in JSON. :func:`open_reader` reads the
kubeconfig as kubectl does (:mod:`.kubeconfig`: the flag, ``$KUBECONFIG``, ``~/.kube/config``; the
context) and, where it is a plain one (a server, its CA or ``insecure-skip-tls-verify``, a client
certificate and key or a bearer token, inline or in files), reads through one kept-alive
``http.client`` connection. Anything else (exec and auth-provider plugins, a proxy from the
environment, ``tls-server-name``, a token file, impersonation, the in-cluster service account) goes
through the client's own loader and transport (:class:`ClientReader`),
as before. Errors are the client's one lines: a kubeconfig to fix, a server that does not answer or
refuses the credentials (:class:`~.kubeconfig.ApiUnreachable`), an API error answer
(:class:`~.errors.ApiAnswer`).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
import tempfile
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from dra_bridge.apiclient.errors import ApiAnswer
from dra_bridge.apiclient.kubeconfig import (
    PROBE_TIMEOUT,
    ApiUnreachable,
    _check_context,
    _check_files,
    _in_cluster,
    _reason,
)
from mdev_manager.yamlfile import load_yaml

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                 "extensions"}
_USER_KEYS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "extensions"}
_CONTEXT_KEYS = {"cluster", "user", "namespace", "extensions"}
_PROXY_ENV = ("https_proxy", "http_proxy", "all_proxy")


class Reader(Protocol):
    """GETs answered in JSON: ``missing`` statuses answer None, other errors raise."""

    def get(self, path: str, missing: Collection[int] = ()) -> dict[str, Any] | None: ...

    def version(self) -> tuple[int, int]: ...

    def close(self) -> None: ...


class ApiGone(Exception):
    """The API server stopped answering after it first did (exit 1: not the user's input)."""

    exit_code = 1


def server_version(info: dict[str, Any]) -> tuple[int, int]:
    """(major, minor) from a ``/version`` answer (``minor`` may carry a ``+``)."""
    return int(info["major"]), int("".join(ch for ch in str(info["minor"]) if ch.isdigit()))


class _JsonGets:
    """What both readers share over their one raw GET (``_fetch``): ``missing`` statuses answer None,
    other error statuses raise :class:`~.errors.ApiAnswer`, and the server's version is asked once."""

    _version: tuple[int, int] | None = None

    def _fetch(self, path: str) -> tuple[int, str, bytes]:
        raise NotImplementedError

    def get(self, path: str, missing: Collection[int] = ()) -> dict[str, Any] | None:
        status, reason, data = self._fetch(path)
        if status in missing:
            return None
        if status >= 400:
            raise ApiAnswer(status, reason, data.decode(errors="replace"))
        answer: dict[str, Any] = json.loads(data)
        return answer

    def version(self) -> tuple[int, int]:
        """The server's version, asked once."""
        if self._version is None:
            info = self.get("/version")
            assert info is not None
            self._version = server_version(info)
        return self._version


class JsonReader(_JsonGets):
    """GETs through one kept-alive connection to ``server`` (``https``: with ``tls``)."""

    def __init__(self, server: str, *, tls: ssl.SSLContext | None = None, token: str | None = None,
                 timeout: float = PROBE_TIMEOUT) -> None:
        self.server = server.rstrip("/")
        url = urlsplit(self.server)
        self._prefix = url.path
        self._headers = {"Accept": "application/json", "User-Agent": "vgpuctl"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if url.scheme == "https":
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                url.hostname or "", url.port, timeout=timeout, context=tls or ssl.create_default_context())
        else:
            self._conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
        self._answered = False

    def _request(self, path: str) -> tuple[int, str, bytes]:
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more, anew
            try:
                self._conn.request("GET", self._prefix + path, headers=self._headers)
                resp = self._conn.getresponse()
                return resp.status, resp.reason, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._conn.close()
                if attempt == 2 or not self._answered:
                    raise self._down(exc) from None
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                raise self._down(exc) from None
        raise AssertionError("unreachable")

    def _down(self, exc: BaseException) -> Exception:
        # an SSL error's reason is its code alone (CERTIFICATE_VERIFY_FAILED): its text says why
        why = re.sub(r" \(_ssl\.c:\d+\)$", "", str(exc)) if isinstance(exc, ssl.SSLError) else _reason(exc)
        if not self._answered:  # the first request: what check_reachable says
            return ApiUnreachable(f"API server {self.server} does not answer ({why}); check the server "
                                  "address in the kubeconfig and that the cluster is up")
        return ApiGone(f"the API server at {self.server} did not answer ({why}); check that it is up "
                       "and reachable")

    def _fetch(self, path: str) -> tuple[int, str, bytes]:
        status, reason, data = self._request(path)
        if status == 401 and not self._answered:
            raise ApiUnreachable(f"API server {self.server} refused the credentials (401 Unauthorized); check the "
                                 "user's token or certificate in the kubeconfig")
        if not self._answered:  # the probe's timeout; the reads after it wait as the client's do (no limit)
            self._answered = True
            self._conn.timeout = None
            if self._conn.sock is not None:
                self._conn.sock.settimeout(None)
        return status, reason, data

    def close(self) -> None:
        self._conn.close()


class ClientReader(_JsonGets):
    """:class:`~dra_bridge.apiclient.reader.Reader` through a client: where the kubeconfig needs the
    client's loader (exec plugins, proxies, in-cluster), the same plain JSON reads."""

    def __init__(self, api: ApiClient, timeout: float | None = None) -> None:
        self.api, self.timeout = api, timeout

    def _fetch(self, path: str) -> tuple[int, str, bytes]:
        method, url, headers, _, _ = self.api.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = self.api.call_api(method, url, headers, _request_timeout=self.timeout)
        return resp.status, resp.reason or "", resp.read() or b""

    def close(self) -> None:
        self.api.close()


def open_reader(kubeconfig: str | None, context: str | None = None, timeout: float = PROBE_TIMEOUT) -> Reader:
    """A reader for the cluster the kubeconfig names (kubectl's order), known to answer: its
    ``version()`` is read here."""
    reader: Reader
    plain = None if _in_cluster(kubeconfig) or _proxied() else _plain(kubeconfig, context)
    if plain is None:
        from dra_bridge.apiclient.client import connect  # the client's loader (~1 s)

        reader = ClientReader(connect(kubeconfig, timeout, context=context))  # probed there; reads: no limit
    else:
        reader = JsonReader(plain["server"], tls=plain.get("tls"), token=plain.get("token"), timeout=timeout)
    try:
        reader.version()
    except BaseException:
        reader.close()
        raise
    return reader


def _proxied() -> bool:
    """Whether the environment names a proxy (the client honours it; this reader does not)."""
    return any(os.environ.get(k) or os.environ.get(k.upper()) for k in _PROXY_ENV)


def _plain(kubeconfig: str | None, context: str | None) -> dict[str, Any] | None:
    """The server, TLS context and token of a plain kubeconfig; None where it is not one (or has a
    fault: the client's loader then names it, as before)."""
    files = _check_files(kubeconfig)
    _check_context(files, context)
    maps: dict[str, dict[str, tuple[dict, str]]] = {"clusters": {}, "users": {}, "contexts": {}}
    current = None
    for path in files:  # kubectl's merge: the first file to name an entry (or current-context) wins
        doc = load_yaml(os.path.expanduser(path), what="kubeconfig")
        base = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
        current = current or doc.get("current-context")
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in doc.get(kind) or []:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get(key), dict):
                    maps[kind].setdefault(entry["name"], (entry[key], base))
    ctx = maps["contexts"].get(context or current or "")
    if ctx is None or not set(ctx[0]) <= _CONTEXT_KEYS:
        return None
    cluster = maps["clusters"].get(ctx[0].get("cluster") or "")
    user = maps["users"].get(ctx[0].get("user") or "", ({}, ""))
    if cluster is None or not set(cluster[0]) <= _CLUSTER_KEYS or not set(user[0]) <= _USER_KEYS:
        return None
    try:
        return _settings(cluster, user)
    except (ValueError, TypeError, OSError, ssl.SSLError):
        return None  # the client's loader says what is wrong, in its words


def _settings(cluster: tuple[dict, str], user: tuple[dict, str]) -> dict[str, Any] | None:
    (c, cbase), (u, ubase) = cluster, user
    server = c.get("server")
    if not isinstance(server, str) or urlsplit(server).scheme not in ("http", "https"):
        return None
    out: dict[str, Any] = {"server": server, "token": u.get("token")}
    if out["token"] is not None and not isinstance(out["token"], str):
        return None
    if urlsplit(server).scheme == "https":
        tls = ssl.create_default_context()
        if c.get("insecure-skip-tls-verify") is True:
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif c.get("certificate-authority-data"):
            tls.load_verify_locations(cadata=base64.b64decode(c["certificate-authority-data"]).decode())
        elif c.get("certificate-authority"):
            tls.load_verify_locations(cafile=os.path.join(cbase, c["certificate-authority"]))
        cert = _pem(u, "client-certificate", ubase)
        key = _pem(u, "client-key", ubase)
        if (cert is None) != (key is None):
            return None
        if cert is not None and key is not None:
            with tempfile.TemporaryDirectory(prefix="vgpuctl-") as d:  # ssl loads a key from files only
                cf, kf = os.path.join(d, "cert"), os.path.join(d, "key")
                for f, data in ((cf, cert), (kf, key)):
                    with open(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                        fh.write(data)
                tls.load_cert_chain(cf, kf)
        out["tls"] = tls
    return out


def _pem(user: dict, key: str, base: str) -> bytes | None:
    if user.get(f"{key}-data"):
        return base64.b64decode(user[f"{key}-data"])
    if user.get(key):
        with open(os.path.join(base, user[key]), "rb") as fh:
            return fh.read()
    return None
