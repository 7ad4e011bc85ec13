"""Binding conditions for vGPU sizes (KEP-5007): every size of an empty GPU without compatibility groups.

Where the API server keeps the shared counters and binding conditions but not compatibility
groups (1.36 by default, 1.37 with the groups' alpha gate off), an empty equal-size GPU offers
every vGPU size and each of its slots carries ``bindingConditions: [<driver>/SizeAssigned]`` and
``bindingFailureConditions: [<driver>/SizeConflict]``. The scheduler then waits in PreBind until
the agent has looked at the allocation: the first size allocated on a GPU becomes its size (the
GPU is republished with that size only, so retries do not pick another), allocations of that size
get ``SizeAssigned=True``, any other size ``SizeConflict=True``, which makes the scheduler drop
that allocation and try again. A conflicting mix therefore never reaches prepare.

:func:`decide` is pure: allocated claims, the pool, the sizes on the host (discovered, and held
by prepared claims) and the agent's own confirmations in, the condition per pending device and
each GPU's size out. :class:`SizeBinder` writes them (``resourceclaims/status``,
``status.devices[].conditions``) on the claim as it was decided from, remembers what it confirmed,
and the agent republishes. A confirmed allocation is never refused later, whatever a lagging watch
shows (#36.2); a resync recomputes the sizes with the host it discovered, so a GPU emptied is
offered whole at once, not at the next claim change (#36.3).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import SIZE_ASSIGNED, SIZE_CONFLICT
from dra_bridge.pool.model import Pool, PoolPolicy

if TYPE_CHECKING:  # the API side, named for its types only: this module decides, it does not call
    from dra_bridge.apiclient.claims import ApiClaimSource
    from dra_bridge.apiclient.claimwatch import ClaimCache
    from dra_bridge.kubeletplugin.state import ClaimRecord
    from mdev_manager.models import Inventory


@dataclass(frozen=True)
class Verdict:
    namespace: str
    claim: str
    device: str
    gpu: str
    ok: bool  # SizeAssigned (True) or SizeConflict (False)
    size_mib: int | None
    message: str
    uid: str = ""  # the claim's: what the agent remembers a confirmation by


def _size_mib(pool: Pool, device: str) -> tuple[str, int | None] | None:
    dev = pool.device(device)
    if dev is None or dev.kind != "vgpu":
        return None
    mem = dev.capacity.get("memory")
    return dev.gpu, (int(parse_quantity(mem) / Fraction(1 << 20)) if mem else None)


def _status(claim: dict, driver: str, pool_name: str, device: str) -> dict[str, str]:
    """condition type -> status of our entry for ``device`` in the claim's ``status.devices``."""
    for e in (claim.get("status") or {}).get("devices") or []:
        if (e.get("driver"), e.get("pool"), e.get("device")) == (driver, pool_name, device):
            return {c.get("type"): c.get("status") for c in e.get("conditions") or []}
    return {}


def _allocation_key(claim: dict) -> tuple[str, str, str, str]:
    """First come, first served: when the scheduler allocated (``allocationTimestamp``), then the
    claim's age and name, so every round orders the same allocations alike."""
    meta = claim.get("metadata") or {}
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return (alloc.get("allocationTimestamp") or "", meta.get("creationTimestamp") or "",
            meta.get("namespace") or "", meta.get("name") or "")


