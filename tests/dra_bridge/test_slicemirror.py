"""The publisher's watched mirror: an idle resync makes no request, changes behind our back are seen
through the watch, a lost watch costs one LIST (issue #15: no periodic LIST, 0 writes when idle)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from dra_bridge.apiclient.publisher import Publisher
from dra_bridge.apiclient.slicemirror import SliceMirror, content_digest
from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.dra import DRIVER, make_node, pool_slices


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    return make_node(tmp_path_factory.mktemp("mirror"), "default", version=(1, 35))


def publisher(srv, node, **kw) -> Publisher:
    return Publisher(srv.api_client(), driver=DRIVER, node_name=node.node, sleep=lambda s: None, **kw)


def requests(srv, verb: str | None = None) -> list:
    return [r for r in srv.request_log if r.resource == "resourceslices" and (verb is None or r.verb == verb)]


def wait_for(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the watch did not deliver the change in time"
        time.sleep(0.02)


def test_idle_resync_makes_no_request(node):
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        try:
            assert pub.sync(pool).writes > 0
            lists = len(requests(srv, "list"))
            srv.reset_counters()
            for _ in range(3):
                assert pub.sync(pool).writes == 0
            assert [r for r in srv.request_log if r.verb != "watch"] == []
            assert lists == 1 and pub.mirror.lists == 1
        finally:
            pub.close()


def test_without_watch_every_sync_lists(node):
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node, watch=False)
        pub.sync(pool)
        srv.reset_counters()
        assert pub.sync(pool).writes == 0
        assert len(requests(srv, "list")) == 1 and not requests(srv, "watch")


def test_a_slice_deleted_behind_our_back_is_seen_and_recreated_without_a_list(node):
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        try:
            pub.sync(pool)
            victim = sorted(pub.mirror.snapshot())[-1]
            client.ResourceV1Api(srv.api_client()).delete_resource_slice(victim)
            wait_for(lambda: victim not in pub.mirror.snapshot())
            srv.reset_counters()
            result = pub.sync(pool)
            assert result.created == 1 and result.updated == result.deleted == 0
            assert not requests(srv, "list")
            assert victim in {s["metadata"]["name"] for s in pool_slices(srv, node=node.node)}
        finally:
            pub.close()


def test_a_slice_edited_behind_our_back_is_put_back(node):
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        try:
            pub.sync(pool)
            name = sorted(pub.mirror.snapshot())[0]
            before = pub.mirror.snapshot()[name].digest
            obj = srv.get_object("resourceslices", name)
            obj["metadata"]["labels"]["edited"] = "by-hand"
            client.ResourceV1Api(srv.api_client()).replace_resource_slice(name, obj)
            wait_for(lambda: pub.mirror.snapshot()[name].digest != before)
            assert pub.sync(pool).updated == 1
            assert "edited" not in srv.get_object("resourceslices", name)["metadata"]["labels"]
        finally:
            pub.close()


def test_an_expired_watch_costs_exactly_one_list(node):
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        srv.inject("watch", "resourceslices", 410, times=1)
        pub = publisher(srv, node)
        try:
            pub.sync(pool)
            wait_for(lambda: not pub.mirror.synced)
            assert pub.sync(pool).writes == 0  # LISTs again, nothing to write
            assert pub.mirror.lists == 2 and pub.mirror.synced
            assert pub.sync(pool).writes == 0 and pub.mirror.lists == 2
        finally:
            pub.close()


# --------------------------------------------------------------------------- the mirror alone

def _slice(name: str, rv: int, gen: int = 1, label: str = "a") -> dict:
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": {"x": label}},
            "spec": {"pool": {"name": "n", "generation": gen}, "driver": DRIVER}}


def test_mirror_ignores_events_older_than_our_own_write():
    events: list[dict] = []
    mirror = SliceMirror(lambda: {"metadata": {"resourceVersion": "5"}, "items": [_slice("s", 5)]},
                         lambda version: iter(events))
    mirror.stop()  # no background watch: events are applied by hand below
    mirror.list_and_watch()
    mirror.record(_slice("s", 9, label="ours"))
    mirror._apply("MODIFIED", _slice("s", 7, label="older"))
    assert mirror.snapshot()["s"].digest == content_digest(_slice("s", 9, label="ours"))
    mirror._apply("DELETED", _slice("s", 8))
    assert "s" in mirror.snapshot()
    mirror._apply("DELETED", _slice("s", 10))
    assert "s" not in mirror.snapshot()


def test_digest_ignores_generation_and_empty_fields():
    a = _slice("s", 1, gen=1)
    b = _slice("s", 2, gen=7)
    b["spec"]["devices"] = []
    assert content_digest(a) == content_digest(b)
    assert content_digest(a) != content_digest(_slice("s", 1, label="b"))


def test_error_event_marks_the_mirror_unsynced():
    mirror = SliceMirror(lambda: {"metadata": {"resourceVersion": "1"}, "items": []},
                         lambda version: iter([{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]))
    mirror.list_and_watch()
    wait_for(lambda: not mirror.synced)
    mirror.stop()


# --------------------------------------------------------------------------- what the server keeps

@pytest.mark.parametrize("version,gates,kept", [
    ("1.35", {}, {"counters": False}),  # DRAPartitionableDevices alpha, off: counters dropped
    ("1.35", None, {"counters": True}),  # every gate on
    ("1.37", {}, {"counters": True, "compatibility_groups": False}),  # DRADeviceCompatibilityGroups alpha
])
def test_fields_the_server_drops_are_detected_and_do_not_cause_rewrites(tmp_path, version, gates, kept):
    major, minor = (int(x) for x in version.split("."))
    node = make_node(tmp_path, "default", version=(major, minor))
    pool = node.build_pool()
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        pub = publisher(srv, node)
        try:
            assert pub.sync(pool).created > 0
            for field, value in kept.items():
                assert getattr(pub.kept, field) is value, pub.kept.describe()
            srv.reset_counters()
            assert pub.sync(pool).writes == 0  # the server's copy lacks fields, yet is as we left it
            assert pub.sync(pool).writes == 0
            assert not srv.writes
        finally:
            pub.close()
