"""Keep this node's ResourceSlices equal to the pool, with the fewest API writes.

* Nothing changed: no write at all (the comparison is on the slices' specs).
* Same slices and one of them changed or missing (deleted behind our back): only that slice is
  replaced or re-created, in place, at the same pool generation (one write is atomic, so the pool
  is old or new, never mixed).
* A GPU that comes or goes (whole devices and counter sets gained or lost, every other one as
  last published): its slices are emptied or filled in place, one write at a time, at the same
  generation and slice count, so the scheduler never loses sight of a GPU that did not change
  (:mod:`dra_bridge.pool.keep`; an emptied slice stays, for the next GPU to fill). The same for a GPU
  narrowed to the size its first vGPU settled (devices lost, binding conditions dropped): its own
  slices, not every slice at a new generation (34 writes on the largest preset before).
* Slice count changed otherwise, or several slices changed: the generation is bumped and every slice
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
server never yields duplicate slices.

What the server holds comes from a :class:`~.slicemirror.SliceMirror`: one LIST, then a watch, as
upstream's slice controller keeps an informer. A resync with nothing to change therefore makes no
request at all; each built slice is hashed once and compared by digest. The mirror LISTs again only
when its watch was lost (410 Gone, a broken stream). ``watch=False`` LISTs at every sync instead.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from dra_bridge.apiclient.errors import api_exception, missing_ok
from dra_bridge.apiclient.kept import KeptFields, observe
from dra_bridge.apiclient.objects import raw, watch_events
from dra_bridge.apiclient.slicemirror import Known, SliceMirror, content_digest
from dra_bridge.pool.devices import Pool, PoolDevice
from dra_bridge.pool.keep import in_place, write_order
from dra_bridge.pool.slicecheck import check_pool_slices
from dra_bridge.pool.slices import build_slices

if TYPE_CHECKING:  # the kubernetes package loads on first use (a command's -h stays light)
    from kubernetes import client

log = logging.getLogger(__name__)
RETRYABLE = {409, 429, 500, 502, 503, 504}
RETRY_AFTER_CAP = 30.0  # seconds: the longest Retry-After honoured as given
WATCH_SECONDS = 300  # a watch request's server-side timeout; it is then resumed from its last version


class ApiTimeout(TimeoutError):
    """The API server did not answer a request within the publisher's timeout."""


def retry_after(exc: BaseException) -> float | None:
    """The seconds an API error's ``Retry-After`` header asks for; ``None`` if absent or not seconds."""
    value = (getattr(exc, "headers", None) or {}).get("Retry-After")
    if value is None:
        return None
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


def server_version(api_client: client.ApiClient, timeout: float | None = None) -> tuple[int, int]:
    """(major, minor) from the API server's /version (``minor`` may carry a ``+``)."""
    from kubernetes import client

    info = client.VersionApi(api_client).get_code(_request_timeout=timeout)
    return int(info.major), int("".join(ch for ch in info.minor if ch.isdigit()))


def comes_or_goes(last: Pool | None, pool: Pool) -> bool:
    """Whether ``pool`` differs from ``last`` only by whole devices and counter sets gained or lost (a GPU
    off the bus, or back), or by devices lost and binding conditions dropped (a GPU narrowed to the size
    its first vGPU settled: its other sizes go, the slots of its size are bound without a verdict now),
    every other member unchanged. Written slice by slice, each state between offers the members of
    both pools, no device the new pool adds a condition to, so nothing either pool forbids (a slot of
    another size still published carries its conditions, which the agent refuses)."""
    if last is None:
        return False
    old_d, new_d = {d.name: d for d in last.devices}, {d.name: d for d in pool.devices}
    old_c, new_c = {c.name: c for c in last.counter_sets}, {c.name: c for c in pool.counter_sets}
    common = old_d.keys() & new_d.keys()
    if not all(old_c[n] == new_c[n] for n in old_c.keys() & new_c.keys()) or \
            not all(old_d[n] == new_d[n] or _unbound(old_d[n], new_d[n]) for n in common):
        return False
    if old_d.keys() == new_d.keys() and old_c.keys() == new_c.keys():
        return any(old_d[n] != new_d[n] for n in common)  # conditions dropped only
    return True


def _unbound(old: PoolDevice, new: PoolDevice) -> bool:
    """``new`` is ``old`` without its binding conditions. (Binding conditions are published only where the
    server keeps no compatibility groups, so the groups the pool model gives a settled size are not
    published either: not compared.)"""
    def plain(d: PoolDevice) -> PoolDevice:
        return d.model_copy(update={"binding_conditions": [], "binding_failure_conditions": [], "consumes": [
            c.model_copy(update={"compatibility_groups": []}) for c in d.consumes]})

    return bool(old.binding_conditions) and not new.binding_conditions and plain(old) == plain(new)


