"""The node agent's own Node object: the labels that name its layout and report its state
(vgpu-device-manager style), and the annotation saying why the state is ``pending``. Under the
DaemonSet's ``nodes: get, patch``."""

from __future__ import annotations


def node_labels(api_client, node: str) -> dict[str, str]:
    """The node's labels as they are now."""
    return node_metadata(api_client, node)[0]


def node_metadata(api_client, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """The node's (labels, annotations) as they are now, in one read."""
    from kubernetes import client

    meta = client.CoreV1Api(api_client).read_node(node).metadata
    return dict(meta.labels or {}), dict(meta.annotations or {})


def set_node_label(api_client, node: str, key: str, value: str) -> None:
    """Set one label with a merge patch (the node's other labels are left alone)."""
    from kubernetes import client

    client.CoreV1Api(api_client).patch_node(node, {"metadata": {"labels": {key: value}}})


def set_node_annotation(api_client, node: str, key: str, value: str | None) -> None:
    """Set one annotation (None removes it) with a merge patch; the others are left alone."""
    from kubernetes import client

    client.CoreV1Api(api_client).patch_node(node, {"metadata": {"annotations": {key: value}}})
