"""The local API server keeps an opaque config's parameters as the bytes sent, as kube-apiserver does.

kube-apiserver 1.37.2 refused every status write of an allocated claim whose parameters came back with
other spacing ("status.allocation: Invalid value: null: field cannot be modified once set"): the
parameters are a ``runtime.RawExtension``, stored verbatim and compared as bytes. The agent's status
writes over the Kubernetes client's default spacing failed on the real server while the simulated one,
comparing decoded values, accepted them; these tests hold the model to the real rule
(``tests/system/test_real_controlplane.py`` checks our client against the real server).
"""

from __future__ import annotations

import http.client
import json

import pytest

from dra_bridge.sim.apiserver import LocalApiServer

DRIVER = "vgpu.kubevirt.io"
PATH = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PARAMS = {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": "T4-2Q"}
SPACED = {"separators": (", ", ": ")}  # the kubernetes client's json.dumps default
COMPACT = {"separators": (",", ":")}


@pytest.fixture
def srv():
    with LocalApiServer(version="1.37") as server:
        yield server


def send(srv, method: str, path: str, text: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request(method, path, body=text.encode() if text is not None else None,
                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def opaque() -> dict:
    return {"driver": DRIVER, "parameters": dict(PARAMS)}


def make_claim(srv, dumps: dict) -> dict:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "opaque-config", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}],
                                  "config": [{"requests": ["vgpu"], "opaque": opaque()}]}}}
    code, made = send(srv, "POST", PATH, json.dumps(claim, **dumps))
    assert code == 201, made
    return made


def allocate(srv, claim: dict, dumps: dict) -> dict:
    """Write the allocation as the scheduler does: the claim's config copied in."""
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "vgpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0"}],
                    "config": [{"source": "FromClaim", "requests": ["vgpu"], "opaque": opaque()}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(claim, **dumps))
    assert code == 200, out
    return out


def add_device_status(claim: dict) -> dict:
    claim["status"]["devices"] = [{"driver": DRIVER, "pool": "n1", "device": "gpu-0-vgpu-2gb-0",
                                   "conditions": [{"type": "vgpu.kubevirt.io/size", "status": "True",
                                                   "reason": "SizeConfirmed", "message": "2 GiB",
                                                   "lastTransitionTime": "2026-12-07T00:00:00Z"}]}]
    return claim


def test_a_status_write_with_the_parameters_respaced_is_refused_as_the_real_server_does(srv):
    allocate(srv, make_claim(srv, COMPACT), COMPACT)
    code, read = send(srv, "GET", f"{PATH}/opaque-config")
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(add_device_status(read), **SPACED))
    assert code == 422, out
    assert out["reason"] == "Invalid"
    assert out["message"] == ('ResourceClaim.resource.k8s.io "opaque-config" is invalid: status.allocation: '
                              "Invalid value: null: field cannot be modified once set")
    assert out["details"]["causes"][0]["field"] == "status.allocation"


def test_the_same_bytes_written_back_are_taken(srv):
    allocate(srv, make_claim(srv, COMPACT), COMPACT)
    code, read = send(srv, "GET", f"{PATH}/opaque-config")
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(add_device_status(read), **COMPACT))
    assert code == 200, out
    assert out["status"]["devices"][0]["conditions"][0]["reason"] == "SizeConfirmed"


def test_parameters_first_sent_spaced_are_kept_spaced(srv):
    """The bytes are stored as first sent (protobuf storage keeps them verbatim), so a claim made with
    spacing takes back only that spacing: compacting it is a change too."""
    allocate(srv, make_claim(srv, SPACED), SPACED)
    code, read = send(srv, "GET", f"{PATH}/opaque-config")
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(add_device_status(read), **COMPACT))
    assert code == 422, out
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(read, **SPACED))
    assert code == 200, out


def test_a_real_change_of_the_allocation_is_refused_and_clearing_it_is_taken(srv):
    allocate(srv, make_claim(srv, COMPACT), COMPACT)
    code, read = send(srv, "GET", f"{PATH}/opaque-config")
    read["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0-vgpu-2gb-1"
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(read, **COMPACT))
    assert code == 422, out
    read["status"] = {}
    code, out = send(srv, "PUT", f"{PATH}/opaque-config/status", json.dumps(read, **COMPACT))
    assert code == 200, out


def test_our_client_confirms_a_binding_condition_on_such_a_claim(srv):
    """What the agent does: read the claim through the Kubernetes client and write a device status."""
    from dra_bridge.apiclient.claims import ApiClaimSource

    allocate(srv, make_claim(srv, COMPACT), COMPACT)
    entry = add_device_status({"status": {}})["status"]["devices"][0]
    assert ApiClaimSource(srv.api_client()).set_device_status("default", "opaque-config", [entry])
    code, read = send(srv, "GET", f"{PATH}/opaque-config")
    assert read["status"]["devices"][0]["conditions"][0]["type"] == "vgpu.kubevirt.io/size"


