"""resource.k8s.io/v1 ResourceClaim, ResourceClaimTemplate and DeviceClass rules, worded as
kube-apiserver words them (``pkg/apis/resource/validation``), so a client sees upstream's 422.

A claim's spec is validated on create only (it is immutable; an update is checked for that
and for its status). The server does not default: an unset ``allocationMode`` is validated as
upstream's default ``ExactCount`` with ``count`` 1, but stored as sent. CEL selectors are not
compiled here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from dra_bridge.api.compat import (
    MAX_CEL_LENGTH,
    MAX_CONFIGS,
    MAX_CONSTRAINTS,
    MAX_DRIVER_NAME_LENGTH,
    MAX_FIRST_AVAILABLE,
    MAX_OPAQUE_PARAMETERS_BYTES,
    MAX_REQUESTS,
    MAX_RESERVED_FOR,
    MAX_SELECTORS,
)
from dra_bridge.sim.apiserver.errors import FieldError
from dra_bridge.sim.apiserver.rawjson import sent_as

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
REQUEST_REF_MSG = ("must be the name of a request in the claim or the name of a request and a subrequest "
                   "separated by '/'")


def _quote(value: Any) -> str:
    """A bad value as field.Error prints it: strings quoted, numbers plain, nothing as null."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value" + (f": {detail}" if detail else ""), reason="FieldValueRequired")


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, f"Invalid value: {_quote(value)}: {detail}")


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    listed = ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, f"Unsupported value: {_quote(value)}: supported values: {listed}",
                      reason="FieldValueNotSupported")


def too_many(path: str, n: int, limit: int) -> FieldError:
    return FieldError(path, f"Too many: {n}: must have at most {limit} items", reason="FieldValueTooMany")


def too_long(path: str, limit: int) -> FieldError:
    return FieldError(path, f"Too long: may not be more than {limit} bytes", reason="FieldValueTooLong")


def dns_label(value: Any, path: str) -> list[FieldError]:
    value = value if isinstance(value, str) else ""
    errors = []
    if len(value) > 63:
        errors.append(invalid(path, value, "must be no more than 63 characters"))
    if not _LABEL.match(value):
        errors.append(invalid(path, value, LABEL_MSG))
    return errors


def dns_subdomain(value: str, path: str) -> list[FieldError]:
    errors = []
    if len(value) > 253:
        errors.append(invalid(path, value, "must be no more than 253 characters"))
    if not _SUBDOMAIN.match(value):
        errors.append(invalid(path, value, SUBDOMAIN_MSG))
    return errors


def _set(items: list, limit: int, path: str, key: Callable[[Any], object] | None = None) -> list[FieldError]:
    """validateSet's size and uniqueness checks."""
    errors = [too_many(path, len(items), limit)] if limit and len(items) > limit else []
    seen: set = set()
    for i, item in enumerate(items):
        k = key(item) if key else item
        if k in seen:
            errors.append(FieldError(f"{path}[{i}]", f"Duplicate value: {_quote(k)}", reason="FieldValueDuplicate"))
        seen.add(k)
    return errors


# ------------------------------------------------------------------ requests
def _device_class(name: Any, path: str) -> list[FieldError]:
    if not name:
        return [required(path)]
    return dns_subdomain(name, path)


def _selectors(selectors: list, path: str) -> list[FieldError]:
    errors = [too_many(path, len(selectors), MAX_SELECTORS)] if len(selectors) > MAX_SELECTORS else []
    for i, sel in enumerate(selectors):
        cel = (sel or {}).get("cel")
        if cel is None:
            errors.append(required(f"{path}[{i}].cel"))
        elif len(cel.get("expression") or "") > MAX_CEL_LENGTH:
            errors.append(too_long(f"{path}[{i}].cel.expression", MAX_CEL_LENGTH))
    return errors


