"""What kube-apiserver drops on write when a feature gate is off (its strategies' dropDisabledFields).

Each rule names a gate, says whether an object already uses the gate's fields ("in use") and
removes them. The rule for updates is upstream's: a disabled gate's fields are dropped from the
new object unless the *old* object already used that feature anywhere (so an unrelated update
never strips what was stored before the gate was turned off). On create there is no old object.

Sources (kubernetes/kubernetes):

* ResourceSlice: ``pkg/registry/resource/resourceslice/strategy.go`` ``dropDisabledFields``
  (DRADeviceTaints, DRAPartitionableDevices, DRADeviceBindingConditions with
  DRAResourceClaimDeviceStatus, DRAConsumableCapacity, DRANodeAllocatableResources,
  DRAListTypeAttributes, and ``partitionTypeAttribute``). Not in the indexed source, from the
  KEPs: ``consumesCounters[].compatibilityGroups`` (DRADeviceCompatibilityGroups, KEP-5963, also
  ``test/integration/dra`` "FieldDroppedWhenDisabled") and ``spec.skipNodeOperations``
  (DRAOptionalNodeOperations, KEP-5945). ``partitionTypeAttribute`` follows the 1.37 gate
  DRAPartitionableDevicesType (a 1.36 pre-release strategy gated it by DRAResourcePoolStatus).
* ResourceClaim / ResourceClaimTemplate spec: ``pkg/api/resourceclaimspec/util.go``
  ``DropDisabledFields`` (DRAPrioritizedList, DRADeviceTaints, DRAAdminAccess,
  DRAConsumableCapacity); DRADerivedAttributes from ``resourceclaim/strategy_test.go`` (1.37).
* ResourceClaim status: ``pkg/registry/resource/resourceclaim/strategy.go``
  ``dropDisabledStatusFields`` (DRAResourceClaimDeviceStatus, DRAAdminAccess,
  DRAConsumableCapacity, DRADeviceBindingConditions); ``results[].skipNodeOperations`` from KEP-5945.
* DeviceClass: ``pkg/registry/resource/deviceclass/strategy.go`` (DRAExtendedResource).

Fields are those of the ``resource.k8s.io/v1`` schemas (kubernetes-validate 1.34 .. 1.37). The
input may be ill-typed (validation runs after this, as upstream): every access tolerates it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

Enabled = Callable[[str], bool]


class Dropped(NamedTuple):
    """One field removed: the (first disabled) gate it belongs to and its path in the object."""

    gate: str
    path: str


# ------------------------------------------------------------------ tolerant access
def _d(obj: Any, key: str) -> dict:
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, dict) else {}


def _l(obj: Any, key: str) -> list:
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, list) else []


def _set(obj: Any, key: str) -> bool:
    """Go's ``!= nil`` for pointers and ``len() > 0`` for lists, on the JSON form."""
    if not isinstance(obj, dict) or obj.get(key) is None:
        return False
    return obj[key] != []


def _pop(obj: Any, key: str, path: str, dropped: list[str]) -> None:
    if isinstance(obj, dict) and key in obj:
        if obj.pop(key) is not None:
            dropped.append(path)


def _indexed(items: list, path: str) -> Iterator[tuple[dict, str]]:
    for i, item in enumerate(items):
        if isinstance(item, dict):
            yield item, f"{path}[{i}]"


def _keyed(items: dict, path: str) -> Iterator[tuple[dict, str]]:
    for k, item in items.items():
        if isinstance(item, dict):
            yield item, f"{path}[{k}]"


# ------------------------------------------------------------------ ResourceSlice
def _devices(obj: dict) -> Iterator[tuple[dict, str]]:
    return _indexed(_l(_d(obj, "spec"), "devices"), "spec.devices")


def _consumptions(obj: dict) -> Iterator[tuple[dict, str]]:
    for dev, path in _devices(obj):
        yield from _indexed(_l(dev, "consumesCounters"), f"{path}.consumesCounters")


DEVICE_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes")
BINDING_FIELDS = ("bindingConditions", "bindingFailureConditions", "bindsToNode")
LIST_ATTRIBUTE_FIELDS = ("bools", "ints", "strings", "versions")
# 1.36 named it nodeAllocatableResourceMappings, 1.37 nodeAllocatableResources
NODE_ALLOCATABLE_FIELDS = ("nodeAllocatableResourceMappings", "nodeAllocatableResources")


def _slice_taints_in_use(obj: dict) -> bool:
    return any(_set(dev, "taints") for dev, _ in _devices(obj))


def _slice_drop_taints(obj: dict, out: list[str]) -> None:
    for dev, path in _devices(obj):
        _pop(dev, "taints", f"{path}.taints", out)


