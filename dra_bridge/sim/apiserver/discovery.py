"""Discovery documents of the local API server: ``/version``, ``/api``, ``/apis``, group versions.

Legacy (non-aggregated) discovery only: clients that ask for aggregated discovery
(``apidiscovery.k8s.io/v2``, as kubectl does) get the legacy documents and fall back to them.
OpenAPI is in :mod:`.openapi`. Pure functions of the served resources.
"""

from __future__ import annotations

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
