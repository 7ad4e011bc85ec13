"""OpenAPI documents of the local API server: ``/openapi/v2`` and ``/openapi/v3`` as kubectl reads them.

kubectl reads the v3 document of a group version to learn that writes take ``fieldValidation``
(then this server validates), to build strategic merge patches for ``kubectl apply`` and for
``kubectl explain``; it falls back to ``/openapi/v2`` (protobuf, :mod:`.openapi_pb`) where v3
fails. The schemas are the upstream ones of the server's version as ``kubernetes-validate``
carries them (JSON Schema), turned back into OpenAPI: nullable types made plain, ``$ref`` into
``#/definitions`` (v2) or ``#/components/schemas`` (v3, wrapped in ``allOf`` beside siblings, as
upstream), int-or-string and quantities as strings, the ``x-kubernetes-*`` extensions kept.
Each document carries the operations of its resources and the closure of the schemas they name.
Without ``kubernetes-validate`` the documents carry the operations only.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from dra_bridge.sim.apiserver import openapi_pb, validation
from dra_bridge.sim.apiserver.resources import ResourceType

META = "io.k8s.apimachinery.pkg.apis.meta.v1."
PATCH_TYPES = ("application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json")
_QUERY = {
    "dryRun": "When present, indicates that modifications should not be persisted. Valid values: All.",
    "fieldManager": "fieldManager is a name associated with the actor or entity that is making these changes.",
    "fieldValidation": "fieldValidation instructs the server on how to handle objects in the request containing "
                       "unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
    "force": "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields "
             "owned by other people. Force flag must be unset for non-apply patch requests.",
    "pretty": "If 'true', then the output is pretty printed.",
    "labelSelector": "A selector to restrict the list of returned objects by their labels.",
    "fieldSelector": "A selector to restrict the list of returned objects by their fields.",
    "limit": "limit is a maximum number of responses to return for a list call.",
    "continue": "The continue option should be set when retrieving more results from the server.",
    "resourceVersion": "resourceVersion sets a constraint on what resource versions a request may be served from.",
    "watch": "Watch for changes to the described resources and return them as a stream of add, update, and "
             "remove notifications.",
    "timeoutSeconds": "Timeout for the list/watch call.",
}


# ------------------------------------------------------------------ schemas
@functools.cache
def _raw_definitions(version: str) -> dict[str, dict]:
    if not validation.HAVE_SCHEMAS:
        return {}
    return validation.definitions(version, strict=False).get("$defs", {})


def _convert(node: Any, prefix: str, v3: bool) -> Any:
    """A JSON Schema node of kubernetes-validate as upstream's OpenAPI writes it."""
    if isinstance(node, list):
        return [_convert(n, prefix, v3) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            value = kinds[0] if len(kinds) == 1 else kinds
        elif key == "$ref":
            value = prefix + value.rsplit("/", 1)[-1]
        elif key == "properties":
            value = {name: _convert({k: v for k, v in sub.items() if not (k == "enum" and name in (
                "apiVersion", "kind"))}, prefix, v3) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            value = _convert(value, prefix, v3)
        out[key] = value
    alternatives = out.get("oneOf")
    if isinstance(alternatives, list) and alternatives and all(set(a) == {"type"} for a in alternatives):
        one_of = {a["type"] for a in alternatives}
        del out["oneOf"]
        out["type"] = "string"
        if "integer" in one_of:
            out["format"] = "int-or-string"
    if v3 and "$ref" in out and len(out) > 1:
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[-1])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def _closure(defs: dict[str, dict], names: Iterable[str]) -> list[str]:
    todo, seen = [n for n in names if n in defs], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found: set[str] = set()
        _refs(defs[name], found)
        todo.extend(n for n in found if n in defs and n not in seen)
    return sorted(seen)


@functools.cache
def _by_gvk(version: str) -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in _raw_definitions(version).items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            out.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)
    return out


def definition_name(version: str, group: str, api_version: str, kind: str) -> str | None:
    return _by_gvk(version).get((group, api_version, kind))