def decide(claims: list[dict], pool: Pool, host_sizes: dict[str, set[int]], *, driver: str,
           pool_name: str, confirmed: dict[tuple[str, str], tuple[str, int]] | None = None,
           prepared: dict[str, str] | None = None) -> tuple[list[Verdict], dict[str, int]]:
    """(verdicts for the allocations waiting on our binding conditions, each GPU's size).

    One decision per GPU over everything that holds it: the vGPUs on the host and the claims
    prepared there (``host_sizes``), the allocations this agent confirmed (``confirmed``: (claim
    uid, device) -> (GPU, MiB), remembered because the claims read may not show our write yet),
    those the claims read show confirmed or bound without conditions, and then the waiting ones,
    first come first (:func:`_allocation_key`). A GPU's size is the first of these; a waiting
    allocation of another size, on a GPU that holds two sizes, or of a device no longer published,
    is a conflict. A confirmed allocation is never decided again, so a verdict never flips.

    An allocation that would be confirmed while its device is still prepared for another claim
    (``prepared``: device -> claim uid, the kubelet plugin's checkpoint: a pod force-deleted before
    its unprepare, whose device the scheduler gave away) gets no verdict yet: confirmed now it
    would be refused at prepare, where the pod is stuck. Its size still holds the GPU; the round
    after that claim's unprepare confirms it (the scheduler waits up to its binding timeout)."""
    confirmed = confirmed or {}
    prepared = prepared or {}
    room = _Room(pool)
    assigned: dict[str, int] = {}
    mixed = {g for g, s in host_sizes.items() if len(s) > 1}  # not ours to settle: nothing more goes there
    for g, s in host_sizes.items():
        assigned[g] = min(s)
    waiting: list[tuple[tuple, str, str, str, str, int | None, str]] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            if r.get("driver") != driver or r.get("pool") != pool_name:
                continue
            device = r.get("device", "")
            known = confirmed.get((meta.get("uid") or "", device))
            if known is not None:
                assigned.setdefault(*known)
                room.take(device, held=True)
                continue
            sized = _size_mib(pool, device)
            state = _status(claim, driver, pool_name, device)
            # bound without conditions, or already confirmed: its size is the GPU's
            if not r.get("bindingConditions") or state.get(f"{driver}/{SIZE_ASSIGNED}") == "True":
                if sized and sized[1] is not None:
                    assigned.setdefault(sized[0], sized[1])
                room.take(device, held=True)
                continue
            if state.get(f"{driver}/{SIZE_CONFLICT}") == "True":
                continue  # the scheduler drops it
            gpu, size = sized if sized else ("", None)
            waiting.append((_allocation_key(claim), meta.get("namespace", ""), meta.get("name", ""), device, gpu,
                            size, meta.get("uid") or ""))
    live = _allocations(claims)
    for device, uid in sorted(prepared.items()):  # a force-deleted pod's claim, prepared still: its vGPU is there
        if (uid, device) not in live:
            room.take(device, held=True)
    verdicts = []
    for _, ns, name, device, gpu, size, uid in sorted(waiting):
        if not gpu:
            verdicts.append(Verdict(ns, name, device, gpu, False, None,
                                    f"device {device} is no longer offered on this node", uid))
            continue
        if gpu in mixed:
            verdicts.append(Verdict(ns, name, device, gpu, False, size,
                                    f"GPU {gpu} holds vGPUs of {len(host_sizes[gpu])} sizes; none is added", uid))
            continue
        have = assigned.setdefault(gpu, size) if size is not None else assigned.get(gpu)
        if size is not None and have == size:
            if prepared.get(device, uid) != uid:
                continue  # withheld: still prepared for another claim (whose room is counted)
            if not room.take(device):  # the pool as read now: vGPUs no claim holds, or claims before it
                verdicts.append(Verdict(ns, name, device, gpu, False, size,
                                        f"GPU {gpu} has no room left for {device} now", uid))
                continue
            verdicts.append(Verdict(ns, name, device, gpu, True, size, f"GPU {gpu} runs {size} MiB vGPUs", uid))
        else:
            verdicts.append(Verdict(ns, name, device, gpu, False, size,
                                    f"GPU {gpu} runs {have} MiB vGPUs (equal-size mode); {device} is {size} MiB", uid))
    return verdicts, assigned


class _Room:
    """What each counter set of the pool has left, as allocations are counted in: a verdict confirms an
    allocation only while the counters published *now* hold it with everything counted before it. The
    scheduler allocated from the slices it saw; vGPUs made since outside any claim take their room
    from the counters at the next read (:func:`dra_bridge.pool.policy.with_outside`), and a confirmed
    allocation must prepare (#36.2)."""

    def __init__(self, pool: Pool):
        self._devices = {d.name: d for d in pool.devices}
        self._left = {c.name: {k: parse_quantity(str(v)) for k, v in c.counters.items()} for c in pool.counter_sets}

    def take(self, device: str, *, held: bool = False) -> bool:
        """Count ``device`` in if it fits (True); ``held`` (an allocation confirmed or bound already):
        counted in whatever is left, so nothing after it fits where it does not. A device not in the
        pool counts as nothing."""
        dev = self._devices.get(device)
        uses = [(u.counter_set, k, parse_quantity(str(v))) for u in (dev.consumes if dev else ())
                for k, v in u.counters.items() if k in self._left.get(u.counter_set, {})]
        if not held and any(self._left[cs][k] < v for cs, k, v in uses):
            return False
        for cs, k, v in uses:
            self._left[cs][k] -= v
        return True


