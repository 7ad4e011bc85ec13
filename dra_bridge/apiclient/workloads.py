"""Running test workloads on a cluster through its API: namespaces, ConfigMaps, ResourceClaimTemplates,
pods, their claims, events and logs, and the published ResourceSlices.

What ``vgpuctl conformance`` and ``capacity`` call, under the user's own credentials: the node
agent never loads this module (its RBAC grants only what the agent itself calls).

Objects go in and come out as plain JSON dicts (:func:`~dra_bridge.apiclient.objects.raw`); named
deletes and reads answer ``False`` / ``None`` when the object is not there (404) and raise any
other API error (:func:`~dra_bridge.apiclient.errors.api_exception`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dra_bridge.apiclient.errors import api_exception, missing_ok
from dra_bridge.apiclient.objects import body, raw

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class WorkloadApi:
    """The calls, through the official client; ``kubernetes`` is imported when one is made."""

    def __init__(self, api_client: ApiClient) -> None:
        # kubernetes costs ~0.4 s: vgpuctl conformance and demo load this module for their parser (--help)
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)

    # ------------------------------------------------------------ cluster-wide
    def device_class_exists(self, name: str) -> bool:
        return missing_ok(self.resource.read_device_class, name)

    def node_allocatable(self, name: str) -> dict[str, str]:
        """``status.allocatable`` of a node ({} if it is not there)."""
        try:
            node = raw(self.core.read_node, name)
        except api_exception() as exc:
            if exc.status != 404:
                raise
            return {}
        return (node.get("status") or {}).get("allocatable") or {}

    def device_classes(self) -> list[dict]:
        return raw(self.resource.list_device_class)["items"]

    def slices(self) -> list[dict]:
        return raw(self.resource.list_resource_slice)["items"]

    def all_claims(self) -> list[dict]:
        return raw(self.resource.list_resource_claim_for_all_namespaces)["items"]

    # ------------------------------------------------------------ namespace and what is in it
    def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        self.core.create_namespace(body({"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": name, "labels": dict(labels)}}))

    def delete_namespace(self, name: str) -> bool:
        return missing_ok(self.core.delete_namespace, name)

    def create_config_map(self, namespace: str, obj: dict[str, Any]) -> None:
        self.core.create_namespaced_config_map(namespace, body(obj))

    def delete_config_map(self, name: str, namespace: str) -> bool:
        return missing_ok(self.core.delete_namespaced_config_map, name, namespace)

    def create_claim_template(self, namespace: str, obj: dict[str, Any]) -> None:
        self.resource.create_namespaced_resource_claim_template(namespace, body(obj))

    def delete_claim_templates(self, namespace: str) -> bool:
        """Every ResourceClaimTemplate of the namespace."""
        return missing_ok(self.resource.delete_collection_namespaced_resource_claim_template, namespace)

    def claims(self, namespace: str) -> list[dict]:
        return raw(self.resource.list_namespaced_resource_claim, namespace)["items"]

    def read_claim(self, name: str, namespace: str) -> dict:
        return raw(self.resource.read_namespaced_resource_claim, name, namespace)

    # ------------------------------------------------------------ pods
    def create_pod(self, namespace: str, obj: dict[str, Any]) -> None:
        self.core.create_namespaced_pod(namespace, body(obj))

    def read_pod(self, name: str, namespace: str) -> dict | None:
        try:
            return raw(self.core.read_namespaced_pod, name, namespace)
        except api_exception() as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, namespace: str) -> list[dict]:
        return raw(self.core.list_namespaced_pod, namespace)["items"]

    def delete_pod(self, name: str, namespace: str, *, grace_period_seconds: int | None = None) -> bool:
        return missing_ok(self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace_period_seconds)

    def pod_log(self, name: str, namespace: str) -> str:
        return self.core.read_namespaced_pod_log(name, namespace)

    def events_of(self, name: str, namespace: str) -> list[dict]:
        """The events about one object of the namespace (by name)."""
        return raw(self.core.list_namespaced_event, namespace, field_selector=f"involvedObject.name={name}")["items"]


def slices_and_claims(api_client: ApiClient) -> tuple[list[dict], list[dict]]:
    """Every ResourceSlice and ResourceClaim of the cluster (``vgpuctl capacity``; read-only)."""
    api = WorkloadApi(api_client)
    return api.slices(), api.all_claims()
