"""Reading ResourceClaims from the API server (the kubelet sends only their identity).

:class:`ApiClaimSource` fits the kubelet plugin's ``ClaimSource`` Protocol
(:mod:`dra_bridge.kubeletplugin.claimsource`), structurally: kube sits below the plugin.
"""

from __future__ import annotations

from dra_bridge.kube.objects import sanitize


class ApiClaimSource:
    """ResourceClaims through the official client, as plain camelCase dicts."""

    def __init__(self, api_client):
        from kubernetes import client

        self.api_client = api_client
        self.api = client.ResourceV1Api(api_client)

    def get(self, namespace: str, name: str) -> dict:
        return sanitize(self.api_client, self.api.read_namespaced_resource_claim(name, namespace))
