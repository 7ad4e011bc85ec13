"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a
schema-guided strategic merge patch.

The strategic merge patch follows the OpenAPI ``x-kubernetes-patch-strategy`` /
``x-kubernetes-patch-merge-key`` annotations of the server version's schema (lists
with strategy ``merge`` are merged by their key, e.g. ``status.reservedFor`` by
``uid``; ``finalizers`` are unioned; every other list is replaced) and honours the
``$patch: replace|delete``, ``$deleteFromPrimitiveList/<f>``, ``$retainKeys`` and
``$setElementOrder/<f>`` directives (the last one only for stripping).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dra_bridge.sim.apiserver.errors import ApiError, bad_request

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# resolve(schema) -> schema with $ref / single allOf followed
Resolver = Callable[[dict], dict]


# --------------------------------------------------------------------------- merge patch
def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --------------------------------------------------------------------------- JSON patch
def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise _patch_failed(f"path {path!r} does not exist")
    return cur


def _patch_failed(why: str) -> ApiError:
    return ApiError(422, f"the server rejected our request due to an error in our request: {why}",
                    reason="Invalid")


def _get(doc: Any, path: str) -> Any:
    return _container(doc, _pointer(path), path)


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise _patch_failed("cannot remove the whole document")
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise _patch_failed(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _patch_failed(f"path {path!r} does not exist")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise _patch_failed(f"path {path!r} is out of range")
    else:
        raise _patch_failed(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            if path == "":
                doc = copy.deepcopy(op.get("value"))
            else:
                doc = _add(doc, path, op.get("value"), replace=True)
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, _get(doc, op["from"]))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _patch_failed(f"testing value {path} failed")
        else:
            raise bad_request(f"unknown JSON patch operation {kind!r}")
    return doc


# --------------------------------------------------------------------------- strategic merge
_DIRECTIVE_PREFIXES = ("$setElementOrder/", "$deleteFromPrimitiveList/")


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if k not in ("$patch", "$retainKeys") and not k.startswith(_DIRECTIVE_PREFIXES)
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and v.get("$patch"))]
    return value


def _child(schema: dict, key: str, resolve: Resolver) -> dict:
    schema = resolve(schema)
    props = schema.get("properties") or {}
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def _merge_list(orig: list, patch: list, schema: dict, resolve: Resolver) -> list:
    strategy = (schema.get("x-kubernetes-patch-strategy") or "").split(",")
    merge_key = schema.get("x-kubernetes-patch-merge-key")
    items_schema = schema.get("items") or {}
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if "merge" not in strategy:
        return [_strip_directives(p) for p in patch]
    result = copy.deepcopy(orig)
    if not merge_key:  # list of primitives: union
        for p in patch:
            if p not in result:
                result.append(copy.deepcopy(p))
        return result
    for p in patch:
        if not isinstance(p, dict) or merge_key not in p:
            raise bad_request(f"map in a merge-by-{merge_key} list lacks the key: {p!r}")
        idx = next((i for i, o in enumerate(result)
                    if isinstance(o, dict) and o.get(merge_key) == p[merge_key]), None)
        if p.get("$patch") == "delete":
            if idx is not None:
                result.pop(idx)
            continue
        if idx is None:
            result.append(_strip_directives(p))
        else:
            result[idx] = strategic_merge_patch(result[idx], p, items_schema, resolve)
    return result


def strategic_merge_patch(orig: Any, patch: Any, schema: dict, resolve: Resolver) -> Any:
    if not isinstance(patch, dict) or not isinstance(orig, dict):
        return _strip_directives(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return None
    result = copy.deepcopy(orig)
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            fld = key.split("/", 1)[1]
            if isinstance(result.get(fld), list):
                result[fld] = [x for x in result[fld] if x not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = _child(schema, key, resolve)
        if isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, resolve(sub), resolve)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            merged = strategic_merge_patch(result[key], value, sub, resolve)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = _strip_directives(value)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def apply_patch(target: dict, body: Any, content_type: str, schema: dict | None,
                resolve: Resolver) -> Any:
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == JSON_PATCH:
        return json_patch(target, body)
    if ctype == MERGE_PATCH:
        if not isinstance(body, dict):
            raise bad_request("a merge patch must be a JSON object")
        return merge_patch(target, body)
    if ctype == STRATEGIC_MERGE_PATCH:
        if not isinstance(body, dict):
            raise bad_request("a strategic merge patch must be a JSON object")
        if schema is None:
            return merge_patch(target, _strip_directives(body))
        return strategic_merge_patch(target, body, schema, resolve)
    raise ApiError(415, f"the body of the request was in an unknown format - accepted media types "
                        f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}",
                   reason="UnsupportedMediaType")
