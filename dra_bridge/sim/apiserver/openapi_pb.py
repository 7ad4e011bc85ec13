"""``/openapi/v2`` in the protobuf form kubectl asks for (gnostic's ``openapi.v2.Document``).

client-go fetches ``/openapi/v2`` with ``Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf``
and decodes nothing else. This module writes the protobuf wire format of the JSON document of
:func:`.openapi.v2` by hand, field numbers from gnostic's ``OpenAPIv2.proto``: the parts kubectl
reads (schemas with their ``x-kubernetes-*`` extensions, operations, parameters, responses).
Extension and default values travel as gnostic does, as YAML text (JSON is YAML).
"""

from __future__ import annotations

import json
import struct
from typing import Any

MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _msg(number: int, payload: bytes, always: bool = False) -> bytes:
    if not payload and not always:
        return b""
    return _field(number, 2) + _varint(len(payload)) + payload


def _str(number: int, value: Any) -> bytes:
    return _msg(number, str(value).encode()) if value not in (None, "") else b""


def _strs(number: int, values: Any) -> bytes:
    return b"".join(_msg(number, str(v).encode(), always=True) for v in values or [])


def _bool(number: int, value: Any, always: bool = False) -> bytes:
    return _field(number, 0) + (b"\x01" if value else b"\x00") if (value or always) else b""


def _int(number: int, value: Any) -> bytes:
    return _field(number, 0) + _varint(int(value)) if value else b""


def _double(number: int, value: Any) -> bytes:
    return _field(number, 1) + struct.pack("<d", float(value)) if value else b""


def _any(value: Any) -> bytes:
    """gnostic's ``Any``: the value as YAML text (field 2)."""
    return _str(2, json.dumps(value))


def _extensions(number: int, node: dict) -> bytes:
    return b"".join(_msg(number, _str(1, k) + _msg(2, _any(v), always=True), always=True)
                    for k, v in node.items() if k.startswith("x-"))


def schema(node: dict) -> bytes:
    """``Schema`` (recursive)."""
    out = _str(1, node.get("$ref")) + _str(2, node.get("format")) + _str(3, node.get("title")) + \
        _str(4, node.get("description"))
    if "default" in node:
        out += _msg(5, _any(node["default"]), always=True)
    out += _double(6, node.get("multipleOf")) + _double(7, node.get("maximum")) + \
        _bool(8, node.get("exclusiveMaximum")) + _double(9, node.get("minimum")) + \
        _bool(10, node.get("exclusiveMinimum")) + _int(11, node.get("maxLength")) + \
        _int(12, node.get("minLength")) + _str(13, node.get("pattern")) + _int(14, node.get("maxItems")) + \
        _int(15, node.get("minItems")) + _bool(16, node.get("uniqueItems")) + \
        _int(17, node.get("maxProperties")) + _int(18, node.get("minProperties")) + _strs(19, node.get("required"))
    out += b"".join(_msg(20, _any(v), always=True) for v in node.get("enum") or [])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out += _msg(21, _msg(1, schema(extra), always=True), always=True)
    elif isinstance(extra, bool):
        out += _msg(21, _bool(2, extra, always=True), always=True)
    if node.get("type"):
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        out += _msg(22, _strs(1, kinds), always=True)
    items = node.get("items")
    if isinstance(items, dict):
        out += _msg(23, _msg(1, schema(items), always=True), always=True)
    out += b"".join(_msg(24, schema(s), always=True) for s in node.get("allOf") or [])
    props = node.get("properties")
    if isinstance(props, dict):
        out += _msg(25, b"".join(_msg(1, _str(1, k) + _msg(2, schema(v), always=True), always=True)
                                 for k, v in props.items()), always=True)
    return out + _bool(27, node.get("readOnly")) + _extensions(31, node)


def _parameter(p: dict) -> bytes:
    """``ParametersItem`` -> ``Parameter``: a body parameter, or a query or path one."""
    if p.get("in") == "body":
        body = _str(1, p.get("description")) + _str(2, p["name"]) + _str(3, "body") + \
            _bool(4, p.get("required")) + _msg(5, schema(p.get("schema") or {}), always=True)
        param = _msg(1, body, always=True)
    else:
        if p.get("in") == "path":  # PathParameterSubSchema: type 5, format 6, uniqueItems 19
            sub = _bool(1, p.get("required")) + _str(2, "path") + _str(3, p.get("description")) + \
                _str(4, p["name"]) + _str(5, p.get("type")) + _str(6, p.get("format")) + _bool(19, p.get("uniqueItems"))
            nonbody = _msg(4, sub, always=True)
        else:  # QueryParameterSubSchema: type 6, format 7, uniqueItems 20
            sub = _bool(1, p.get("required")) + _str(2, "query") + _str(3, p.get("description")) + \
                _str(4, p["name"]) + _str(6, p.get("type")) + _str(7, p.get("format")) + _bool(20, p.get("uniqueItems"))
            nonbody = _msg(3, sub, always=True)
        param = _msg(2, nonbody, always=True)
    return _msg(1, param, always=True)


def _operation(op: dict) -> bytes:
    out = _strs(1, op.get("tags")) + _str(3, op.get("description")) + _str(5, op.get("operationId")) + \
        _strs(6, op.get("produces")) + _strs(7, op.get("consumes"))
    out += b"".join(_msg(8, _parameter(p), always=True) for p in op.get("parameters") or [])
    responses = b""
    for code, resp in (op.get("responses") or {}).items():
        r = _str(1, resp.get("description"))
        if resp.get("schema"):
            r += _msg(2, _msg(1, schema(resp["schema"]), always=True), always=True)
        responses += _msg(1, _str(1, code) + _msg(2, _msg(1, r, always=True), always=True), always=True)
    return out + _msg(9, responses, always=True) + _extensions(13, op)


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def encode(doc: dict) -> bytes:
    """The protobuf ``openapi.v2.Document`` of a swagger 2.0 document (a dict)."""
    info = doc.get("info") or {}
    paths = b""
    for path, item in (doc.get("paths") or {}).items():
        body = b"".join(_msg(_METHODS[m], _operation(op), always=True) for m, op in item.items() if m in _METHODS)
        body += b"".join(_msg(9, _parameter(p), always=True) for p in item.get("parameters") or [])
        paths += _msg(2, _str(1, path) + _msg(2, body, always=True), always=True)
    definitions = b"".join(_msg(1, _str(1, name) + _msg(2, schema(s), always=True), always=True)
                           for name, s in (doc.get("definitions") or {}).items())
    return _str(1, doc.get("swagger", "2.0")) + _msg(2, _str(1, info.get("title")) + _str(2, info.get("version"))) + \
        _msg(8, paths, always=True) + _msg(9, definitions, always=True)
