"""Field ownership (``metadata.managedFields``) and server-side apply, as kube-apiserver keeps them.

A field set is a dict from a path (a tuple of ``f:<field>``, ``k:<keys as JSON>``, ``v:<value as
JSON>`` elements, the FieldsV1 vocabulary) to the value there; lists are walked by the schema's
``x-kubernetes-list-type`` (``map`` by its keys, ``set`` by value, else atomic) or, where a list
has none, by its strategic-merge-patch key, as kube-openapi converts them. Writes by
create / update / patch give their manager the fields they changed (operation ``Update``; an
object that has no managedFields is not tracked by them, as upstream); an apply
(``application/apply-patch+yaml``) makes the applier own exactly the fields it sent, removes the
fields it sent before and no longer does (unless another manager owns them), and answers 409
with upstream's wording when it would change a field another manager owns, unless forced.

Simplified: no cap on the number of Update managers, no conversion between API versions, no
use of ``kubectl.kubernetes.io/last-applied-configuration`` when switching from client-side apply.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection
from typing import Any

from dra_bridge.sim.apiserver.errors import ApiError

Path = tuple[str, ...]
Resolver = Callable[[dict], dict]
_ITEM = object()  # the value recorded for a list item's own membership (".")
# what no manager owns (the field manager strips it before comparing)
_STRIPPED_META = ("name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields",
                  "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def list_kind(schema: dict) -> tuple[str, list[str]]:
    """``("map", keys)``, ``("set", [])`` or ``("atomic", [])`` for a list's schema."""
    kind = schema.get("x-kubernetes-list-type")
    if kind == "map":
        return "map", list(schema.get("x-kubernetes-list-map-keys") or [])
    if kind in ("set", "atomic"):
        return kind, []
    if "merge" in (schema.get("x-kubernetes-patch-strategy") or "").split(","):
        key = schema.get("x-kubernetes-patch-merge-key")
        return ("map", [key]) if key else ("set", [])
    return "atomic", []


class Fields:
    """The schema-guided field walk of one kind (``schema``: its top-level schema; None: every list atomic)."""

    def __init__(self, schema: dict | None, resolve: Resolver, status_subresource: bool):
        self.schema = schema or {}
        self.resolve = resolve
        self.status_subresource = status_subresource

    def child(self, schema: dict, key: str) -> dict:
        schema = self.resolve(schema)
        props = schema.get("properties") or {}
        if key in props:
            return props[key]
        extra = schema.get("additionalProperties")
        return extra if isinstance(extra, dict) else {}

    @staticmethod
    def item_key(item: Any, keys: list[str]) -> str:
        return "k:" + _compact({k: item[k] for k in keys if isinstance(item, dict) and k in item})

    # ---------------------------------------------------------------- object -> field set
    def of(self, obj: dict, sub: str | None = None) -> dict[Path, Any]:
        """The fields of ``obj`` a manager can own (``sub``: the subresource written, None: the main
        one, ``"*"``: both)."""
        out: dict[Path, Any] = {}
        for key, value in (obj or {}).items():
            if key in ("apiVersion", "kind"):
                continue
            if self.status_subresource and sub != "*" and (key == "status") != (sub == "status"):
                continue
            if key == "metadata" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in _STRIPPED_META}
                if not value:
                    continue
            self._walk(value, self.child(self.schema, key), (f"f:{key}",), out)
        return out

    def _walk(self, value: Any, schema: dict, path: Path, out: dict[Path, Any]) -> None:
        schema = self.resolve(schema)
        if isinstance(value, dict) and value and schema.get("x-kubernetes-map-type") != "atomic":
            for k, v in value.items():
                self._walk(v, self.child(schema, k), path + (f"f:{k}",), out)
            return
        if isinstance(value, list) and value:
            kind, keys = list_kind(schema)
            items = schema.get("items") or {}
            if kind == "map" and all(isinstance(i, dict) for i in value):
                for item in value:
                    p = path + (self.item_key(item, keys),)
                    out[p] = _ITEM
                    for k, v in item.items():
                        self._walk(v, self.child(items, k), p + (f"f:{k}",), out)
                return
            if kind == "set":
                for item in value:
                    out[path + ("v:" + _compact(item),)] = item
                return
        out[path] = value

    # ---------------------------------------------------------------- apply's merge and removal
    def merge(self, live: Any, config: Any, schema: dict) -> Any:
        schema = self.resolve(schema)
        if isinstance(live, dict) and isinstance(config, dict) and schema.get("x-kubernetes-map-type") != "atomic":
            out = dict(live)
            for k, v in config.items():
                out[k] = self.merge(live[k], v, self.child(schema, k)) if k in live else copy.deepcopy(v)
            return out
        if isinstance(live, list) and isinstance(config, list):
            kind, keys = list_kind(schema)
            if kind == "map" and all(isinstance(i, dict) for i in live + config):
                items = list(live)
                where = {self.item_key(i, keys): n for n, i in enumerate(items)}
                for item in config:
                    n = where.get(self.item_key(item, keys))
                    if n is None:
                        items.append(copy.deepcopy(item))
                    else:
                        items[n] = self.merge(items[n], item, schema.get("items") or {})
                return items
            if kind == "set":
                return live + [copy.deepcopy(i) for i in config if i not in live]
        return copy.deepcopy(config)

    def remove(self, obj: Any, path: Path) -> None:
        """Remove the field or list item at ``path`` from ``obj`` (in place; absent: nothing)."""
        parent, last = obj, path[-1]
        for element in path[:-1]:
            parent = self._step(parent, element)
            if parent is None:
                return
        if isinstance(parent, dict) and last.startswith("f:"):
            parent.pop(last[2:], None)
        elif isinstance(parent, list):
            hit = self._find(parent, last)
            if hit is not None:
                parent.pop(hit)

    def _step(self, value: Any, element: str) -> Any:
        if isinstance(value, dict) and element.startswith("f:"):
            return value.get(element[2:])
        if isinstance(value, list):
            hit = self._find(value, element)
            return value[hit] if hit is not None else None
        return None

    def _find(self, items: list, element: str) -> int | None:
        if element.startswith("k:"):
            keys = json.loads(element[2:])
            return next((n for n, i in enumerate(items)
                         if isinstance(i, dict) and all(i.get(k) == v for k, v in keys.items())), None)
        if element.startswith("v:"):
            value = json.loads(element[2:])
            return next((n for n, i in enumerate(items) if i == value), None)
        return None


