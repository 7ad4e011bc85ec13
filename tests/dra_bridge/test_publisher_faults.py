"""The publisher under API faults, from outside: a real LocalApiServer over HTTP injects them.

409 conflicts, 5xx bursts, 429 with Retry-After (honoured, capped), a slow server (per-request
timeout, a clean error, the next publish succeeds) and a create the server applied late. After
every publish, faulty or not, what the server holds must never show two generations as one pool
nor a device twice. The publisher LISTs and keeps no watch, so there is no dropped watch to test.

The publisher's retries are the only ones: the clients we build let urllib3 retry connection
errors alone, so a 429/503 Retry-After on any verb reaches the publisher (and its cap), and a
timed-out GET/PUT is re-sent once by the publisher, not up to three times by urllib3.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from kubernetes.client.exceptions import ApiException

from dra_bridge.apiclient.publisher import RETRY_AFTER_CAP, ApiTimeout, Publisher, retry_delay
from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.dra import DRIVER, assert_consistent_pool, make_node, pool_slices, published_devices, version_tuple

VERSION = "1.35"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    return make_node(tmp_path_factory.mktemp("faults"), "default", version=version_tuple(VERSION))


@pytest.fixture
def srv():
    with LocalApiServer(version=VERSION) as s:
        yield s


def publisher(srv, node, sleeps: list[float] | None = None, **kw) -> Publisher:
    return Publisher(srv.api_client(), driver=DRIVER, node_name=node.node, version=version_tuple(VERSION),
                     sleep=(sleeps.append if sleeps is not None else (lambda s: None)),
                     rand=kw.pop("rand", lambda: 0.5), **kw)


def renamed(pool, *indexes: int):
    """The pool with the product name of the devices at ``indexes`` changed."""
    changed = pool.model_copy(deep=True)
    for i in indexes:
        changed.devices[i].attributes["productName"] = {"string": f"renamed board {i}"}
    return changed


def assert_safe(srv, node) -> None:
    """What a scheduler reading the server's slices can see: never a mixed pool, never a device twice.

    The newest generation is the pool; its slices all announce the same ``resourceSliceCount`` and are
    no more than that (fewer: incomplete, not allocated from). Within it no slice name or device repeats.
    """
    slices = pool_slices(srv, node=node.node)
    names = [s["metadata"]["name"] for s in slices]
    assert len(names) == len(set(names)), f"duplicate slice names {names}"
    if not slices:
        return
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    cur = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in cur}
    assert len(counts) == 1, f"generation {newest} disagrees on resourceSliceCount: {counts}"
    assert len(cur) <= counts.pop(), f"more slices of generation {newest} than it announces"
    devices = Counter(d["name"] for s in cur for d in s["spec"].get("devices") or [])
    assert not [d for d, n in devices.items() if n > 1], f"devices published twice: {devices}"


def assert_published(srv, node, pool) -> None:
    """A successful publish: one complete generation holding exactly the pool's devices."""
    assert_safe(srv, node)
    slices = pool_slices(srv, node=node.node)
    assert_consistent_pool(slices)
    assert published_devices(slices) == {d.name for d in pool.devices}


# --------------------------------------------------------------------------- pure backoff


def test_backoff_grows_with_jitter_and_is_capped():
    d = [retry_delay(a, backoff=0.1, max_backoff=1.0, jitter=0.0) for a in range(6)]
    assert d == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert retry_delay(0, backoff=0.1, max_backoff=1.0, jitter=0.99) == pytest.approx(0.1495)
    assert retry_delay(0, backoff=0.1, max_backoff=1.0, jitter=0.0, server_asks=4) == 4
    assert retry_delay(3, backoff=0.1, max_backoff=1.0, jitter=0.0, server_asks=0.01) == 0.8  # never sooner than ours
    assert retry_delay(0, backoff=0.1, max_backoff=1.0, jitter=0.0, server_asks=86400) == RETRY_AFTER_CAP


# --------------------------------------------------------------------------- 409


def test_conflicts_on_update_are_retried_then_succeed(srv, node):
    pool = node.build_pool()
    sleeps: list[float] = []
    pub = publisher(srv, node, sleeps)
    pub.sync(pool)
    changed = renamed(pool, -1)
    inj = srv.inject("update", "resourceslices", 409, times=3)
    res = pub.sync(changed)
    assert inj.hits == 3 and len(sleeps) == 3 and res.updated == 1
    assert sum(1 for r in srv.request_log if r.verb == "update" and r.code == 409) == 3
    assert_published(srv, node, changed)


def test_create_finding_its_slice_already_there_replaces_it(srv, node):
    """A create of ours the server applied late (we had given up): 409 AlreadyExists, take it over."""
    pool = node.build_pool()
    pub = publisher(srv, node)
    api, landed = pub.api, []

    class LateCreate:
        def __getattr__(self, name):
            return getattr(api, name)

        def create_resource_slice(self, body, **kw):
            if not landed:  # the server now holds an (older) copy under this name
                late = {**body, "spec": {**body["spec"], "devices": body["spec"]["devices"][:1]}} \
                    if body["spec"].get("devices") else body
                srv.add(late)
                landed.append(body["metadata"]["name"])
            return api.create_resource_slice(body, **kw)

    pub.api = LateCreate()
    res = pub.sync(pool)
    assert landed and res.created == len(pool_slices(srv, node=node.node))
    assert any(r.verb == "create" and r.code == 409 for r in srv.request_log)
    assert_published(srv, node, pool)


