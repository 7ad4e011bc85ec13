"""API clients: the one place a ``kubernetes.client.ApiClient`` is made.

Only a command that talks to a cluster loads this module (``kubernetes`` costs tens of MB and
most commands never do). A kubeconfig that cannot be used, or a server that does not answer, is
bad input, not a crash: :class:`KubeconfigError` and :class:`ApiUnreachable` say in one line
which file or server and what to check.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from dra_bridge.apiclient.kubeconfig import (  # noqa: F401  (re-exported: the client's names)
    PROBE_TIMEOUT,
    ApiUnreachable,
    KubeconfigError,
    _check_context,
    _check_files,
    _first_line,
    _in_cluster,
    _reason,
)


def transport_retries() -> Retry:
    """urllib3's retry policy for every client we build: only connection errors are retried there
    (the request never reached the server). The kubernetes client's default ``Retry(3)`` would also
    re-send a timed-out GET/PUT/DELETE up to three times and wait out any 429/503 ``Retry-After``
    with no cap before the caller sees it; the callers that retry (the publisher) do that themselves,
    bounded (urllib3 ``Retry``: ``read``, ``status``, ``respect_retry_after_header``)."""
    return Retry(total=3, connect=3, read=0, status=0, other=0, redirect=3,
                 respect_retry_after_header=False, raise_on_status=False)


def api_client_from(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """The client for the kubeconfig found in kubectl's order (flag, $KUBECONFIG, ~/.kube/config,
    in-cluster), at ``context`` (default: its current-context)."""
    if _in_cluster(kubeconfig):
        if context:
            raise KubeconfigError(f"--context {context}: no kubeconfig to take it from (running in-cluster); "
                                  "pass --kubeconfig FILE")
        try:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
        except Exception as exc:  # noqa: BLE001 - ConfigException, OSError, ...
            raise KubeconfigError(f"in-cluster config: {exc}; run in a pod with a service account token, "
                                  "or pass --kubeconfig FILE") from None
        cfg.retries = transport_retries()
        return compact_json(client.ApiClient(cfg))
    files = _check_files(kubeconfig)
    _check_context(files, context)
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=os.pathsep.join(files), context=context or None,
                                client_configuration=cfg)
    except Exception as exc:  # noqa: BLE001 - ConfigException, and TypeError etc. on odd shapes
        where = ", ".join(files)
        raise KubeconfigError(f"kubeconfig {where}: {_first_line(exc)}; check it with "
                              f"`kubectl config view --kubeconfig {files[0]}`") from None
    cfg.retries = transport_retries()
    return compact_json(client.ApiClient(cfg))


class _CompactJson:
    """The pool manager the Kubernetes client sends through, with each JSON body written without
    whitespace.

    The client encodes a body with ``json.dumps``' default separators (``", "``, ``": "``), and
    kube-apiserver keeps an opaque config's ``parameters`` (a RawExtension) byte for byte: the scheduler
    copies them into the claim's allocation as they came, and every later status write over JSON (which
    re-encodes them compactly) is refused as a change of the allocation ("status.allocation: field
    cannot be modified once set", 422): the agent could never confirm a binding condition on a claim
    whose template this client made (found on Kubernetes 1.37.2; kubectl sends compact JSON)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def request(self, method: str, url: str, body: Any = None, **kw: Any) -> Any:
        kind = str((kw.get("headers") or {}).get("Content-Type") or "json")  # none: the client's JSON
        if isinstance(body, str) and "json" in kind:
            body = json.dumps(json.loads(body), separators=(",", ":"))
        return self._pool.request(method, url, body=body, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def compact_json(api: client.ApiClient) -> client.ApiClient:
    """``api`` sending its JSON bodies without whitespace (:class:`_CompactJson` says why)."""
    rest = api.rest_client
    if not isinstance(rest.pool_manager, _CompactJson):
        rest.pool_manager = _CompactJson(rest.pool_manager)  # type: ignore[assignment]  # a wrapper, same calls
    return api


def check_reachable(api: client.ApiClient, timeout: float = PROBE_TIMEOUT) -> None:
    """Ask the server its version; :class:`ApiUnreachable` when it does not answer or refuses the user."""
    host = api.configuration.host
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)  # its warning per retry would bury the one line that says why
    try:
        client.VersionApi(api).get_code(_request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 401:
            raise ApiUnreachable(f"API server {host} refused the credentials (401 Unauthorized); check the "
                                 "user's token or certificate in the kubeconfig") from None
        # any other answer: the server is there; the command's own calls say what they need
    except Exception as exc:  # noqa: BLE001 - urllib3's connection, TLS and timeout errors
        raise ApiUnreachable(f"API server {host} does not answer ({_reason(exc)}); check the server address "
                             "in the kubeconfig and that the cluster is up") from None
    finally:
        pool_log.setLevel(level)


def connect(kubeconfig: str | None, timeout: float = PROBE_TIMEOUT, *, context: str | None = None) -> client.ApiClient:
    """:func:`api_client_from`, then :func:`check_reachable`: a command's client, known to answer."""
    api = api_client_from(kubeconfig, context)
    try:
        check_reachable(api, timeout)
    except ApiUnreachable:
        api.close()
        raise
    return api


def plain_http_configuration(url: str) -> client.Configuration:
    """A ``kubernetes.client.Configuration`` for a local server on plain HTTP with no auth."""
    cfg = client.Configuration(host=url, no_proxy="127.0.0.1,localhost")
    cfg.verify_ssl = False
    cfg.retries = transport_retries()
    return cfg


def plain_http_client(url: str) -> client.ApiClient:
    """An ``ApiClient`` for :func:`plain_http_configuration`; the caller closes it."""
    return compact_json(client.ApiClient(plain_http_configuration(url)))