# ------------------------------------------------------------------ FieldsV1 and entries
def to_fields_v1(paths: Collection[Path]) -> dict:
    """The FieldsV1 trie of a set of paths (``"."`` marks a member that also has children)."""
    root: dict = {}
    for path in paths:
        node = root
        for element in path:
            node = node.setdefault(element, {})
    for path in paths:
        node = root
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return root


def from_fields_v1(trie: dict, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in (trie or {}).items():
        if key == ".":
            continue
        path = prefix + (key,)
        if not sub or "." in sub:
            out.add(path)
        out |= from_fields_v1(sub, path)
    return out


def path_string(path: Path) -> str:
    """A path as the conflict messages print it: ``.spec.containers[name="agent"].image``."""
    out = ""
    for element in path:
        kind, text = element[:2], element[2:]
        if kind == "f:":
            out += f".{text}"
        elif kind == "k:":
            keys = json.loads(text)
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
        elif kind == "v:":
            out += f"[={text}]"
        else:
            out += f"[{text}]"
    return out


def _identity(entry: dict) -> tuple:
    return (entry.get("manager"), entry.get("operation"), entry.get("subresource", ""),
            "" if entry.get("operation") == "Apply" else entry.get("apiVersion"))


def _printed(entry: dict) -> str:
    out = json.dumps(entry.get("manager", ""))
    if entry.get("subresource"):
        out += f" with subresource {json.dumps(entry['subresource'])}"
    if entry.get("operation") == "Update":
        out += f" using {entry.get('apiVersion')}"
    return out


def _entry(manager: str, operation: str, api_version: str, sub: str | None, paths: Collection[Path], now: str) -> dict:
    e = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
    if sub:
        e["subresource"] = sub
    return e


def _sorted(entries: list[dict]) -> list[dict]:
    return sorted((e for e in entries if e.get("fieldsV1")),
                  key=lambda e: (e.get("operation", ""), e.get("time", ""), e.get("manager", ""),
                                 e.get("apiVersion", ""), e.get("subresource", "")))


def _owned(entries: list[dict]) -> list[tuple[dict, set[Path]]]:
    return [(e, from_fields_v1(e.get("fieldsV1") or {})) for e in entries]


def _changed(old: dict[Path, Any], new: dict[Path, Any]) -> set[Path]:
    return {p for p, v in new.items() if p not in old or old[p] != v} | (set(old) - set(new))


def _rebuild(owned: list[tuple[dict, set[Path]]], present: dict[Path, Any], now_entry: dict | None) -> list[dict]:
    out = []
    for e, paths in owned:
        kept = {p for p in paths if p in present}
        if kept:
            out.append({**e, "fieldsV1": to_fields_v1(kept)})
    if now_entry is not None:
        out.append(now_entry)
    return _sorted(out)


def after_create(f: Fields, new: dict, manager: str, api_version: str, sub: str | None, now: str) -> list[dict]:
    return _sorted([_entry(manager, "Update", api_version, sub, f.of(new, sub), now)])


def after_update(f: Fields, old: dict, new: dict, manager: str, api_version: str, sub: str | None,
                 now: str) -> list[dict] | None:
    """The managedFields after ``manager`` changed ``old`` into ``new``; None: not tracked (old had none)."""
    entries = (old.get("metadata") or {}).get("managedFields") or []
    if not entries:
        return None
    before, after = f.of(old, sub), f.of(new, sub)
    changed = {p for p in _changed(before, after) if p in after}
    me = {"manager": manager, "operation": "Update", "apiVersion": api_version, "subresource": sub or ""}
    owned, mine = [], set()
    for e, paths in _owned(entries):
        if _identity(e) == _identity(me):
            mine = paths
        else:
            owned.append((e, paths - changed))
    present = f.of(new, "*")
    mine = (mine | changed) & set(present)
    entry = _entry(manager, "Update", api_version, sub, mine, now) if mine else None
    return _rebuild(owned, present, entry)


def conflict(conflicts: list[tuple[dict, Path]]) -> ApiError:
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {_printed(e)}", "field": path_string(p)}
              for e, p in conflicts]
    if len(conflicts) == 1:
        (e, p), = conflicts
        message = f"Apply failed with 1 conflict: conflict with {_printed(e)}: {path_string(p)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for e, p in conflicts:
            by_manager.setdefault(_printed(e), []).append(path_string(p))
        lines = []
        for who in sorted(by_manager):
            lines.append(f"conflicts with {who}:")
            lines += [f"- {p}" for p in by_manager[who]]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, message, reason="Conflict", details={"causes": causes})