# --------------------------------------------------------------------------- 5xx


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_burst_on_every_verb_is_ridden_out(srv, node, status):
    pool = node.build_pool()
    sleeps: list[float] = []
    pub = publisher(srv, node, sleeps, retries=4)
    inj = srv.inject(None, "resourceslices", status, times=4)  # list, then creates
    pub.sync(pool)
    assert inj.hits == 4 and len(sleeps) == 4
    assert_published(srv, node, pool)
    changed = renamed(pool, 0, -1)  # several slices: a generation bump, creates/updates/deletes
    inj = srv.inject(None, "resourceslices", status, times=4)
    pub.sync(changed)
    assert inj.hits == 4
    assert_published(srv, node, changed)


def test_5xx_longer_than_the_retries_fails_safe_and_recovers(srv, node):
    pool = node.build_pool()
    pub = publisher(srv, node, retries=2)
    pub.sync(pool)
    changed = renamed(pool, 0, -1)
    # the list and the first creates pass, then the server breaks down mid-publish
    srv.inject("create", "resourceslices", None, times=2)
    srv.inject(None, "resourceslices", 503, times=None)
    with pytest.raises(ApiException) as exc:
        pub.sync(changed)
    assert exc.value.status == 503
    assert_safe(srv, node)  # half a new generation is incomplete: the old pool or nothing is seen
    srv.clear_injections()
    pub.sync(changed)
    assert_published(srv, node, changed)


# --------------------------------------------------------------------------- 429 + Retry-After


def test_429_retry_after_is_honoured(srv, node):
    pool = node.build_pool()
    sleeps: list[float] = []
    inj = srv.inject("create", "resourceslices", 429, times=2, retry_after=2)
    publisher(srv, node, sleeps).sync(pool)
    assert inj.hits == 2 and sleeps == [2.0, 2.0], "waits must be what the server asked, not our backoff"
    assert_published(srv, node, pool)


@pytest.mark.parametrize("verb", ["list", "update", "delete"])
def test_retry_after_on_idempotent_verbs_reaches_the_publisher(srv, node, verb):
    """urllib3 would wait out a GET/PUT/DELETE Retry-After itself, uncapped, unseen: not with our clients."""
    pool = node.build_pool()
    publisher(srv, node).sync(pool)
    changed = {"list": pool, "update": renamed(pool, -1), "delete": type(pool)()}[verb]
    sleeps: list[float] = []
    inj = srv.inject(verb, "resourceslices", 503, times=1, retry_after=3600)
    publisher(srv, node, sleeps).sync(changed)
    assert inj.hits == 1 and sleeps == [RETRY_AFTER_CAP]
    if changed.devices:
        assert_published(srv, node, changed)
    else:  # every slice deleted
        assert published_devices(srv.objects("resourceslices")) == set()


def test_429_retry_after_is_capped(srv, node):
    pool = node.build_pool()
    sleeps: list[float] = []
    srv.inject("create", "resourceslices", 429, times=1, retry_after=3600)
    publisher(srv, node, sleeps).sync(pool)
    assert sleeps == [RETRY_AFTER_CAP]
    assert_published(srv, node, pool)


def test_429_without_retry_after_backs_off_exponentially_within_bounds(srv, node):
    pool = node.build_pool()
    sleeps: list[float] = []
    srv.inject("create", "resourceslices", 429, times=None)
    with pytest.raises(ApiException) as exc:
        publisher(srv, node, sleeps, retries=4, backoff=0.1, max_backoff=0.5, rand=lambda: 0.0).sync(pool)
    assert exc.value.status == 429
    assert sleeps == [0.1, 0.2, 0.4, 0.5]
    assert_safe(srv, node)


# --------------------------------------------------------------------------- slow server


@pytest.mark.parametrize("verb", ["list", "create", "update"])
def test_slow_server_fails_the_publish_cleanly_then_recovers(srv, node, verb):
    pool = node.build_pool()
    pub = publisher(srv, node, timeout=10.0)  # set-up and recovery: a loaded machine is no slow server
    if verb == "update":
        pub.sync(pool)
        pool = renamed(pool, -1)
    sleeps: list[float] = []
    pub.sleep = sleeps.append
    pub.timeout = 0.2
    srv.inject(verb, "resourceslices", None, times=None, delay=0.6)  # answers, always too late
    started = time.monotonic()
    what = {"list": "list", "create": "create", "update": "replace"}[verb]
    with pytest.raises(ApiTimeout, match=rf"{what} resourceslice.*did not answer within 0\.2 s"):
        pub.sync(pool)
    assert time.monotonic() - started < 3, "a slow server must not hang the publish"
    assert sleeps == [], "a timeout is not retried by the publisher: the next resync tries again"
    srv.clear_injections()
    time.sleep(0.8)  # the late requests land on the server after the publisher gave up
    assert_safe(srv, node)
    pub.timeout = 10.0
    pub.sync(pool)
    assert_published(srv, node, pool)


@pytest.mark.parametrize("verb", ["list", "update"])
def test_one_slow_idempotent_request_is_ridden_out(srv, node, verb):
    """GET and PUT that time out once are re-sent once by the publisher (never by urllib3: a second
    timeout fails the sync); a PUT applied late then conflicts and is re-read: the publish still
    succeeds, with nothing duplicated."""
    pool = node.build_pool()
    pub = publisher(srv, node, timeout=1.0)  # ample for every other request on a loaded machine
    if verb == "update":
        pub.sync(pool)
        pool = renamed(pool, -1)
    inj = srv.inject(verb, "resourceslices", None, times=1, delay=1.6)
    pub.sync(pool)
    assert inj.hits == 1
    time.sleep(1.6)  # the late request lands
    assert_published(srv, node, pool)
