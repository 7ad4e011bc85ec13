"""The node agent's own Node object: the labels that name its layout and report its state
(vgpu-device-manager style), and the annotation saying why the state is ``pending``. Under the
DaemonSet's ``nodes: get, patch``."""

from __future__ import annotations

from kubernetes import client

from dra_bridge.apiclient.core import CoreV1Api


def node_labels(api_client: client.ApiClient, node: str) -> dict[str, str]:
    """The node's labels as they are now."""
    return node_metadata(api_client, node)[0]


def node_metadata(api_client: client.ApiClient, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """The node's (labels, annotations) as they are now, in one read."""
    meta = CoreV1Api(api_client).read_node(node).get("metadata") or {}
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


def set_node_label(api_client: client.ApiClient, node: str, key: str, value: str) -> None:
    """Set one label with a merge patch (the node's other labels are left alone)."""
    CoreV1Api(api_client).patch_node(node, {"metadata": {"labels": {key: value}}})


def set_node_annotation(api_client: client.ApiClient, node: str, key: str, value: str | None) -> None:
    """Set one annotation (None removes it) with a merge patch; the others are left alone."""
    CoreV1Api(api_client).patch_node(node, {"metadata": {"annotations": {key: value}}})
