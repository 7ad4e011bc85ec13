"""The agent's side of ``vgpuctl cordon``: read the node's cordon annotation, publish accordingly.

The annotation comes from a watch of the agent's own Node (:class:`~dra_bridge.apiclient.nodewatch.NodeWatch`),
so a cordon wakes the agent at once and an idle resync still makes no request. What is published
for it is the pure :func:`~dra_bridge.pool.cordon.cordoned_pool`: taints where the server keeps
them, else the GPU's free devices withdrawn; held devices stay either way. A value that does not
parse keeps the last good one (logged): a typo must not put a GPU back into service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from dra_bridge.api.compat import KeptFields
from dra_bridge.api.names import ANNOTATION_CORDON, ANNOTATION_CORDON_APPLIED
from dra_bridge.apiclient.errors import brief, report_level
from dra_bridge.apiclient.nodes import set_node_annotation
from dra_bridge.pool.cordon import Cordon, cordoned_pool, parse_cordon
from dra_bridge.pool.model import Pool

if TYPE_CHECKING:  # the watch and the publisher load the Kubernetes client: only where they run
    from dra_bridge.apiclient.nodewatch import NodeWatch
    from dra_bridge.apiclient.publisher import Publisher, SyncResult

log = logging.getLogger(__name__)


class NodeCordon:
    """The cordon in force on this node, and what publishing it means for a pool."""

    def __init__(self, api_client: Any, node: str, wake: Callable[[], None]) -> None:
        self.api_client = api_client
        self.node = node
        self.wake = wake
        self._watch: NodeWatch | None = None
        self._text: str | None = None
        self._cordon: Cordon = {}
        self._said: str | None = None
        self._acked: str | None = None  # the cordon.applied annotation as it is on the node

    def _annotation(self) -> str | None:
        if self.api_client is None:
            return None
        if self._watch is None:
            from dra_bridge.apiclient.nodewatch import NodeWatch

            self._watch = NodeWatch(self.api_client, self.node, on_change=self._changed)
        annotations = self._watch.annotations()
        self._acked = annotations.get(ANNOTATION_CORDON_APPLIED)
        return annotations.get(ANNOTATION_CORDON)

    def _changed(self) -> None:
        """A node event: wake the agent only when the cordon itself changed (its own patches are events too)."""
        watch = self._watch
        if watch is None:
            return
        try:
            text = (watch.snapshot().get(self.node) or {}).get("annotations", {}).get(ANNOTATION_CORDON)
        except Exception:  # noqa: BLE001 - a lost watch: the next resync reads again
            text = self._text
        if text != self._text or not watch.synced:
            self.wake()

    def key(self) -> str | None:
        """The annotation as it is now: part of what a resync depends on."""
        try:
            text = self._annotation()
        except Exception as exc:  # noqa: BLE001 - no answer: keep publishing what the last read said
            log.info("could not read node %s for its cordon (%s); keeping the last one", self.node, brief(exc))
            return self._text
        if text != self._text:
            try:
                self._cordon = parse_cordon(text)
            except ValueError as exc:
                log.error("node %s: %s; keeping the cordon read before", self.node, exc)
            self._text = text
        return self._text

    def current(self) -> Cordon:
        self.key()
        return dict(self._cordon)

    def published(self, pool: Pool, kept: KeptFields, in_use: Iterable[str]) -> Pool:
        """``pool`` as the cordon wants it published (taints only where the server is known to keep them)."""
        cordon = self.current()
        out, effect = cordoned_pool(pool, cordon, taints=kept.taints is True, in_use=in_use)
        said = effect.describe()
        if said != self._said:
            log.info("cordon on node %s: %s", self.node, said)
            self._said = said
        return out

    def publish(self, publisher: Publisher, pool: Pool, kept: KeptFields, in_use: Iterable[str]) -> SyncResult:
        """Publish ``pool`` as the cordon wants it, then say so on the node (``cordon.applied``: the
        cordon text acted on), once per change, so ``vgpuctl cordon`` knows when it took effect."""
        result = publisher.sync(self.published(pool, kept, in_use))
        if self.api_client is not None and self._acked != self._text:
            try:
                set_node_annotation(self.api_client, self.node, ANNOTATION_CORDON_APPLIED, self._text)
                self._acked = self._text
            except Exception as exc:  # noqa: BLE001 - a report: the publish stands; cordon waits and says so
                log.log(report_level(exc), "could not annotate node %s with %s (%s)", self.node,
                        ANNOTATION_CORDON_APPLIED, brief(exc))
        return result

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
