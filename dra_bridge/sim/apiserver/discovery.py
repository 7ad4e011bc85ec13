"""Discovery documents of the local API server: ``/version``, ``/api``, ``/apis``, group versions.

Legacy (non-aggregated) discovery only: clients that ask for aggregated discovery
(``apidiscovery.k8s.io/v2``, as kubectl does) get the legacy documents and fall back to them.
``/openapi/v3`` lists each group version's operations (no schemas), which is what kubectl
needs to create objects with server-side field validation. Pure functions of the served resources.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from dra_bridge.sim.apiserver.resources import ResourceType


def version_info(minor: int, git_version: str) -> dict:
    return {
        "major": "1", "minor": str(minor),
        "emulationMajor": "1", "emulationMinor": str(minor),
        "minCompatibilityMajor": "1", "minCompatibilityMinor": str(minor - 1),
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64",
    }


def groups(resources: Iterable[ResourceType]) -> dict[str, list[str]]:
    """Named groups and their versions, in the order the resources list them."""
    out: dict[str, list[str]] = {}
    for rt in resources:
        if rt.group:
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
    return out


def api_versions(host: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}


def api_group(resources: Iterable[ResourceType], group: str) -> dict:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups(resources)[group]]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
            "preferredVersion": gvs[0]}


def api_group_list(resources: Iterable[ResourceType]) -> dict:
    resources = tuple(resources)
    items = []
    for g in groups(resources):
        doc = api_group(resources, g)
        doc.pop("kind"), doc.pop("apiVersion")
        items.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": items}


def resource_list(resources: Iterable[ResourceType], group: str, version: str) -> dict | None:
    rts = [rt for rt in resources if rt.group == group and rt.version == version]
    if not rts:
        return None
    entries = []
    for rt in rts:
        entry = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                 "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        entries.append(entry)
        if rt.status_subresource:
            entries.append({"name": f"{rt.plural}/status", "singularName": "",
                            "namespaced": rt.namespaced, "kind": rt.kind,
                            "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


# ------------------------------------------------------------------ OpenAPI v3 (what kubectl reads)
def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def group_versions(resources: Iterable[ResourceType]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rt in resources:
        if (rt.group, rt.version) not in out:
            out.append((rt.group, rt.version))
    return out


def openapi_v3_root(resources: Iterable[ResourceType]) -> dict:
    """``/openapi/v3``: one entry per group version, as kube-apiserver lists them."""
    resources = tuple(resources)
    paths = {}
    for group, version in group_versions(resources):
        doc = json.dumps(openapi_v3_group_version(resources, group, version), sort_keys=True)
        digest = hashlib.sha512(doc.encode()).hexdigest()[:64].upper()
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def _param(name: str, description: str) -> dict:
    return {"name": name, "in": "query", "description": description, "schema": {"type": "string"},
            "uniqueItems": True}


_WRITE_PARAMS = [
    _param("dryRun", "When present, indicates that modifications should not be persisted."),
    _param("fieldManager", "A name associated with the actor or entity that is making these changes."),
    _param("fieldValidation", "Strict, Warn or Ignore: what the server does with unknown or duplicate fields."),
]


def openapi_v3_group_version(resources: Iterable[ResourceType], group: str, version: str) -> dict | None:
    """``/openapi/v3/apis/<group>/<version>``: the operations of each resource, with their GVK.

    Only paths and operations, no schemas: enough for kubectl to see that writes take
    ``fieldValidation`` (it then lets this server validate instead of downloading schemas).
    """
    rts = [rt for rt in resources if rt.group == group and rt.version == version]
    if not rts:
        return None
    paths: dict[str, dict] = {}
    for rt in rts:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        base = "/" + _gv_path(group, version) + ("/namespaces/{namespace}" if rt.namespaced else "")

        def op(action: str, params: list[dict] | None = None, rt=rt, gvk=gvk) -> dict:
            return {"operationId": f"{action}{rt.kind}", "tags": [group or "core"],
                    "parameters": list(params or []), "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk}

        collection = {}
        if "list" in rt.verbs:
            collection["get"] = op("list")
        if "create" in rt.verbs:
            collection["post"] = op("post", _WRITE_PARAMS)
        if "deletecollection" in rt.verbs:
            collection["delete"] = op("deletecollection")
        paths[f"{base}/{rt.plural}"] = collection
        item = {}
        for verb, method, action, params in (("get", "get", "get", None), ("update", "put", "put", _WRITE_PARAMS),
                                             ("patch", "patch", "patch", _WRITE_PARAMS),
                                             ("delete", "delete", "delete", None)):
            if verb in rt.verbs:
                item[method] = op(action, params)
        paths[f"{base}/{rt.plural}/{{name}}"] = item
        if rt.status_subresource:
            paths[f"{base}/{rt.plural}/{{name}}/status"] = {
                "get": op("get"), "put": op("put", _WRITE_PARAMS), "patch": op("patch", _WRITE_PARAMS)}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths, "components": {"schemas": {}}}
