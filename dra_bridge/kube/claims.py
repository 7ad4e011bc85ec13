"""Reading ResourceClaims from the API server (the kubelet sends only their identity)."""

from __future__ import annotations

from typing import Protocol


class ClaimSource(Protocol):
    def get(self, namespace: str, name: str) -> dict: ...


class ApiClaimSource:
    """ResourceClaims through the official client, as plain camelCase dicts."""

    def __init__(self, api_client):
        from kubernetes import client

        self.api_client = api_client
        self.api = client.ResourceV1Api(api_client)

    def get(self, namespace: str, name: str) -> dict:
        obj = self.api.read_namespaced_resource_claim(name, namespace)
        return self.api_client.sanitize_for_serialization(obj)


def allocation_results(claim: dict) -> list[dict]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return ((alloc.get("devices") or {}).get("results")) or []
