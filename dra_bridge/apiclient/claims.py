"""Reading ResourceClaims from the API server (the kubelet sends only their identity).

:class:`ApiClaimSource` fits the kubelet plugin's ``ClaimSource`` Protocol
(:mod:`dra_bridge.kubeletplugin.claimsource`), structurally: kube sits below the plugin.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_bridge.apiclient import resource
from dra_bridge.apiclient.objects import body, raw

LIST_PAGE = 500  # claims per list request: a big cluster's claims in bounded pieces
LIST_TIMEOUT = 10.0  # seconds per request: a rebuild must not hang on a black-holed server


class ApiClaimSource:
    """ResourceClaims through the official client, as plain camelCase dicts."""

    def __init__(self, api_client: client.ApiClient, *, timeout: float = LIST_TIMEOUT) -> None:
        self.api_client = api_client
        self.api = resource.ResourceV1Api(api_client)
        self.timeout = timeout

    def get(self, namespace: str, name: str) -> dict:
        return raw(self.api.read_namespaced_resource_claim, name, namespace)

    def allocated(self, driver: str, pool: str) -> list[dict]:
        """Every ResourceClaim, in any namespace, with a device allocated from ``driver``'s ``pool``
        (``status.allocation.devices.results``); what the plugin rebuilds its checkpoint from when
        the file cannot be trusted. Raises the client's errors: the caller decides what an
        unreachable server means.

        Filtered here: kube-apiserver offers no field selector on a claim's allocation (its
        ResourceClaim fields are ``generic.ObjectMetaFieldsSet`` only: kubernetes/kubernetes,
        pkg/registry/resource/resourceclaim/strategy.go, ``toSelectableFields``), so one paged
        list it is; it runs only when the checkpoint cannot be trusted.
        """
        out = []
        for claim in list_all_claims(self.api, self.timeout)["items"]:
            alloc = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
            if any(r.get("driver") == driver and r.get("pool") == pool for r in alloc.get("results") or []):
                claim.setdefault("apiVersion", "resource.k8s.io/v1")
                claim.setdefault("kind", "ResourceClaim")
                out.append(claim)
        return out

    def set_device_status(self, namespace: str, name: str, entries: list[dict], *,
                          resource_version: str | None = None) -> bool:
        """Write our ``status.devices`` entries (matched by driver, pool and device; other entries,
        other drivers' included, are kept) on the claim as it is at ``resource_version`` (the claim a
        decision was made from; None: as read now). Returns False, writing nothing, when the claim
        changed since (409) or was deallocated: a verdict decided from an older claim must not
        replace one written since (the binder's rounds may read a watch that lags its own writes).

        A JSON merge patch of ``status.devices`` only, not a PUT of the status read: kube-apiserver
        (1.37) refuses a PUT of the very status it served once the scheduler has allocated, with
        "status.allocation: field cannot be modified once set": the scheduler's protobuf write
        keeps ``allocationTimestamp``'s nanoseconds, JSON carries whole seconds, and the allocation
        read back over JSON is no longer equal to the stored one. A merge patch leaves it alone."""
        keys = {(e["driver"], e["pool"], e["device"]) for e in entries}
        claim = raw(self.api.read_namespaced_resource_claim, name, namespace)
        version = claim["metadata"]["resourceVersion"]
        status = claim.get("status") or {}
        if resource_version is not None and version != resource_version:
            return False
        if not (status.get("allocation") or {}).get("devices"):
            return False  # deallocated meanwhile: nothing to say about it
        kept = [e for e in status.get("devices") or []
                if (e.get("driver"), e.get("pool"), e.get("device")) not in keys]
        patch = {"metadata": {"resourceVersion": version}, "status": {"devices": kept + entries}}
        try:
            self.api.patch_namespaced_resource_claim_status(
                name, namespace, body(patch), _content_type="application/merge-patch+json",
                _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 422 and allocation_refused(exc.body):
                raise UnwritableClaimStatus(namespace, name) from None
            if exc.status != 409:
                raise
            return False
        return True


def allocation_refused(answer: bytes | str | None) -> bool:
    """Whether a 422 answer to our patch of ``status.devices`` is the server refusing a change of
    ``status.allocation`` (which the patch never names: the allocation it re-encodes differs from the
    stored bytes). Read from the Status' causes, its field; the words differ by version (1.37: "field
    cannot be modified once set", 1.34: "field is immutable"), so they are only a fallback."""
    said = answer.decode(errors="replace") if isinstance(answer, bytes) else str(answer or "")
    try:
        causes = ((json.loads(said) or {}).get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        causes = []
    if any(isinstance(c, dict) and c.get("field") == "status.allocation" for c in causes):
        return True
    return "status.allocation" in said and ("cannot be modified once set" in said or "field is immutable" in said)


class UnwritableClaimStatus(RuntimeError):
    """kube-apiserver refuses every status write of this claim over JSON.

    An opaque config's ``parameters`` are stored as the bytes first sent (protobuf storage) and an
    allocation is compared byte for byte, while a JSON write (any patch, or a PUT) carries them
    compacted: parameters first sent with spaces (Python's ``json.dumps`` default) or in another key
    order make every later JSON status write "modify" the allocation (seen on 1.37.2 and 1.34.12; only
    protobuf clients, kube-scheduler and the kubelet, are spared). Nothing the agent sends can change that."""

    def __init__(self, namespace: str, name: str):
        super().__init__(
            f"claim {namespace}/{name}: the API server refuses every status write over JSON (422 on "
            "status.allocation: 'field cannot be modified once set' or 'field is immutable'): the opaque config "
            "parameters it copied "
            "from the claim's template or DeviceClass were sent with spaces or another key order and are kept "
            "byte for byte; create those with kubectl (or compact JSON) and re-create the claim")
        self.claim = f"{namespace}/{name}"


def list_all_claims(api: resource.ResourceV1Api, timeout: float) -> dict[str, Any]:
    """Every ResourceClaim in any namespace, in pages of ``LIST_PAGE``, as one LIST answer
    (``items`` and the list's ``metadata.resourceVersion``)."""
    items: list[dict] = []
    token, version = None, None
    while True:
        kw: dict[str, Any] = {"limit": LIST_PAGE, "_request_timeout": timeout}
        if token:
            kw["_continue"] = token
        page = raw(api.list_resource_claim_for_all_namespaces, **kw)
        items += page.get("items") or []
        meta = page.get("metadata") or {}
        version = meta.get("resourceVersion") or version
        token = meta.get("continue")
        if not token:
            return {"items": items, "metadata": {"resourceVersion": version}}