class Publisher:
    """Publishes a :class:`Pool` as this node's ResourceSlices (see the module docstring).

    ``retries``: retries per request after the first attempt; ``backoff``: the first wait
    (doubling, ``max_backoff`` at most); ``timeout``: seconds per request; ``sleep`` and
    ``rand`` (jitter in [0, 1)) are injectable for tests; ``on_error`` hears of every failed request.
    """

    def __init__(self, api_client: client.ApiClient, *, driver: str, node_name: str, pool_name: str | None = None,
                 version: tuple[int, int] | None = None, retries: int = 5, backoff: float = 0.05,
                 max_backoff: float = 5.0, timeout: float = 20.0, watch: bool = True,
                 sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random,
                 on_error: Callable[[str], None] | None = None):
        from dra_bridge.apiclient import resource

        self.api_client = api_client
        self.api = resource.ResourceV1Api(api_client)
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
        self.on_error = on_error or (lambda code: None)  # each failed request: "409", "timeout", "unreachable"
        self.watch = watch
        self._selector = f"spec.nodeName={node_name},spec.driver={driver}"
        self.mirror = SliceMirror(self._list_raw, self._watch_raw)
        # name -> (digest of what we sent, digest of what the server stored) of our last write: a
        # server that drops fields (a disabled gate) stores less than we send, and a slice it still
        # holds as we left it is compared by what we sent, or every resync would rewrite it
        self._sent: dict[str, tuple[str, str]] = {}
        self.kept = KeptFields()
        self._seen: frozenset | None = None  # the mirror as our last sync left it
        self._last: Pool | None = None  # the pool our last complete sync published

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
                self.on_error(str(exc.status))
                if exc.status not in RETRYABLE or attempt == self.retries:
                    raise
                asks = retry_after(exc)
                log.info("%s: API answered %s, retrying", what, exc.status)
            except (ConnectionError, OSError, TransportError) as exc:
                self.on_error("timeout" if _timed_out(exc) else "unreachable")
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

    def _list_raw(self) -> dict:
        return self._retry("list resourceslices", lambda: raw(
            self.api.list_resource_slice, field_selector=self._selector, _request_timeout=self.timeout))

    def _watch_raw(self, version: str | None) -> Iterator[dict[str, Any]]:
        """Raw watch events of this driver's slices on this node, from ``version`` (one request; it
        ends at the server's timeout). An ``ERROR`` event is yielded as is (the mirror handles it)."""
        yield from watch_events(self.api.list_resource_slice(
            field_selector=self._selector, watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False, _request_timeout=(self.timeout, WATCH_SECONDS + 30)))

    def known(self, *, all_pools: bool = False) -> dict[str, Known]:
        """This driver's slices of this node as the server holds them: of our pool, or (``all_pools``)
        of any pool. From the watched mirror; a LIST only when it is not synced (or ``watch=False``)."""
        if self.watch and self.mirror.synced:
            have = self.mirror.snapshot()
        elif self.watch:
            have = self.mirror.list_and_watch()
        else:
            have = {o["metadata"]["name"]: Known.of(o) for o in self._list_raw().get("items") or []}
        return {n: k for n, k in have.items() if all_pools or k.pool == self.pool_name}

    def existing(self, *, all_pools: bool = False) -> dict[str, dict]:
        """The server's full objects (a LIST, for tools and tests; the sync itself uses :meth:`known`)."""
        out = {}
        for obj in self._list_raw().get("items") or []:
            if all_pools or obj["spec"].get("pool", {}).get("name") == self.pool_name:
                out[obj["metadata"]["name"]] = obj
        return out

    def desired(self, pool: Pool, generation: int) -> list[dict]:
        return build_slices(pool, driver=self.driver, node_name=self.node_name, pool_name=self.pool_name,
                            generation=generation, server_version=self.version)

    def _differs(self, name: str, old: Known | None, digest: str, generation: int) -> bool:
        if old is None or old.generation != generation:
            return True
        sent, stored = self._sent.get(name, (None, None))
        return (sent if stored == old.digest else old.digest) != digest

    def _written(self, name: str, body: dict, answer: dict) -> None:
        """Remember a write: the mirror takes the server's answer; what it kept is noted."""
        self.mirror.record(answer)
        self._sent[name] = (content_digest(body), content_digest(answer))
        kept = observe(self.kept, body, answer)
        if kept != self.kept:
            level = logging.WARNING if False in (kept.counters, kept.compatibility_groups) else logging.INFO
            log.log(level, "the API server keeps: %s", kept.describe())
            self.kept = kept

    def _mirror_key(self) -> frozenset:
        return frozenset((n, k.digest, k.generation) for n, k in self.mirror.snapshot().items())

    def is_current(self) -> bool:
        """The server holds exactly what our last sync left (the watch saw no other change): a
        resync whose pool did not change either has nothing to publish, nor to compare."""
        return self.watch and self.mirror.synced and self._seen is not None and self._mirror_key() == self._seen

    def sync(self, pool: Pool) -> SyncResult:
        last, self._last = self._last, None  # unknown until this sync completes
        current = self.is_current()
        # no shortcut when the pool equals the last one and the mirror what the last sync left: under load a
        # slice deleted while a sync ran was then never written again (test_dashboard's recreated slice);
        # every sync compares, cheaply where nothing changed (#37, left open)
        result = self._sync(pool, last if current else None)
        self._seen = self._mirror_key() if self.watch and self.mirror.synced else None
        self._last = pool
        return result

    def _sync(self, pool: Pool, last: Pool | None = None) -> SyncResult:
        everything = self.known(all_pools=True)
        have = {n: k for n, k in everything.items() if k.pool == self.pool_name}
        generation = max((k.generation for k in have.values()), default=0)
        want = self.desired(pool, generation)
        if set(everything) == set(have):
            kept = self._in_place(have, want, generation, comes_or_goes(last, pool))
            if kept is not None:
                return kept
        digests = {s["metadata"]["name"]: content_digest(s) for s in want}  # each built slice hashed once
        # one slice changed or missing: written in place at the same generation (one write is atomic);
        # in-place writes of several would show a mix of old and new as one pool
        same_shape = bool(have) and set(have) <= set(digests) and all(k.generation == generation for k in have.values())
        if same_shape and sum(self._differs(n, have.get(n), d, generation) for n, d in digests.items()) > 1:
            same_shape = False
        result = SyncResult(generation=generation)
        if not same_shape:
            generation += 1
            for s in want:  # the generation is not part of the digest: no rebuild needed
                s["spec"]["pool"]["generation"] = generation
            result.generation = generation
        for s in want:
            name = s["metadata"]["name"]
            old = everything.get(name)  # (a slice of another pool under our name is taken over)
            if old is None:
                self._create(name, s)
                result.created += 1
            elif self._differs(name, old, digests[name], generation):
                self._replace(name, s)
                result.updated += 1
        for name in sorted(set(everything) - set(digests)):
            self._delete(name)
            result.deleted += 1
        if result.writes:
            log.info("published pool %s generation %s: %s", self.pool_name, result.generation, result.model_dump())
        return result

    def _in_place(self, have: dict[str, Known], want: list[dict], generation: int, membership: bool) -> SyncResult | None:
        """The sync done in place (:mod:`dra_bridge.pool.keep`): nothing to write, one slice (one
        atomic write), or, where only whole GPUs came or went (``membership``), a write per slice in an
        order that keeps every other GPU visible; None when the generation must be bumped instead."""
        held = {n: k.held for n, k in have.items()}
        bodies = in_place(held, want)
        if bodies is None or check_pool_slices(list(bodies.values()), self.version):
            return None  # (a plan the server would refuse is a bug here: the generation is bumped instead)
        changed = [n for n, b in bodies.items() if self._differs(n, have[n], content_digest(b), generation)]
        if len(changed) > 1 and not membership:  # content changes in several slices: never shown mixed
            return None
        order = write_order(held, bodies, changed) if len(changed) > 1 else changed
        if order is None:
            return None
        for name in order:
            self._replace(name, bodies[name])
        if order:
            log.info("published pool %s generation %s in place: %d slices rewritten", self.pool_name, generation,
                     len(order))
        return SyncResult(updated=len(order), generation=generation)

    def _create(self, name: str, body: dict) -> None:
        def attempt() -> bool:
            try:
                self._written(name, body, raw(self.api.create_resource_slice, body, _request_timeout=self.timeout))
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
        def attempt() -> None:
            current = self.api.read_resource_slice(name, _request_timeout=self.timeout)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                self._written(name, body, raw(self.api.replace_resource_slice, name, body,
                                              _request_timeout=self.timeout))
            finally:
                body["metadata"].pop("resourceVersion", None)

        if not missing_ok(self._retry, f"replace resourceslice {name}", attempt):  # deleted meanwhile
            self._retry(f"create resourceslice {name}", lambda: self._written(
                name, body, raw(self.api.create_resource_slice, body, _request_timeout=self.timeout)), idempotent=False)

    def _delete(self, name: str) -> None:
        missing_ok(self._retry, f"delete resourceslice {name}",
                   lambda: self.api.delete_resource_slice(name, _request_timeout=self.timeout))
        self.mirror.forget(name)
        self._sent.pop(name, None)

    def delete_all(self) -> int:
        have = self.existing(all_pools=True)
        for name in have:
            self._delete(name)
        return len(have)

    def close(self) -> None:
        """Stop the watch (the daemon's shutdown)."""
        self.mirror.stop()
