"""The local API server (``dra_bridge.sim.apiserver``) driven by the real ``kubernetes`` client."""

from __future__ import annotations

import json
import threading
import time

import kubernetes_validate
import pytest
from kubernetes import client, config, watch
from kubernetes.client import ApiException

from dra_bridge.sim.apiserver import LocalApiServer, dra_rules
from dra_bridge.sim.apiserver.validation import schema_errors

DRIVER = "gpu.example.com"


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def api(srv):
    return client.ResourceV1Api(srv.api_client())


def pool(name="node-a", generation=1, count=1):
    return client.V1ResourcePool(name=name, generation=generation, resource_slice_count=count)


def device(name, **attrs):
    return client.V1Device(
        name=name,
        attributes={k: client.V1DeviceAttribute(string=v) for k, v in attrs.items()} or None,
    )


def make_slice(name, node="node-a", devices=None, labels=None, driver=DRIVER, **spec):
    return client.V1ResourceSlice(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1ResourceSliceSpec(
            driver=driver, pool=pool(node), node_name=node,
            devices=devices if devices is not None else [device("gpu-0")], **spec),
    )


def counters_and_devices_slice(name="node-a-gpu-0"):
    """The 1.34 layout: the counter set and the devices consuming it in one slice."""
    return make_slice(
        name,
        shared_counters=[client.V1CounterSet(
            name="gpu-0-counter-set", counters={"memory": client.V1Counter(value="80Gi")})],
        devices=[client.V1Device(
            name=f"gpu-0-vgpu-{i}",
            consumes_counters=[client.V1DeviceCounterConsumption(
                counter_set="gpu-0-counter-set",
                counters={"memory": client.V1Counter(value="20Gi")})],
        ) for i in range(2)],
    )


def raw(api_client, method, path, body=None, content_type="application/json"):
    """A request through the real ApiClient, bypassing the models' client-side checks."""
    params = api_client.param_serialize(
        method=method, resource_path=path,
        header_params={"Content-Type": content_type, "Accept": "application/json"}, body=body)
    resp = api_client.call_api(*params)
    resp.read()
    return api_client.response_deserialize(resp, {"2XX": "object"}).data


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


# ----------------------------------------------------------------------------- server basics
@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_version_is_configurable(version):
    with LocalApiServer(version=version) as srv:
        info = client.VersionApi(srv.api_client()).get_code()
        assert (info.major, info.minor, info.git_version) == ("1", version[2:], f"v{version}.0")


def test_unsupported_version_refused():
    with pytest.raises(ValueError):
        LocalApiServer(version="1.33")


def test_discovery_documents(srv):
    ac = srv.api_client()
    groups = raw(ac, "GET", "/apis")
    assert "resource.k8s.io" in [g["name"] for g in groups["groups"]]
    group = raw(ac, "GET", "/apis/resource.k8s.io")
    assert group["preferredVersion"]["groupVersion"] == "resource.k8s.io/v1"
    resources = {r["name"]: r for r in raw(ac, "GET", "/apis/resource.k8s.io/v1")["resources"]}
    assert resources["resourceslices"]["namespaced"] is False
    assert resources["resourceclaims"]["namespaced"] is True
    assert "resourceclaims/status" in resources
    core = {r.name: r for r in client.CoreV1Api(ac).get_api_resources().resources}
    assert core["nodes"].namespaced is False and core["pods"].namespaced is True
    groups_api = client.ApisApi(ac).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in groups_api.groups]


