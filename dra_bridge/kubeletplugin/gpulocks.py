"""One lock per GPU, so prepares of claims on different GPUs run at once (#37.2).

A claim's prepare or unprepare reads and changes only its GPUs (their VFs, vGPUs, GPU instances,
driver bindings), so it holds only their locks: one GPU's slow operation (a vGPU's creation, a
MIG mode switch, a rebind) does not stall a prepare on another GPU. Every decision that could give
one device to two claims is taken per GPU (the same device, a whole GPU against a vGPU on it, a VF
another claim's vGPU sits on), so it is taken under that GPU's lock, over the records of the
claims on it. Two claims of one namespace and name share their metadata file: they are serialised
by a key of their own. Keys are taken in sorted order, so two claims never wait for each other.
The node lock (:mod:`mdev_manager.host.lock`) is held shared around all of it: a hand-run
``vgpuctl apply`` or the agent's layout reconcile waits for every prepare in flight, and they for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class GpuLocks:
    """Locks by key (a GPU's PCI address, or ``claim:<namespace>/<name>``); :meth:`hold` takes several."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._held = threading.local()

    def _lock(self, key: str) -> threading.Lock:
        with self._mutex:
            return self._locks.setdefault(key, threading.Lock())

    @contextmanager
    def hold(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold every lock of ``keys`` (those this thread holds already are not taken again)."""
        mine: set[str] = getattr(self._held, "keys", set())
        todo = sorted(set(keys) - mine)
        taken: list[threading.Lock] = []
        try:
            for key in todo:
                lock = self._lock(key)
                lock.acquire()
                taken.append(lock)
            self._held.keys = mine | set(todo)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()
            self._held.keys = mine

    def holds(self, key: str) -> bool:
        """This thread holds ``key`` (a check before a GPU is changed)."""
        return key in getattr(self._held, "keys", set())
