"""Keep this node's ResourceSlices equal to the pool, with the fewest API writes.

* Nothing changed: no write at all (the comparison is on the slices' specs).
* Same number of slices and one slice changed: only that slice is replaced, in place, at
  the same pool generation (one write is atomic, so the pool is old or new, never mixed).
* Slice count changed, or several slices changed: the generation is bumped and every slice
  rewritten; slices that no longer belong (this driver and node, including other pools)
  are deleted last. The scheduler ignores the older generation and
  treats the new one as incomplete until ``resourceSliceCount`` slices of it are visible,
  so two generations are never read as one pool.
API faults: 409 conflicts re-read and retry; 429/5xx and connection errors back off and retry,
a bounded number of times (exponential backoff with jitter, each wait capped at ``max_backoff``).
A ``Retry-After`` from the server is honoured (never retried sooner than asked) up to
``RETRY_AFTER_CAP`` seconds, so a confused server cannot park the daemon. Every request carries a
timeout; an idempotent request (GET, PUT, DELETE) that times out is re-sent once, a create is not,
and a second timeout fails the sync with :class:`ApiTimeout` (the server is overloaded, the next
resync tries again). These retries are all there are: the clients built by :mod:`.client` let
urllib3 retry only connection errors (:func:`.client.transport_retries`). A create that finds its slice already
there (an earlier request of ours the server applied after we gave up) replaces it, so a slow
server never yields duplicate slices. The publisher LISTs; it keeps no watch to re-establish.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable

from pydantic import BaseModel

from dra_bridge.kube.errors import api_exception, missing_ok
from dra_bridge.kube.objects import sanitize
from dra_bridge.pool.devices import Pool
from dra_bridge.pool.slices import build_slices

log = logging.getLogger(__name__)
RETRYABLE = {409, 429, 500, 502, 503, 504}
RETRY_AFTER_CAP = 30.0  # seconds: the longest Retry-After honoured as given


class ApiTimeout(TimeoutError):
    """The API server did not answer a request within the publisher's timeout."""


def retry_after(exc: BaseException) -> float | None:
    """The seconds an API error's ``Retry-After`` header asks for; ``None`` if absent or not seconds."""
    value = (getattr(exc, "headers", None) or {}).get("Retry-After")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None  # absent, or an HTTP date (Kubernetes sends seconds)
    return seconds if seconds >= 0 else None


def retry_delay(attempt: int, *, backoff: float, max_backoff: float, jitter: float,
                server_asks: float | None = None) -> float:
    """Seconds to wait before retrying after failed ``attempt`` (0-based).

    Exponential backoff with up to 50 % jitter (``jitter`` in [0, 1)), at most ``max_backoff``;
    the server's ``Retry-After`` raises it, capped at :data:`RETRY_AFTER_CAP`.
    """
    delay = min(max_backoff, backoff * (2 ** attempt) * (1 + jitter / 2))
    if server_asks is not None:
        delay = max(delay, min(server_asks, RETRY_AFTER_CAP))
    return delay


def _timed_out(exc: BaseException) -> bool:
    """A read timeout (the server took the request, then did not answer), bare or in a MaxRetryError.

    Connect errors are not timeouts here (urllib3 derives "connection refused" from its connect
    timeout): an unreachable server is retried.
    """
    from urllib3.exceptions import ReadTimeoutError

    return isinstance(exc, ReadTimeoutError) or isinstance(getattr(exc, "reason", None), ReadTimeoutError)


class SyncResult(BaseModel):
    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


def server_version(api_client, timeout: float | None = None) -> tuple[int, int]:
    """(major, minor) from the API server's /version (``minor`` may carry a ``+``)."""
    from kubernetes import client

    info = client.VersionApi(api_client).get_code(_request_timeout=timeout)
    return int(info.major), int("".join(ch for ch in info.minor if ch.isdigit()))