def test_create_get_list_and_server_fields(srv, api):
    created = api.create_resource_slice(make_slice("node-a-gpus"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    assert int(created.metadata.resource_version) > 0
    got = api.read_resource_slice("node-a-gpus")
    assert got.metadata.uid == created.metadata.uid and got.kind == "ResourceSlice"
    listed = api.list_resource_slice()
    assert [s.metadata.name for s in listed.items] == ["node-a-gpus"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    with pytest.raises(ApiException) as exc:
        api.create_resource_slice(make_slice("node-a-gpus"))
    assert exc.value.status == 409 and status_of(exc.value)["reason"] == "AlreadyExists"


def test_generate_name(api):
    s = make_slice(None)
    s.metadata = client.V1ObjectMeta(generate_name="node-a-gpu.example.com-")
    a, b = api.create_resource_slice(s), api.create_resource_slice(s)
    assert a.metadata.name.startswith("node-a-gpu.example.com-")
    assert a.metadata.name != b.metadata.name


def test_get_and_delete_missing_are_404_status(api):
    for call in (lambda: api.read_resource_slice("nope"), lambda: api.delete_resource_slice("nope")):
        with pytest.raises(ApiException) as exc:
            call()
        body = status_of(exc.value)
        assert exc.value.status == 404
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": 'resourceslices.resource.k8s.io "nope" not found',
                        "reason": "NotFound", "code": 404,
                        "details": {"name": "nope", "group": "resource.k8s.io",
                                    "kind": "resourceslices"}}


# ----------------------------------------------------------------------------- validation
def test_schema_invalid_body_is_422_naming_the_field(srv):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                     "nodeName": "n", "devices": [{"name": "gpu-0", "bogusField": 1}]}}
    with pytest.raises(ApiException) as exc:
        raw(srv.api_client(), "POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert exc.value.status == 422
    status = status_of(exc.value)
    assert status["reason"] == "Invalid" and status["kind"] == "Status"
    assert "spec.devices[0].bogusField" in status["message"]
    assert status["details"]["causes"][0]["field"] == "spec.devices[0].bogusField"
    assert srv.objects("resourceslices") == []


def test_wrong_type_is_422(srv):
    body = {"metadata": {"name": "s"},
            "spec": {"driver": DRIVER, "pool": {"name": "p", "generation": "one",
                                                "resourceSliceCount": 1}, "nodeName": "n"}}
    with pytest.raises(ApiException) as exc:
        raw(srv.api_client(), "POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert exc.value.status == 422 and "spec.pool.generation" in status_of(exc.value)["message"]


def test_fields_newer_than_the_server_version_are_rejected():
    """compatibilityGroups is a 1.37 field: a 1.35 server's schema does not know it."""
    def slice_with_groups():
        return make_slice("counters-consumer", devices=[client.V1Device(
            name="gpu-0-mig-1g", consumes_counters=[client.V1DeviceCounterConsumption(
                counter_set="gpu-0-counter-set", counters={"memory": client.V1Counter(value="10Gi")},
                compatibility_groups=["1g"])])])

    with LocalApiServer(version="1.35") as srv:
        with pytest.raises(ApiException) as exc:
            client.ResourceV1Api(srv.api_client()).create_resource_slice(slice_with_groups())
        assert exc.value.status == 422
        assert "spec.devices[0].consumesCounters[0].compatibilityGroups" in status_of(exc.value)["message"]
    with LocalApiServer(version="1.37") as srv:
        client.ResourceV1Api(srv.api_client()).create_resource_slice(slice_with_groups())


def test_devices_and_counters_in_one_slice_rejected_on_1_35_accepted_on_1_34():
    with LocalApiServer(version="1.35") as srv:
        with pytest.raises(ApiException) as exc:
            client.ResourceV1Api(srv.api_client()).create_resource_slice(counters_and_devices_slice())
        assert exc.value.status == 422
        assert "only one of sharedCounters or devices is allowed" in status_of(exc.value)["message"]
    with LocalApiServer(version="1.34") as srv:
        created = client.ResourceV1Api(srv.api_client()).create_resource_slice(
            counters_and_devices_slice())
        assert len(created.spec.devices) == 2 and created.spec.shared_counters


def test_split_layout_accepted_on_1_35(api):
    counters = make_slice("node-a-counters", devices=[], shared_counters=[client.V1CounterSet(
        name="gpu-0-counter-set", counters={"memory": client.V1Counter(value="80Gi")})])
    api.create_resource_slice(counters)
    devices = counters_and_devices_slice("node-a-devices")
    devices.spec.shared_counters = None
    api.create_resource_slice(devices)


def test_1_34_devices_must_consume_counters_of_their_own_slice():
    s = counters_and_devices_slice()
    s.spec.shared_counters = None
    with LocalApiServer(version="1.34") as srv:
        with pytest.raises(ApiException) as exc:
            client.ResourceV1Api(srv.api_client()).create_resource_slice(s)
        assert "must reference a counterSet" in status_of(exc.value)["message"]


@pytest.mark.parametrize("mutate, expected", [
    (lambda s: setattr(s.spec, "all_nodes", True), "exactly one of `nodeName`"),
    (lambda s: setattr(s.spec, "node_name", None), "exactly one of `nodeName`"),
    (lambda s: setattr(s.spec, "devices", [device(f"gpu-{i}") for i in range(129)]),
     "spec.devices: Too many: 129: must have at most 128"),
    (lambda s: setattr(s.spec, "devices", [device("gpu-0"), device("gpu-0")]),
     'spec.devices[1].name: Duplicate value: "gpu-0"'),
    (lambda s: setattr(s.spec, "devices", [device("GPU_0")]), "must be a DNS label"),
    (lambda s: setattr(s.spec, "devices", [device("gpu-0", **{f"a{i}": "x" for i in range(33)})]),
     "Too many: 33: must have at most 32 attributes and capacities"),
    (lambda s: setattr(s.spec, "devices", [device("gpu-0", uuid="x" * 65)]),
     "spec.devices[0].attributes[uuid].string: Too long"),
    (lambda s: setattr(s.spec, "devices", [client.V1Device(name="gpu-0", attributes={
        "v": client.V1DeviceAttribute(string="a", int=1)})]), "exactly one value"),
    (lambda s: setattr(s.spec, "devices", [client.V1Device(name="gpu-0", attributes={
        "driverVersion": client.V1DeviceAttribute(version="550.1")})]), "semver"),
])
def test_dra_rules_reject(api, mutate, expected):
    s = make_slice("bad")
    mutate(s)
    with pytest.raises(ApiException) as exc:
        api.create_resource_slice(s)
    assert exc.value.status == 422
    assert expected in status_of(exc.value)["message"]


def test_64_device_limit_with_counters_only_from_1_35():
    def big():
        s = make_slice("big", devices=[client.V1Device(
            name=f"gpu-{i}", consumes_counters=[client.V1DeviceCounterConsumption(
                counter_set="cs", counters={"memory": client.V1Counter(value="1Gi")})])
            for i in range(65)])
        s.spec.shared_counters = [client.V1CounterSet(
            name="cs", counters={"memory": client.V1Counter(value="80Gi")})]
        return s

    with LocalApiServer(version="1.34") as srv:
        client.ResourceV1Api(srv.api_client()).create_resource_slice(big())
    with LocalApiServer(version="1.35") as srv:
        s = big()
        s.spec.shared_counters = None  # 1.35 layout: counters live in another slice
        with pytest.raises(ApiException) as exc:
            client.ResourceV1Api(srv.api_client()).create_resource_slice(s)
        assert "Too many: 65: must have at most 64" in status_of(exc.value)["message"]
        s.spec.devices = s.spec.devices[:64]
        client.ResourceV1Api(srv.api_client()).create_resource_slice(s)


def test_dra_rules_read_like_the_spec():
    spec = {"driver": DRIVER, "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "n", "devices": [{"name": "a"}], "sharedCounters": [
                {"name": "cs", "counters": {"memory": {"value": "1"}}}]}
    assert dra_rules.only_devices_or_shared_counters(spec, 34) == []
    assert dra_rules.only_devices_or_shared_counters(spec, 35)
    assert dra_rules.exactly_one_node_selection(spec, 35) == []
    assert dra_rules.exactly_one_node_selection({**spec, "allNodes": True}, 35)
    assert dra_rules.taints_per_device_limit(
        {"devices": [{"name": "a", "taints": [{}] * 5}]}, 34)
    assert not dra_rules.taints_per_device_limit(
        {"devices": [{"name": "a", "taints": [{}] * 5}]}, 35)


def test_schema_validation_matches_kubernetes_validate():
    ok = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
          "spec": {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                   "nodeName": "n", "devices": [{"name": "a"}]}}
    bad = json.loads(json.dumps(ok))
    bad["spec"]["devices"][0]["oops"] = True
    for version in ("1.34", "1.35", "1.36", "1.37"):
        kubernetes_validate.validate(ok, desired_version=version, strict=True)
        assert schema_errors(ok, version) == []
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, desired_version=version, strict=True)
        assert schema_errors(bad, version)


