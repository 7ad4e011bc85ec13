"""The local API server's storage: Kubernetes REST semantics on plain dicts, with watch history.

create / get / list / update / patch / delete / deletecollection with optimistic concurrency
(``resourceVersion``), ``generateName``, finalizers, the ``status`` subresource, label and field
selectors, ``limit`` / ``continue``, ``dryRun`` and ``fieldValidation``; every write passes the
feature gates' field drops (:mod:`.featuregates`), then validation (:mod:`.validation`), and is
recorded as a watch event. No HTTP here (see :mod:`.handler`); one lock guards everything.
"""

from __future__ import annotations

import base64
import bisect
import builtins
import copy
import json
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_bridge.sim.apiserver import errors as E
from dra_bridge.sim.apiserver import managedfields as mf
from dra_bridge.sim.apiserver.errors import ApiError, FieldError
from dra_bridge.sim.apiserver.featuregates import drop_disabled
from dra_bridge.sim.apiserver.patch import APPLY_PATCH, apply_patch
from dra_bridge.sim.apiserver.rawjson import reencoded
from dra_bridge.sim.apiserver.resources import ResourceType, field_value
from dra_bridge.sim.apiserver.selectors import field_matcher, label_matcher
from dra_bridge.sim.apiserver.validation import kind_schema, resolver, validate_object

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand alphabet


@dataclass
class Event:
    rv: int
    key: str  # ResourceType.key
    type: str  # ADDED / MODIFIED / DELETED
    obj: dict
    old: dict | None = None


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: dict) -> dict:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = obj["metadata"] = {}
    return m


def _same(a: dict, b: dict) -> bool:
    """Equal but for the times in managedFields (a write that changes nothing else is no write)."""
    def untimed(o: dict) -> dict:
        m = dict(o.get("metadata") or {})
        m["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in m.get("managedFields") or []]
        return {**o, "metadata": m}
    return a == b or untimed(a) == untimed(b)


def sort_key(obj: dict) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return m.get("namespace") or "", m.get("name") or ""


def prune_unknown(obj: Any, schema: dict, resolve: Callable[[dict], dict], path: str, dropped: list[str]) -> Any:
    """Drop fields the schema does not know (fieldValidation=Ignore/Warn), recording them."""
    schema = resolve(schema)
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    if isinstance(obj, dict) and (isinstance(props, dict) or isinstance(extra, dict) or extra is False):
        out = {}
        for k, v in obj.items():
            sub_path = f"{path}.{k}" if path else k
            if isinstance(props, dict) and k in props:
                out[k] = prune_unknown(v, props[k], resolve, sub_path, dropped)
            elif isinstance(extra, dict):
                out[k] = prune_unknown(v, extra, resolve, sub_path, dropped)
            elif isinstance(props, dict) and extra is False:
                dropped.append(sub_path)
            else:
                out[k] = v
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune_unknown(v, schema["items"], resolve, f"{path}[{i}]", dropped)
                for i, v in enumerate(obj)]
    return obj


