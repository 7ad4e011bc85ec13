"""Server-side printing: ``meta.k8s.io/v1 Table`` answers, as kube-apiserver gives ``kubectl get``.

kubectl asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the columns
the server defines; without a table it could show names only. The columns and cells follow
kube-apiserver's printers (``pkg/printers/internalversion/printers.go``), written here apart:
columns of priority 1 are what ``-o wide`` adds. Kinds without a printer get the default table
(Name, Created At), as upstream. ``as=PartialObjectMetadata[List]`` (the metadata-only client)
is answered too.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dra_bridge.sim.apiserver.resources import ResourceType

META = "meta.k8s.io"
_NAME_DOC = "Name must be unique within a namespace."
_AGE_DOC = "CreationTimestamp is a timestamp representing the server time when this object was created."


def negotiate(accept: str) -> tuple[str, str] | None:
    """The ``(as, version)`` of the first ``meta.k8s.io`` form in an Accept header, else None (plain JSON)."""
    for clause in (accept or "").split(","):
        params = dict(p.strip().split("=", 1) for p in clause.split(";")[1:] if "=" in p)
        if params.get("g") == META and params.get("as") in (
                "Table", "PartialObjectMetadata", "PartialObjectMetadataList"):
            return params["as"], params.get("v", "v1")
        if clause.split(";")[0].strip() in ("application/json", "*/*", "application/*"):
            return None
    return None


# ------------------------------------------------------------------ cells
def human_duration(seconds: float) -> str:
    """How kubectl shows an age: ``45s``, ``3m20s``, ``4h12m``, ``2d5h``, ``1y30d``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def age(obj: dict, now: datetime | None = None) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration(((now or datetime.now(UTC)) - then).total_seconds())


def _get(obj: Any, path: str, default: Any = None) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or obj.get(part) is None:
            return default
        obj = obj[part]
    return obj


def _or_none(value: Any) -> Any:
    return "<none>" if value in (None, "", [], {}) else value


def _labels(selector: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((selector or {}).items())) or "<none>"


