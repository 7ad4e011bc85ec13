"""What the API server holds of this node's ResourceSlices, kept current by one watch.

Upstream's slice controller (k8s.io/dynamic-resource-allocation/resourceslice, ``controller.go``)
keeps an informer on the driver's slices of its node and compares against that cache, so an idle
resync makes no request at all. :class:`SliceMirror` does the same with the official client's
``Watch``: one LIST primes it (``list_and_watch``), a background watch from that
``resourceVersion`` applies every ADDED / MODIFIED / DELETED event (bookmarks only move the
version), and the publisher records its own writes from their answers, so a resync made before the
watch echoes a write does not see stale state. A watch that ends is resumed from the last version;
one the server expired (410 Gone) or that fails marks the mirror unsynced, and the next resync
LISTs again — the only LIST after the first. Objects are kept as a digest of what the publisher
compares (spec without the generation, labels) plus generation, pool and resourceVersion: the
publisher never holds the server's full objects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dra_bridge.pool.keep import Held

log = logging.getLogger(__name__)


def _strip(obj: Any) -> Any:
    """Drop empty values so specs compare equal however the server echoes them."""
    if isinstance(obj, dict):
        out = {k: _strip(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def content_digest(obj: dict) -> str:
    """sha256 of a slice's spec without the pool generation, and of its labels: what a generation
    bump does not change. Computed once per built slice and once per object the server sends."""
    spec = dict(_strip(obj.get("spec") or {}))
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    labels = (obj.get("metadata") or {}).get("labels") or {}
    text = json.dumps({"spec": spec, "labels": labels}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Known:
    """One slice as the server holds it (``held``: what it holds, by name, for in-place changes)."""

    digest: str
    generation: int
    pool: str | None
    resource_version: str | None
    held: Held = field(default_factory=Held, compare=False)

    @classmethod
    def of(cls, obj: dict) -> Known:
        spec_pool = (obj.get("spec") or {}).get("pool") or {}
        return cls(content_digest(obj), int(spec_pool.get("generation") or 0), spec_pool.get("name"),
                   (obj.get("metadata") or {}).get("resourceVersion"), Held.of(obj))


def _older(a: str | None, b: str | None) -> bool:
    """Whether resourceVersion ``a`` is older than ``b``. Versions are opaque to clients, but every
    server (etcd revisions, our local one) issues increasing integers; anything else is never older."""
    try:
        return a is not None and b is not None and int(a) < int(b)
    except ValueError:
        return False


class WatchMirror:
    """Objects as the server holds them, primed by one LIST and kept current by a watch.

    ``list_raw()`` returns the LIST answer as plain JSON; ``watch_raw(resource_version)`` yields
    raw watch events (``{"type", "object"}``) and may end (the server's timeout) or raise; an
    exception with ``status == 410`` means the version expired. Both are the kube layer's calls.
    Subclasses say what an object is kept as (:meth:`_key`, :meth:`_entry`, :meth:`_entry_version`);
    :attr:`changed` is set at every change the watch applies, and when the watch is lost.
    """

    what = "object"  # for the log

    def __init__(self, list_raw: Callable[[], dict], watch_raw: Callable[[str | None], Any]):
        self._list_raw = list_raw
        self._watch_raw = watch_raw
        self._lock = threading.Lock()
        self._known: dict[Any, Any] = {}
        self._synced = False
        self._version: str | None = None
        self._epoch = 0  # bumped by every LIST: a watch of an older epoch stops
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.changed = threading.Event()
        self.lists = 0  # LISTs made (for metrics and tests)

    def _key(self, obj: dict) -> Any:
        return (obj.get("metadata") or {}).get("name")

    def _entry(self, obj: dict) -> Any:
        return obj

    def _entry_version(self, entry: Any) -> str | None:
        return (entry.get("metadata") or {}).get("resourceVersion")

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._known)

    def list_and_watch(self) -> dict:
        """LIST (the first time, and whenever the watch was lost), then keep current by watching."""
        answer = self._list_raw()
        self.lists += 1
        known = {self._key(o): self._entry(o) for o in answer.get("items") or []}
        with self._lock:
            self._known, self._synced = known, True
            self._version = (answer.get("metadata") or {}).get("resourceVersion")
            self._epoch += 1
            epoch = self._epoch
        if self._version is not None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, args=(epoch,), name=f"{self.what}-watch", daemon=True)
            self._thread.start()
        return dict(known)

    def stop(self) -> None:
        self._stop.set()
        self.changed.set()
        with self._lock:
            self._synced = False
            self._epoch += 1

    # ------------------------------------------------------------------ the watch
    def _apply(self, kind: str, obj: dict, *, from_watch: bool = True) -> None:
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        with self._lock:
            if from_watch and version is not None and not _older(version, self._version):
                self._version = version
            if kind == "BOOKMARK" or meta.get("name") is None:
                return
            key = self._key(obj)
            old = self._known.get(key)
            if old is not None and _older(version, self._entry_version(old)):
                return  # an event older than what a write of ours already told us
            if kind == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = self._entry(obj)
        if from_watch:
            self.changed.set()

    def _lost(self, epoch: int, why: str) -> None:
        with self._lock:
            if epoch == self._epoch:
                self._synced = False
        self.changed.set()
        log.info("%s watch lost (%s); the next round lists again", self.what, why)

    def _run(self, epoch: int) -> None:
        while not self._stop.is_set():
            with self._lock:
                if epoch != self._epoch:
                    return
                version = self._version
            try:
                for event in self._watch_raw(version):
                    with self._lock:
                        if epoch != self._epoch:
                            return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        self._lost(epoch, f"server error {obj.get('code')}: {obj.get('message')}")
                        return
                    self._apply(kind, obj)
                    del event, obj  # not held while the watch waits (a slice is ~0.3 MB as dicts: #37)
            except Exception as exc:  # noqa: BLE001 - any failure: fall back to a LIST at the next round
                self._lost(epoch, "expired (410 Gone)" if getattr(exc, "status", None) == 410 else repr(exc))
                return
            if self._stop.wait(0):
                return


class SliceMirror(WatchMirror):
    """This driver's slices on this node as the server holds them: name -> :class:`Known`."""

    what = "resourceslice"

    def _entry(self, obj: dict) -> Known:
        return Known.of(obj)

    def _entry_version(self, entry: Known) -> str | None:
        return entry.resource_version

    def record(self, obj: dict) -> None:
        """A slice we wrote, as the server answered it (the watch resumes from its own version, so
        it still sees every other change made before this write)."""
        self._apply("MODIFIED", obj, from_watch=False)

    def forget(self, name: str) -> None:
        """A slice we deleted."""
        with self._lock:
            self._known.pop(name, None)
