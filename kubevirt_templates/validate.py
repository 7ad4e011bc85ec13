"""Validate KubeVirt objects against KubeVirt's OpenAPI definitions.

The schema is given, never guessed: a file (KubeVirt's swagger 2.0 ``api/openapi-spec/swagger.json``,
or an OpenAPI v3 document), ``$VGPUCTL_KUBEVIRT_OPENAPI`` when no file is named, or a document
fetched from a cluster (``/openapi/v3/apis/kubevirt.io/v1``, which describes the KubeVirt
release that cluster runs). Without one, :class:`KubeVirtSchemaMissing` is raised: an
installed package has no copy of its own to fall back on.

The definitions are turned into a JSON Schema once, with the strictness of KubeVirt's
structural CRD schemas and of ``kubectl``'s strict field validation:

* an object schema without ``additionalProperties`` rejects unknown properties (also the
  property-less structs such as ``masquerade: {}``); only ``RawExtension``, ``FieldsV1`` and
  ``Patch`` stay free-form, as in the API;
* ``nullable: true`` admits ``null``; ``int-or-string`` admits both;
* ``required``, types and enums are checked as written; ``default`` and ``description`` are
  ignored.

The object's ``apiVersion`` and ``kind`` pick the definition: by ``x-kubernetes-group-version-kind``
where the document has it (OpenAPI v3), else by name (``kubevirt.io/v1`` + ``VirtualMachine`` is
``v1.VirtualMachine``: swagger definitions are keyed by version and kind only).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from mdev_manager.yamlfile import read_bytes

#: The environment variable naming the schema file when no path is given.
ENV_SCHEMA = "VGPUCTL_KUBEVIRT_OPENAPI"
SCHEMA_MAX_BYTES = 64 << 20  # KubeVirt's whole OpenAPI document is under 1 MiB

#: Definitions left free-form (by name suffix: swagger says ``k8s.io.apimachinery...``, v3 ``io.k8s.apimachinery...``).
FREE_FORM = (
    "apimachinery.pkg.runtime.RawExtension",
    "apimachinery.pkg.apis.meta.v1.FieldsV1",
    "apimachinery.pkg.apis.meta.v1.Patch",
)

_DROP = {"default", "description", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
         "x-kubernetes-map-type", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key"}


class KubeVirtSchemaError(ValueError):
    """The object does not validate; ``problems`` lists each as ``path: message``."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class KubeVirtSchemaMissing(FileNotFoundError):
    """No schema was named (no argument, no ``$VGPUCTL_KUBEVIRT_OPENAPI``)."""


def schema_path(path: str | os.PathLike | None = None) -> Path:
    """``path``, else ``$VGPUCTL_KUBEVIRT_OPENAPI``; :class:`KubeVirtSchemaMissing` when neither is set."""
    raw = path or os.environ.get(ENV_SCHEMA)
    if not raw:
        raise KubeVirtSchemaMissing(
            f"no KubeVirt OpenAPI schema given: pass its path or set ${ENV_SCHEMA} "
            "(kubevirt/kubevirt: api/openapi-spec/swagger.json)"
        )
    p = Path(raw)
    if not p.is_file():
        raise FileNotFoundError(f"KubeVirt OpenAPI schema not found at {p}")
    return p


_V3_REF = "#/components/schemas/"


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
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = _strict(v)
        elif k in ("allOf", "anyOf", "oneOf") and isinstance(v, list):
            out[k] = [_strict(sub) for sub in v]
        elif k == "$ref" and isinstance(v, str) and v.startswith(_V3_REF):
            out[k] = "#/definitions/" + v[len(_V3_REF):]
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