def test_field_validation_ignore_drops_unknown_fields(srv):
    body = {"metadata": {"name": "s"},
            "spec": {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                     "nodeName": "n", "devices": [{"name": "gpu-0", "bogusField": 1}]}}
    created = raw(srv.api_client(), "POST",
                  "/apis/resource.k8s.io/v1/resourceslices?fieldValidation=Ignore", body)
    assert created["spec"]["devices"] == [{"name": "gpu-0"}]


# ----------------------------------------------------------------------------- update / patch
def test_stale_update_is_409_conflict(api):
    first = api.create_resource_slice(make_slice("s"))
    first.spec.devices.append(device("gpu-1"))
    updated = api.replace_resource_slice("s", first)
    assert int(updated.metadata.resource_version) > int(first.metadata.resource_version)
    assert updated.metadata.generation == 2
    first.spec.devices.append(device("gpu-2"))  # still carries the old resourceVersion
    with pytest.raises(ApiException) as exc:
        api.replace_resource_slice("s", first)
    assert exc.value.status == 409
    status = status_of(exc.value)
    assert status["reason"] == "Conflict" and "the object has been modified" in status["message"]


def test_metadata_only_update_keeps_generation_and_noop_keeps_resource_version(api):
    s = api.create_resource_slice(make_slice("s"))
    s.metadata.labels = {"a": "b"}
    s2 = api.replace_resource_slice("s", s)
    assert s2.metadata.generation == 1
    s3 = api.replace_resource_slice("s", s2)
    assert s3.metadata.resource_version == s2.metadata.resource_version


