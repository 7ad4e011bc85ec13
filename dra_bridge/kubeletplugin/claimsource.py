"""Where the driver reads a claim's allocation: the kubelet sends only a claim's identity.

A Protocol so the driver does not care whether claims come from the API server
(:class:`dra_bridge.kube.claims.ApiClaimSource`) or, in tests, from plain dicts.
"""

from __future__ import annotations

from typing import Protocol


class ClaimSource(Protocol):
    def get(self, namespace: str, name: str) -> dict: ...


def allocation_results(claim: dict) -> list[dict]:
    """The devices the scheduler allocated to a ResourceClaim (``status.allocation.devices.results``)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return ((alloc.get("devices") or {}).get("results")) or []