def with_assigned(policy: PoolPolicy, assigned: dict[str, int]) -> PoolPolicy:
    """``policy`` with each GPU of ``assigned`` offering its assigned size only."""
    gpus = dict(policy.gpus)
    for addr, mib in assigned.items():
        base = policy.for_gpu(addr)
        if base is None:
            continue
        gpus[addr.lower()] = base.model_copy(update={"equal_size_fb_mib": mib})
    return policy.model_copy(update={"gpus": gpus})


def status_entries(verdicts: list[Verdict], *, driver: str, pool_name: str, now: str) -> dict[tuple[str, str], list[dict]]:
    """(namespace, claim) -> our ``status.devices`` entries for its verdicts."""
    out: dict[tuple[str, str], list[dict]] = {}
    for v in verdicts:
        ok, bad = ("True", "False") if v.ok else ("False", "True")
        conditions = [
            {"type": f"{driver}/{SIZE_ASSIGNED}", "status": ok, "reason": "SizeConfirmed" if v.ok else "SizeTaken",
             "message": v.message, "lastTransitionTime": now},
            {"type": f"{driver}/{SIZE_CONFLICT}", "status": bad, "reason": "SizeTaken" if not v.ok else "SizeConfirmed",
             "message": v.message, "lastTransitionTime": now},
        ]
        out.setdefault((v.namespace, v.claim), []).append(
            {"driver": driver, "pool": pool_name, "device": v.device, "conditions": conditions})
    return out


def host_sizes(inventory: Inventory | None, prepared: Iterable[ClaimRecord] = ()) -> dict[str, set[int]]:
    """GPU -> framebuffer sizes (MiB) of the time-sliced vGPUs on it now: those the last discovery
    saw, and those the claims in the kubelet plugin's checkpoint (``prepared``: its records) hold,
    which are current where the discovery is not (a prepare since, a claim deleted before its
    unprepare)."""
    out: dict[str, set[int]] = {}
    fb_of: dict[str, dict[str, int]] = {}
    for g in inventory.gpus if inventory is not None else []:
        fb = {t.id: t.framebuffer_mib for t in g.types if not t.mig_backed and t.framebuffer_mib}
        fb_of[g.address] = fb
        sizes = {fb[v.type_id] for v in g.vgpus if fb.get(v.type_id)}
        if sizes:
            out[g.address] = sizes
    for rec in prepared:
        for d in rec.devices:
            mib = fb_of.get(d.gpu, {}).get(d.type_id or "")
            if d.kind == "vgpu" and mib and d.gi_profile is None:
                out.setdefault(d.gpu, set()).add(mib)
    return out


def prepared_devices(records: Iterable[ClaimRecord], pool_name: str) -> dict[str, str]:
    """Device -> the uid of the claim prepared with it, of this node's pool, from the kubelet
    plugin's checkpoint records (every state: a ``preparing`` record may have made its vGPU)."""
    return {d.device: rec.uid for rec in records for d in rec.devices if d.pool == pool_name}


