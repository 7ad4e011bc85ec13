"""resource.k8s.io/v1 ResourceSlice validation rules that the OpenAPI schemas cannot express
(claims, templates and classes: :mod:`.dra_claims`).

One function per rule, named after it, in the order of /work/shared/reference/dra.md
("ResourceSlice", "Limits", "Partitionable devices"). Each takes the object's spec
(and the server's minor version where the rule changed between releases) and
returns a list of :class:`FieldError` (empty when the rule holds). The schema
itself (field names, types, required fields) is checked before these run, so the
rules may assume well-typed input but must tolerate ``None`` for optional fields.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# ---------------------------------------------------------------- limits (dra.md table; the numbers in one place)
from dra_bridge.api.compat import (  # noqa: E402
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    MAX_COMPATIBILITY_GROUPS,
    MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34,
    MAX_CONSUMED_COUNTERS_PER_SET,
    MAX_COUNTER_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTER_CONSUMPTIONS_PER_SLICE_1_34,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_COUNTER_SET,
    MAX_COUNTERS_PER_SLICE_1_34,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
    MAX_DOMAIN_LENGTH,
    MAX_DRIVER_NAME_LENGTH,
    MAX_ID_LENGTH,
    MAX_POOL_NAME_LENGTH,
    MAX_STRING_ATTRIBUTE_LENGTH,
    MAX_TAINTS_PER_DEVICE,
    MAX_TAINTS_PER_DEVICE_1_34,
    MAX_VERSION_ATTRIBUTE_LENGTH,
)
from dra_bridge.sim.apiserver.errors import FieldError

NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
DEVICE_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


# ---------------------------------------------------------------- helpers
def _devices(spec: dict) -> list[dict]:
    return spec.get("devices") or []


def _counter_sets(spec: dict) -> list[dict]:
    return spec.get("sharedCounters") or []


def _is_set(obj: dict, field: str) -> bool:
    value = obj.get(field)
    if isinstance(value, bool):
        return value
    return value not in (None, "", {}, [])


def is_dns_label(name: Any) -> bool:
    """An RFC 1123 label of at most 63 characters (the server's own check, written apart from
    ``dra_bridge.api.k8sname`` so a mistake there cannot hide here)."""
    return isinstance(name, str) and len(name) <= 63 and bool(_DNS_LABEL.match(name))


def is_dns_subdomain(name: Any) -> bool:
    """An RFC 1123 subdomain of at most 253 characters."""
    return isinstance(name, str) and len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def _too_many(path: str, n: int, limit: int, what: str = "items") -> FieldError:
    return FieldError(path, f"Too many: {n}: must have at most {limit} {what}",
                      reason="FieldValueTooMany")


def _qualified_name_error(path: str, name: str) -> FieldError | None:
    """Attribute and capacity names: ``<C identifier>`` or ``<DNS subdomain>/<C identifier>``."""
    domain, _, ident = name.rpartition("/")
    if "/" in name and (not domain or len(domain) > MAX_DOMAIN_LENGTH or not is_dns_subdomain(domain)):
        return FieldError(path, f'Invalid value: "{name}": the domain must be a DNS subdomain '
                                f"of at most {MAX_DOMAIN_LENGTH} characters")
    if not _C_IDENTIFIER.match(ident) or len(ident) > MAX_ID_LENGTH:
        return FieldError(path, f'Invalid value: "{name}": the name must be a C identifier '
                                f"(letters, digits, '_'; not starting with a digit) of at most "
                                f"{MAX_ID_LENGTH} characters")
    return None


# ================================================================ ResourceSlice: spec
def driver_name_is_a_dns_subdomain(spec: dict, minor: int) -> list[FieldError]:
    """`driver`: a DNS subdomain of at most 63 characters."""
    driver = spec.get("driver") or ""
    if not driver:
        return [FieldError("spec.driver", "Required value", reason="FieldValueRequired")]
    if len(driver) > MAX_DRIVER_NAME_LENGTH:
        return [FieldError("spec.driver", f"Too long: may not be more than {MAX_DRIVER_NAME_LENGTH} "
                                          "bytes", reason="FieldValueTooLong")]
    if not is_dns_subdomain(driver):
        return [FieldError("spec.driver", f'Invalid value: "{driver}": must be a DNS subdomain')]
    return []


def pool_is_valid(spec: dict, minor: int) -> list[FieldError]:
    """`pool{name, generation, resourceSliceCount}`: name is '/'-separated DNS subdomains,
    generation >= 0, resourceSliceCount >= 1."""
    pool = spec.get("pool") or {}
    errors = []
    name = pool.get("name") or ""
    if not name:
        errors.append(FieldError("spec.pool.name", "Required value", reason="FieldValueRequired"))
    elif len(name) > MAX_POOL_NAME_LENGTH:
        errors.append(FieldError("spec.pool.name", f"Too long: may not be more than "
                                                   f"{MAX_POOL_NAME_LENGTH} bytes",
                                 reason="FieldValueTooLong"))
    elif not all(is_dns_subdomain(part) for part in name.split("/")):
        errors.append(FieldError("spec.pool.name", f'Invalid value: "{name}": each "/"-separated '
                                                   "part must be a DNS subdomain"))
    if (pool.get("generation") or 0) < 0:
        errors.append(FieldError("spec.pool.generation", "Invalid value: must be greater than or "
                                                         "equal to 0"))
    if (pool.get("resourceSliceCount") or 0) < 1:
        errors.append(FieldError("spec.pool.resourceSliceCount", "Invalid value: must be greater "
                                                                 "than or equal to 1"))
    return errors


def exactly_one_node_selection(spec: dict, minor: int) -> list[FieldError]:
    """Exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`."""
    chosen = [f for f in NODE_SELECTION_FIELDS if _is_set(spec, f)]
    wanted = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        return [FieldError("spec", f"Required value: {wanted} is required",
                           reason="FieldValueRequired")]
    if len(chosen) > 1:
        return [FieldError("spec", f"Invalid value: {{{', '.join(chosen)}}}: {wanted} is required, "
                                   "but multiple fields are set")]
    return []


def per_device_node_selection(spec: dict, minor: int) -> list[FieldError]:
    """With `perDeviceNodeSelection: true` each device sets exactly one of `nodeName`,
    `nodeSelector`, `allNodes`; otherwise devices set none of them."""
    errors = []
    per_device = spec.get("perDeviceNodeSelection") is True
    for i, dev in enumerate(_devices(spec)):
        chosen = [f for f in DEVICE_NODE_FIELDS if _is_set(dev, f)]
        path = f"spec.devices[{i}]"
        if per_device and len(chosen) != 1:
            errors.append(FieldError(path, "Invalid value: exactly one of `nodeName`, "
                                           "`nodeSelector`, `allNodes` is required when "
                                           "`perDeviceNodeSelection` is set"))
        elif not per_device and chosen:
            errors.append(FieldError(f"{path}.{chosen[0]}", "Forbidden: only allowed when "
                                                            "`perDeviceNodeSelection` is set",
                                     reason="FieldValueForbidden"))
    return errors


def only_devices_or_shared_counters(spec: dict, minor: int) -> list[FieldError]:
    """1.35+: a slice holds either `devices` or `sharedCounters`, never both."""
    if minor >= 35 and _devices(spec) and _counter_sets(spec):
        return [FieldError("spec", "Invalid value: only one of sharedCounters or devices is allowed")]
    return []


def devices_per_slice_limit(spec: dict, minor: int) -> list[FieldError]:
    """At most 128 devices; 1.35+: at most 64 if any device has taints or consumes counters."""
    devices = _devices(spec)
    limit = MAX_DEVICES_PER_SLICE
    if minor >= 35 and any(d.get("taints") or d.get("consumesCounters") for d in devices):
        limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    if len(devices) > limit:
        return [_too_many("spec.devices", len(devices), limit)]
    return []


# ================================================================ ResourceSlice: devices
def device_names_are_dns_labels(spec: dict, minor: int) -> list[FieldError]:
    """Device `name`: a DNS label."""
    return [FieldError(f"spec.devices[{i}].name", f'Invalid value: "{d.get("name")}": must be a '
                                                  "DNS label")
            for i, d in enumerate(_devices(spec)) if not is_dns_label(d.get("name"))]


def device_names_unique(spec: dict, minor: int) -> list[FieldError]:
    """Device names are unique in the slice."""
    seen: set[object] = set()
    errors = []
    for i, dev in enumerate(_devices(spec)):
        name = dev.get("name")
        if name in seen:
            errors.append(FieldError(f"spec.devices[{i}].name", f'Duplicate value: "{name}"',
                                     reason="FieldValueDuplicate"))
        seen.add(name)
    return errors


def attributes_and_capacities_per_device_limit(spec: dict, minor: int) -> list[FieldError]:
    """At most 32 attributes and capacities together per device."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        n = len(dev.get("attributes") or {}) + len(dev.get("capacity") or {})
        if n > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
            errors.append(_too_many(f"spec.devices[{i}]", n, MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
                                    "attributes and capacities"))
    return errors


def attribute_and_capacity_names_are_qualified(spec: dict, minor: int) -> list[FieldError]:
    """Attribute / capacity names: plain C identifier or `domain/identifier`."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for field in ("attributes", "capacity"):
            for name in dev.get(field) or {}:
                err = _qualified_name_error(f"spec.devices[{i}].{field}[{name}]", name)
                if err:
                    errors.append(err)
    return errors


def attribute_has_exactly_one_value(spec: dict, minor: int) -> list[FieldError]:
    """An attribute is exactly one of `int`, `bool`, `string`, `version`."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for name, value in (dev.get("attributes") or {}).items():
            set_fields = [k for k in ("int", "bool", "string", "version")
                          if (value or {}).get(k) is not None]
            if len(set_fields) != 1:
                errors.append(FieldError(f"spec.devices[{i}].attributes[{name}]",
                                         "Invalid value: exactly one value must be specified"))
    return errors


def string_attribute_length(spec: dict, minor: int) -> list[FieldError]:
    """String attribute values are at most 64 characters."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for name, value in (dev.get("attributes") or {}).items():
            s = (value or {}).get("string")
            if s is not None and len(s.encode()) > MAX_STRING_ATTRIBUTE_LENGTH:
                errors.append(FieldError(f"spec.devices[{i}].attributes[{name}].string",
                                         f"Too long: may not be more than "
                                         f"{MAX_STRING_ATTRIBUTE_LENGTH} bytes",
                                         reason="FieldValueTooLong"))
    return errors


def version_attribute_is_semver(spec: dict, minor: int) -> list[FieldError]:
    """Version attribute values are semver 2.0.0 strings of at most 64 characters."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for name, value in (dev.get("attributes") or {}).items():
            v = (value or {}).get("version")
            path = f"spec.devices[{i}].attributes[{name}].version"
            if v is None:
                continue
            if len(v) > MAX_VERSION_ATTRIBUTE_LENGTH:
                errors.append(FieldError(path, f"Too long: may not be more than "
                                               f"{MAX_VERSION_ATTRIBUTE_LENGTH} bytes",
                                         reason="FieldValueTooLong"))
            elif not _SEMVER.match(v):
                errors.append(FieldError(path, f'Invalid value: "{v}": must be a string compatible '
                                               "with semver.org spec 2.0.0"))
    return errors


def taints_per_device_limit(spec: dict, minor: int) -> list[FieldError]:
    """At most 4 taints per device (1.34), 16 (1.35+)."""
    limit = MAX_TAINTS_PER_DEVICE if minor >= 35 else MAX_TAINTS_PER_DEVICE_1_34
    return [_too_many(f"spec.devices[{i}].taints", len(d["taints"]), limit)
            for i, d in enumerate(_devices(spec)) if len(d.get("taints") or []) > limit]


# ================================================================ ResourceSlice: counters
def counter_set_names_valid_and_unique(spec: dict, minor: int) -> list[FieldError]:
    """`sharedCounters[].name` and counter names are DNS labels; set names unique in the slice."""
    errors = []
    seen: set[object] = set()
    for i, cs in enumerate(_counter_sets(spec)):
        name = cs.get("name")
        path = f"spec.sharedCounters[{i}]"
        if not is_dns_label(name):
            errors.append(FieldError(f"{path}.name", f'Invalid value: "{name}": must be a DNS label'))
        elif name in seen:
            errors.append(FieldError(f"{path}.name", f'Duplicate value: "{name}"',
                                     reason="FieldValueDuplicate"))
        seen.add(name)
        counters = cs.get("counters") or {}
        if not counters:
            errors.append(FieldError(f"{path}.counters", "Required value",
                                     reason="FieldValueRequired"))
        for counter in counters:
            if not is_dns_label(counter):
                errors.append(FieldError(f"{path}.counters[{counter}]",
                                         f'Invalid value: "{counter}": must be a DNS label'))
    return errors


def shared_counters_limit(spec: dict, minor: int) -> list[FieldError]:
    """1.34: at most 32 counters summed over all sets; 1.35+: at most 8 sets of 32 counters."""
    sets = _counter_sets(spec)
    if minor <= 34:
        total = sum(len(cs.get("counters") or {}) for cs in sets)
        if total > MAX_COUNTERS_PER_SLICE_1_34:
            return [_too_many("spec.sharedCounters", total, MAX_COUNTERS_PER_SLICE_1_34, "counters")]
        return []
    errors = []
    if len(sets) > MAX_COUNTER_SETS_PER_SLICE:
        errors.append(_too_many("spec.sharedCounters", len(sets), MAX_COUNTER_SETS_PER_SLICE))
    for i, cs in enumerate(sets):
        n = len(cs.get("counters") or {})
        if n > MAX_COUNTERS_PER_COUNTER_SET:
            errors.append(_too_many(f"spec.sharedCounters[{i}].counters", n,
                                    MAX_COUNTERS_PER_COUNTER_SET))
    return errors


def counter_consumption_limits(spec: dict, minor: int) -> list[FieldError]:
    """1.34: at most 32 consumed counters per device and 1024 per slice;
    1.35+: at most 2 consumed sets per device, 32 counters each; 1.37+: at most 2
    compatibility groups per consumption."""
    errors = []
    slice_total = 0
    for i, dev in enumerate(_devices(spec)):
        consumptions = dev.get("consumesCounters") or []
        path = f"spec.devices[{i}].consumesCounters"
        per_device = sum(len(c.get("counters") or {}) for c in consumptions)
        slice_total += per_device
        if minor <= 34:
            if per_device > MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34:
                errors.append(_too_many(path, per_device, MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34,
                                        "counters"))
            continue
        if len(consumptions) > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE:
            errors.append(_too_many(path, len(consumptions), MAX_COUNTER_CONSUMPTIONS_PER_DEVICE))
        for j, c in enumerate(consumptions):
            n = len(c.get("counters") or {})
            if n > MAX_CONSUMED_COUNTERS_PER_SET:
                errors.append(_too_many(f"{path}[{j}].counters", n, MAX_CONSUMED_COUNTERS_PER_SET))
            groups = c.get("compatibilityGroups") or []
            if len(groups) > MAX_COMPATIBILITY_GROUPS:
                errors.append(_too_many(f"{path}[{j}].compatibilityGroups", len(groups),
                                        MAX_COMPATIBILITY_GROUPS))
    if minor <= 34 and slice_total > MAX_COUNTER_CONSUMPTIONS_PER_SLICE_1_34:
        errors.append(_too_many("spec.devices", slice_total, MAX_COUNTER_CONSUMPTIONS_PER_SLICE_1_34,
                                "counter consumptions"))
    return errors


def consumed_counter_sets_are_dns_labels(spec: dict, minor: int) -> list[FieldError]:
    """`consumesCounters[].counterSet` names a counter set (a DNS label)."""
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for j, c in enumerate(dev.get("consumesCounters") or []):
            if not is_dns_label(c.get("counterSet")):
                errors.append(FieldError(f"spec.devices[{i}].consumesCounters[{j}].counterSet",
                                         f'Invalid value: "{c.get("counterSet")}": must be a '
                                         "DNS label"))
    return errors


def consumed_counters_defined_in_same_slice(spec: dict, minor: int) -> list[FieldError]:
    """1.34 and older: a device consumes only counter sets (and their counters) published in
    the same slice's `sharedCounters`. From 1.35 the sets live in another slice of the pool,
    which object validation cannot see."""
    if minor >= 35:
        return []
    defined = {cs.get("name"): set(cs.get("counters") or {}) for cs in _counter_sets(spec)}
    errors = []
    for i, dev in enumerate(_devices(spec)):
        for j, c in enumerate(dev.get("consumesCounters") or []):
            path = f"spec.devices[{i}].consumesCounters[{j}]"
            name = c.get("counterSet")
            if name not in defined:
                errors.append(FieldError(f"{path}.counterSet", f'Invalid value: "{name}": must '
                                         "reference a counterSet defined in the ResourceSlice "
                                         "sharedCounters"))
                continue
            for counter in c.get("counters") or {}:
                if counter not in defined[name]:
                    errors.append(FieldError(f"{path}.counters", f'Invalid value: "{counter}": '
                                             "must reference a counter defined in the "
                                             "ResourceSlice sharedCounters"))
    return errors


SLICE_RULES: tuple[Callable[[dict, int], list[FieldError]], ...] = (
    driver_name_is_a_dns_subdomain,
    pool_is_valid,
    exactly_one_node_selection,
    per_device_node_selection,
    only_devices_or_shared_counters,
    devices_per_slice_limit,
    device_names_are_dns_labels,
    device_names_unique,
    attributes_and_capacities_per_device_limit,
    attribute_and_capacity_names_are_qualified,
    attribute_has_exactly_one_value,
    string_attribute_length,
    version_attribute_is_semver,
    taints_per_device_limit,
    counter_set_names_valid_and_unique,
    shared_counters_limit,
    counter_consumption_limits,
    consumed_counter_sets_are_dns_labels,
    consumed_counters_defined_in_same_slice,
)


def validate_resource_slice(obj: dict, old: dict | None, minor: int) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    for rule in SLICE_RULES:
        errors += rule(spec, minor)
    return errors