def _strip(obj: Any) -> Any:
    """Drop empty values so specs compare equal however the server echoes them."""
    if isinstance(obj, dict):
        out = {k: _strip(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _content(spec: dict) -> dict:
    """A slice's spec without the pool bookkeeping that a generation bump changes."""
    s = dict(_strip(spec))
    pool = dict(s.get("pool", {}))
    pool.pop("generation", None)
    s["pool"] = pool
    return s


class Publisher:
    """Publishes a :class:`Pool` as this node's ResourceSlices (see the module docstring).

    ``retries``: retries per request after the first attempt; ``backoff``: the first wait
    (doubling, ``max_backoff`` at most); ``timeout``: seconds per request; ``sleep`` and
    ``rand`` (jitter in [0, 1)) are injectable for tests.
    """

    def __init__(self, api_client, *, driver: str, node_name: str, pool_name: str | None = None,
                 version: tuple[int, int] | None = None, retries: int = 5, backoff: float = 0.05,
                 max_backoff: float = 5.0, timeout: float = 20.0,
                 sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random):
        from kubernetes import client

        self.api_client = api_client
        self.api = client.ResourceV1Api(api_client)
        self.driver = driver
        self.node_name = node_name
        self.pool_name = pool_name or node_name
        self._version = version
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.sleep = sleep
        self.rand = rand

    @property
    def version(self) -> tuple[int, int]:
        if self._version is None:
            self._version = self._retry("read /version", lambda: server_version(self.api_client, self.timeout))
        return self._version

    def _retry(self, what: str, fn: Callable[[], Any], *, idempotent: bool = True) -> Any:
        """``fn`` with the bounded retries of the module docstring; ``idempotent``: safe to re-send
        after a timeout (a create is not: the server may have applied it)."""
        from urllib3.exceptions import HTTPError as TransportError  # connection refused/reset, timeouts

        resent = not idempotent
        for attempt in range(self.retries + 1):
            asks = None
            try:
                return fn()
            except api_exception() as exc:
                if exc.status not in RETRYABLE or attempt == self.retries:
                    raise
                asks = retry_after(exc)
                log.info("%s: API answered %s, retrying", what, exc.status)
            except (ConnectionError, OSError, TransportError) as exc:
                if _timed_out(exc):
                    if resent or attempt == self.retries:
                        raise ApiTimeout(f"{what}: the API server did not answer within {self.timeout:g} s "
                                         f"(overloaded?); the next resync tries again") from exc
                    resent = True
                    log.info("%s: no answer within %g s, sending it once more", what, self.timeout)
                    continue
                if attempt == self.retries:
                    raise
                log.info("%s: API unreachable (%s), retrying", what, exc)
            self.sleep(retry_delay(attempt, backoff=self.backoff, max_backoff=self.max_backoff,
                                   jitter=self.rand(), server_asks=asks))

    def existing(self, *, all_pools: bool = False) -> dict[str, dict]:
        """This driver's slices of this node: of our pool, or (``all_pools``) of any pool."""
        sel = f"spec.nodeName={self.node_name},spec.driver={self.driver}"
        resp = self._retry("list resourceslices", lambda: self.api.list_resource_slice(
            field_selector=sel, _request_timeout=self.timeout))
        out = {}
        for item in resp.items:
            obj = sanitize(self.api_client, item)
            if all_pools or obj["spec"].get("pool", {}).get("name") == self.pool_name:
                out[obj["metadata"]["name"]] = obj
        return out

    def desired(self, pool: Pool, generation: int) -> list[dict]:
        return build_slices(pool, driver=self.driver, node_name=self.node_name, pool_name=self.pool_name,
                            generation=generation, server_version=self.version)

    @staticmethod
    def _differs(old: dict | None, new: dict, generation: int) -> bool:
        return old is None or _content(old["spec"]) != _content(new["spec"]) \
            or old["spec"]["pool"].get("generation") != generation \
            or (old["metadata"].get("labels") or {}) != new["metadata"]["labels"]

    def sync(self, pool: Pool) -> SyncResult:
        everything = self.existing(all_pools=True)
        have = {n: o for n, o in everything.items() if o["spec"].get("pool", {}).get("name") == self.pool_name}
        generation = max((o["spec"]["pool"].get("generation", 0) for o in have.values()), default=0)
        want = self.desired(pool, generation)
        same_shape = set(have) == {s["metadata"]["name"] for s in want} and all(
            o["spec"]["pool"].get("generation", 0) == generation for o in have.values())
        if same_shape and sum(self._differs(have.get(s["metadata"]["name"]), s, generation) for s in want) > 1:
            same_shape = False  # in-place updates of several slices would show a mix of old and new as one pool
        result = SyncResult(generation=generation)
        if not same_shape:
            generation += 1
            want = self.desired(pool, generation)
            result.generation = generation
        for s in want:
            name = s["metadata"]["name"]
            old = everything.get(name)  # (a slice of another pool under our name is taken over)
            if old is None:
                self._create(name, s)
                result.created += 1
            elif self._differs(old, s, generation):
                self._replace(name, s)
                result.updated += 1
        for name in sorted(set(everything) - {s["metadata"]["name"] for s in want}):
            self._delete(name)
            result.deleted += 1
        if result.writes:
            log.info("published pool %s generation %s: %s", self.pool_name, result.generation, result.model_dump())
        return result

    def _create(self, name: str, body: dict) -> None:
        def attempt() -> bool:
            try:
                self.api.create_resource_slice(body, _request_timeout=self.timeout)
                return True
            except api_exception() as exc:
                # there after all (a create of ours the server applied after we gave up): replace it
                if exc.status == 409 and missing_ok(self.api.read_resource_slice, name,
                                                    _request_timeout=self.timeout):
                    return False
                raise

        if not self._retry(f"create resourceslice {name}", attempt, idempotent=False):
            self._replace(name, body)

    def _replace(self, name: str, body: dict) -> None:
        def attempt():
            current = self.api.read_resource_slice(name, _request_timeout=self.timeout)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            try:
                return self.api.replace_resource_slice(name, body, _request_timeout=self.timeout)
            finally:
                body["metadata"].pop("resourceVersion", None)

        if not missing_ok(self._retry, f"replace resourceslice {name}", attempt):  # deleted meanwhile
            self._retry(f"create resourceslice {name}",
                        lambda: self.api.create_resource_slice(body, _request_timeout=self.timeout), idempotent=False)

    def _delete(self, name: str) -> None:
        missing_ok(self._retry, f"delete resourceslice {name}",
                   lambda: self.api.delete_resource_slice(name, _request_timeout=self.timeout))

    def delete_all(self) -> int:
        have = self.existing(all_pools=True)
        for name in have:
            self._delete(name)
        return len(have)
