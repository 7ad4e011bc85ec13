"""Keep this node's ResourceSlices equal to the pool, with the fewest API writes.

* Nothing changed: no write at all (the comparison is on the slices' specs).
* Same number of slices and one slice changed: only that slice is replaced, in place, at
  the same pool generation (one write is atomic, so the pool is old or new, never mixed).
* Slice count changed, or several slices changed: the generation is bumped and every slice
  rewritten; slices that no longer belong (this driver and node, including other pools)
  are deleted last. The scheduler ignores the older generation and
  treats the new one as incomplete until ``resourceSliceCount`` slices of it are visible,
  so two generations are never read as one pool.
Conflicts (409) re-read and retry; 429/5xx and connection errors back off and retry.
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


class SyncResult(BaseModel):
    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


def server_version(api_client) -> tuple[int, int]:
    """(major, minor) from the API server's /version (``minor`` may carry a ``+``)."""
    from kubernetes import client

    info = client.VersionApi(api_client).get_code()
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
    def __init__(self, api_client, *, driver: str, node_name: str, pool_name: str | None = None,
                 version: tuple[int, int] | None = None, retries: int = 5, backoff: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep):
        from kubernetes import client

        self.api_client = api_client
        self.api = client.ResourceV1Api(api_client)
        self.driver = driver
        self.node_name = node_name
        self.pool_name = pool_name or node_name
        self._version = version
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep

    @property
    def version(self) -> tuple[int, int]:
        if self._version is None:
            self._version = self._retry(lambda: server_version(self.api_client))
        return self._version

    def _retry(self, fn: Callable[[], Any]) -> Any:
        from urllib3.exceptions import HTTPError as TransportError  # connection refused/reset, timeouts

        for attempt in range(self.retries + 1):
            try:
                return fn()
            except api_exception() as exc:
                if exc.status not in RETRYABLE or attempt == self.retries:
                    raise
                log.info("API answered %s, retrying", exc.status)
            except (ConnectionError, OSError, TransportError) as exc:
                if attempt == self.retries:
                    raise
                log.info("API unreachable (%s), retrying", exc)
            self.sleep(self.backoff * (2 ** attempt) * (1 + random.random() / 2))

    def existing(self, *, all_pools: bool = False) -> dict[str, dict]:
        """This driver's slices of this node: of our pool, or (``all_pools``) of any pool."""
        sel = f"spec.nodeName={self.node_name},spec.driver={self.driver}"
        resp = self._retry(lambda: self.api.list_resource_slice(field_selector=sel))
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
                self._retry(lambda s=s: self.api.create_resource_slice(s))
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

    def _replace(self, name: str, body: dict) -> None:
        def attempt():
            current = self.api.read_resource_slice(name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            try:
                return self.api.replace_resource_slice(name, body)
            finally:
                body["metadata"].pop("resourceVersion", None)

        if not missing_ok(self._retry, attempt):  # deleted meanwhile: create it again
            self._retry(lambda: self.api.create_resource_slice(body))

    def _delete(self, name: str) -> None:
        missing_ok(self._retry, lambda: self.api.delete_resource_slice(name))

    def delete_all(self) -> int:
        have = self.existing(all_pools=True)
        for name in have:
            self._delete(name)
        return len(have)