# ------------------------------------------------------------------ printers, per kind
def _claim_state(obj: dict) -> str:
    states = []
    deleted = bool(_get(obj, "metadata.deletionTimestamp"))
    if deleted:
        states.append("deleted")
    if _get(obj, "status.allocation") is None:
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if _get(obj, "status.reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _node_status(obj: dict) -> str:
    ready = [c for c in _get(obj, "status.conditions", []) if c.get("type") == "Ready"]
    status = ["Ready" if ready[-1].get("status") == "True" else "NotReady"] if ready else ["Unknown"]
    if _get(obj, "spec.unschedulable"):
        status.append("SchedulingDisabled")
    return ",".join(status)


def _node_roles(obj: dict) -> str:
    roles = set()
    for key, value in (_get(obj, "metadata.labels", {})).items():
        if key.startswith("node-role.kubernetes.io/") and key.split("/", 1)[1]:
            roles.add(key.split("/", 1)[1])
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _address(obj: dict, kind: str) -> str:
    return next((a["address"] for a in _get(obj, "status.addresses", []) if a.get("type") == kind), "<none>")


def _pod_cells(obj: dict) -> list:
    statuses = _get(obj, "status.containerStatuses", [])
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = _get(obj, "status.reason") or _get(obj, "status.phase", "")
    for c in statuses:
        waiting = _get(c, "state.waiting.reason") or _get(c, "state.terminated.reason")
        if waiting:
            reason = waiting
    if _get(obj, "metadata.deletionTimestamp") and reason not in ("Succeeded", "Failed"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [f"{ready}/{len(_get(obj, 'spec.containers', []))}", reason, restarts]


def _event_object(obj: dict) -> str:
    ref = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{(ref.get('kind') or '').lower()}/{ref.get('name', '')}"


def _event_seen(obj: dict, *fields: str) -> str:
    for f in fields:
        ts = _get(obj, f)
        if ts:
            then = datetime.fromisoformat(ts.replace("Z", "+00:00"))
            return human_duration((datetime.now(UTC) - then).total_seconds())
    return "<unknown>"


def _binding_subjects(obj: dict, kind: str) -> str:
    names = [(f"{s['namespace']}/{s['name']}" if kind == "ServiceAccount" else s["name"])
             for s in obj.get("subjects") or [] if s.get("kind") == kind]
    return ", ".join(names)


def _param_kind(obj: dict) -> str:
    pk = _get(obj, "spec.paramKind")
    return f"{pk.get('apiVersion')}/{pk.get('kind')}" if pk else "<unset>"


def _param_ref(obj: dict) -> str:
    ref = _get(obj, "spec.paramRef")
    if not ref:
        return "<unset>"
    if ref.get("name"):
        return f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
    return "*/*"


Column = tuple[str, str, int]  # name, type, priority (1: -o wide only)
Printer = tuple[tuple[Column, ...], Callable[[dict], list]]

_S, _I = "string", "integer"
PRINTERS: dict[tuple[str, str], Printer] = {
    ("resource.k8s.io", "ResourceSlice"): (
        (("Node", _S, 0), ("Driver", _S, 0), ("Pool", _S, 0), ("Age", _S, 0)),
        lambda o: [_get(o, "spec.nodeName", ""), _get(o, "spec.driver", ""), _get(o, "spec.pool.name", ""), age(o)]),
    ("resource.k8s.io", "DeviceClass"): ((("Age", _S, 0),), lambda o: [age(o)]),
    ("resource.k8s.io", "ResourceClaim"): (
        (("State", _S, 0), ("Age", _S, 0)), lambda o: [_claim_state(o), age(o)]),
    ("resource.k8s.io", "ResourceClaimTemplate"): ((("Age", _S, 0),), lambda o: [age(o)]),
    ("", "Node"): (
        (("Status", _S, 0), ("Roles", _S, 0), ("Age", _S, 0), ("Version", _S, 0), ("Internal-IP", _S, 1),
         ("External-IP", _S, 1), ("OS-Image", _S, 1), ("Kernel-Version", _S, 1), ("Container-Runtime", _S, 1)),
        lambda o: [_node_status(o), _node_roles(o), age(o), _get(o, "status.nodeInfo.kubeletVersion", ""),
                   _address(o, "InternalIP"), _address(o, "ExternalIP"),
                   _get(o, "status.nodeInfo.osImage", "<unknown>"), _get(o, "status.nodeInfo.kernelVersion", "<unknown>"),
                   _get(o, "status.nodeInfo.containerRuntimeVersion", "<unknown>")]),
    ("", "Namespace"): (
        (("Status", _S, 0), ("Age", _S, 0)), lambda o: [_get(o, "status.phase", ""), age(o)]),
    ("", "Pod"): (
        (("Ready", _S, 0), ("Status", _S, 0), ("Restarts", _S, 0), ("Age", _S, 0), ("IP", _S, 1), ("Node", _S, 1),
         ("Nominated Node", _S, 1), ("Readiness Gates", _S, 1)),
        lambda o: [*_pod_cells(o), age(o), _or_none(_get(o, "status.podIP")), _or_none(_get(o, "spec.nodeName")),
                   _or_none(_get(o, "status.nominatedNodeName")), "<none>"]),
    ("", "Event"): (
        (("Last Seen", _S, 0), ("Type", _S, 0), ("Reason", _S, 0), ("Object", _S, 0), ("Subobject", _S, 1),
         ("Source", _S, 1), ("Message", _S, 0), ("First Seen", _S, 1), ("Count", _S, 1), ("Name", _S, 1)),
        lambda o: [_event_seen(o, "lastTimestamp", "eventTime", "metadata.creationTimestamp"), o.get("type", ""),
                   o.get("reason", ""), _event_object(o), _get(o, "involvedObject.fieldPath", ""),
                   _get(o, "source.component", "") or o.get("reportingComponent", ""), o.get("message", ""),
                   _event_seen(o, "firstTimestamp", "eventTime", "metadata.creationTimestamp"), o.get("count") or 1,
                   _get(o, "metadata.name", "")]),
    ("", "ServiceAccount"): (
        (("Secrets", _I, 0), ("Age", _S, 0)), lambda o: [len(o.get("secrets") or []), age(o)]),
    ("", "ConfigMap"): (
        (("Data", _I, 0), ("Age", _S, 0)),
        lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {}), age(o)]),
    ("rbac.authorization.k8s.io", "ClusterRole"): (
        (("Created At", "date", 0),), lambda o: [_get(o, "metadata.creationTimestamp", "")]),
    ("rbac.authorization.k8s.io", "Role"): (
        (("Created At", "date", 0),), lambda o: [_get(o, "metadata.creationTimestamp", "")]),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): (
        (("Role", _S, 0), ("Age", _S, 0), ("Users", _S, 1), ("Groups", _S, 1), ("ServiceAccounts", _S, 1)),
        lambda o: [f"{_get(o, 'roleRef.kind', '')}/{_get(o, 'roleRef.name', '')}", age(o), _binding_subjects(o, "User"),
                   _binding_subjects(o, "Group"), _binding_subjects(o, "ServiceAccount")]),
    ("rbac.authorization.k8s.io", "RoleBinding"): (
        (("Role", _S, 0), ("Age", _S, 0), ("Users", _S, 1), ("Groups", _S, 1), ("ServiceAccounts", _S, 1)),
        lambda o: [f"{_get(o, 'roleRef.kind', '')}/{_get(o, 'roleRef.name', '')}", age(o), _binding_subjects(o, "User"),
                   _binding_subjects(o, "Group"), _binding_subjects(o, "ServiceAccount")]),
    ("apps", "DaemonSet"): (
        (("Desired", _I, 0), ("Current", _I, 0), ("Ready", _I, 0), ("Up-to-date", _I, 0), ("Available", _I, 0),
         ("Node Selector", _S, 0), ("Age", _S, 0), ("Containers", _S, 1), ("Images", _S, 1), ("Selector", _S, 1)),
        lambda o: [_get(o, "status.desiredNumberScheduled", 0), _get(o, "status.currentNumberScheduled", 0),
                   _get(o, "status.numberReady", 0), _get(o, "status.updatedNumberScheduled", 0),
                   _get(o, "status.numberAvailable", 0), _labels(_get(o, "spec.template.spec.nodeSelector")), age(o),
                   ",".join(c.get("name", "") for c in _get(o, "spec.template.spec.containers", [])),
                   ",".join(c.get("image", "") for c in _get(o, "spec.template.spec.containers", [])),
                   _labels(_get(o, "spec.selector.matchLabels"))]),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"): (
        (("Validations", _I, 0), ("ParamKind", _S, 0), ("Age", _S, 0)),
        lambda o: [len(_get(o, "spec.validations", [])), _param_kind(o), age(o)]),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"): (
        (("PolicyName", _S, 0), ("ParamRef", _S, 0), ("Age", _S, 0)),
        lambda o: [_get(o, "spec.policyName", ""), _param_ref(o), age(o)]),
}
PRINTERS[("events.k8s.io", "Event")] = PRINTERS[("", "Event")]
DEFAULT_PRINTER: Printer = ((("Created At", "date", 0),), lambda o: [_get(o, "metadata.creationTimestamp", "")])