def test_patches(srv, api):
    api.create_resource_slice(make_slice("s", labels={"keep": "1", "drop": "1"}))
    p = api.patch_resource_slice("s", {"metadata": {"labels": {"drop": None, "new": "x"}}})
    assert p.metadata.labels == {"keep": "1", "new": "x"}
    p = api.patch_resource_slice("s", [{"op": "replace", "path": "/spec/devices/0/name",
                                        "value": "gpu-9"}])
    assert p.spec.devices[0].name == "gpu-9" and p.metadata.generation == 2
    p = api.patch_resource_slice("s", {"spec": {"nodeName": "node-b"}},
                                 _content_type="application/merge-patch+json")
    assert p.spec.node_name == "node-b"
    with pytest.raises(ApiException) as exc:  # patch results are validated too
        api.patch_resource_slice("s", {"spec": {"allNodes": True}})
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:  # resourceVersion in a patch is a precondition
        api.patch_resource_slice("s", {"metadata": {"resourceVersion": "1", "labels": {"z": "z"}}})
    assert exc.value.status == 409


def test_claim_status_subresource_and_strategic_merge(srv):
    api = client.ResourceV1Api(srv.api_client())
    claim = client.ResourceV1ResourceClaim(
        metadata=client.V1ObjectMeta(name="claim", namespace="default"),
        spec=client.V1ResourceClaimSpec(devices=client.V1DeviceClaim(requests=[
            client.V1DeviceRequest(name="gpu", exactly=client.V1ExactDeviceRequest(
                device_class_name="gpu.example.com"))])),
        status=client.V1ResourceClaimStatus(reserved_for=[client.V1ResourceClaimConsumerReference(
            resource="pods", name="ignored", uid="u-0")]))
    created = api.create_namespaced_resource_claim("default", claim)
    assert created.status is None  # status is not settable on create
    alloc = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u-1"}]}}
    api.patch_namespaced_resource_claim_status("claim", "default", alloc)
    # strategic merge: reservedFor merges by uid
    api.patch_namespaced_resource_claim_status(
        "claim", "default", {"status": {"reservedFor": [{"resource": "pods", "name": "p2", "uid": "u-2"}]}})
    got = api.read_namespaced_resource_claim("claim", "default")
    assert [r.uid for r in got.status.reserved_for] == ["u-1", "u-2"]
    assert got.status.allocation.devices.results[0].device == "gpu-0"
    # the main endpoint ignores status; the spec of a claim is immutable
    got.status = None
    got.metadata.labels = {"x": "y"}
    after = api.replace_namespaced_resource_claim("claim", "default", got)
    assert after.status.allocation is not None and after.metadata.labels == {"x": "y"}
    after.spec.devices.requests[0].name = "other"
    with pytest.raises(ApiException) as exc:
        api.replace_namespaced_resource_claim("claim", "default", after)
    assert exc.value.status == 422 and "field is immutable" in status_of(exc.value)["message"]
    assert ("patch", "resourceclaims/status", "claim") in srv.writes


