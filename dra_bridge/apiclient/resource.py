"""The agent's resource.k8s.io/v1 calls (its ResourceSlices, the claims it prepares) without the generated
``ResourceV1Api``.

``kubernetes/client/api/resource_v1_api.py`` imports the typed model of every resource/v1 call at its top:
71 modules and about 5 MB resident in the agent (#37.3), which reads and writes these objects as plain JSON
anyway (:func:`~dra_bridge.apiclient.objects.raw`). As :mod:`dra_bridge.apiclient.core`: the same
``ApiClient``, the generated methods' request lines (:data:`CALLS`, checked against them by
tests/system/test_rbac.py), plain JSON answers, the client's ``ApiException`` on an error status.
"""

from __future__ import annotations

from typing import Any

from dra_bridge.apiclient.core import LightApi

_V1 = "/apis/resource.k8s.io/v1"
#: method -> (HTTP method, path): those of ``kubernetes.client.ResourceV1Api``'s methods of the same name
CALLS = {
    "list_resource_slice": ("GET", f"{_V1}/resourceslices"),
    "create_resource_slice": ("POST", f"{_V1}/resourceslices"),
    "read_resource_slice": ("GET", f"{_V1}/resourceslices/{{name}}"),
    "replace_resource_slice": ("PUT", f"{_V1}/resourceslices/{{name}}"),
    "delete_resource_slice": ("DELETE", f"{_V1}/resourceslices/{{name}}"),
    "read_namespaced_resource_claim": ("GET", f"{_V1}/namespaces/{{namespace}}/resourceclaims/{{name}}"),
    "patch_namespaced_resource_claim_status": ("PATCH", f"{_V1}/namespaces/{{namespace}}/resourceclaims/{{name}}/status"),
    "list_resource_claim_for_all_namespaces": ("GET", f"{_V1}/resourceclaims"),
}


class ResourceV1Api(LightApi):
    """The subset of ``kubernetes.client.ResourceV1Api`` the agent calls, answering plain JSON (or, with
    ``_preload_content=False``, the HTTP response, its body unread: what :func:`~dra_bridge.apiclient.objects.raw`
    and a watch read)."""

    CALLS = CALLS

    def list_resource_slice(self, *, _preload_content: bool = True, _request_timeout: Any = None, **query: Any) -> Any:
        return self._call("list_resource_slice", {}, query=query, preload=_preload_content, timeout=_request_timeout)

    def create_resource_slice(self, body: Any, *, _preload_content: bool = True, _request_timeout: Any = None,
                              **query: Any) -> Any:
        return self._call("create_resource_slice", {}, query=query, body=body, preload=_preload_content,
                          timeout=_request_timeout)

    def read_resource_slice(self, name: str, *, _preload_content: bool = True, _request_timeout: Any = None) -> Any:
        return self._call("read_resource_slice", {"name": name}, preload=_preload_content, timeout=_request_timeout)

    def replace_resource_slice(self, name: str, body: Any, *, _preload_content: bool = True,
                               _request_timeout: Any = None, **query: Any) -> Any:
        return self._call("replace_resource_slice", {"name": name}, query=query, body=body, preload=_preload_content,
                          timeout=_request_timeout)

    def delete_resource_slice(self, name: str, *, _preload_content: bool = True, _request_timeout: Any = None) -> Any:
        return self._call("delete_resource_slice", {"name": name}, preload=_preload_content, timeout=_request_timeout)

    def read_namespaced_resource_claim(self, name: str, namespace: str, *, _preload_content: bool = True,
                                       _request_timeout: Any = None) -> Any:
        return self._call("read_namespaced_resource_claim", {"name": name, "namespace": namespace},
                          preload=_preload_content, timeout=_request_timeout)

    def patch_namespaced_resource_claim_status(self, name: str, namespace: str, body: Any, *,
                                               _content_type: str = "application/merge-patch+json",
                                               _preload_content: bool = True, _request_timeout: Any = None) -> Any:
        return self._call("patch_namespaced_resource_claim_status", {"name": name, "namespace": namespace},
                          body=body, content_type=_content_type, preload=_preload_content, timeout=_request_timeout)

    def list_resource_claim_for_all_namespaces(self, *, _preload_content: bool = True, _request_timeout: Any = None,
                                               **query: Any) -> Any:
        return self._call("list_resource_claim_for_all_namespaces", {}, query=query, preload=_preload_content,
                          timeout=_request_timeout)
