"""Where the driver reads a claim's allocation: the kubelet sends only a claim's identity.

A Protocol so the driver does not care whether claims come from the API server
(:class:`dra_bridge.apiclient.claims.ApiClaimSource`) or, in tests, from plain dicts. Listing the
claims allocated on this node is optional (:class:`ListsAllocated`): only a rebuild of an
untrusted checkpoint asks for it, and a source without it leaves that rebuild to the node's files.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class ClaimSource(Protocol):
    def get(self, namespace: str, name: str) -> dict: ...


@runtime_checkable
class ListsAllocated(Protocol):
    def allocated(self, driver: str, pool: str) -> list[dict]:
        """Every ResourceClaim with a device allocated from ``driver``'s ``pool``; raises when the
        claims cannot be read (an unreachable API server)."""
        ...


def allocated_claims(source: object, driver: str, pool: str) -> list[dict] | None:
    """The claims ``source`` says are allocated from this pool; None when it cannot list them.
    Errors propagate: the caller decides what an unreachable server means."""
    if not isinstance(source, ListsAllocated):
        return None
    return source.allocated(driver, pool)


def allocation_results(claim: dict) -> list[dict]:
    """The devices the scheduler allocated to a ResourceClaim (``status.allocation.devices.results``)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return ((alloc.get("devices") or {}).get("results")) or []