# ----------------------------------------------------------------------------- selectors
def test_label_and_field_selectors(api):
    api.create_resource_slice(make_slice("a1", node="node-a", labels={"tier": "gold", "zone": "1"}))
    api.create_resource_slice(make_slice("a2", node="node-a", labels={"tier": "silver"}))
    api.create_resource_slice(make_slice("b1", node="node-b", labels={"tier": "gold"},
                                         driver="other.example.com"))

    def names(**kw):
        return sorted(s.metadata.name for s in api.list_resource_slice(**kw).items)

    assert names(field_selector="spec.nodeName=node-a") == ["a1", "a2"]
    assert names(field_selector="spec.nodeName=node-a,metadata.name!=a1") == ["a2"]
    assert names(field_selector=f"spec.driver={DRIVER}") == ["a1", "a2"]
    assert names(field_selector="metadata.name==b1") == ["b1"]
    assert names(label_selector="tier=gold") == ["a1", "b1"]
    assert names(label_selector="tier!=gold") == ["a2"]
    assert names(label_selector="tier in (gold, silver),zone") == ["a1"]
    assert names(label_selector="tier notin (gold)") == ["a2"]
    assert names(label_selector="!zone") == ["a2", "b1"]
    assert names(label_selector="tier=gold", field_selector="spec.nodeName=node-b") == ["b1"]
    page = api.list_resource_slice(limit=2)
    assert len(page.items) == 2 and page.metadata.var_continue
    rest = api.list_resource_slice(limit=2, _continue=page.metadata.var_continue)
    assert [s.metadata.name for s in rest.items] == ["b1"]
    with pytest.raises(ApiException) as exc:
        api.list_resource_slice(field_selector="spec.pool.name=x")
    assert exc.value.status == 400


def test_deletecollection_with_selector(srv, api):
    for i, node in enumerate(["node-a", "node-a", "node-b"]):
        api.create_resource_slice(make_slice(f"s{i}", node=node))
    srv.reset_counters()
    api.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")
    assert [s["metadata"]["name"] for s in srv.objects("resourceslices")] == ["s2"]
    assert sorted(w.name for w in srv.writes) == ["s0", "s1"]
    assert srv.requests["deletecollection"] == 1