def _schemas(version: str, rts: Iterable[ResourceType], prefix: str, v3: bool) -> dict[str, dict]:
    defs = _raw_definitions(version)
    roots = [META + n for n in ("Status", "DeleteOptions", "Patch", "WatchEvent")]
    for rt in rts:
        roots += [n for n in (definition_name(version, rt.group, rt.version, rt.kind),
                              definition_name(version, rt.group, rt.version, rt.list_kind)) if n]
    return {name: _convert(defs[name], prefix, v3) for name in _closure(defs, roots)}


# ------------------------------------------------------------------ operations
def _group_id(group: str) -> str:
    """``rbac.authorization.k8s.io`` -> ``RbacAuthorization`` (upstream's operationId part)."""
    parts = (group or "core").replace(".k8s.io", "").split(".")
    return "".join(p[:1].upper() + p[1:] for p in parts)


def _operations(version: str, rt: ResourceType, v3: bool) -> dict[str, dict]:
    """The paths of one resource: collection, item, status; each operation with its GVK."""
    prefix = "#/components/schemas/" if v3 else "#/definitions/"
    gv = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    ns = "/namespaces/{namespace}" if rt.namespaced else ""
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    name_id = f"{_group_id(rt.group)}{rt.version[:1].upper()}{rt.version[1:]}{'Namespaced' if rt.namespaced else ''}"
    tag = f"{(rt.group or 'core').replace('.k8s.io', '').split('.')[0]}_{rt.version}"
    obj = definition_name(version, rt.group, rt.version, rt.kind)
    lst = definition_name(version, rt.group, rt.version, rt.list_kind)

    def ref(name: str | None) -> dict:
        return {"$ref": prefix + name} if name else {"type": "object"}

    def params(*names: str) -> list[dict]:
        out = []
        for n in names:
            p: dict[str, Any] = {"name": n, "in": "query", "description": _QUERY[n], "uniqueItems": True}
            typ = "boolean" if n in ("force", "watch") else "integer" if n in ("limit", "timeoutSeconds") else "string"
            if v3:
                p["schema"] = {"type": typ, "uniqueItems": True}
                del p["uniqueItems"]
            else:
                p["type"] = typ
            out.append(p)
        return out

    def op(action: str, verb: str, response: str | None, query: tuple[str, ...] = (),
           body: str | None = None, body_types: tuple[str, ...] = ("*/*",)) -> dict:
        o: dict[str, Any] = {"description": f"{verb} {rt.kind}", "operationId": f"{verb}{name_id}{rt.kind}",
                             "tags": [tag], "parameters": params(*query),
                             "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk}
        codes = {"201": "Created", "202": "Accepted"} if action in ("post", "put", "patch") else {}
        if v3:
            content = {t: {"schema": ref(response)} for t in ("application/json", "application/yaml")}
            o["responses"] = {"200": {"description": "OK", "content": content},
                              **{c: {"description": d, "content": content} for c, d in codes.items()},
                              "401": {"description": "Unauthorized"}}
            if body is not None:
                o["requestBody"] = {"content": {t: {"schema": ref(body)} for t in body_types}, "required": True}
        else:
            o["consumes"], o["produces"] = list(body_types), ["application/json", "application/yaml"]
            o["responses"] = {"200": {"description": "OK", "schema": ref(response)},
                              **{c: {"description": d, "schema": ref(response)} for c, d in codes.items()},
                              "401": {"description": "Unauthorized"}}
            if body is not None:
                o["parameters"].insert(0, {"name": "body", "in": "body", "required": True, "schema": ref(body)})
        return o

    write = ("dryRun", "fieldManager", "fieldValidation")
    lists = ("labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "timeoutSeconds", "watch")
    verbs = set(rt.verbs)

    def path_params(*names: str) -> list[dict]:
        out = []
        for n in names:
            p = {"name": n, "in": "path", "required": True, "description": f"{n} of the {rt.kind}"}
            out.append({**p, "schema": {"type": "string", "uniqueItems": True}} if v3 else
                       {**p, "type": "string", "uniqueItems": True})
        return out + params("pretty")

    paths: dict[str, dict] = {}
    collection: dict[str, Any] = {"parameters": path_params(*(["namespace"] if rt.namespaced else []))}
    if "list" in verbs:
        collection["get"] = op("list", "list", lst, lists)
    if "create" in verbs:
        collection["post"] = op("post", "create", obj, write, obj)
    if "deletecollection" in verbs:
        collection["delete"] = op("deletecollection", "deleteCollection", META + "Status", lists,
                                  META + "DeleteOptions")
    paths[f"{gv}{ns}/{rt.plural}"] = collection
    if rt.namespaced and "list" in verbs:
        paths[f"{gv}/{rt.plural}"] = {"get": {**op("list", "list", lst, lists),
                                              "operationId": f"list{name_id.replace('Namespaced', '')}{rt.kind}"
                                                             "ForAllNamespaces"},
                                      "parameters": params("pretty")}
    for suffix, label in (("", ""), ("/status", "Status")):
        if suffix and not rt.status_subresource:
            continue
        item: dict[str, Any] = {"parameters": path_params("name", *(["namespace"] if rt.namespaced else []))}
        item["get"] = op("get", f"read{label}", obj)
        item["put"] = op("put", f"replace{label}", obj, write, obj)
        item["patch"] = op("patch", f"patch{label}", obj, (*write, "force"), META + "Patch", PATCH_TYPES)
        if not suffix:
            item["delete"] = op("delete", "delete", META + "Status", ("dryRun",), META + "DeleteOptions")
        for verb, method in (("get", "get"), ("update", "put"), ("patch", "patch"), ("delete", "delete")):
            if method in item and verb not in verbs and not suffix:
                del item[method]
        paths[f"{gv}{ns}/{rt.plural}/{{name}}{suffix}"] = item
    return paths


class _Served(tuple):
    """The served resources, hashable by what the documents depend on (a cache key)."""

    def __hash__(self) -> int:
        return hash(tuple((rt.key, rt.version, rt.kind, rt.namespaced, rt.status_subresource, rt.verbs) for rt in self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Served) and hash(self) == hash(other) and tuple.__eq__(self, other)


def _key(resources: Iterable[ResourceType]) -> _Served:
    return _Served(resources)


def group_versions(resources: Iterable[ResourceType]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rt in resources:
        if (rt.group, rt.version) not in out:
            out.append((rt.group, rt.version))
    return out


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def _v3(version: str, resources: tuple[ResourceType, ...], group: str, gv_version: str) -> bytes | None:
    rts = [rt for rt in resources if rt.group == group and rt.version == gv_version]
    if not rts:
        return None
    paths: dict[str, dict] = {}
    for rt in rts:
        paths.update(_operations(version, rt, v3=True))
    doc = {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": f"v{version}"}, "paths": paths,
           "components": {"schemas": _schemas(version, rts, "#/components/schemas/", True)}}
    return json.dumps(doc).encode()


def v3_group_version(version: str, resources: Iterable[ResourceType], group: str, gv_version: str) -> bytes | None:
    """``/openapi/v3/apis/<group>/<version>`` (JSON bytes), None for a group version not served."""
    return _v3(version, _key(resources), group, gv_version)


@functools.cache
def _v3_root(version: str, resources: tuple[ResourceType, ...]) -> dict:
    paths = {}
    for group, gv_version in group_versions(resources):
        digest = hashlib.sha512(_v3(version, resources, group, gv_version) or b"").hexdigest()[:128].upper()
        path = _gv_path(group, gv_version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def v3_root(version: str, resources: Iterable[ResourceType]) -> dict:
    """``/openapi/v3``: one entry per group version, with the hash of its document."""
    return _v3_root(version, _key(resources))


@functools.cache
def _v2(version: str, git_version: str, resources: tuple[ResourceType, ...]) -> dict:
    paths: dict[str, dict] = {}
    for rt in resources:
        paths.update(_operations(version, rt, v3=False))
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": git_version}, "paths": paths,
            "definitions": _schemas(version, resources, "#/definitions/", False)}


def v2(version: str, git_version: str, resources: Iterable[ResourceType]) -> dict:
    """``/openapi/v2`` as a dict (JSON; :func:`.openapi_pb.encode` makes kubectl's protobuf of it)."""
    return _v2(version, git_version, _key(resources))


@functools.cache
def _v2_pb(version: str, git_version: str, resources: _Served) -> bytes:
    return openapi_pb.encode(_v2(version, git_version, resources))


def v2_protobuf(version: str, git_version: str, resources: Iterable[ResourceType]) -> bytes:
    """``/openapi/v2`` as client-go asks for it (:mod:`.openapi_pb`)."""
    return _v2_pb(version, git_version, _key(resources))