def _allocation_mode(req: dict, path: str) -> list[FieldError]:
    mode = req.get("allocationMode") or "ExactCount"  # upstream's default, applied before validation
    count = req.get("count")
    if mode == "All":
        return [invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")] if count else []
    if mode == "ExactCount":
        count = 1 if count in (None, 0) else count
        return [invalid(f"{path}.count", count, "must be greater than zero")] if count <= 0 else []
    return [not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"])]


def _exact(req: dict, path: str) -> list[FieldError]:
    return (_device_class(req.get("deviceClassName"), f"{path}.deviceClassName")
            + _selectors(req.get("selectors") or [], f"{path}.selectors")
            + _allocation_mode(req, path))


def _request(req: dict, path: str) -> list[FieldError]:
    errors = dns_label(req.get("name"), f"{path}.name")
    first = req.get("firstAvailable") or []
    exactly = req.get("exactly")
    if exactly is None and not first:
        return errors + [required(path, "exactly one of `exactly` or `firstAvailable` is required")]
    if exactly is not None and first:
        return errors + [invalid(path, None, "exactly one of `exactly` or `firstAvailable` is required, "
                                             "but multiple fields are set")]
    if exactly is not None:
        return errors + _exact(exactly, f"{path}.exactly")
    errors += _set(first, MAX_FIRST_AVAILABLE, f"{path}.firstAvailable", key=lambda s: (s or {}).get("name"))
    for j, sub in enumerate(first):
        spath = f"{path}.firstAvailable[{j}]"
        errors += dns_label(sub.get("name"), f"{spath}.name") + _exact(sub, spath)
    return errors


def _request_names(devices: dict) -> dict[str, set[str]]:
    return {r.get("name"): {s.get("name") for s in r.get("firstAvailable") or []}
            for r in devices.get("requests") or []}


def _request_refs(refs: list, names: dict[str, set[str]], path: str) -> list[FieldError]:
    errors = _set(refs, MAX_REQUESTS, path)
    for i, ref in enumerate(refs):
        parts = str(ref).split("/")
        if len(parts) > 2 or parts[0] not in names or (len(parts) == 2 and parts[1] not in names[parts[0]]):
            errors.append(invalid(f"{path}[{i}]", ref, REQUEST_REF_MSG))
    return errors


def opaque_config(config: dict, path: str) -> list[FieldError]:
    """A ``DeviceConfiguration``: opaque, with a driver name and parameters of at most 10 KiB."""
    opaque = (config or {}).get("opaque")
    if opaque is None:
        return [required(f"{path}.opaque")]
    errors = []
    driver = opaque.get("driver") or ""
    if not driver:
        errors.append(required(f"{path}.opaque.driver"))
    elif len(driver) > MAX_DRIVER_NAME_LENGTH:
        errors.append(too_long(f"{path}.opaque.driver", MAX_DRIVER_NAME_LENGTH))
    else:
        errors += dns_subdomain(driver.lower(), f"{path}.opaque.driver")
    params = opaque.get("parameters")
    if params is None:
        errors.append(required(f"{path}.opaque.parameters"))
    elif not isinstance(params, dict):
        errors.append(invalid(f"{path}.opaque.parameters", "<value omitted>", "parameters must be a valid JSON object"))
    elif len(json.dumps(params, separators=(",", ":")).encode()) > MAX_OPAQUE_PARAMETERS_BYTES:
        errors.append(too_long(f"{path}.opaque.parameters", MAX_OPAQUE_PARAMETERS_BYTES))
    return errors


def claim_spec(spec: dict, path: str) -> list[FieldError]:
    devices = (spec or {}).get("devices") or {}
    dpath = f"{path}.devices"
    requests = devices.get("requests") or []
    errors = _set(requests, MAX_REQUESTS, f"{dpath}.requests", key=lambda r: (r or {}).get("name"))
    for i, req in enumerate(requests):
        errors += _request(req or {}, f"{dpath}.requests[{i}]")
    names = _request_names(devices)
    constraints = devices.get("constraints") or []
    if len(constraints) > MAX_CONSTRAINTS:
        errors.append(too_many(f"{dpath}.constraints", len(constraints), MAX_CONSTRAINTS))
    for i, c in enumerate(constraints):
        cpath = f"{dpath}.constraints[{i}]"
        errors += _request_refs(c.get("requests") or [], names, f"{cpath}.requests")
        if not c.get("matchAttribute") and not c.get("distinctAttribute"):
            errors.append(required(f"{cpath}.matchAttribute"))
    configs = devices.get("config") or []
    if len(configs) > MAX_CONFIGS:
        errors.append(too_many(f"{dpath}.config", len(configs), MAX_CONFIGS))
    for i, cfg in enumerate(configs):
        cpath = f"{dpath}.config[{i}]"
        errors += _request_refs(cfg.get("requests") or [], names, f"{cpath}.requests") + opaque_config(cfg, cpath)
    return errors


def claim_status(status: dict) -> list[FieldError]:
    errors = []
    reserved = status.get("reservedFor") or []
    if len(reserved) > MAX_RESERVED_FOR:
        errors.append(too_many("status.reservedFor", len(reserved), MAX_RESERVED_FOR))
    for i, ref in enumerate(reserved):
        for f in ("resource", "name", "uid"):
            if not (ref or {}).get(f):
                errors.append(required(f"status.reservedFor[{i}].{f}"))
    if reserved and status.get("allocation") is None:
        errors.append(FieldError("status.reservedFor", "Forbidden: may not be specified when `allocated` is not set",
                                 reason="FieldValueForbidden"))
    return errors


def _same(new: Any, old: Any, key: str = "") -> bool:
    """``apiequality.Semantic.DeepEqual`` as it treats an allocation: nil and empty alike, an opaque
    config's ``parameters`` (a ``runtime.RawExtension``) compared as the bytes sent and stored."""
    if key == "parameters" and isinstance(new, dict) and isinstance(old, dict):
        return sent_as(new) == sent_as(old)
    if isinstance(new, dict) and isinstance(old, dict):
        return all(_same(new.get(k), old.get(k), k) for k in set(new) | set(old))
    if isinstance(new, list) and isinstance(old, list):
        return len(new) == len(old) and all(_same(a, b) for a, b in zip(new, old, strict=True))
    if new in (None, [], {}) and old in (None, [], {}):
        return True
    return bool(new == old)


def allocation_update(status: dict, old_status: dict, minor: int = 37) -> list[FieldError]:
    """A set allocation may be cleared but not changed. The words differ by version: 1.37's
    declarative validation (``+k8s:update=NoModify``) says ``field cannot be modified once set``,
    1.34's ``ValidateImmutableField`` says ``field is immutable`` (both seen on the real servers,
    tests/system/test_real_controlplane.py; 1.35 and 1.36 are given 1.37's words, unchecked)."""
    new, old = status.get("allocation"), old_status.get("allocation")
    if new is None or old is None or _same(new, old):
        return []
    return [invalid("status.allocation", None,
                    "field is immutable" if minor <= 34 else "field cannot be modified once set")]


def validate_resource_claim(obj: dict, old: dict | None, minor: int) -> list[FieldError]:
    spec_errors = claim_spec(obj.get("spec") or {}, "spec") if old is None else []
    update_errors = allocation_update(obj.get("status") or {}, old.get("status") or {}, minor) if old is not None else []
    return spec_errors + claim_status(obj.get("status") or {}) + update_errors


def validate_resource_claim_template(obj: dict, old: dict | None, minor: int) -> list[FieldError]:
    if old is not None:
        return []
    return claim_spec((obj.get("spec") or {}).get("spec") or {}, "spec.spec")


def validate_device_class(obj: dict, old: dict | None, minor: int) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = _selectors(spec.get("selectors") or [], "spec.selectors")
    configs = spec.get("config") or []
    if len(configs) > MAX_CONFIGS:
        errors.append(too_many("spec.config", len(configs), MAX_CONFIGS))
    for i, cfg in enumerate(configs):
        errors += opaque_config(cfg, f"spec.config[{i}]")
    return errors
