"""Binding conditions for vGPU sizes (KEP-5007): every size of an empty GPU without compatibility groups.

Where the API server keeps the shared counters and binding conditions but not compatibility
groups (1.36 by default, 1.37 with the groups' alpha gate off), an empty equal-size GPU offers
every vGPU size and each of its slots carries ``bindingConditions: [<driver>/SizeAssigned]`` and
``bindingFailureConditions: [<driver>/SizeConflict]``. The scheduler then waits in PreBind until
the agent has looked at the allocation: the first size allocated on a GPU becomes its size (the
GPU is republished with that size only, so retries do not pick another), allocations of that size
get ``SizeAssigned=True``, any other size ``SizeConflict=True``, which makes the scheduler drop
that allocation and try again. A conflicting mix therefore never reaches prepare.

:func:`decide` is pure: allocated claims, the pool and the sizes already on the host in, the
condition per pending device and each GPU's size out. The agent writes them
(``resourceclaims/status``, ``status.devices[].conditions``) and republishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import SIZE_ASSIGNED, SIZE_CONFLICT
from dra_bridge.pool.model import Pool, PoolPolicy


@dataclass(frozen=True)
class Verdict:
    namespace: str
    claim: str
    device: str
    gpu: str
    ok: bool  # SizeAssigned (True) or SizeConflict (False)
    size_mib: int | None
    message: str


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


def decide(claims: list[dict], pool: Pool, host_sizes: dict[str, set[int]], *, driver: str,
           pool_name: str) -> tuple[list[Verdict], dict[str, int]]:
    """(verdicts for the allocations waiting on our binding conditions, each GPU's size).

    A GPU's size: that of the vGPUs on the host, else of allocations already confirmed, else of
    the first waiting allocation (oldest claim first). A waiting allocation of another size, or of
    a device no longer published, is a conflict."""
    assigned: dict[str, int] = {g: next(iter(s)) for g, s in host_sizes.items() if len(s) == 1}
    waiting: list[tuple[tuple, str, str, str, str, int | None]] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            if r.get("driver") != driver or r.get("pool") != pool_name:
                continue
            sized = _size_mib(pool, r.get("device", ""))
            state = _status(claim, driver, pool_name, r.get("device", ""))
            # bound without conditions, or already confirmed: its size is the GPU's
            if not r.get("bindingConditions") or state.get(f"{driver}/{SIZE_ASSIGNED}") == "True":
                if sized and sized[1] is not None:
                    assigned.setdefault(sized[0], sized[1])
                continue
            if state.get(f"{driver}/{SIZE_CONFLICT}") == "True":
                continue  # the scheduler drops it
            key = (meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta.get("name") or "")
            gpu, size = sized if sized else ("", None)
            waiting.append((key, meta.get("namespace", ""), meta.get("name", ""), r["device"], gpu, size))
    verdicts = []
    for _, ns, name, device, gpu, size in sorted(waiting):
        if not gpu:
            verdicts.append(Verdict(ns, name, device, gpu, False, None,
                                    f"device {device} is no longer offered on this node"))
            continue
        have = assigned.setdefault(gpu, size) if size is not None else assigned.get(gpu)
        if size is not None and have == size:
            verdicts.append(Verdict(ns, name, device, gpu, True, size, f"GPU {gpu} runs {size} MiB vGPUs"))
        else:
            verdicts.append(Verdict(ns, name, device, gpu, False, size,
                                    f"GPU {gpu} runs {have} MiB vGPUs (equal-size mode); {device} is {size} MiB"))
    return verdicts, assigned


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


def host_sizes(inventory) -> dict[str, set[int]]:
    """GPU -> framebuffer sizes (MiB) of the time-sliced vGPUs on it now."""
    out: dict[str, set[int]] = {}
    for g in inventory.gpus if inventory is not None else []:
        fb = {t.id: t.framebuffer_mib for t in g.types if not t.mig_backed}
        sizes = {fb[v.type_id] for v in g.vgpus if fb.get(v.type_id)}
        if sizes:
            out[g.address] = sizes
    return out


class SizeBinder:
    """The agent's side of the binding conditions: decide, write the claims' device conditions, and
    remember each GPU's size for the next publish (:meth:`policy`)."""

    def __init__(self, driver: str, pool_name: str):
        self.driver = driver
        self.pool_name = pool_name
        self.assigned: dict[str, int] = {}

    def policy(self, policy: PoolPolicy) -> PoolPolicy:
        return with_assigned(policy, self.assigned)

    def bind(self, claims, pool: Pool, inventory, allocated: list[dict] | None = None) -> tuple[list[Verdict], bool]:
        """One round: (verdicts written, whether a GPU's size changed, so the pool must be republished).
        ``claims``: an :class:`~dra_bridge.apiclient.claims.ApiClaimSource` (the writes, and the LIST when
        ``allocated``, the claims a watch keeps, is not given)."""
        import datetime

        if allocated is None:
            allocated = claims.allocated(self.driver, self.pool_name)
        verdicts, assigned = decide(allocated, pool, host_sizes(inventory), driver=self.driver,
                                    pool_name=self.pool_name)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for (ns, name), entries in status_entries(verdicts, driver=self.driver, pool_name=self.pool_name,
                                                  now=now).items():
            claims.set_device_status(ns, name, entries)
        changed = assigned != self.assigned
        self.assigned = assigned
        return verdicts, changed


def bind_loop(cache, *, active, bind, stop, retry_seconds: float) -> None:
    """The agent's binding rounds: while ``active()``, one LIST, then each change of the watched
    claims (``cache``: a :class:`~dra_bridge.apiclient.claimwatch.ClaimCache`), or a minute without one,
    is a round of ``bind(claims)``; otherwise it looks again every ``retry_seconds``."""
    import logging

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
                logging.getLogger(__name__).warning("binding conditions: %s", exc)
                stop.wait(retry_seconds)
            cache.wait(60.0)
    finally:
        cache.stop()


__all__ = ["SizeBinder", "bind_loop", "Verdict", "decide", "host_sizes", "status_entries", "with_assigned"]