def _partitionable_in_use(obj: dict) -> bool:
    spec = _d(obj, "spec")
    if _set(spec, "sharedCounters") or _set(spec, "perDeviceNodeSelection"):
        return True
    return any(_set(dev, f) for dev, _ in _devices(obj) for f in ("consumesCounters",) + DEVICE_NODE_FIELDS)


def _drop_partitionable(obj: dict, out: list[str]) -> None:
    spec = _d(obj, "spec")
    _pop(spec, "sharedCounters", "spec.sharedCounters", out)
    _pop(spec, "perDeviceNodeSelection", "spec.perDeviceNodeSelection", out)
    for dev, path in _devices(obj):
        for f in ("consumesCounters",) + DEVICE_NODE_FIELDS:
            _pop(dev, f, f"{path}.{f}", out)


def _binding_in_use(obj: dict) -> bool:
    return any(_set(dev, f) for dev, _ in _devices(obj) for f in BINDING_FIELDS)


def _drop_binding(obj: dict, out: list[str]) -> None:
    for dev, path in _devices(obj):
        for f in BINDING_FIELDS:
            _pop(dev, f, f"{path}.{f}", out)


def _slice_consumable_in_use(obj: dict) -> bool:
    for dev, path in _devices(obj):
        if _set(dev, "allowMultipleAllocations"):
            return True
        if any(_set(cap, "requestPolicy") for cap, _ in _keyed(_d(dev, "capacity"), path)):
            return True
    return False


def _slice_drop_consumable(obj: dict, out: list[str]) -> None:
    for dev, path in _devices(obj):
        _pop(dev, "allowMultipleAllocations", f"{path}.allowMultipleAllocations", out)
        for cap, cpath in _keyed(_d(dev, "capacity"), f"{path}.capacity"):
            _pop(cap, "requestPolicy", f"{cpath}.requestPolicy", out)


def _node_allocatable_in_use(obj: dict) -> bool:
    return any(_set(dev, f) for dev, _ in _devices(obj) for f in NODE_ALLOCATABLE_FIELDS)


def _drop_node_allocatable(obj: dict, out: list[str]) -> None:
    for dev, path in _devices(obj):
        for f in NODE_ALLOCATABLE_FIELDS:
            _pop(dev, f, f"{path}.{f}", out)


def _list_attributes_in_use(obj: dict) -> bool:
    return any(_set(attr, f) for dev, path in _devices(obj)
               for attr, _ in _keyed(_d(dev, "attributes"), path) for f in LIST_ATTRIBUTE_FIELDS)


def _drop_list_attributes(obj: dict, out: list[str]) -> None:
    for dev, path in _devices(obj):
        for attr, apath in _keyed(_d(dev, "attributes"), f"{path}.attributes"):
            for f in LIST_ATTRIBUTE_FIELDS:
                _pop(attr, f, f"{apath}.{f}", out)


def _spec_field_in_use(field: str) -> Callable[[dict], bool]:
    return lambda obj: _set(_d(obj, "spec"), field)


def _drop_spec_field(field: str) -> Callable[[dict, list[str]], None]:
    return lambda obj, out: _pop(_d(obj, "spec"), field, f"spec.{field}", out)


def _groups_in_use(obj: dict) -> bool:
    return any(_set(c, "compatibilityGroups") for c, _ in _consumptions(obj))


def _drop_groups(obj: dict, out: list[str]) -> None:
    for c, path in _consumptions(obj):
        _pop(c, "compatibilityGroups", f"{path}.compatibilityGroups", out)


# ------------------------------------------------------------------ claim specs (claims and templates)
def _requests(spec: dict, path: str) -> Iterator[tuple[dict, str]]:
    return _indexed(_l(_d(spec, "devices"), "requests"), f"{path}.devices.requests")


def _request_bodies(spec: dict, path: str) -> Iterator[tuple[dict, str]]:
    """Each request's ``exactly`` and each of its ``firstAvailable`` sub-requests."""
    for req, rpath in _requests(spec, path):
        if isinstance(req.get("exactly"), dict):
            yield req["exactly"], f"{rpath}.exactly"
        yield from _indexed(_l(req, "firstAvailable"), f"{rpath}.firstAvailable")


def _exactly(spec: dict, path: str) -> Iterator[tuple[dict, str]]:
    for req, rpath in _requests(spec, path):
        if isinstance(req.get("exactly"), dict):
            yield req["exactly"], f"{rpath}.exactly"