class Store:
    """The objects of every served resource, by ``ResourceType.key`` and ``(namespace, name)``."""

    def __init__(self, version: str, resources: Iterable[ResourceType], *, validate: bool,
                 field_validation: str, strict_namespaces: bool, max_history: int,
                 feature_gates: Mapping[str, bool]):
        self.version = version
        self.resources = tuple(resources)
        self.validate = validate
        self.field_validation = field_validation
        self.strict_namespaces = strict_namespaces
        self.max_history = max_history
        self.feature_gates = dict(feature_gates)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.stopping = False
        self.rv = 0
        self.compacted_rv = 0
        self.objects: dict[str, dict[tuple[str, str], dict]] = {rt.key: {} for rt in self.resources}
        self.events: list[Event] = []
        self.event_rvs: list[int] = []

    # ------------------------------------------------------------------ lookup
    def resource_type(self, resource: str) -> ResourceType:
        """Look a resource up by ``plural``, ``plural.group``, kind or singular name."""
        for rt in self.resources:
            if resource == rt.key:
                return rt
        for rt in self.resources:
            if resource in (rt.plural, rt.kind, rt.singular) or resource in rt.short_names:
                return rt
        raise KeyError(f"unknown resource {resource!r}")

    def rt_for_object(self, obj: dict) -> ResourceType:
        for rt in self.resources:
            if rt.kind == obj.get("kind") and rt.api_version == obj.get("apiVersion"):
                return rt
        raise KeyError(f"no resource for {obj.get('apiVersion')} {obj.get('kind')}")

    @staticmethod
    def object_key(rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return (namespace or "") if rt.namespaced else "", name

    def get_stored(self, rt: ResourceType, namespace: str | None, name: str) -> dict:
        obj = self.objects[rt.key].get(self.object_key(rt, namespace, name))
        if obj is None:
            raise E.not_found(rt.plural, rt.group, name)
        return obj

    def compact(self) -> None:
        with self.lock:
            self.compacted_rv = self.rv
            self.events.clear()
            self.event_rvs.clear()

    # ------------------------------------------------------------------ commit
    def commit(self, rt: ResourceType, key: tuple[str, str], new: dict | None, old: dict | None,
               etype: str) -> dict:
        """Store ``new`` (``None`` deletes), bump the resourceVersion and emit a watch event."""
        with self.cond:
            self.rv += 1
            if new is None:
                assert old is not None
                obj = copy.deepcopy(old)
                meta(obj)["resourceVersion"] = str(self.rv)
                del self.objects[rt.key][key]
            else:
                obj = new
                meta(obj)["resourceVersion"] = str(self.rv)
                self.objects[rt.key][key] = obj
            self.events.append(Event(self.rv, rt.key, etype, copy.deepcopy(obj),
                                     copy.deepcopy(old) if etype == "MODIFIED" else None))
            self.event_rvs.append(self.rv)
            if len(self.events) > self.max_history:
                drop = len(self.events) - self.max_history // 2
                self.compacted_rv = self.events[drop - 1].rv
                del self.events[:drop]
                del self.event_rvs[:drop]
            self.cond.notify_all()
            return copy.deepcopy(obj)

    # ------------------------------------------------------------------ validation
    def _drop_disabled(self, obj: dict, old: dict | None, *, status: bool) -> None:
        drop_disabled(obj, old, self.feature_gates, status=status)

    def check(self, rt: ResourceType, obj: dict, old: dict | None, query: dict,
              warnings: list[str], validate: bool = True) -> dict:
        mode = (query.get("fieldValidation") or self.field_validation or "Strict").capitalize()
        if mode not in ("Strict", "Warn", "Ignore"):
            raise E.bad_request(f'fieldValidation must be one of Strict, Warn, Ignore, got "{mode}"')
        if mode != "Strict":
            schema = kind_schema(self.version, rt.kind, rt.api_version, True)
            if schema is not None:
                dropped: list[str] = []
                obj = prune_unknown(obj, schema, resolver(self.version), "", dropped)
                if mode == "Warn":
                    warnings += [f'unknown field "{p}"' for p in dropped]
        if not (self.validate and validate):
            return obj
        errors = validate_object(obj, old, self.version, strict=True,
                                 name_is_label=(rt.kind == "Namespace" and rt.group == ""))
        if rt.immutable_spec and old is not None and obj.get("spec") != old.get("spec"):
            errors.append(FieldError("spec", "Invalid value: field is immutable"))
        if errors:
            name = (obj.get("metadata") or {}).get("name") or ""
            raise E.invalid(rt.kind, rt.group, name, errors)
        return obj

    def check_body(self, rt: ResourceType, body: Any, namespace: str | None) -> dict:
        if not isinstance(body, dict):
            raise E.bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("apiVersion") not in (None, "", rt.api_version):
            raise E.bad_request(f"the API version in the data ({obj['apiVersion']}) does not match "
                                f"the expected API version ({rt.api_version})")
        if obj.get("kind") not in (None, "", rt.kind):
            raise E.bad_request(f"the kind in the data ({obj['kind']}) does not match the expected "
                                f"kind ({rt.kind})")
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        m = meta(obj)
        if rt.namespaced:
            if m.get("namespace") and namespace and m["namespace"] != namespace:
                raise E.bad_request("the namespace of the provided object does not match the "
                                    "namespace sent on the request")
            m["namespace"] = namespace or m.get("namespace") or "default"
        else:
            m.pop("namespace", None)
        return obj

    # ------------------------------------------------------------------ verbs
    def fields(self, rt: ResourceType) -> mf.Fields:
        return mf.Fields(kind_schema(self.version, rt.kind, rt.api_version, True), resolver(self.version),
                         rt.status_subresource)

    def create(self, rt: ResourceType, namespace: str | None, body: Any, query: dict,
               warnings: list[str] | None = None, keep_status: bool = False,
               validate: bool = True, manager: str | None = None,
               managed_fields: list[dict] | None = None) -> dict:
        """``manager`` (the fieldManager) owns what it wrote (managedFields); None: not tracked,
        as for objects from before server-side apply (what :meth:`LocalApiServer.add` makes)."""
        warnings = [] if warnings is None else warnings
        obj = self.check_body(rt, body, namespace)
        m = meta(obj)
        if m.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created",
                           reason="InternalError")
        with self.lock:
            if rt.namespaced and self.strict_namespaces and \
                    ("", m["namespace"]) not in self.objects["namespaces"]:
                raise E.not_found("namespaces", "", m["namespace"])
            if not m.get("name") and m.get("generateName"):
                for _ in range(100):
                    candidate = m["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
                    if self.object_key(rt, namespace, candidate) not in self.objects[rt.key]:
                        m["name"] = candidate
                        break
            for server_set in ("uid", "creationTimestamp", "deletionTimestamp",
                               "deletionGracePeriodSeconds", "selfLink", "managedFields"):
                m.pop(server_set, None)
            m["uid"] = str(uuid.uuid4())
            m["creationTimestamp"] = now()
            if rt.has_generation:
                m["generation"] = 1
            else:
                m.pop("generation", None)
            if rt.status_subresource and rt.initial_status is not None and not keep_status:
                if rt.initial_status:
                    obj["status"] = copy.deepcopy(rt.initial_status)
                else:
                    obj.pop("status", None)
            self._drop_disabled(obj, None, status=False)
            if keep_status:
                self._drop_disabled(obj, None, status=True)
            obj = self.check(rt, obj, None, query, warnings, validate)
            if managed_fields is not None:
                meta(obj)["managedFields"] = managed_fields
            elif manager:
                meta(obj)["managedFields"] = mf.after_create(self.fields(rt), obj, manager, rt.api_version, None,
                                                             now())
            key = self.object_key(rt, meta(obj).get("namespace"), meta(obj)["name"])
            if key in self.objects[rt.key]:
                raise E.already_exists(rt.plural, rt.group, key[1])
            if query.get("dryRun"):
                return obj
            return self.commit(rt, key, obj, None, "ADDED")

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, query: dict,
               sub: str | None, warnings: list[str], manager: str | None = None,
               managed_fields: list[dict] | None = None) -> dict:
        obj = self.check_body(rt, body, namespace)
        m = meta(obj)
        if m.get("name") and m["name"] != name:
            raise E.bad_request(f"the name of the object ({m['name']}) does not match the name "
                                f"on the URL ({name})")
        m["name"] = name
        with self.lock:
            old = self.get_stored(rt, namespace, name)
            old_meta = old["metadata"]
            if m.get("resourceVersion") and m["resourceVersion"] != old_meta["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name, E.STALE)
            if m.get("uid") and m["uid"] != old_meta["uid"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: UID in precondition: {m['uid']}, "
                                 f"UID in object meta: {old_meta['uid']}")
            if sub == "status":
                new = copy.deepcopy(old)
                if "status" in obj:
                    new["status"] = obj["status"]
                else:
                    new.pop("status", None)
            else:
                new = obj
                if rt.status_subresource:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                for kept in ("uid", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation"):
                    if kept in old_meta:
                        m[kept] = old_meta[kept]
                    else:
                        m.pop(kept, None)
                m.pop("selfLink", None)
                if rt.has_generation and new.get("spec") != old.get("spec"):
                    m["generation"] = int(old_meta.get("generation") or 0) + 1
            self._drop_disabled(new, old, status=sub == "status")
            meta(new)["resourceVersion"] = old_meta["resourceVersion"]
            meta(new).pop("managedFields", None)
            new = self.check(rt, new, old, query, warnings)
            if managed_fields is None and manager:
                managed_fields = mf.after_update(self.fields(rt), old, new, manager, rt.api_version, sub, now())
            if managed_fields is None:
                managed_fields = old_meta.get("managedFields")
            if managed_fields:
                meta(new)["managedFields"] = managed_fields
            if _same(new, old):  # no-op: no new resourceVersion, no watch event
                return copy.deepcopy(old)
            if query.get("dryRun"):
                return new
            key = self.object_key(rt, namespace, name)
            if old_meta.get("deletionTimestamp") and not meta(new).get("finalizers"):
                return self.commit(rt, key, None, new, "DELETED")
            return self.commit(rt, key, new, old, "MODIFIED")

    def patch(self, rt: ResourceType, namespace: str | None, name: str, body: Any,
              content_type: str, query: dict, sub: str | None, warnings: list[str],
              manager: str | None = None) -> tuple[dict, bool]:
        """A patch, or a server-side apply (which creates a missing object); returns (object, created)."""
        is_apply = (content_type or "").split(";")[0].strip().lower() == APPLY_PATCH
        if is_apply and not query.get("fieldManager"):
            raise E.invalid("PatchOptions", "meta.k8s.io", "", [FieldError(
                "fieldManager", "Required value: is required for apply patch", reason="FieldValueRequired")])
        if not is_apply and query.get("force"):
            raise E.invalid("PatchOptions", "meta.k8s.io", "", [FieldError(
                "force", "Forbidden: may not be specified for non-apply patch", reason="FieldValueForbidden")])
        if is_apply:
            return self.apply(rt, namespace, name, body, query, sub, warnings, manager or "")
        with self.lock:
            old = self.get_stored(rt, namespace, name)
            schema = kind_schema(self.version, rt.kind, rt.api_version, True)
            patched = reencoded(rt.kind, apply_patch(copy.deepcopy(old), body, content_type, schema,
                                                     resolver(self.version)))
            if not isinstance(patched, dict):
                raise E.bad_request("the patch must produce a JSON object")
            wanted_rv = ((body.get("metadata") or {}).get("resourceVersion")
                         if isinstance(body, dict) else None)
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name, E.STALE)
            meta(patched)["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self.update(rt, namespace, name, patched, query, sub, warnings, manager), False

    def apply(self, rt: ResourceType, namespace: str | None, name: str, body: Any, query: dict,
              sub: str | None, warnings: list[str], manager: str) -> tuple[dict, bool]:
        """Server-side apply (:mod:`.managedfields`): create the object, or merge ``body`` into it."""
        config = self.check_body(rt, body, namespace)
        for what in ("apiVersion", "kind"):
            if not (body or {}).get(what):
                raise E.bad_request(f"{what} must be set in an apply configuration")
        if meta(config).get("name") not in (None, name):
            raise E.bad_request(f"the name of the object ({meta(config)['name']}) does not match the name "
                                f"on the URL ({name})")
        meta(config)["name"] = name
        force = (query.get("force") or "").lower() in ("true", "1")
        with self.lock:
            live = self.objects[rt.key].get(self.object_key(rt, namespace, name))
            if live is None and sub:
                raise E.not_found(rt.plural, rt.group, name)
            merged, entries = mf.apply(self.fields(rt), copy.deepcopy(live) if live else None, config, manager,
                                       rt.api_version, sub, force, now())
            merged = reencoded(rt.kind, merged)
            if live is None:
                return self.create(rt, namespace, merged, query, warnings, managed_fields=entries), True
            return self.update(rt, namespace, name, merged, query, sub, warnings, managed_fields=entries), False

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: Any,
               query: dict) -> dict:
        options = options if isinstance(options, dict) else {}
        pre = options.get("preconditions") or {}
        with self.lock:
            old = self.get_stored(rt, namespace, name)
            old_meta = old["metadata"]
            if pre.get("uid") and pre["uid"] != old_meta["uid"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: UID in precondition: {pre['uid']}, "
                                 f"UID in object meta: {old_meta['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != old_meta["resourceVersion"]:
                raise E.conflict(rt.plural, rt.group, name,
                                 f"Precondition failed: ResourceVersion in precondition: "
                                 f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                 f"{old_meta['resourceVersion']}")
            if query.get("dryRun") or options.get("dryRun"):
                return copy.deepcopy(old)
            key = self.object_key(rt, namespace, name)
            if old_meta.get("finalizers"):
                if old_meta.get("deletionTimestamp"):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self.commit(rt, key, new, old, "MODIFIED")
            return self.commit(rt, key, None, old, "DELETED")

    def matcher(self, rt: ResourceType, namespace: str | None, query: dict) -> Callable[[dict], bool]:
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"), rt.allowed_field_selectors, field_value)

        def match(obj: dict) -> bool:
            if rt.namespaced and namespace and (obj.get("metadata") or {}).get("namespace") != namespace:
                return False
            return labels(obj) and fields(obj)

        return match

    def list(self, rt: ResourceType, namespace: str | None, query: dict) -> dict:
        match = self.matcher(rt, namespace, query)
        with self.lock:
            items = sorted((o for o in self.objects[rt.key].values() if match(o)), key=sort_key)
            items = [copy.deepcopy(o) for o in items]
            rv = str(self.rv)
        list_meta: dict[str, Any] = {"resourceVersion": rv}
        token = query.get("continue")
        if token:
            try:
                start = tuple(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
            except Exception:
                raise E.bad_request("continue key is not valid") from None
            items = [o for o in items if sort_key(o) > start]
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = sort_key(items[limit - 1])
            list_meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "start": list(last)}).encode()).decode()
            list_meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        for item in items:  # list items carry no kind / apiVersion, as in Kubernetes
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": list_meta, "items": items}

    def deletecollection(self, rt: ResourceType, namespace: str | None, options: Any,
                         query: dict) -> tuple[dict, builtins.list[str]]:
        match = self.matcher(rt, namespace, query)
        deleted, names = [], []
        with self.lock:
            targets = sorted((o for o in self.objects[rt.key].values() if match(o)), key=sort_key)
            for obj in targets:
                m = obj["metadata"]
                deleted.append(self.delete(rt, m.get("namespace"), m["name"], options, query))
                names.append(m["name"])
            rv = str(self.rv)
        for item in deleted:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return ({"kind": rt.list_kind, "apiVersion": rt.api_version,
                 "metadata": {"resourceVersion": rv}, "items": deleted}, names)

    # ------------------------------------------------------------------ watch
    def initial_events(self, rt: ResourceType, match: Callable[[dict], bool]) -> builtins.list[dict]:
        """ADDED events for the current objects matching ``match`` (a watch from "now")."""
        items = sorted((o for o in self.objects[rt.key].values() if match(o)), key=sort_key)
        return [{"type": "ADDED", "object": copy.deepcopy(o)} for o in items]

    def watch_events(self, rt: ResourceType, after_rv: int, match: Callable[[dict], bool]) -> tuple[builtins.list[dict], int]:
        """Events for ``rt`` after ``after_rv`` as the client sees them (selector-aware)."""
        out = []
        start = bisect.bisect_right(self.event_rvs, after_rv)
        last = after_rv
        for ev in self.events[start:]:
            last = ev.rv
            if ev.key != rt.key:
                continue
            now_matches = match(ev.obj)
            if ev.type == "MODIFIED":
                before = match(ev.old) if ev.old is not None else now_matches
                etype = ("MODIFIED" if before else "ADDED") if now_matches else \
                    ("DELETED" if before else None)
            else:
                etype = ev.type if now_matches else None
            if etype:
                out.append({"type": etype, "object": copy.deepcopy(ev.obj)})
        return out, last
