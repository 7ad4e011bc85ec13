"""API objects as the plain JSON the server sent (no typed client models).

No API call of its own: the node agent loads this module, and its RBAC is what its code calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # re-exported for annotations outside this package (only dra_bridge.apiclient imports kubernetes)
    from kubernetes.client import ApiClient as ApiClient
    from kubernetes.client import Configuration as Configuration
    from urllib3 import BaseHTTPResponse


def unparsed(call: Callable[..., Any], *args: Any, **kw: Any) -> BaseHTTPResponse:
    """A client call's HTTP response, its body not read (``_preload_content=False``): what the client
    answers then, whatever its annotations say."""
    response: BaseHTTPResponse = call(*args, _preload_content=False, **kw)
    return response


def raw(call: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
    """A client call's answer as the plain JSON the server sent: no typed models, which the client
    builds and validates at some cost for every object (ResourceSlices have many devices)."""
    return json.loads(unparsed(call, *args, **kw).data)


def sanitize(api_client: ApiClient, obj: object) -> dict[str, Any]:
    """A typed client object as plain JSON."""
    return api_client.sanitize_for_serialization(obj)


def body(obj: dict[str, Any]) -> Any:
    """A plain JSON object as a request body. The client sends a dict as it is
    (``ApiClient.sanitize_for_serialization``); its methods' annotations name only its model classes."""
    return obj


def watch_events(resp: BaseHTTPResponse) -> Iterator[dict[str, Any]]:
    """The raw events (``{"type", "object"}``) of a watch response opened with
    ``_preload_content=False``, until the server ends it; the connection is released after."""
    # kubernetes costs ~0.4 s: vgpuctl conformance and demo load this module for their parser (--help)
    from kubernetes.watch.watch import iter_resp_lines

    try:
        for line in iter_resp_lines(resp):
            if line:
                yield json.loads(line)
    finally:
        resp.close()
        resp.release_conn()
