"""How the simulated host orders its writers: the node lock, one lock per GPU, and its state file.

The host's state is one JSON file (``.sim/state.json``) beside its tree; every writer, in any thread
or process (the FUSE daemon, a CLI beside it, the kernel's own process: :mod:`.kproc`), reads it under
a lock and writes it back before letting go. Whole-host writes (binding, SR-IOV, NVML's mode changes,
a reboot) hold the node lock (``.sim/lock``) exclusively. One GPU's writes hold it shared and that
GPU's lock (``.sim/lock.<pf>``), as the kernel orders an mdev's create per parent, not node-wide
(:meth:`HostLocks._gpu_locked` cites mdev_core.c); what the whole host shares (a UUID's uniqueness,
IOMMU group and vfio cdev numbers, the state file itself) is taken in a short section
(``.sim/lock.list``). :class:`~.tree.SysfsTree` inherits this.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class HostLocks:
    """The locks and the state file of a simulated host rooted at ``root``."""

    root: Path
    sys: Path
    _lock: threading.RLock
    _tls: threading.local
    _state: dict[str, Any]

    @property
    def state(self) -> dict[str, Any]:
        """The host's state: the copy a GPU write on this thread works on (:meth:`_gpu_locked`), else the
        one the node lock last read (what readers without a lock see)."""
        mine = getattr(self._tls, "state", None)
        return self._state if mine is None else mine

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        if getattr(self._tls, "state", None) is not None:
            self._tls.state = value
        else:
            self._state = value

    def _save(self) -> None:
        if getattr(self._tls, "gpu", None) is not None:
            return  # a GPU write saves its GPU into the file as it leaves (:meth:`_gpu_locked`)
        self._dump(self.state)

    def _dump(self, state: dict[str, Any]) -> None:
        tmp = self.root / ".sim/state.json.tmp"  # every writer of the file holds the node lock or the list lock
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.root / ".sim/state.json")

    def _load(self) -> dict[str, Any]:
        return json.loads((self.root / ".sim/state.json").read_text())

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The node lock: one writer on the whole host at a time, across threads (FUSE) and processes
        (CLI beside a mount); it waits for every GPU write in progress (:meth:`_gpu_locked`)."""
        if getattr(self._tls, "gpu", None) is not None:  # a GPU write asks the node (NVML): it has its GPU
            yield
            return
        with self._lock:
            with self._entered(fcntl.LOCK_EX):
                self._tls.depth = getattr(self._tls, "depth", 0) + 1
                try:
                    self._state = self._load()
                    yield
                finally:
                    self._tls.depth -= 1

    @contextmanager
    def _entered(self, mode: int) -> Iterator[None]:
        """Hold the node lock in ``mode``, entered through a turnstile (``.sim/lock.gate``): a whole-host
        writer waiting for the GPU writes in flight keeps new ones from starting meanwhile, so a storm of
        them never starves it (a flock grants a shared request while an exclusive one waits)."""
        with open(self.root / ".sim/lock", "a") as lf:
            with self._flock("lock.gate", fcntl.LOCK_EX):
                fcntl.flock(lf, mode)
            try:
                yield
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    def _holds_node_lock(self) -> bool:
        return getattr(self._tls, "depth", 0) > 0

    @contextmanager
    def _flock(self, name: str, mode: int) -> Iterator[None]:
        with open(self.root / ".sim" / name, "a") as lf:
            fcntl.flock(lf, mode)
            try:
                yield
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    @contextmanager
    def _gpu_locked(self, pf: str) -> Iterator[None]:
        """A write that changes one GPU (an mdev's create or remove, a vendor-VFIO vGPU set or cleared):
        it holds that GPU's lock and the node lock shared, so writes to other GPUs proceed at once and
        whole-host writes (binding, SR-IOV, NVML's mode changes, a reboot) wait for it and it for them.

        The kernel takes no node-wide lock for an mdev's create: mdev_core.c's mdev_device_create holds the
        global ``mdev_list_lock`` only for the UUID's duplicate check (EEXIST) and the core's instance count,
        then creates the device under its parent's ``unreg_sem`` taken shared; the vendor driver orders the
        creates on one physical GPU (whose VFs share its capacity). Here: the duplicate check is a short
        node-wide section (:meth:`_claim_uuid`), and so are the counters shared by the host (IOMMU group and
        vfio cdev numbers, :meth:`_bump`); the rest runs under the GPU's lock.

        The write works on its own copy of the state (``state`` is per thread meanwhile) and, as it leaves,
        puts its GPU's record into the state file under the short node-wide section."""
        with self._entered(fcntl.LOCK_SH), self._flock(f"lock.{pf}", fcntl.LOCK_EX):
            self._tls.state = self._load()
            self._tls.gpu = pf
            try:
                yield
            finally:
                try:
                    with self._flock("lock.list", fcntl.LOCK_EX):
                        disk = self._load()
                        mine = next((g for g in self._tls.state["gpus"] if g["pf"] == pf), None)
                        disk["gpus"] = [mine if g["pf"] == pf and mine is not None else g for g in disk["gpus"]]
                        for key in ("next_group", "next_vfio"):
                            disk[key] = max(disk.get(key, 0), self._tls.state.get(key, 0))
                        self._dump(disk)
                        self._release_claims()
                        self._state = disk
                finally:
                    self._tls.state = self._tls.gpu = None

    @contextmanager
    def _gpu_read(self, pf: str) -> Iterator[None]:
        """A read of one GPU's state that changes nothing (NVML's queries): the node lock and that GPU's
        lock, both shared. A real NVML answers a query on one GPU while vGPUs are made on others; here it
        waits only for a write to this GPU (or to the whole host) in progress, never for other GPUs'.
        It reads its own copy of the state file, as their writes left it. A host that orders every
        write node-wide (mdevctl's udev rule) reads under the node lock as before; so does a thread
        already holding a lock (its own copy)."""
        if getattr(self._tls, "gpu", None) is not None or self._holds_node_lock() \
                or self._state.get("spec", {}).get("mdevctl_udev") \
                or not any(g.get("pf") == pf for g in self._state.get("gpus", [])):  # no such GPU: said under the lock
            with self._locked():
                yield
            return
        with self._entered(fcntl.LOCK_SH), self._flock(f"lock.{pf}", fcntl.LOCK_SH):
            self._tls.state = self._load()
            try:
                yield
            finally:
                self._tls.state = None

    def _bump(self, key: str) -> int:
        """The next number of a counter the whole host shares (an IOMMU group, a vfio cdev)."""
        if getattr(self._tls, "gpu", None) is None:
            n = self.state[key]
            self.state[key] = n + 1
            return n
        with self._flock("lock.list", fcntl.LOCK_EX):  # other GPUs' writes take numbers too
            disk = self._load()
            n = max(disk[key], self.state[key])
            disk[key] = self.state[key] = n + 1
            self._dump(disk)
            return n

    def _claim_uuid(self, uid: str) -> bool:
        """Claim ``uid`` for an mdev being created; False when it exists, or another write is creating it
        (the kernel's duplicate check under ``mdev_list_lock``). A GPU write's claim is let go as it
        saves, once the mdev is on the bus or its create failed; a crashed writer's claim lapses with it."""
        if getattr(self._tls, "gpu", None) is None:
            return not os.path.lexists(self.sys / "bus/mdev/devices" / uid)
        with self._flock("lock.list", fcntl.LOCK_EX):
            if os.path.lexists(self.sys / "bus/mdev/devices" / uid):
                return False
            claims = self.root / ".sim/creating"
            claims.mkdir(exist_ok=True)
            f = open(claims / uid, "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                return False
            self._tls.claims = [*getattr(self._tls, "claims", []), (claims / uid, f)]
            return True

    def _release_claims(self) -> None:
        """(Under the node-wide section.) Let go of this thread's UUID claims."""
        for path, f in getattr(self._tls, "claims", []):
            path.unlink(missing_ok=True)
            f.close()
        self._tls.claims = []
