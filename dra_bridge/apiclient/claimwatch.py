"""Every ResourceClaim, kept current by one watch: what the agent's binding conditions look at.

The agent must answer each allocation waiting on its binding conditions within the scheduler's
wait (its PreBind polls every 5 s, for up to 10 minutes: kube-scheduler's dynamicresources plugin,
``BindingTimeout``), on every node, so polling with a LIST would cost the API server one
cluster-wide LIST per node per second. As an informer does, one LIST primes the cache and a watch
from its ``resourceVersion`` applies every change (the machinery of the publisher's slice mirror,
:class:`~dra_bridge.apiclient.slicemirror.WatchMirror`); :meth:`ClaimCache.wait` returns at the next
change. A watch that ends is resumed; one that fails or expires (410 Gone) marks the cache unsynced
and the next round LISTs again. kube-apiserver has no field selector on a claim's allocation, so
the filter to this node's pool is the caller's (:func:`dra_bridge.agent.binder.decide`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from kubernetes import client

from dra_bridge.apiclient import resource
from dra_bridge.apiclient.claims import list_all_claims
from dra_bridge.apiclient.objects import watch_events
from dra_bridge.apiclient.slicemirror import WatchMirror

if TYPE_CHECKING:
    from urllib3 import BaseHTTPResponse

WATCH_SECONDS = 300


class ClaimCache(WatchMirror):
    """(namespace, name) -> the claim as the server holds it."""

    what = "resourceclaim"

    def __init__(self, api_client: client.ApiClient, *, timeout: float = 10.0) -> None:
        self.api = resource.ResourceV1Api(api_client)
        self.timeout = timeout
        super().__init__(lambda: list_all_claims(self.api, self.timeout), self._watch_claims)

    def _key(self, obj: dict) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace", ""), meta.get("name", "")

    def claims(self) -> list[dict]:
        return list(self.snapshot().values())

    def wait(self, timeout: float) -> bool:
        """Until a claim changes (True) or ``timeout`` seconds pass (False)."""
        hit = self.changed.wait(timeout)
        self.changed.clear()
        return hit

    def _watch_claims(self, version: str | None) -> Iterator[dict[str, Any]]:
        """Raw watch events of every claim from ``version`` (one request, until the server's timeout)."""
        resp = self.api.list_resource_claim_for_all_namespaces(
            watch=True, resource_version=version, allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
            _preload_content=False, _request_timeout=(self.timeout, WATCH_SECONDS + 30))
        yield from watch_events(cast("BaseHTTPResponse", resp))  # unparsed: the client's annotation names the model