class KubeVirtSchema:
    """Strict JSON Schema definitions of one KubeVirt OpenAPI document, and a validator per kind."""

    def __init__(self, doc: Mapping[str, Any], source: str = "KubeVirt OpenAPI") -> None:
        if doc.get("swagger") == "2.0" and "definitions" in doc:
            raw = doc["definitions"]
        elif str(doc.get("openapi", "")).startswith("3.") and "schemas" in (doc.get("components") or {}):
            raw = doc["components"]["schemas"]
        else:
            raise ValueError(f"{source}: neither a swagger 2.0 document with definitions nor an OpenAPI v3 one")
        self.source = source
        self.definitions = {name: _strict(d, free_form=name.endswith(FREE_FORM)) for name, d in raw.items()}
        self._by_gvk: dict[tuple[str, str, str], str] = {}
        for name, d in raw.items():
            for gvk in d.get("x-kubernetes-group-version-kind") or ():
                self._by_gvk.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)
        self._validators: dict[str, jsonschema.Draft4Validator] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> KubeVirtSchema:
        data = read_bytes(path, what="OpenAPI schema", max_bytes=SCHEMA_MAX_BYTES)
        try:
            return cls(json.loads(data), source=str(path))
        except RecursionError:
            raise ValueError("nested too deeply to be an OpenAPI schema") from None
        except ValueError as exc:
            raise ValueError(f"not a JSON OpenAPI schema ({exc})") from None

    def definition_for(self, obj: Mapping[str, Any]) -> str:
        """The definition of an object's ``apiVersion`` and ``kind`` (``v1.VirtualMachine``)."""
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str) or "/" not in api_version:
            raise KubeVirtSchemaError([f"apiVersion/kind: {api_version!r}/{kind!r} is not a KubeVirt object"])
        group, _, version = api_version.partition("/")
        if not (group == "kubevirt.io" or group.endswith(".kubevirt.io")):
            raise KubeVirtSchemaError([f"apiVersion: group {group!r} is not a KubeVirt API group"])
        name = self._by_gvk.get((group, version, kind)) or f"{version}.{kind}"
        if name not in self.definitions:
            raise KubeVirtSchemaError([f"kind: {api_version} {kind} is not in the KubeVirt schema ({name})"])
        return name

    def _validator(self, name: str) -> jsonschema.Draft4Validator:
        if name not in self._validators:
            root = {"definitions": self.definitions, "$ref": f"#/definitions/{name}"}
            self._validators[name] = jsonschema.Draft4Validator(root)
        return self._validators[name]

    def problems(self, obj: Mapping[str, Any]) -> list[str]:
        """Everything the schema rejects in ``obj``, as ``path: message`` (empty when valid)."""
        try:
            name = self.definition_for(obj)
        except KubeVirtSchemaError as exc:
            return exc.problems
        problems = []
        for err in sorted(self._validator(name).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
            where = ".".join(str(p) for p in err.absolute_path) or "(root)"
            problems.append(f"{obj.get('kind')} {where}: {err.message}")
        return problems


#: A schema, or where to read one (None: ``$VGPUCTL_KUBEVIRT_OPENAPI``).
SchemaSource = KubeVirtSchema | str | os.PathLike | None


@lru_cache(maxsize=4)
def _from_file(path: str) -> KubeVirtSchema:
    return KubeVirtSchema.from_file(path)


def load_schema(schema: SchemaSource = None) -> KubeVirtSchema:
    """``schema`` itself, or the file it names (cached per file), or ``$VGPUCTL_KUBEVIRT_OPENAPI``."""
    if isinstance(schema, KubeVirtSchema):
        return schema
    return _from_file(str(schema_path(schema)))


def definitions(schema: SchemaSource = None) -> dict[str, Any]:
    """The strict JSON Schema definitions."""
    return load_schema(schema).definitions


def definition_for(obj: Mapping[str, Any], schema: SchemaSource = None) -> str:
    return load_schema(schema).definition_for(obj)


def kubevirt_problems(obj: Mapping[str, Any], schema: SchemaSource = None) -> list[str]:
    """Everything KubeVirt's schema rejects in ``obj``, as ``path: message`` (empty when valid)."""
    return load_schema(schema).problems(obj)


def validate_kubevirt(obj: Mapping[str, Any], schema: SchemaSource = None) -> None:
    """Raise :class:`KubeVirtSchemaError` unless ``obj`` validates against KubeVirt's schema."""
    problems = kubevirt_problems(obj, schema)
    if problems:
        raise KubeVirtSchemaError(problems)


def _vmi_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "VirtualMachine":
        spec = ((spec.get("template") or {}).get("spec")) or {}
    return spec if isinstance(spec, Mapping) else {}


def ramfb_displays(obj: Mapping[str, Any]) -> int:
    """How many vGPUs of a VirtualMachine (or VMI) show a display with ramfb, counted as KubeVirt's
    countConfiguredMDEVRamFBs does: ``virtualGPUOptions.display`` set, ``enabled`` not false,
    ``ramFB`` absent or enabled."""
    gpus = ((_vmi_spec(obj).get("domain") or {}).get("devices") or {}).get("gpus") or []
    count = 0
    for g in gpus:
        display = ((g or {}).get("virtualGPUOptions") or {}).get("display")
        if display is None or display.get("enabled") is False:
            continue
        ramfb = display.get("ramFB")
        if ramfb is None or ramfb.get("enabled") is True:
            count += 1
    return count


def admission_problems(obj: Mapping[str, Any]) -> list[str]:
    """What KubeVirt's admission webhooks refuse beyond the schema, for the rules the templates
    could break: more than one vGPU display with ramfb (validateMDEVRamFB in
    pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go, which VM templates
    go through too)."""
    if obj.get("kind") not in ("VirtualMachine", "VirtualMachineInstance") or not is_kubevirt(obj):
        return []
    n = ramfb_displays(obj)
    if n <= 1:
        return []
    return [f"{obj.get('kind')} domain.devices.gpus: configuring multiple displays with ramfb is not valid "
            f"({n} vGPUs show a display with ramfb; KubeVirt's admitter allows one: set "
            "virtualGPUOptions.display.ramFB.enabled: false on the others)"]


def is_kubevirt(obj: Mapping[str, Any]) -> bool:
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    return group == "kubevirt.io" or group.endswith(".kubevirt.io")


__all__ = [
    "ENV_SCHEMA",
    "admission_problems",
    "KubeVirtSchema",
    "KubeVirtSchemaError",
    "KubeVirtSchemaMissing",
    "definition_for",
    "definitions",
    "is_kubevirt",
    "kubevirt_problems",
    "load_schema",
    "ramfb_displays",
    "schema_path",
    "validate_kubevirt",
]
