"""The agent's own Node, kept current by one watch: its annotations (the cordon) at no cost at rest.

A cordon (``vgpuctl cordon``) is a node annotation the agent must act on at once, yet an idle
resync makes no API request (issue #15). So, as an informer would, one LIST of the node (field
selector ``metadata.name``) primes the mirror and a watch keeps it current; ``on_change`` hears of
every change the watch applies, and of a lost watch (the next read LISTs again). Under the
DaemonSet's ``nodes: list, watch`` (a field selector does not narrow RBAC).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dra_bridge.apiclient.core import CoreV1Api
from dra_bridge.apiclient.objects import raw, watch_events
from dra_bridge.apiclient.slicemirror import WatchMirror

WATCH_SECONDS = 300


class NodeWatch(WatchMirror):
    """name -> {"labels", "annotations", "resourceVersion"} of the one node."""

    what = "node"

    def __init__(self, api_client: Any, node: str, *, on_change: Callable[[], None] | None = None,
                 timeout: float = 10.0) -> None:
        self.api = CoreV1Api(api_client)
        self.node = node
        self.timeout = timeout
        self.on_change = on_change or (lambda: None)
        self._selector = f"metadata.name={node}"
        super().__init__(lambda: raw(self.api.list_node, field_selector=self._selector,
                                     _request_timeout=self.timeout), self._watch_node)

    def _entry(self, obj: dict) -> dict:
        meta = obj.get("metadata") or {}
        return {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {}),
                "resourceVersion": meta.get("resourceVersion")}

    def _entry_version(self, entry: dict) -> str | None:
        return entry.get("resourceVersion")

    def _apply(self, kind: str, obj: dict, *, from_watch: bool = True) -> None:
        super()._apply(kind, obj, from_watch=from_watch)
        if from_watch and kind != "BOOKMARK":
            self.on_change()

    def _lost(self, epoch: int, why: str) -> None:
        super()._lost(epoch, why)
        self.on_change()

    def annotations(self) -> dict[str, str]:
        """The node's annotations (LIST first when the watch is not running)."""
        if not self.synced:
            self.list_and_watch()
        return dict((self.snapshot().get(self.node) or {}).get("annotations") or {})

    def _watch_node(self, version: str | None) -> Iterator[dict[str, Any]]:
        yield from watch_events(self.api.list_node(
            watch=True, field_selector=self._selector, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False, _request_timeout=(self.timeout, WATCH_SECONDS + 30)))