class SizeBinder:
    """The agent's side of the binding conditions: decide, write the claims' device conditions, and
    remember each GPU's size for the next publish (:meth:`policy`).

    Rounds (:meth:`bind`, one thread) and resyncs (:meth:`observe_host`, another) share one lock,
    held across a round's writes, so each GPU's size is one decision at a time. A verdict is written
    with the resourceVersion of the claim it was decided from: a claim changed since (our own earlier
    verdict, the scheduler's deallocation) is left for the round its watch event brings, never
    overwritten. What was confirmed is remembered until the claims read no longer hold it."""

    def __init__(self, driver: str, pool_name: str):
        self.driver = driver
        self.pool_name = pool_name
        self.assigned: dict[str, int] = {}
        self.confirmed: dict[tuple[str, str], tuple[str, int]] = {}  # (claim uid, device) -> (GPU, MiB)
        self._allocated: list[dict] = []  # the claims the last round saw
        self.failed: Exception | None = None  # the last round's first failed write (the others were made)
        self._lock = threading.Lock()

    def policy(self, policy: PoolPolicy) -> PoolPolicy:
        with self._lock:
            return with_assigned(policy, self.assigned)

    def observe_host(self, pool: Pool, held: dict[str, set[int]]) -> bool:
        """A resync saw the host (``held``: :func:`host_sizes`): each GPU's size again over the claims
        the last round saw, so a GPU freed since is offered whole by this very resync rather than at
        the next claim change. Writes nothing. Returns whether a size changed."""
        with self._lock:
            _, assigned = decide(self._allocated, pool, held, driver=self.driver, pool_name=self.pool_name,
                                 confirmed=self.confirmed)
            changed = assigned != self.assigned
            self.assigned = assigned
            return changed

    def bind(self, claims: ApiClaimSource, pool: Pool, held: dict[str, set[int]],
             allocated: list[dict] | None = None, prepared: dict[str, str] | None = None,
             ) -> tuple[list[Verdict], bool]:
        """One round: (verdicts written, whether a GPU's size changed, so the pool must be republished).
        ``claims``: an :class:`~dra_bridge.apiclient.claims.ApiClaimSource` (the writes, and the LIST when
        ``allocated``, the claims a watch keeps, is not given); ``held``: :func:`host_sizes`;
        ``prepared``: :func:`prepared_devices` (an allocation of a device still prepared for another
        claim waits)."""
        import datetime

        if allocated is None:
            allocated = claims.allocated(self.driver, self.pool_name)
        ours = [c for c in allocated if any(r.get("driver") == self.driver and r.get("pool") == self.pool_name
                                            for r in _results(c))]
        with self._lock:
            live = _allocations(ours)
            self.confirmed = {k: v for k, v in self.confirmed.items() if k in live}
            self._allocated = ours
            verdicts, assigned = decide(ours, pool, held, driver=self.driver, pool_name=self.pool_name,
                                        confirmed=self.confirmed, prepared=prepared)
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            versions = {_name(c): (c.get("metadata") or {}).get("resourceVersion") for c in ours}
            by_claim: dict[tuple[str, str], list[Verdict]] = {}
            for v in verdicts:
                by_claim.setdefault((v.namespace, v.claim), []).append(v)
            written: list[Verdict] = []
            self.failed = None
            for key, entries in status_entries(verdicts, driver=self.driver, pool_name=self.pool_name,
                                               now=now).items():
                try:
                    if not claims.set_device_status(*key, entries, resource_version=versions.get(key)):
                        continue  # changed since it was read: its watch event brings another round
                except Exception as exc:  # noqa: BLE001 - the others are still answered; the caller raises it
                    self.failed = self.failed or exc
                    continue
                for v in by_claim[key]:
                    written.append(v)
                    if v.ok and v.size_mib is not None:
                        self.confirmed[(v.uid, v.device)] = (v.gpu, v.size_mib)
            changed = assigned != self.assigned
            self.assigned = assigned
        return written, changed


def _name(claim: dict) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def _allocations(claims: list[dict]) -> set[tuple[str, str]]:
    """(claim uid, device) of every allocation result of ``claims``."""
    return {((c.get("metadata") or {}).get("uid") or "", r.get("device", "")) for c in claims for r in _results(c)}


def _results(claim: dict) -> list[dict]:
    return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []


def bind_loop(cache: ClaimCache, *, active: Callable[[], bool], bind: Callable[[list[dict[str, Any]]], Any],
              stop: threading.Event, retry_seconds: float) -> None:
    """The agent's binding rounds: while ``active()``, one LIST, then each change of the watched
    claims (``cache``: a :class:`~dra_bridge.apiclient.claimwatch.ClaimCache`), or a minute without one,
    is a round of ``bind(claims)``; otherwise it looks again every ``retry_seconds``. A round that
    failed (a verdict not written, a republish that failed) is tried again after ``retry_seconds``,
    not at the next change: the scheduler is waiting for it."""
    import logging

    from dra_bridge.apiclient.errors import brief

    said = ""  # the last failure logged: the same one again each retry goes to debug
    try:
        while not stop.is_set():
            if not active():
                stop.wait(retry_seconds)
                continue
            try:
                if not cache.synced:
                    cache.list_and_watch()
                bind(cache.claims())
            except Exception as exc:  # noqa: BLE001 - the scheduler waits; the next round tries again
                line = brief(exc)
                logging.getLogger(__name__).log(logging.DEBUG if line == said else logging.WARNING,
                                                "binding conditions: %s", line)
                said = line
                stop.wait(retry_seconds)
                continue
            said = ""
            cache.wait(60.0)
    finally:
        cache.stop()


__all__ = ["SizeBinder", "bind_loop", "Verdict", "decide", "host_sizes", "prepared_devices", "status_entries",
           "with_assigned"]