def _claim_spec_rules(spec_of: Callable[[dict], tuple[dict, str]]) -> list[tuple]:
    """resourceclaimspec.DropDisabledFields, on the claim spec ``spec_of(obj)`` returns."""

    def prioritized_in_use(obj: dict) -> bool:
        spec, path = spec_of(obj)
        return any(_set(r, "firstAvailable") for r, _ in _requests(spec, path))

    def drop_prioritized(obj: dict, out: list[str]) -> None:
        spec, path = spec_of(obj)
        for r, rpath in _requests(spec, path):
            _pop(r, "firstAvailable", f"{rpath}.firstAvailable", out)

    def taints_in_use(obj: dict) -> bool:
        spec, path = spec_of(obj)
        return any(_set(b, "tolerations") for b, _ in _request_bodies(spec, path))

    def drop_taints(obj: dict, out: list[str]) -> None:
        spec, path = spec_of(obj)
        for b, bpath in _request_bodies(spec, path):
            _pop(b, "tolerations", f"{bpath}.tolerations", out)

    def admin_in_use(obj: dict) -> bool:
        spec, path = spec_of(obj)
        return any(_set(e, "adminAccess") for e, _ in _exactly(spec, path))

    def drop_admin(obj: dict, out: list[str]) -> None:
        spec, path = spec_of(obj)
        for e, epath in _exactly(spec, path):
            _pop(e, "adminAccess", f"{epath}.adminAccess", out)

    def consumable_in_use(obj: dict) -> bool:
        spec, path = spec_of(obj)
        constraints = _l(_d(spec, "devices"), "constraints")
        return (any(_set(c, "distinctAttribute") for c, _ in _indexed(constraints, ""))
                or any(_set(b, "capacity") for b, _ in _request_bodies(spec, path)))

    def drop_consumable(obj: dict, out: list[str]) -> None:
        spec, path = spec_of(obj)
        for c, cpath in _indexed(_l(_d(spec, "devices"), "constraints"), f"{path}.devices.constraints"):
            _pop(c, "distinctAttribute", f"{cpath}.distinctAttribute", out)
        for b, bpath in _request_bodies(spec, path):
            _pop(b, "capacity", f"{bpath}.capacity", out)

    def derived_in_use(obj: dict) -> bool:
        spec, path = spec_of(obj)
        return any(_set(b, "derivedAttributes") for b, _ in _request_bodies(spec, path))

    def drop_derived(obj: dict, out: list[str]) -> None:
        spec, path = spec_of(obj)
        for b, bpath in _request_bodies(spec, path):
            _pop(b, "derivedAttributes", f"{bpath}.derivedAttributes", out)

    # upstream order: prioritized list first, so taints are not looked for in dropped sub-requests
    return [
        (("DRAPrioritizedList",), prioritized_in_use, drop_prioritized),
        (("DRADeviceTaints",), taints_in_use, drop_taints),
        (("DRAAdminAccess",), admin_in_use, drop_admin),
        (("DRAConsumableCapacity",), consumable_in_use, drop_consumable),
        (("DRADerivedAttributes",), derived_in_use, drop_derived),
    ]


# ------------------------------------------------------------------ ResourceClaim status
def _results(obj: dict) -> Iterator[tuple[dict, str]]:
    devices = _d(_d(_d(obj, "status"), "allocation"), "devices")
    return _indexed(_l(devices, "results"), "status.allocation.devices.results")


def _status_devices(obj: dict) -> Iterator[tuple[dict, str]]:
    return _indexed(_l(_d(obj, "status"), "devices"), "status.devices")


_CLAIM_SPEC_RULES = _claim_spec_rules(lambda obj: (_d(obj, "spec"), "spec"))
_TEMPLATE_SPEC_RULES = _claim_spec_rules(lambda obj: (_d(_d(obj, "spec"), "spec"), "spec.spec"))
_SPEC_IN_USE = {rule[0][0]: rule[1] for rule in _CLAIM_SPEC_RULES}


def _device_status_in_use(obj: dict) -> bool:
    return bool(_l(_d(obj, "status"), "devices"))


def _drop_device_status(obj: dict, out: list[str]) -> None:
    _pop(_d(obj, "status"), "devices", "status.devices", out)


def _admin_status_in_use(obj: dict) -> bool:
    return _SPEC_IN_USE["DRAAdminAccess"](obj) or any(_set(r, "adminAccess") for r, _ in _results(obj))


def _drop_admin_status(obj: dict, out: list[str]) -> None:
    for r, path in _results(obj):
        _pop(r, "adminAccess", f"{path}.adminAccess", out)


