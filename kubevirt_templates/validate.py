"""Validate KubeVirt objects against KubeVirt's published OpenAPI (swagger 2.0) definitions.

The swagger file (``api/openapi-spec/swagger.json`` of kubevirt/kubevirt; this repository reads
``../shared/schemas/kubevirt-openapi.json`` unless told otherwise) is turned into a JSON Schema
once, with the strictness of KubeVirt's structural CRD schemas and of ``kubectl``'s strict field
validation:

* an object schema without ``additionalProperties`` rejects unknown properties (also the
  property-less structs such as ``masquerade: {}``); only ``RawExtension``, ``FieldsV1`` and
  ``Patch`` stay free-form, as in the API;
* ``nullable: true`` admits ``null``; ``int-or-string`` admits both;
* ``required``, types and enums are checked as written; ``default`` and ``description`` are
  ignored.

The object's ``apiVersion`` picks the definition: ``kubevirt.io/v1`` + ``VirtualMachine`` is
``v1.VirtualMachine`` (definitions are keyed by version and kind only).
"""

from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jsonschema

#: Where the schema is looked for when no path is given: $VGPUCTL_KUBEVIRT_OPENAPI, then
#: ``shared/schemas/kubevirt-openapi.json`` next to the repository.
DEFAULT_SCHEMA = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "kubevirt-openapi.json"
ENV_SCHEMA = "VGPUCTL_KUBEVIRT_OPENAPI"

FREE_FORM = {
    "k8s.io.apimachinery.pkg.runtime.RawExtension",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Patch",
}

_DROP = {"default", "description", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
         "x-kubernetes-map-type", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key"}


class KubeVirtSchemaError(ValueError):
    """The object does not validate; ``problems`` lists each as ``path: message``."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def schema_path(path: str | os.PathLike | None = None) -> Path:
    p = Path(path or os.environ.get(ENV_SCHEMA) or DEFAULT_SCHEMA)
    if not p.is_file():
        raise FileNotFoundError(
            f"KubeVirt OpenAPI schema not found at {p}; pass its path or set ${ENV_SCHEMA} "
            "(kubevirt/kubevirt: api/openapi-spec/swagger.json)"
        )
    return p


def _types(schema: Mapping[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def _strict(schema: Any, free_form: bool = False) -> Any:
    """A swagger 2.0 schema fragment as a strict draft-4 JSON Schema fragment."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in _DROP or (k.startswith("x-") and k != "x-kubernetes-preserve-unknown-fields"):
            continue
        if k == "properties":
            out[k] = {name: _strict(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = _strict(v)
        elif k == "nullable":
            continue
        else:
            out[k] = v
    if "$ref" in out:  # draft 4 ignores a $ref's siblings; keep only the reference
        return {"$ref": out["$ref"]}
    types = _types(out)
    if schema.get("format") == "int-or-string":
        types = ["integer", "string"]
        out.pop("format", None)
    if schema.get("nullable") and types and "null" not in types:
        types = types + ["null"]
    if types:
        out["type"] = types[0] if len(types) == 1 else types
    is_object = "object" in types or ("properties" in out and not types)
    if (is_object and "additionalProperties" not in out and not free_form
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    out.pop("x-kubernetes-preserve-unknown-fields", None)
    return out


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if doc.get("swagger") != "2.0" or "definitions" not in doc:
        raise ValueError(f"{path}: not a swagger 2.0 document with definitions")
    defs = {name: _strict(d, free_form=name in FREE_FORM) for name, d in doc["definitions"].items()}
    return {"definitions": defs}


def definitions(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The strict JSON Schema definitions (cached per file)."""
    return _load(str(schema_path(path)))["definitions"]


def definition_for(obj: Mapping[str, Any], path: str | os.PathLike | None = None) -> str:
    """The definition name for an object's ``apiVersion`` and ``kind`` (``v1.VirtualMachine``)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or "/" not in api_version:
        raise KubeVirtSchemaError([f"apiVersion/kind: {api_version!r}/{kind!r} is not a KubeVirt object"])
    group, _, version = api_version.partition("/")
    if not (group == "kubevirt.io" or group.endswith(".kubevirt.io")):
        raise KubeVirtSchemaError([f"apiVersion: group {group!r} is not a KubeVirt API group"])
    name = f"{version}.{kind}"
    if name not in definitions(path):
        raise KubeVirtSchemaError([f"kind: {api_version} {kind} is not in the KubeVirt schema ({name})"])
    return name


@lru_cache(maxsize=64)
def _validator(path: str, name: str) -> jsonschema.Draft4Validator:
    root = copy.copy(_load(path))
    root["$ref"] = f"#/definitions/{name}"
    return jsonschema.Draft4Validator(root)


def kubevirt_problems(obj: Mapping[str, Any], path: str | os.PathLike | None = None) -> list[str]:
    """Everything KubeVirt's schema rejects in ``obj``, as ``path: message`` (empty when valid)."""
    try:
        name = definition_for(obj, path)
    except KubeVirtSchemaError as exc:
        return exc.problems
    v = _validator(str(schema_path(path)), name)
    problems = []
    for err in sorted(v.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in err.absolute_path) or "(root)"
        problems.append(f"{obj.get('kind')} {where}: {err.message}")
    return problems


def validate_kubevirt(obj: Mapping[str, Any], path: str | os.PathLike | None = None) -> None:
    """Raise :class:`KubeVirtSchemaError` unless ``obj`` validates against KubeVirt's schema."""
    problems = kubevirt_problems(obj, path)
    if problems:
        raise KubeVirtSchemaError(problems)


def is_kubevirt(obj: Mapping[str, Any]) -> bool:
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    return group == "kubevirt.io" or group.endswith(".kubevirt.io")


def kubernetes_problems(obj: Mapping[str, Any], versions: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37")) -> list[str]:
    """Problems with a Kubernetes object under the strict schemas of ``kubernetes-validate``
    (a test dependency, imported here only when called)."""
    import kubernetes_validate

    problems = []
    for version in versions:
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "(root)"
            problems.append(f"{obj.get('kind')} {where} (Kubernetes {version}): {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{obj.get('kind')} (Kubernetes {version}): {exc.message}")
    return problems


__all__ = [
    "KubeVirtSchemaError",
    "definition_for",
    "definitions",
    "is_kubevirt",
    "kubernetes_problems",
    "kubevirt_problems",
    "schema_path",
    "validate_kubevirt",
]