# ----------------------------------------------------------------------------- delete
def test_delete_preconditions_and_finalizers(srv):
    api = client.ResourceV1Api(srv.api_client())
    s = api.create_resource_slice(make_slice("s"))
    with pytest.raises(ApiException) as exc:
        api.delete_resource_slice("s", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version="1")))
    assert exc.value.status == 409
    api.delete_resource_slice("s", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=s.metadata.resource_version)))
    assert srv.objects("resourceslices") == []

    f = make_slice("f")
    f.metadata.finalizers = ["example.com/keep"]
    api.create_resource_slice(f)
    deleting = api.delete_resource_slice("f")
    assert deleting.metadata.deletion_timestamp is not None
    assert srv.get_object("resourceslices", "f") is not None
    api.patch_resource_slice("f", {"metadata": {"$deleteFromPrimitiveList/finalizers":
                                                ["example.com/keep"]}})
    assert srv.get_object("resourceslices", "f") is None


# ----------------------------------------------------------------------------- watch
def test_watch_replays_from_resource_version(api):
    start = api.list_resource_slice().metadata.resource_version
    s = api.create_resource_slice(make_slice("w"))
    s.spec.devices.append(device("gpu-1"))
    api.replace_resource_slice("w", s)
    api.delete_resource_slice("w")
    w = watch.Watch()
    seen = []
    t0 = time.monotonic()
    for event in w.stream(api.list_resource_slice, resource_version=start, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]
    assert time.monotonic() - t0 < 2
    assert isinstance(event["object"], client.V1ResourceSlice)


def test_watch_streams_live_events_with_selector(api):
    api.create_resource_slice(make_slice("existing", node="node-a"))
    seen: list[tuple[str, str]] = []
    ready = threading.Event()
    w = watch.Watch()

    def consume():
        for event in w.stream(api.list_resource_slice, field_selector="spec.nodeName=node-a",
                              timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            ready.set()
            if event["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    assert ready.wait(2)  # the initial ADDED for "existing"
    api.create_resource_slice(make_slice("other-node", node="node-b"))  # filtered out
    s = api.create_resource_slice(make_slice("live", node="node-a"))
    s.metadata.labels = {"x": "y"}
    api.replace_resource_slice("live", s)
    api.delete_resource_slice("live")
    t.join(timeout=5)
    assert not t.is_alive()
    assert seen == [("ADDED", "existing"), ("ADDED", "live"), ("MODIFIED", "live"),
                    ("DELETED", "live")]


def test_watch_timeout_ends_stream(api):
    t0 = time.monotonic()
    events = list(watch.Watch().stream(api.list_resource_slice, timeout_seconds=1))
    assert events == [] and 0.9 <= time.monotonic() - t0 < 2


def test_watch_from_compacted_version_is_410(srv, api):
    api.create_resource_slice(make_slice("a"))
    old = api.list_resource_slice().metadata.resource_version
    api.create_resource_slice(make_slice("b"))
    srv.compact()
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(api.list_resource_slice, resource_version=str(int(old) - 1),
                                  timeout_seconds=1))
    assert exc.value.status == 410


# ----------------------------------------------------------------------------- faults & counters
def test_injected_503_surfaces_then_clears(srv, api):
    api.create_resource_slice(make_slice("s"))
    srv.reset_counters()
    inj = srv.inject(verb="update", resource="resourceslices", status=503, times=1)
    s = api.read_resource_slice("s")
    s.metadata.labels = {"a": "b"}
    with pytest.raises(ApiException) as exc:
        api.replace_resource_slice("s", s)
    assert exc.value.status == 503
    assert status_of(exc.value)["reason"] == "ServiceUnavailable"
    assert srv.writes == []  # the failed request had no effect
    api.replace_resource_slice("s", s)
    assert inj.remaining == 0
    assert srv.writes == [("update", "resourceslices", "s")]
    assert srv.requests["update"] == 2 and srv.requests["get"] == 1


def test_injected_conflicts_for_retry_loops(srv, api):
    api.create_resource_slice(make_slice("s"))
    srv.inject(verb="update", resource="resourceslices", status=409, times=2)
    attempts = 0
    while True:
        attempts += 1
        s = api.read_resource_slice("s")
        s.metadata.labels = {"n": str(attempts)}
        try:
            api.replace_resource_slice("s", s)
            break
        except ApiException as exc:
            assert exc.status == 409 and status_of(exc)["reason"] == "Conflict"
    assert attempts == 3
    with pytest.raises(ApiException) as exc:
        srv.inject(verb="create", resource="resourceslices", status=500)
        api.create_resource_slice(make_slice("t"))
    assert exc.value.status == 500


# ----------------------------------------------------------------------------- core kinds, kubeconfig
def test_core_kinds_and_kubeconfig(srv, tmp_path):
    path = srv.kubeconfig(tmp_path / "kubeconfig")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    core = client.CoreV1Api(client.ApiClient(cfg))
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="node-a", labels={"gpu": "yes"})))
    assert [n.metadata.name for n in core.list_node(label_selector="gpu").items] == ["node-a"]
    pod = core.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(node_name="node-a", containers=[client.V1Container(name="c",
                                                                                 image="busybox")])))
    assert pod.status.phase == "Pending"
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=node-a").items] == ["p"]
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="p."), reason="Prepared", type="Normal",
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default")))
    assert len(core.list_namespaced_event("default", field_selector="involvedObject.name=p").items) == 1
    assert {n.metadata.name for n in core.list_namespace().items} >= {"default", "kube-system"}
    with pytest.raises(ApiException) as exc:  # core kinds are schema-checked too
        raw(core.api_client, "POST", "/api/v1/namespaces/default/pods",
            {"metadata": {"name": "q"}, "spec": {"containers": [{"name": "c", "imagee": "x"}]}})
    assert exc.value.status == 422
    assert "spec.containers[0].imagee" in status_of(exc.value)["message"]