def apply(f: Fields, live: dict | None, config: dict, manager: str, api_version: str, sub: str | None,
          force: bool, now: str) -> tuple[dict, list[dict]]:
    """Server-side apply of ``config`` by ``manager`` onto ``live`` (None: the object is created).

    Returns the object to store and its managedFields; raises the 409 of a conflict unless ``force``.
    """
    sent = f.of(config, sub)
    if live is None:
        return copy.deepcopy(config), _sorted([_entry(manager, "Apply", api_version, sub, sent, now)])
    entries = (live.get("metadata") or {}).get("managedFields") or []
    if not entries:  # an object no manager tracked yet: what it holds belongs to "before-first-apply"
        entries = [_entry("before-first-apply", "Update", api_version, None, f.of(live), now)]
    me = {"manager": manager, "operation": "Apply", "subresource": sub or ""}
    others, before = [], set()
    for e, paths in _owned(entries):
        if _identity(e) == _identity(me):
            before = paths
        else:
            others.append((e, paths))
    body = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
    if isinstance(body.get("metadata"), dict):
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in _STRIPPED_META}
    if f.status_subresource:
        body = {k: v for k, v in body.items() if (k == "status") == (sub == "status") or k == "metadata"}
    merged = f.merge(live, body, f.schema)
    others_own = set().union(*(paths for _, paths in others)) if others else set()
    for path in sorted(before - set(sent), key=len):  # a list item before its fields (found by its keys)
        if not any(o[:len(path)] == path for o in others_own):
            f.remove(merged, path)
    changed = _changed(f.of(live, sub), f.of(merged, sub)) & set(sent)
    clashes = [(e, p) for e, paths in others for p in sorted(paths & changed)]
    if clashes and not force:
        raise conflict(clashes)
    others = [(e, paths - changed) for e, paths in others]
    present = f.of(merged, "*")
    return merged, _rebuild(others, present, _entry(manager, "Apply", api_version, sub, sent, now))
