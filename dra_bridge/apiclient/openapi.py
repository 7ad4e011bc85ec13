"""OpenAPI documents a cluster publishes, read through the one ``ApiClient``.

``vgpuctl render --kubeconfig`` validates KubeVirt objects against the schema of the KubeVirt
release the cluster runs (``/openapi/v3/apis/kubevirt.io/v1``), not against a copy that may
be older or newer.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

#: KubeVirt's core API group, as the API server publishes it (OpenAPI v3, one document per group-version).
KUBEVIRT_V1 = "/openapi/v3/apis/kubevirt.io/v1"


class OpenApiUnavailable(LookupError):
    """The server did not answer ``path`` with a document (404: the group is not installed)."""

    def __init__(self, path: str, status: int, reason: str) -> None:
        self.path, self.status, self.reason = path, status, reason
        hint = " (is KubeVirt installed on this cluster?)" if status == 404 and "kubevirt" in path else ""
        super().__init__(f"GET {path}: {status} {reason}{hint}")


def fetch_openapi_v3(api_client: ApiClient, path: str = KUBEVIRT_V1, *, timeout: float = 30.0) -> dict[str, Any]:
    """The OpenAPI v3 document at ``path`` (``/openapi/v3/apis/<group>/<version>``), parsed."""
    method, url, headers, body, _ = api_client.param_serialize(
        "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
    try:
        resp = api_client.call_api(method, url, headers, body, _request_timeout=timeout)
        data = resp.read()
    except ApiException as exc:
        raise OpenApiUnavailable(path, exc.status or 0, str(exc.reason or "")) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise OpenApiUnavailable(path, 0, f"cannot reach the API server ({exc})") from None
    if not 200 <= resp.status < 300:
        raise OpenApiUnavailable(path, resp.status, resp.reason or "")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise OpenApiUnavailable(path, resp.status, f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise OpenApiUnavailable(path, resp.status, "not an OpenAPI document")
    return doc


def fetch_kubevirt_openapi(api_client: ApiClient, *, timeout: float = 30.0) -> dict[str, Any]:
    """KubeVirt's ``kubevirt.io/v1`` schema as this cluster serves it."""
    return fetch_openapi_v3(api_client, KUBEVIRT_V1, timeout=timeout)


__all__ = ["KUBEVIRT_V1", "OpenApiUnavailable", "fetch_kubevirt_openapi", "fetch_openapi_v3"]
