"""The prepared claims the driver holds: their records in memory and the checkpoint on disk.

The driver changes a record under its claim's GPU locks (:mod:`.gpulocks`); this keeps the map
itself consistent across the gRPC threads (:attr:`PreparedClaims.lock`) and the file in step with
it (:meth:`PreparedClaims.save`, a group commit). A checkpoint that cannot be trusted is moved
aside and rebuilt from the node and the API server (:func:`load_or_rebuild`, :mod:`.recovery`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import recovery, refcheck
from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore, Serializer
from dra_bridge.kubeletplugin.claimsource import ClaimSource
from dra_bridge.kubeletplugin.state import Checkpoint, ClaimRecord
from dra_bridge.pool.devices import Pool
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Usage

log = logging.getLogger(__name__)


class PreparedClaims:
    """Each claim's record by uid, and the checkpoint file that holds them."""

    def __init__(self, store: CheckpointStore, cp: Checkpoint):
        self.store = store
        self.cp = cp
        self.lock = threading.RLock()  # the checkpoint in memory: each change, and each read of all records
        self._save_lock = threading.Lock()  # saves in order: the file always ends as the latest snapshot
        self._changes = 0  # each save's change number (under lock); the file holds those up to _saved
        self._saved = 0
        self.writes = 0  # checkpoint files written (tests count them)
        self._serialize = Serializer()  # (under lock) unchanged records are not dumped again

    def get(self, uid: str) -> ClaimRecord | None:
        return self.cp.claims.get(uid)

    def all(self) -> list[ClaimRecord]:
        """Every claim's record now (a copy of the list: other GPUs' prepares change it meanwhile)."""
        with self.lock:
            return list(self.cp.claims.values())

    def put(self, rec: ClaimRecord) -> None:
        with self.lock:
            self.cp.claims[rec.uid] = rec

    def drop(self, uid: str) -> None:
        with self.lock:
            del self.cp.claims[uid]

    def save(self) -> None:
        """The records as they are now, on disk (fsync) before this returns.

        Group commit: each save numbers its change under the lock of the records, then waits for the
        file. A writer snapshots every change made so far (under that lock) and writes it outside it,
        so the calls of other GPUs' prepares that queued behind one write are all covered by the next
        one: a storm of prepares writes the file once per batch, not once per change, and no call
        returns before a write holding its change completed (a failed write covers no one)."""
        with self.lock:
            self._changes += 1
            mine = self._changes
        with self._save_lock:
            if self._saved >= mine:  # a write that began after this change holds it
                return
            with self.lock:
                text, upto = self._serialize(self.cp), self._changes
            self.store.write(text)
            self._saved = upto
            self.writes += 1

    def gpus_of(self, uid: str) -> set[str]:
        rec = self.cp.claims.get(uid)
        return {d.gpu for d in rec.devices} if rec else set()

    def recorded_vfs(self, uid: str) -> set[str]:
        """The VFs other claims' records name as their vGPUs' parents, whatever their boot: a claim
        prepared before a reboot gets its own VF back whichever claim the kubelet retries first (a
        PF that parents many mdevs is no one's)."""
        return {d.parent for other in self.all() if other.uid != uid
                for d in other.devices if d.kind == "vgpu" and d.parent and d.parent != d.gpu}

    def held_elsewhere(self, uid: str, boot: str | None) -> set[str]:
        """vGPU ids and GPUs that another claim of this boot (or of unknown boot) holds."""
        return {d.vgpu_id or d.gpu for other in self.all()
                if other.uid != uid and refcheck.may_be_live(other, boot) for d in other.devices}

    def usage(self) -> Usage:
        """Devices held by prepared claims count as in use for the node manager."""
        with self.lock:
            return self.cp.usage()


def load_or_rebuild(store: CheckpointStore, *, paths: NodePaths, env: HostEnv, io: HostIO, claims: ClaimSource,
                    pool_name: str, pool: Callable[[], Pool], boot_id: Callable[[], str | None]) -> Checkpoint:
    """The checkpoint on disk, or where it cannot be trusted the one rebuilt from the node."""
    try:
        return store.load()
    except CheckpointCorrupt as exc:
        return _rebuild(store, str(exc), paths=paths, env=env, io=io, claims=claims, pool_name=pool_name,
                        pool=pool, boot_id=boot_id)


def _rebuild(store: CheckpointStore, why: str, *, paths: NodePaths, env: HostEnv, io: HostIO, claims: ClaimSource,
             pool_name: str, pool: Callable[[], Pool], boot_id: Callable[[], str | None]) -> Checkpoint:
    """Move the untrusted file aside, rebuild from the node and the API server's claims allocated
    here (:mod:`.recovery`), save; one log line says what happened and what came from the API."""
    try:
        kept = f"kept as {store.quarantine()}"
    except OSError as exc:
        kept = f"could not be moved aside ({exc.strerror or exc})"
    try:
        published = pool()  # empty while the daemon starts: device names then tell the GPU
    except Exception:  # noqa: BLE001 - the pool is a hint; the rebuild goes on without it
        published = None
    obs = recovery.observe(paths, env, io, claims, pool_name)
    out = recovery.rebuild(obs, driver=paths.driver, pool=pool_name, boot_id=boot_id(),
                           published=published if published is not None and published.devices else None)
    cp = Checkpoint(claims=out.claims)
    try:
        store.save(cp)
        saved = ""
    except OSError as exc:
        saved = f"; the rebuilt checkpoint is not saved ({exc.strerror or exc})"
    found = ", ".join(f"{refcheck.who(r)} ({refcheck.n(len(r.devices), 'device')}{refcheck.rebuilt_how(r)})"
                      for r in out.claims.values()) or "none"
    if obs.api is None:
        sources = f"the CDI specs, metadata files and devices on the node (not the API server: {obs.api_error})"
    else:
        sources = (f"the CDI specs, metadata files, devices on the node and the API server's {len(obs.api)} "
                   "claims allocated here")
    api = f"; from the API server: {'; '.join(out.from_api)}" if out.from_api else ""
    waiting = (f"; allocated here but not prepared (the kubelet prepares them): {', '.join(out.not_prepared)}"
               if out.not_prepared else "")
    left = f"; left out: {'; '.join(out.skipped)}" if out.skipped else ""
    log.warning("checkpoint %s cannot be trusted (%s), %s; recovered %d prepared claims from %s: %s%s%s%s%s",
                paths.checkpoint, why, kept, len(out.claims), sources, found, api, waiting, left, saved)
    return cp