def test_kubeconfig_is_written_atomically_and_private(srv, tmp_path):
    path = srv.kubeconfig(tmp_path / "dir" / "kubeconfig")
    assert [p.name for p in path.parent.iterdir()] == ["kubeconfig"]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o600
    assert srv.url in path.read_text()


def test_openapi_v3_lists_operations_with_field_validation(srv):
    """What kubectl create reads to let the server validate (kubectl's QueryParamVerifierV3)."""
    ac = srv.api_client()
    root = raw(ac, "GET", "/openapi/v3")["paths"]
    assert {"api/v1", "apis/resource.k8s.io/v1"} <= set(root)
    doc = raw(ac, "GET", root["apis/resource.k8s.io/v1"]["serverRelativeURL"].split("?")[0])
    patch = doc["paths"]["/apis/resource.k8s.io/v1/resourceslices/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    claims = doc["paths"]["/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"]
    assert "fieldValidation" in [p["name"] for p in claims["post"]["parameters"]]
    with pytest.raises(ApiException) as exc:
        raw(ac, "GET", "/openapi/v3/apis/nothing.example.com/v1")
    assert exc.value.status == 404


def test_strict_namespaces():
    with LocalApiServer(version="1.36", strict_namespaces=True) as srv:
        api = client.ResourceV1Api(srv.api_client())
        tmpl = client.V1ResourceClaimTemplate(
            metadata=client.V1ObjectMeta(name="t"),
            spec=client.V1ResourceClaimTemplateSpec(spec=client.V1ResourceClaimSpec()))
        with pytest.raises(ApiException) as exc:
            api.create_namespaced_resource_claim_template("missing", tmpl)
        assert exc.value.status == 404
        api.create_namespaced_resource_claim_template("default", tmpl)
        assert srv.objects("resourceclaimtemplates", namespace="default")[0]["metadata"]["name"] == "t"
