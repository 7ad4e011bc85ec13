"""API objects as the plain JSON the server sent (no typed client models)."""

from __future__ import annotations

import json


def raw(call, *args, **kw) -> dict:
    """A client call's answer as the plain JSON the server sent: no typed models, which the client
    builds and validates at some cost for every object (ResourceSlices have many devices)."""
    r = call(*args, _preload_content=False, **kw)
    return json.loads(r.data)


def sanitize(api_client, obj) -> dict:
    """A typed client object as plain JSON."""
    return api_client.sanitize_for_serialization(obj)


def slices_and_claims(api_client) -> tuple[list[dict], list[dict]]:
    """Every ResourceSlice and ResourceClaim through the official client (list calls; read-only)."""
    from kubernetes import client

    api = client.ResourceV1Api(api_client)
    return raw(api.list_resource_slice)["items"], raw(api.list_resource_claim_for_all_namespaces)["items"]
