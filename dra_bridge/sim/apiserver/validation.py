"""Validation of every object written to the local API server.

1. OpenAPI schema of the server's Kubernetes version, from ``kubernetes-validate`` when it
   is installed (a test dependency; without it this step is skipped, ``HAVE_SCHEMAS`` is
   False, and steps 2 and 3, the DRA rules included, still apply):
   the same schema files and version resolution as ``kubernetes_validate.validate``
   (``v<version>-local-strict`` for strict validation, ``-local`` otherwise), with
   the compiled validator cached per (version, kind) so a write costs well under a
   millisecond instead of re-reading a 1.5 MB definitions file.
2. Object metadata rules the schema cannot express (name format, name/generateName).
3. Per-kind rules the schema cannot express; for resource.k8s.io see ``dra_rules``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from dra_bridge.sim.apiserver import dra_claims, dra_rules
from dra_bridge.sim.apiserver.errors import FieldError

try:  # the [sim] extra's kubernetes-validate: the upstream schemas each object is checked against
    import jsonschema
    import referencing
    from kubernetes_validate import utils as kv_utils

    HAVE_SCHEMAS = True
except ImportError:  # without it: the DRA and metadata rules only (nothing below uses the three then)
    HAVE_SCHEMAS = False

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric character")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
             "or '-', and must start and end with an alphanumeric character")


def minor_of(version: str) -> int:
    """``"1.35"`` / ``"v1.35.2"`` -> 35."""
    return int(version.lstrip("v").split(".")[1])


def resolved_schema_version(version: str) -> str:
    """The schema version ``kubernetes_validate.validate(desired_version=version)`` uses."""
    if not HAVE_SCHEMAS:
        raise ValueError("kubernetes-validate is not installed: no OpenAPI schemas")
    wanted = kv_utils.major_minor(version.lstrip("v"))
    candidates = [v for v in kv_utils.all_versions()
                  if _vkey(kv_utils.major_minor(v)) <= _vkey(wanted)]
    if not candidates:
        raise ValueError(f"kubernetes-validate has no schema for Kubernetes {version}")
    return candidates[-1]


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def _schema_dir(version: str, strict: bool) -> str:
    return f"v{resolved_schema_version(version)}-local" + ("-strict" if strict else "")


@functools.cache
def _definitions(schema_dir: str) -> dict:
    return kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json",
                                    schema_dir)


def definitions(version: str, strict: bool = True) -> dict:
    """Every definition of Kubernetes ``version`` (``{"$defs": {name: schema}}``); what OpenAPI serves."""
    return _definitions(_schema_dir(version, strict))


@functools.cache
def kind_schema(version: str, kind: str, api_version: str, strict: bool = True) -> dict | None:
    """The top-level schema of ``kind`` (``None`` if kubernetes-validate has none or is missing)."""
    if not HAVE_SCHEMAS:
        return None
    group_part = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        return kv_utils.schema_contents(
            f"kubernetes-json-schema/{_schema_dir(version, strict)}/{kind.lower()}-{group_part}.json",
            version,
        )
    except FileNotFoundError:
        return None


@functools.cache
def _validator(version: str, kind: str, api_version: str, strict: bool) -> jsonschema.validators.Draft202012Validator | None:
    schema = kind_schema(version, kind, api_version, strict)
    if schema is None:
        return None
    definitions = _definitions(_schema_dir(version, strict))
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = referencing.Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def resolver(version: str, strict: bool = True) -> Callable[[dict], dict]:
    """Follows ``$ref`` (into ``_definitions.json``) and single-entry ``allOf``."""
    defs = _definitions(_schema_dir(version, strict)).get("$defs", {}) if HAVE_SCHEMAS else {}

    def resolve(schema: dict) -> dict:
        seen = 0
        while isinstance(schema, dict) and seen < 32:
            seen += 1
            if "$ref" in schema:
                schema = defs.get(schema["$ref"].split("#/$defs/")[-1], {})
            elif isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
                schema = schema["allOf"][0]
            else:
                break
        return schema if isinstance(schema, dict) else {}

    return resolve


def _json_path(path: Iterable[object]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def schema_errors(obj: dict, version: str, strict: bool = True) -> list[FieldError]:
    """Field errors of ``obj`` against the OpenAPI schema of Kubernetes ``version``."""
    validator = _validator(version, obj.get("kind", ""), obj.get("apiVersion", ""), strict)
    if validator is None:
        return []
    errors: list[FieldError] = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.path]):
        path = _json_path(err.path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set((err.schema or {}).get("properties") or {})
            for extra in sorted(k for k in err.instance if k not in allowed):
                errors.append(FieldError(f"{path}.{extra}" if path else extra,
                                         f"unknown field ({err.message})",
                                         reason="FieldValueNotFound"))
            continue
        if err.validator == "required":  # as upstream words a missing field: <path>.<field>: Required value
            missing = err.message.split("'")[1] if err.message.count("'") >= 2 else ""
            errors.append(FieldError(f"{path}.{missing}" if path else missing, "Required value",
                                     reason="FieldValueRequired"))
        else:
            errors.append(FieldError(path, err.message))
        if len(errors) >= 20:
            break
    return errors


# names that are not DNS subdomains: namespaces are labels, RBAC objects path segments (``system:x``)
NAME_RULES = {("v1", "Namespace"): "label",
              **{("rbac.authorization.k8s.io/v1", k): "path-segment"
                 for k in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")}}


def _path_segment_errors(name: str) -> list[str]:
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def metadata_errors(obj: dict, namespaced_name_is_label: bool = False) -> list[FieldError]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    errors: list[FieldError] = []
    if not name:
        errors.append(FieldError("metadata.name", "Required value: name or generateName is required",
                                 reason="FieldValueRequired"))
        return errors
    rule = NAME_RULES.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if rule == "path-segment":
        errors += [FieldError("metadata.name", f'Invalid value: "{name}": {m}') for m in _path_segment_errors(name)]
    elif namespaced_name_is_label or rule == "label":
        if not dra_rules.is_dns_label(name):
            errors.append(FieldError("metadata.name", f'Invalid value: "{name}": {LABEL_MSG}'))
    elif not dra_rules.is_dns_subdomain(name):
        errors.append(FieldError("metadata.name", f'Invalid value: "{name}": {SUBDOMAIN_MSG}'))
    for _key, value in (meta.get("labels") or {}).items():
        if value is not None and len(value) > 63:
            errors.append(FieldError("metadata.labels", f'Invalid value: "{value}": must be no more '
                                                          f"than 63 characters"))
    return errors


# kind -> rules(obj, old_obj_or_None, minor) -> [FieldError]
KIND_RULES: dict[tuple[str, str], Callable[[dict, dict | None, int], list[FieldError]]] = {
    ("resource.k8s.io/v1", "ResourceSlice"): dra_rules.validate_resource_slice,
    ("resource.k8s.io/v1", "ResourceClaim"): dra_claims.validate_resource_claim,
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): dra_claims.validate_resource_claim_template,
    ("resource.k8s.io/v1", "DeviceClass"): dra_claims.validate_device_class,
}


def validate_object(obj: dict, old: dict | None, version: str, *, strict: bool = True,
                    name_is_label: bool = False) -> list[FieldError]:
    """All errors for writing ``obj`` (``old`` is the stored object on update)."""
    errors = schema_errors(obj, version, strict)
    errors += metadata_errors(obj, name_is_label)
    if errors:
        return errors
    rules = KIND_RULES.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if rules is not None:
        minor = minor_of(version)
        errors += rules(obj, old, minor)
    return errors
