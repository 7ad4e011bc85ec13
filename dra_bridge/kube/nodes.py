"""The node agent's own Node object: the labels that name its layout and report its state
(vgpu-device-manager style). Two calls, under the DaemonSet's ``nodes: get, patch``."""

from __future__ import annotations


def node_labels(api_client, node: str) -> dict[str, str]:
    """The node's labels as they are now."""
    from kubernetes import client

    return dict(client.CoreV1Api(api_client).read_node(node).metadata.labels or {})


def set_node_label(api_client, node: str, key: str, value: str) -> None:
    """Set one label with a merge patch (the node's other labels are left alone)."""
    from kubernetes import client

    client.CoreV1Api(api_client).patch_node(node, {"metadata": {"labels": {key: value}}})
