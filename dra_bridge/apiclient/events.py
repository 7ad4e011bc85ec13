"""Kubernetes Events on the agent's Node (``kubectl describe node`` shows them): why the layout
is not reached yet, and when it is. One call, under the DaemonSet's ``events: create``.

Node events live in the ``default`` namespace, as the kubelet's own do (a Node has none).
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from typing import Any

from kubernetes import client

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.apiclient.core import CoreV1Api
from dra_bridge.apiclient.objects import body

COMPONENT = "vgpuctl"
NAMESPACE = "default"
MAX_MESSAGE = 1024  # the API server truncates longer ones anyway


def node_event(node: str, reason: str, message: str, *, warning: bool = False, now: dt.datetime | None = None,
               node_uid: str | None = None) -> dict[str, Any]:
    """A core/v1 Event about Node ``node`` (pure: the object only)."""
    ts = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "v1", "kind": "Node", "name": node}
    if node_uid:
        involved["uid"] = node_uid
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node}.{secrets.token_hex(8)}", "namespace": NAMESPACE},
        "involvedObject": involved,
        "reason": reason, "message": message[:MAX_MESSAGE], "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": DEFAULT_DRIVER, "reportingInstance": os.environ.get("HOSTNAME", node),
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
    }


def record_node_event(api_client: client.ApiClient, node: str, reason: str, message: str, *,
                      warning: bool = False) -> None:
    """Create the event; callers treat a failure as a log line, never as a failed resync."""
    CoreV1Api(api_client).create_namespaced_event(NAMESPACE, body(node_event(node, reason, message, warning=warning)))