def patch(srv, text: str, ctype: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("PATCH", f"{PATH}/opaque-config/status", body=text.encode(),
                     headers={"Content-Type": ctype, "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


@pytest.mark.parametrize("ctype", ["application/merge-patch+json", "application/strategic-merge-patch+json"])
@pytest.mark.parametrize("first, taken", [(COMPACT, True), (SPACED, False)])
def test_a_status_patch_is_taken_only_where_the_parameters_were_stored_compact(srv, ctype, first, taken):
    """A patch merges into the stored object encoded again (compacted): parameters first sent with
    spaces then differ from what is stored, and no JSON status write is ever taken again, as
    kube-apiserver 1.37.2 answers to every kind of patch and to a PUT (an upstream limitation)."""
    allocate(srv, make_claim(srv, first), first)
    entries = add_device_status({"status": {}})["status"]["devices"]
    code, out = patch(srv, json.dumps({"status": {"devices": entries}}, **COMPACT), ctype)
    assert (code == 200) == taken, out
    if not taken:
        assert "field cannot be modified once set" in out["message"]


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_the_agent_names_a_claim_whose_status_no_json_write_can_change(version):
    """What the agent says when the server refuses it for that reason: the claim, why, and the fix, in
    one line (not the raw API error with its headers, every second). On 1.34 too, whose server words
    the refusal otherwise ("field is immutable"): the agent raised the raw 422 there."""
    from dra_bridge.apiclient.claims import ApiClaimSource, UnwritableClaimStatus

    with LocalApiServer(version=version) as srv:
        allocate(srv, make_claim(srv, SPACED), SPACED)
        entry = add_device_status({"status": {}})["status"]["devices"][0]
        with pytest.raises(UnwritableClaimStatus) as caught:
            ApiClaimSource(srv.api_client()).set_device_status("default", "opaque-config", [entry])
    text = str(caught.value)
    assert "\n" not in text and text.startswith("claim default/opaque-config: ")
    assert "byte for byte" in text and "kubectl" in text


def test_the_1_34_server_words_the_refusal_as_field_is_immutable():
    """kube-apiserver 1.34.12's ``ValidateImmutableField`` (not 1.37's declarative "cannot be modified
    once set"), on the same field: what the real 1.34 server answered (tests/system/test_real_controlplane.py)."""
    with LocalApiServer(version="1.34") as srv:
        allocate(srv, make_claim(srv, SPACED), SPACED)
        entries = add_device_status({"status": {}})["status"]["devices"]
        code, out = patch(srv, json.dumps({"status": {"devices": entries}}, **COMPACT), "application/merge-patch+json")
    assert code == 422, out
    assert out["message"].endswith("status.allocation: Invalid value: null: field is immutable"), out
    assert out["details"]["causes"][0]["field"] == "status.allocation"


#: The 422 bodies the real servers answered (values shortened): 1.37.2 and 1.34.12
REFUSED_1_37 = ('{"kind":"Status","status":"Failure","message":"ResourceClaim.resource.k8s.io \\"c\\" is invalid: '
                'status.allocation: Invalid value: null: field cannot be modified once set","reason":"Invalid",'
                '"details":{"causes":[{"reason":"FieldValueInvalid","message":"Invalid value: null: field cannot be '
                'modified once set","field":"status.allocation"}]},"code":422}')
REFUSED_1_34 = ('{"kind":"Status","status":"Failure","message":"ResourceClaim.resource.k8s.io \\"c\\" is invalid: '
                'status.allocation: Invalid value: {\\"Devices\\":{}}: field is immutable","reason":"Invalid",'
                '"details":{"causes":[{"reason":"FieldValueInvalid","message":"Invalid value: {\\"Devices\\":{}}: '
                'field is immutable","field":"status.allocation"}]},"code":422}')
OTHER_422 = ('{"kind":"Status","status":"Failure","message":"status.devices[0].conditions: Too many","reason":'
             '"Invalid","details":{"causes":[{"reason":"FieldValueTooMany","field":"status.devices[0].conditions"}]},'
             '"code":422}')


@pytest.mark.parametrize(("body", "refused"), [(REFUSED_1_37, True), (REFUSED_1_34, True), (REFUSED_1_34.encode(), True),
                                               (OTHER_422, False), ("not json", False), (None, False)])
def test_the_allocation_refusal_is_told_apart_on_either_version(body, refused):
    from dra_bridge.apiclient.claims import allocation_refused

    assert allocation_refused(body) is refused
