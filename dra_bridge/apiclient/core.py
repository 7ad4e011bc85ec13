"""The agent's few core/v1 calls (its Node, its Events) without the generated ``CoreV1Api``.

``kubernetes/client/api/core_v1_api.py`` imports the typed model of every core/v1 call at its top:
235 modules, 20 MB resident and half a second of CPU in the agent (#37.3), for four calls. These go
through the same ``ApiClient`` (credentials, TLS, retries) with the request line and headers the
generated methods send (:data:`CALLS`, checked against them by tests/system/test_rbac.py), answer the
plain JSON the server sent, and raise the client's ``ApiException`` on an error status as they do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from urllib3 import BaseHTTPResponse

#: method -> (HTTP method, path): those of ``kubernetes.client.CoreV1Api``'s methods of the same name
CALLS = {
    "read_node": ("GET", "/api/v1/nodes/{name}"),
    "patch_node": ("PATCH", "/api/v1/nodes/{name}"),
    "list_node": ("GET", "/api/v1/nodes"),
    "create_namespaced_event": ("POST", "/api/v1/namespaces/{namespace}/events"),
}
#: what the generated ``patch_node`` sends; the client's REST layer sends a dict body as a strategic merge patch
_PATCH = "application/json-patch+json"
#: keyword -> query parameter, for the keywords the agent passes
_QUERY = {"field_selector": "fieldSelector", "resource_version": "resourceVersion", "watch": "watch",
          "allow_watch_bookmarks": "allowWatchBookmarks", "timeout_seconds": "timeoutSeconds",
          "label_selector": "labelSelector", "dry_run": "dryRun", "limit": "limit", "_continue": "continue"}


class LightApi:
    """Calls made through the generated client's ``ApiClient`` on the generated methods' request lines
    (``CALLS``: method -> (HTTP method, path)), answering plain JSON."""

    CALLS: dict[str, tuple[str, str]] = {}

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def _call(self, name: str, path_params: dict[str, str], *, query: dict[str, Any] | None = None, body: Any = None,
              content_type: str | None = None, preload: bool = True, timeout: Any = None) -> Any:
        http, path = self.CALLS[name]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(_QUERY[k], v) for k, v in (query or {}).items() if v is not None]
        request = self.api_client.param_serialize(method=http, resource_path=path, path_params=path_params,
                                                  query_params=params, header_params=headers, body=body, post_params=[],
                                                  auth_settings=["BearerToken"])
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not preload:  # as the generated method: an error status raises before the body is handed over
            if not 200 <= response.status <= 299:
                response.read()
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            raw: BaseHTTPResponse = response.response
            return raw
        response.read()
        return self.api_client.response_deserialize(response, {"2XX": "object"}).data


class CoreV1Api(LightApi):
    """The subset of ``kubernetes.client.CoreV1Api`` the agent calls, answering plain JSON."""

    CALLS = CALLS

    def read_node(self, name: str, *, _request_timeout: Any = None) -> dict[str, Any]:
        return self._call("read_node", {"name": name}, timeout=_request_timeout)

    def patch_node(self, name: str, body: Any, *, _request_timeout: Any = None) -> dict[str, Any]:
        return self._call("patch_node", {"name": name}, body=body, content_type=_PATCH, timeout=_request_timeout)

    def list_node(self, *, _preload_content: bool = True, _request_timeout: Any = None, **query: Any) -> Any:
        """The NodeList (or, with ``_preload_content=False``, the HTTP response, its body unread: a watch)."""
        return self._call("list_node", {}, query=query, preload=_preload_content, timeout=_request_timeout)

    def create_namespaced_event(self, namespace: str, body: Any, *, _request_timeout: Any = None) -> dict[str, Any]:
        return self._call("create_namespaced_event", {"namespace": namespace}, body=body, timeout=_request_timeout)