def columns(rt: ResourceType) -> list[dict]:
    """The column definitions of ``rt``'s table, Name first."""
    cols, _ = PRINTERS.get((rt.group, rt.kind), DEFAULT_PRINTER)
    out = [{"name": "Name", "type": "string", "format": "name", "description": _NAME_DOC, "priority": 0}]
    for name, typ, priority in cols:
        out.append({"name": name, "type": typ, "format": "",
                    "description": _AGE_DOC if name in ("Age", "Created At") else name, "priority": priority})
    return out


def partial(obj: dict, version: str = "v1") -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": f"{META}/{version}",
            "metadata": obj.get("metadata") or {}}


def row(rt: ResourceType, obj: dict, include: str = "PartialObjectMetadata") -> dict:
    _, cells = PRINTERS.get((rt.group, rt.kind), DEFAULT_PRINTER)
    out: dict[str, Any] = {"cells": [_get(obj, "metadata.name", ""), *cells(obj)]}
    if include == "Object":
        out["object"] = {"apiVersion": rt.api_version, "kind": rt.kind, **obj}
    elif include != "None":
        out["object"] = partial(obj)
    return out


def table(rt: ResourceType, objs: list[dict], list_meta: dict, *, include: str = "PartialObjectMetadata",
          version: str = "v1") -> dict:
    """A ``Table`` of ``objs`` (``include``: the ``includeObject`` query parameter)."""
    return {"kind": "Table", "apiVersion": f"{META}/{version}", "metadata": list_meta,
            "columnDefinitions": columns(rt), "rows": [row(rt, o, include or "PartialObjectMetadata") for o in objs]}


def convert(rt: ResourceType, body: dict, form: tuple[str, str], query: dict) -> dict:
    """The answer to a get or list (``body``: the object or the list) in the negotiated form."""
    kind, version = form
    is_list = body.get("kind", "").endswith("List") and "items" in body
    items = body["items"] if is_list else [body]
    list_meta = dict(body["metadata"]) if is_list else \
        {"resourceVersion": _get(body, "metadata.resourceVersion", "")}
    if kind == "Table":
        return table(rt, items, list_meta, include=query.get("includeObject") or "PartialObjectMetadata",
                     version=version)
    if kind == "PartialObjectMetadataList" or is_list:
        return {"kind": "PartialObjectMetadataList", "apiVersion": f"{META}/{version}", "metadata": list_meta,
                "items": [partial(o, version) for o in items]}
    return partial(body, version)
