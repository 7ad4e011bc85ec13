"""Every ResourceClaim, kept current by one watch: what the agent's binding conditions look at.

The agent must answer each allocation waiting on its binding conditions within the scheduler's
wait (its PreBind polls every 5 s, for up to 10 minutes: kube-scheduler's dynamicresources plugin,
``BindingTimeout``), on every node, so polling with a LIST would cost the API server one
cluster-wide LIST per node per second. As an informer does, one LIST primes the cache and a watch
from its ``resourceVersion`` applies every change; :meth:`ClaimCache.wait` returns at the next
change. A watch that ends is resumed; one that fails or expires (410 Gone) marks the cache unsynced
and the next round LISTs again. kube-apiserver has no field selector on a claim's allocation, so
the filter to this node's pool is the caller's (:func:`dra_bridge.agent.binder.decide`).
"""

from __future__ import annotations

import json
import logging
import threading

from dra_bridge.kube.objects import raw

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
LIST_PAGE = 500


class ClaimCache:
    def __init__(self, api_client, *, timeout: float = 10.0):
        from kubernetes import client

        self.api = client.ResourceV1Api(api_client)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, str], dict] = {}
        self._version: str | None = None
        self._synced = False
        self._epoch = 0
        self._changed = threading.Event()
        self._stop = threading.Event()
        self.lists = 0

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def claims(self) -> list[dict]:
        with self._lock:
            return list(self._claims.values())

    def list_and_watch(self) -> None:
        items: dict[tuple[str, str], dict] = {}
        token, version = None, None
        while True:
            kw = {"limit": LIST_PAGE, "_request_timeout": self.timeout}
            if token:
                kw["_continue"] = token
            page = raw(self.api.list_resource_claim_for_all_namespaces, **kw)
            for c in page.get("items") or []:
                items[(c["metadata"].get("namespace", ""), c["metadata"]["name"])] = c
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        self.lists += 1
        with self._lock:
            self._claims, self._version, self._synced = items, version, True
            self._epoch += 1
            epoch = self._epoch
        threading.Thread(target=self._run, args=(epoch,), name="claim-watch", daemon=True).start()

    def wait(self, timeout: float) -> bool:
        """Until a claim changes (True) or ``timeout`` seconds pass (False)."""
        hit = self._changed.wait(timeout)
        self._changed.clear()
        return hit

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        with self._lock:
            self._synced = False
            self._epoch += 1

    def _lost(self, epoch: int, why: str) -> None:
        with self._lock:
            if epoch == self._epoch:
                self._synced = False
        self._changed.set()
        log.info("resourceclaim watch lost (%s); listing again", why)

    def _run(self, epoch: int) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self._stop.is_set():
            with self._lock:
                if epoch != self._epoch:
                    return
                version = self._version
            try:
                resp = self.api.list_resource_claim_for_all_namespaces(
                    watch=True, resource_version=version, allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
                    _preload_content=False, _request_timeout=(self.timeout, WATCH_SECONDS + 30))
                try:
                    for line in iter_resp_lines(resp):
                        if not line:
                            continue
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            self._lost(epoch, f"server error {obj.get('code')}: {obj.get('message')}")
                            return
                        meta = obj.get("metadata") or {}
                        with self._lock:
                            if epoch != self._epoch:
                                return
                            self._version = meta.get("resourceVersion") or self._version
                            if kind == "BOOKMARK":
                                continue
                            key = (meta.get("namespace", ""), meta.get("name", ""))
                            if kind == "DELETED":
                                self._claims.pop(key, None)
                            else:
                                self._claims[key] = obj
                        self._changed.set()
                finally:
                    resp.close()
                    resp.release_conn()
            except Exception as exc:  # noqa: BLE001 - any failure: list again
                self._lost(epoch, "expired (410 Gone)" if getattr(exc, "status", None) == 410 else repr(exc))
                return
