"""The local API server as kubectl sees it, over plain HTTP: server-side apply and managedFields,
``meta.k8s.io`` Tables, and OpenAPI v2 / v3 documents whose references all resolve."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.apiserver.tables import human_duration

APPLY = "application/apply-patch+yaml"
CM = "/api/v1/namespaces/default/configmaps"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def req(srv, method: str, path: str, body=None, ctype: str = "application/json", accept: str = "application/json"):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(srv.url + path, data=data, method=method,
                               headers={"Content-Type": ctype, "Accept": accept, "User-Agent": "tester/1.0"})
    try:
        with urllib.request.urlopen(r, timeout=10) as resp:
            raw = resp.read()
            code = resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read(), exc.code
    return code, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)


def cm(**data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": data}


def owners(obj: dict) -> dict[tuple[str, str], set[str]]:
    """(manager, operation) -> the data keys it owns."""
    return {(e["manager"], e["operation"]): {k[2:] for k in e["fieldsV1"].get("f:data", {})}
            for e in obj["metadata"].get("managedFields", [])}


@pytest.fixture
def srv():
    with LocalApiServer(version="1.37") as s:
        yield s


def test_apply_owns_what_it_sends_shares_removes_and_conflicts(srv):
    code, err = req(srv, "PATCH", f"{CM}/cm", cm(a="1"), APPLY)
    assert (code, err["message"]) == (422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                           'is required for apply patch')
    code, obj = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice", cm(a="1", b="2"), APPLY)
    assert code == 201 and owners(obj) == {("alice", "Apply"): {"a", "b"}}
    # an update by another manager takes the fields it changed
    code, obj = req(srv, "PUT", f"{CM}/cm?fieldManager=bob", {**obj, "data": {"a": "10", "b": "2", "c": "3"}})
    assert code == 200 and owners(obj) == {("alice", "Apply"): {"b"}, ("bob", "Update"): {"a", "c"}}
    code, err = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice", cm(a="1", b="2"), APPLY)
    assert code == 409 and err["reason"] == "Conflict"
    assert err["message"] == 'Apply failed with 1 conflict: conflict with "bob" using v1: .data.a'
    assert err["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "bob" using v1',
                                         "field": ".data.a"}]
    # the same value is no conflict: both own it
    code, obj = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice", cm(a="10", b="2", d="4"), APPLY)
    assert code == 200 and owners(obj) == {("alice", "Apply"): {"a", "b", "d"}, ("bob", "Update"): {"a", "c"}}
    # what it stops sending goes, unless another manager owns it too
    code, obj = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice", cm(b="2"), APPLY)
    assert obj["data"] == {"a": "10", "b": "2", "c": "3"}
    rv = obj["metadata"]["resourceVersion"]
    code, obj = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice", cm(b="2"), APPLY)
    assert obj["metadata"]["resourceVersion"] == rv  # nothing changed: no write
    code, obj = req(srv, "PATCH", f"{CM}/cm?fieldManager=alice&force=true", cm(a="9", b="2"), APPLY)
    assert obj["data"]["a"] == "9" and owners(obj) == {("alice", "Apply"): {"a", "b"}, ("bob", "Update"): {"c"}}
    code, err = req(srv, "PATCH", f"{CM}/cm?force=true", {"data": {"x": "1"}}, "application/merge-patch+json")
    assert code == 422 and "force: Forbidden: may not be specified for non-apply patch" in err["message"]


def test_objects_from_before_any_manager_are_untracked_until_applied(srv):
    srv.add(cm(a="1"))
    code, obj = req(srv, "PATCH", f"{CM}/cm", {"data": {"a": "2"}}, "application/merge-patch+json")
    assert code == 200 and "managedFields" not in obj["metadata"]  # updates do not start tracking
    code, err = req(srv, "PATCH", f"{CM}/cm?fieldManager=kubectl", cm(a="3"), APPLY)
    assert code == 409 and 'conflict with "before-first-apply" using v1: .data.a' in err["message"]
    code, obj = req(srv, "POST", f"{CM}?fieldManager=creator", {**cm(x="1"), "metadata": {"name": "new"}})
    assert owners(obj) == {("creator", "Update"): {"x"}}
    code, obj = req(srv, "POST", CM, {**cm(x="1"), "metadata": {"name": "ua"}})
    assert owners(obj) == {("tester", "Update"): {"x"}}  # no fieldManager: the User-Agent's product


def test_apply_merges_associative_lists_by_key(srv):
    def ds(*containers: str) -> dict:
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                    "metadata": {"labels": {"app": "d"}},
                    "spec": {"containers": [{"name": n, "image": f"{n}:1"} for n in containers]}}}}

    path = "/apis/apps/v1/namespaces/default/daemonsets/d"
    assert req(srv, "PATCH", f"{path}?fieldManager=alice", ds("a"), APPLY)[0] == 201
    code, obj = req(srv, "PATCH", f"{path}?fieldManager=bob", ds("b"), APPLY)
    assert [c["name"] for c in obj["spec"]["template"]["spec"]["containers"]] == ["a", "b"]
    bob = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "bob")
    assert 'k:{"name":"b"}' in bob["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    code, obj = req(srv, "PATCH", f"{path}?fieldManager=alice", ds(), APPLY)  # alice drops hers
    assert [c["name"] for c in obj["spec"]["template"]["spec"]["containers"]] == ["b"]


def test_get_answers_tables_and_metadata_when_asked(srv):
    srv.add({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
             "spec": {"driver": "vgpu.kubevirt.io", "nodeName": "n1", "pool": {"name": "p", "generation": 1,
                                                                               "resourceSliceCount": 1}}})
    code, t = req(srv, "GET", "/apis/resource.k8s.io/v1/resourceslices", accept=TABLE)
    assert (t["kind"], t["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in t["columnDefinitions"]] == ["Name", "Node", "Driver", "Pool", "Age"]
    (row,) = t["rows"]
    assert row["cells"][:4] == ["s", "n1", "vgpu.kubevirt.io", "p"]
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["name"] == "s"
    code, t = req(srv, "GET", "/apis/resource.k8s.io/v1/resourceslices/s?includeObject=Object", accept=TABLE)
    assert t["rows"][0]["object"]["spec"]["nodeName"] == "n1"
    code, t = req(srv, "GET", "/api/v1/namespaces", accept="application/json;as=PartialObjectMetadataList;v=v1;"
                                                          "g=meta.k8s.io")
    assert t["kind"] == "PartialObjectMetadataList" and {i["metadata"]["name"] for i in t["items"]} >= {"default"}
    code, plain = req(srv, "GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert plain["kind"] == "ResourceSliceList"


@pytest.mark.parametrize("seconds,shown", [(-5, "<invalid>"), (0, "0s"), (119, "119s"), (125, "2m5s"), (600, "10m"),
                                           (3 * 3600 + 60, "3h1m"), (9 * 3600, "9h"), (50 * 3600, "2d2h"),
                                           (30 * 86400, "30d"), (800 * 86400, "2y70d")])
def test_ages_read_as_kubectl_shows_them(seconds, shown):
    assert human_duration(seconds) == shown


def _refs(node, out: set) -> set:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.add(node["$ref"])
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)
    return out


def _fields(data: bytes) -> list[tuple[int, bytes | int]]:
    """Top-level protobuf fields (number, payload) of a message: varints and length-delimited only."""
    out, i = [], 0

    def varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = varint()
        if key & 7 == 0:
            out.append((key >> 3, varint()))
        elif key & 7 == 2:
            size = varint()
            out.append((key >> 3, data[i:i + size]))
            i += size
        else:
            raise AssertionError(f"wire type {key & 7}")
    return out


def test_openapi_documents_carry_the_schemas_they_name(srv):
    code, root = req(srv, "GET", "/openapi/v3")
    for gv in ("api/v1", "apis/resource.k8s.io/v1", "apis/apps/v1", "apis/admissionregistration.k8s.io/v1"):
        code, doc = req(srv, "GET", root["paths"][gv]["serverRelativeURL"])
        schemas = doc["components"]["schemas"]
        missing = {r for r in _refs(doc, set()) if r.split("/")[-1] not in schemas}
        assert code == 200 and not missing, (gv, missing)
    code, doc = req(srv, "GET", root["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"])
    slice_ = doc["components"]["schemas"]["io.k8s.api.resource.v1.ResourceSlice"]
    assert slice_["x-kubernetes-group-version-kind"] == [{"group": "resource.k8s.io", "kind": "ResourceSlice",
                                                          "version": "v1"}]
    assert slice_["properties"]["kind"]["type"] == "string"  # plain OpenAPI types, no JSON Schema nullables
    patch = doc["paths"]["/apis/resource.k8s.io/v1/resourceslices/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
    assert {"fieldValidation", "fieldManager", "force"} <= {p["name"] for p in patch["parameters"]}
    code, v2 = req(srv, "GET", "/openapi/v2")
    assert v2["swagger"] == "2.0" and not {r for r in _refs(v2, set()) if r.split("/")[-1] not in v2["definitions"]}
    code, pb = req(srv, "GET", "/openapi/v2", accept="application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
    top = _fields(pb)
    assert (1, b"2.0") in top
    (definitions,) = [v for n, v in top if n == 9]
    names = {dict(_fields(named))[1].decode() for _, named in _fields(definitions)}
    assert names == set(v2["definitions"])
