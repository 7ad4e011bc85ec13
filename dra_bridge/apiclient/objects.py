"""API objects as the plain JSON the server sent (no typed client models).

No API call of its own: the node agent loads this module, and its RBAC is what its code calls.
"""

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


def watch_events(resp):
    """The raw events (``{"type", "object"}``) of a watch response opened with
    ``_preload_content=False``, until the server ends it; the connection is released after."""
    from kubernetes.watch.watch import iter_resp_lines

    try:
        for line in iter_resp_lines(resp):
            if line:
                yield json.loads(line)
    finally:
        resp.close()
        resp.release_conn()