def _consumable_status_in_use(obj: dict) -> bool:
    return (_SPEC_IN_USE["DRAConsumableCapacity"](obj)
            or any(_set(r, f) for r, _ in _results(obj) for f in ("shareID", "consumedCapacity"))
            or any(_set(d, "shareID") for d, _ in _status_devices(obj)))


def _drop_consumable_status(obj: dict, out: list[str]) -> None:
    for r, path in _results(obj):
        _pop(r, "shareID", f"{path}.shareID", out)
        _pop(r, "consumedCapacity", f"{path}.consumedCapacity", out)
    for d, path in _status_devices(obj):
        _pop(d, "shareID", f"{path}.shareID", out)


def _binding_status_in_use(obj: dict) -> bool:
    return any(_set(r, f) for r, _ in _results(obj) for f in ("bindingConditions", "bindingFailureConditions"))


def _drop_binding_status(obj: dict, out: list[str]) -> None:
    for r, path in _results(obj):
        _pop(r, "bindingConditions", f"{path}.bindingConditions", out)
        _pop(r, "bindingFailureConditions", f"{path}.bindingFailureConditions", out)


def _skip_ops_status_in_use(obj: dict) -> bool:
    return any(_set(r, "skipNodeOperations") for r, _ in _results(obj))


def _drop_skip_ops_status(obj: dict, out: list[str]) -> None:
    for r, path in _results(obj):
        _pop(r, "skipNodeOperations", f"{path}.skipNodeOperations", out)


# ------------------------------------------------------------------ the rules per kind
# (gates that must all be on to keep the fields, in use in the old object?, drop from the new one)
Rule = tuple[tuple[str, ...], Callable[[dict], bool], Callable[[dict, list[str]], None]]

SLICE_RULES: list[Rule] = [
    (("DRADeviceTaints",), _slice_taints_in_use, _slice_drop_taints),
    (("DRAPartitionableDevices",), _partitionable_in_use, _drop_partitionable),
    (("DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"), _binding_in_use, _drop_binding),
    (("DRAConsumableCapacity",), _slice_consumable_in_use, _slice_drop_consumable),
    (("DRANodeAllocatableResources",), _node_allocatable_in_use, _drop_node_allocatable),
    (("DRAListTypeAttributes",), _list_attributes_in_use, _drop_list_attributes),
    (("DRAPartitionableDevicesType",), _spec_field_in_use("partitionTypeAttribute"),
     _drop_spec_field("partitionTypeAttribute")),
    (("DRADeviceCompatibilityGroups",), _groups_in_use, _drop_groups),
    (("DRAOptionalNodeOperations",), _spec_field_in_use("skipNodeOperations"),
     _drop_spec_field("skipNodeOperations")),
]

CLAIM_STATUS_RULES: list[Rule] = [
    (("DRAResourceClaimDeviceStatus",), _device_status_in_use, _drop_device_status),
    (("DRAAdminAccess",), _admin_status_in_use, _drop_admin_status),
    (("DRAConsumableCapacity",), _consumable_status_in_use, _drop_consumable_status),
    (("DRADeviceBindingConditions",), _binding_status_in_use, _drop_binding_status),
    (("DRAOptionalNodeOperations",), _skip_ops_status_in_use, _drop_skip_ops_status),
]

CLASS_RULES: list[Rule] = [
    (("DRAExtendedResource",), _spec_field_in_use("extendedResourceName"), _drop_spec_field("extendedResourceName")),
]

RESOURCE = "resource.k8s.io/v1"
RULES: dict[tuple[str, str, bool], list[Rule]] = {
    (RESOURCE, "ResourceSlice", False): SLICE_RULES,
    (RESOURCE, "ResourceClaim", False): _CLAIM_SPEC_RULES,
    (RESOURCE, "ResourceClaim", True): CLAIM_STATUS_RULES,
    (RESOURCE, "ResourceClaimTemplate", False): _TEMPLATE_SPEC_RULES,
    (RESOURCE, "DeviceClass", False): CLASS_RULES,
}


def drop_disabled_fields(obj: dict, old: dict | None, enabled: Enabled, *,
                         status: bool = False) -> list[Dropped]:
    """Apply the rules of ``obj``'s kind (``status``: its status subresource's); what was dropped."""
    if not isinstance(obj, dict):
        return []
    rules = RULES.get((obj.get("apiVersion", ""), obj.get("kind", ""), status), [])
    dropped: list[Dropped] = []
    for gates, in_use, drop in rules:
        off = [g for g in gates if not enabled(g)]
        if not off or (old is not None and in_use(old)):
            continue
        paths: list[str] = []
        drop(obj, paths)
        dropped += [Dropped(off[0], p) for p in paths]
    return dropped
